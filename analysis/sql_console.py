"""Read-only SQL over a run, safe to expose (CLI `sql`, the dashboard's console).

Why these settings: the console takes arbitrary user text, so the connection opens the database
read-only with DuckDB's external access disabled (no files, no ATTACH, no extensions), spilling
disabled (DuckDB would otherwise let the console read and write its temp directory) and the
configuration locked. Each query gets its own connection, and only one query statement
(SELECT, WITH, FROM, DESCRIBE, SUMMARIZE, EXPLAIN, ...): no temp objects, variables, prepared
statements or transactions exist to leak into a later query. Each query is bounded in rows,
time, memory (DuckDB's limit plus an address-space cap on the process while it runs) and result
bytes, and errors never name the server's files.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
from ranklens.analysis.sql_types import renderable, to_frame
from ranklens.analysis.views import apply_all_views
from ranklens.ingest import shards
from ranklens.ingest.database import connect
from ranklens.ingest.errors import RanklensError
from ranklens.ingest.schema import TABLE_BY_NAME

MIB = 1 << 20
MEMORY_LIMIT = 2048 * MIB  # DuckDB's memory limit for the console's database
HEADROOM = 1024 * MIB  # address space beyond MEMORY_LIMIT a query may add to its process
RESULT_BYTES = 64 * MIB  # the result of one query, as Arrow columns (CLI)
TIMEOUT_S = 30.0
BATCH_ROWS = 2048  # rows fetched at a time while the result's size is counted
QUERY_TYPES = frozenset({duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN})
NARROW = (
    "narrow the query: select fewer columns, filter (WHERE rank = ..., step = ...), "
    "aggregate (GROUP BY) or add a LIMIT"
)
TABLES_HINT = (
    "tables: meta, sources, ranks, process_groups, events, steps, threads; "
    "views: <analysis>_by_step, ..."
)


class SqlError(RanklensError):
    """The query failed, was refused, or ran out of time, memory or result size."""

    def __init__(self, message: str, hint: str | None = TABLES_HINT) -> None:
        super().__init__(message, hint)


def safe_connect(
    db_path: str | os.PathLike[str], *, memory_limit: int | None = MEMORY_LIMIT
) -> duckdb.DuckDBPyConnection:
    """A read-only, sandboxed connection with the analysis views (the run's stored ones when
    they are current, else temp views: views.apply_all_views).

    `memory_limit` None keeps DuckDB's defaults (memory, spilling to `<db>.tmp/`): only for
    code that runs no user text (the dashboard's own pages, benchmarks)."""
    connect(db_path).close()  # raises a clear error for a missing or foreign file
    sharded = shards.is_sharded_run(db_path)
    config: dict[str, str | bool | int | float | list[str]] = {
        # A sharded run's events are its Parquet shards: that one directory stays readable
        # (set below, once the database is open); the rest of the file system does not.
        "enable_external_access": sharded,
        "autoinstall_known_extensions": False,
        "autoload_known_extensions": False,
        "asof_loop_join_threshold": 0,  # what apply_sql sets, set before the lock
    }
    if memory_limit is not None:
        config |= {"memory_limit": f"{memory_limit // MIB}MiB", "temp_directory": ""}
    try:
        con = duckdb.connect(str(shards.catalog_of(db_path)), read_only=True, config=config)
    except duckdb.Error as exc:
        msg = _scrub(str(exc), db_path)
        raise SqlError(f"cannot open the database sandboxed ({msg})") from None
    con.execute("SET enable_progress_bar = false")
    if sharded:
        allowed = f"{shards.shard_dir_of(db_path)}/".replace("'", "''")
        con.execute(f"SET allowed_directories = ['{allowed}']")
        shards.attach(con, db_path)
        con.execute("SET enable_external_access = false")
    apply_all_views(con)
    con.execute("SET lock_configuration = true")
    return con


def cursor(
    con: duckdb.DuckDBPyConnection, db_path: str | os.PathLike[str]
) -> duckdb.DuckDBPyConnection:
    """Another connection to the sandboxed database of `con` (same settings); a sharded run's
    `events` is a temporary view, which each connection must get anew."""
    cur = con.cursor()
    if shards.is_sharded_run(db_path):
        shards.attach(cur, db_path)
    return cur


def view_names(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The analysis views a console query can read (installs them on `con`); not `events`,
    a view only in how it is stored (listed with the tables)."""
    apply_all_views(con)
    rows = con.execute(
        "SELECT DISTINCT view_name FROM duckdb_views() WHERE NOT internal "
        "AND view_name NOT LIKE '\\_%' ESCAPE '\\' ORDER BY 1"
    ).fetchall()
    return [str(r[0]) for r in rows if str(r[0]) not in TABLE_BY_NAME]


def run_sql(
    db_path: str | os.PathLike[str],
    query: str,
    *,
    max_rows: int | None = 1000,
    timeout_s: float = TIMEOUT_S,
    max_bytes: int = RESULT_BYTES,
) -> pl.DataFrame:
    """Run one query on a connection of its own; at most `max_rows` rows (None: all),
    `timeout_s` seconds and `max_bytes` of result."""
    return to_frame(query_arrow(db_path, query, max_rows, timeout_s, max_bytes))


def query_arrow(
    db_path: str | os.PathLike[str],
    query: str,
    max_rows: int | None,
    timeout_s: float,
    max_bytes: int,
) -> pa.Table:
    """The query's result as Arrow (what the dashboard's query process sends back)."""
    try:
        con = safe_connect(db_path)
    except RanklensError as exc:
        raise SqlError(_scrub(exc.message, db_path), exc.hint) from None
    try:
        return _fetch(con, query, max_rows, timeout_s, max_bytes)
    except SqlError as exc:
        raise SqlError(_scrub(exc.message, db_path), exc.hint) from None
    finally:
        con.close()


def check_query(con: duckdb.DuckDBPyConnection, query: str) -> None:
    """Refuse anything but one query statement: the console reads and keeps no state."""
    try:
        statements = con.extract_statements(query)
    except duckdb.Error as exc:
        raise SqlError(str(exc).splitlines()[0]) from None
    if not statements:
        raise SqlError("no statement in the query", "type a query, e.g. SELECT * FROM steps")
    if len(statements) > 1:
        raise SqlError(
            f"{len(statements)} statements: the console runs one query at a time",
            "use WITH name AS (...) SELECT ... for intermediate results",
        )
    kind = statements[0].type
    if kind not in QUERY_TYPES:
        raise SqlError(
            f"{kind.name} statements are refused: the console is read-only and keeps no state "
            "between queries (no CREATE, SET, BEGIN, PREPARE, COPY, ATTACH, PRAGMA, ...)",
            "write a query (SELECT, WITH, FROM, DESCRIBE, SUMMARIZE, EXPLAIN); PIVOT needs its "
            "values listed: PIVOT t ON c IN ('a', 'b') USING ...",
        )


def _fetch(
    con: duckdb.DuckDBPyConnection,
    query: str,
    max_rows: int | None,
    timeout_s: float,
    max_bytes: int,
) -> pa.Table:
    check_query(con, query)
    timer = threading.Timer(timeout_s, con.interrupt)
    timer.start()
    try:
        with _memory_cap(MEMORY_LIMIT + HEADROOM):
            rel = con.sql(query)
            if rel is None:
                return pa.table({})
            rel = renderable(rel)
            if max_rows is not None:
                rel = rel.limit(max_rows)
            return _collect(rel.to_arrow_reader(BATCH_ROWS), max_bytes)
    except (duckdb.Error, MemoryError, OSError, pa.ArrowException) as exc:
        # errors met while the result streams reach here through Arrow, as OSError
        raise _error(exc, timeout_s) from None
    finally:
        timer.cancel()


def _error(exc: BaseException, timeout_s: float) -> SqlError:
    """The message for a query that failed, ran out of time or of memory."""
    text = str(exc)
    if isinstance(exc, duckdb.InterruptException) or text.startswith("INTERRUPT"):
        return SqlError(f"query stopped after {timeout_s:.0f} s (the console's time limit)", NARROW)
    if isinstance(exc, (duckdb.OutOfMemoryException, MemoryError)) or "Out of Memory" in text:
        return SqlError(
            f"the query needs more than the console's {MEMORY_LIMIT // MIB:,} MiB of memory",
            NARROW,
        )
    return SqlError(text.strip().splitlines()[0] if text.strip() else type(exc).__name__)


def _collect(reader: pa.RecordBatchReader, max_bytes: int) -> pa.Table:
    """Read the result batch by batch, stopping as soon as it outgrows `max_bytes`."""
    batches: list[pa.RecordBatch] = []
    size = 0
    for batch in reader:
        size += batch.nbytes
        if size > max_bytes:
            raise SqlError(
                f"the result is larger than the console's limit of {max_bytes // MIB:,} MiB",
                NARROW + "; for a full export, open the file with DuckDB itself",
            )
        batches.append(batch)
    return pa.Table.from_batches(batches, schema=reader.schema)


@contextmanager
def _memory_cap(extra: int) -> Iterator[None]:
    """Cap the process' address space at its current size + `extra` while a query runs, so
    memory DuckDB does not account for (huge strings built per row) also fails cleanly."""
    try:
        import resource
    except ImportError:  # not on POSIX: DuckDB's own limit only
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    size = _address_space()
    cap = size + extra if hard == resource.RLIM_INFINITY else min(size + extra, hard)
    if not size or (soft != resource.RLIM_INFINITY and soft <= cap):
        yield
        return
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _address_space() -> int:
    """This process' virtual size in bytes (0 where /proc is not there)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _scrub(message: str, db_path: str | os.PathLike[str]) -> str:
    """`message` without the server's paths: the database and its folder."""
    path = Path(db_path).resolve()
    given = str(db_path)
    for p, label in (
        (f"{path}.tmp", "<db>.tmp"),
        (str(path), "<db>"),
        (given if os.sep in given else "", "<db>"),
        (str(path.parent), "<db dir>"),
    ):
        if len(p) > 1:
            message = message.replace(p, label)
    return message
