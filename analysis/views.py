"""Analysis results as SQL views, so users can query them next to the tables.

`store_views` stores them in the database file so any DuckDB client sees them, with a digest
of their SQL in `meta`; `apply_all_views` (any connection, read-only included) uses the stored
ones when this code stored them and creates temp ones otherwise (apply_sql decides, per SQL
file). Both create them unbound where DuckDB can (_sql.unbound): a query binds what it reads.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from types import ModuleType

import duckdb
from ranklens.analysis import _sql
from ranklens.ingest.database import connect_writable

from ranklens import analysis


def view_files(mods: Iterable[ModuleType] | None = None) -> tuple[str, ...]:
    """The SQL files of the registered analyses' views (each module's VIEW_FILES; none when it
    declares none) and the files they require, each once, after what it requires.

    Why derived: registering an analysis is its one line in REGISTRY, not a second list here."""
    mods = analysis.REGISTRY if mods is None else mods
    return tuple(_sql.with_requirements([f for m in mods for f in getattr(m, "VIEW_FILES", ())]))


def apply_all_views(con: duckdb.DuckDBPyConnection) -> None:
    """Every analysis view and macro on `con`: the run's stored ones when they are this code's
    (nothing to create), else temp ones shadowing whatever older code stored (apply_sql)."""
    _sql.apply_sql(con, *view_files())


def stored_views_current(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the run on `con` stored this code's views (store_views' digest in `meta`).
    Looks before it reads: a failed read would abort the caller's transaction."""
    meta = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE NOT temporary AND table_name = 'meta' "
        "AND schema_name = 'main' AND database_name = current_database()"
    ).fetchone()
    if meta != (1,):
        return False
    try:
        row = con.execute("SELECT value FROM meta WHERE key = ?", [VIEWS_DIGEST]).fetchone()
    except duckdb.Error:  # not a ranklens run (the caller's own checks say so)
        return False
    return row == (views_digest(),)


VIEWS_DIGEST = "views_digest"


def views_digest() -> str:
    """A digest of every view file's name and SQL, as this code has them."""
    h = hashlib.sha256()
    for name in view_files():
        h.update(f"{name}\0{_sql.sql_text(name)}\0".encode())
    return h.hexdigest()[:16]


def store_views(con: duckdb.DuckDBPyConnection) -> None:
    """Store the analysis views and macros in the database `con` writes (an ingest passes
    this as its `finalize`, so the views are in the file before its one atomic rename)."""
    for name in view_files():
        con.execute(_sql.unbound(re.sub(r"\bTEMP\s+", "", _sql.sql_text(name))))
    con.execute("DELETE FROM meta WHERE key = ?", [VIEWS_DIGEST])
    con.execute("INSERT INTO meta VALUES (?, ?)", [VIEWS_DIGEST, views_digest()])


def install_views(db_path: str | os.PathLike[str]) -> None:
    """Store the analysis views and macros in an existing database file."""
    con = connect_writable(db_path)
    try:
        store_views(con)
        con.execute("CHECKPOINT")
    finally:
        con.close()
