"""Recognize and open a ranklens database read-only, with errors that say what is wrong.

Why apart from run.py (which opens a run given as a database or as traces): the SQL console
and the dashboard open databases themselves, and all of them must tell a locked file, a
damaged one and one of another schema version apart.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
from ranklens.ingest import shards
from ranklens.ingest.errors import DatabaseError
from ranklens.ingest.schema import SCHEMA_VERSION

_DUCKDB_MAGIC = b"DUCK"


def is_database(path: str | os.PathLike[str]) -> bool:
    """True if `path` is a DuckDB file (checked by its header, not its name), or a sharded
    run's directory holding one."""
    p = shards.catalog_of(path)
    if not p.is_file():
        return False
    try:
        with open(p, "rb") as f:
            head = f.read(16)
    except OSError as exc:
        if looks_like_database(p):
            raise DatabaseError(f"{p}: cannot read the database ({exc.strerror})", _PERM) from None
        return False  # the trace readers say why they cannot read it
    return head[8:12] == _DUCKDB_MAGIC


DATABASE_SUFFIXES = (".duckdb", ".ddb", ".db")
_PERM = "check the file's permissions"


def looks_like_database(path: str | os.PathLike[str]) -> bool:
    """A file named like a database (whatever it holds)."""
    return str(path).endswith(DATABASE_SUFFIXES) and Path(path).is_file()


def _open_hint(exc: duckdb.Error) -> str:
    """What to do about a database DuckDB would not open: the hint follows the cause."""
    msg = str(exc)
    if "lock" in msg.lower():
        return "another process holds it for writing (an ingest?); wait for it or copy the file"
    if "Permission denied" in msg:
        return _PERM
    if "version" in msg.lower():
        return "it was written by another DuckDB version: re-ingest it with this ranklens"
    return "the file is damaged or not a DuckDB database; re-create it with `ranklens ingest`"


def connect(db_path: str | os.PathLike[str]) -> duckdb.DuckDBPyConnection:
    """Open a ranklens database read-only, checking it is one and of this schema version (a
    sharded run: its catalog, with `events` reading its shards)."""
    try:
        con = duckdb.connect(str(shards.catalog_of(db_path)), read_only=True)
        con.execute("SET enable_progress_bar = false")
    except duckdb.Error as exc:
        raise DatabaseError(
            f"{db_path}: cannot open the database ({str(exc).splitlines()[0]})", _open_hint(exc)
        ) from None
    try:
        rows = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall()
    except duckdb.Error:
        con.close()
        raise DatabaseError(
            f"{db_path}: not a ranklens database (no meta table)",
            "create one with: ranklens ingest RUN_DIR -o run.duckdb",
        ) from None
    if not rows or rows[0][0] != str(SCHEMA_VERSION):
        con.close()
        found = rows[0][0] if rows else "none"
        raise DatabaseError(
            f"{db_path}: schema version {found}, this ranklens reads {SCHEMA_VERSION}",
            "re-ingest the traces with this version of ranklens",
        )
    if shards.is_sharded_run(db_path):
        shards.attach(con, db_path)
    return con


def connect_writable(db_path: str | os.PathLike[str]) -> duckdb.DuckDBPyConnection:
    """A read-write connection to a run nobody else holds open (storing views and results):
    the file itself, or a sharded run's catalog with `events` reading its shards."""
    con = duckdb.connect(str(shards.catalog_of(db_path)))
    if shards.is_sharded_run(db_path):
        shards.attach(con, db_path)
    return con


@contextmanager
def registered(con: duckdb.DuckDBPyConnection, name: str, table: Any) -> Iterator[None]:
    """`table` (Arrow, or a polars frame) readable as `name` by the block's SQL, and gone after
    it, whatever happens: a statement over many rows at once, not one per row."""
    con.register(name, table)
    try:
        yield
    except BaseException:
        # in a transaction the failure aborted, unregister fails too: the failure is the news
        with contextlib.suppress(duckdb.Error):
            con.unregister(name)
        raise
    con.unregister(name)
