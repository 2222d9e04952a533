"""Open a run for reading: an existing ranklens database, or trace files ingested on the fly.

Why: every face (report, sql, dashboard, check) accepts either, and none may modify what the
user gave; traces given directly are ingested into a private temporary database.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
from ranklens.ingest.config import ConfigError, RunOptions
from ranklens.ingest.errors import DatabaseError
from ranklens.ingest.loader import IngestReport, Progress, load_traces
from ranklens.ingest.schema import SCHEMA_VERSION

_DUCKDB_MAGIC = b"DUCK"


def is_database(path: str | os.PathLike[str]) -> bool:
    """True if `path` is a DuckDB file (checked by its header, not its name)."""
    p = Path(path)
    if not p.is_file():
        return False
    with open(p, "rb") as f:
        head = f.read(16)
    return head[8:12] == _DUCKDB_MAGIC


def connect(db_path: str | os.PathLike[str]) -> duckdb.DuckDBPyConnection:
    """Open a ranklens database read-only, checking it is one and of this schema version."""
    try:
        con = duckdb.connect(str(db_path), read_only=True)
        con.execute("SET enable_progress_bar = false")
    except duckdb.Error as exc:
        raise DatabaseError(
            f"{db_path}: cannot open the database ({exc})",
            "another process may hold it for writing; wait for it or copy the file",
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
    return con


@contextmanager
def open_run(
    source: str | os.PathLike[str] | list[str],
    *,
    on_error: str = "raise",
    progress: Progress | None = None,
    options: RunOptions | None = None,
    allow_mixed: bool = False,
) -> Iterator[tuple[duckdb.DuckDBPyConnection, IngestReport | None]]:
    """Yield a read-only connection to a run given as a database or as trace inputs.

    `options` (alignment, offsets, layout) apply when traces are ingested; a database keeps
    the ones it was ingested with, so giving them as flags with a database is an error.
    """
    inputs = source if isinstance(source, list) else [str(source)]
    if len(inputs) == 1 and is_database(inputs[0]):
        flags = {"align": "--no-align", "offsets": "--offsets", "layout": "--layout"}
        sources = options.sources if options else {}
        given = [flags.get(k, k) for k, v in sources.items() if v == "flag"]
        if given:
            raise ConfigError(
                f"{inputs[0]} is a database; {', '.join(given)} apply when traces are ingested",
                "re-ingest: ranklens ingest RUN_DIR -o run.duckdb with those options, or give "
                "the trace directory instead of the database",
            )
        con = connect(inputs[0])
        try:
            yield con, None
        finally:
            con.close()
        return
    tmp = tempfile.mkdtemp(prefix="ranklens-run-")
    try:
        db = os.path.join(tmp, "run.duckdb")
        report = load_traces(
            inputs,
            db,
            on_error=on_error,
            progress=progress,
            options=options,
            allow_mixed=allow_mixed,
        )
        con = connect(db)
        try:
            yield con, report
        finally:
            con.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
