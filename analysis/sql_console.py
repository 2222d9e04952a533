"""Read-only SQL over a run, safe to expose (CLI `sql`, the dashboard's console).

Why these settings: the console takes arbitrary user text, so the connection opens the database
read-only with DuckDB's external access disabled (no files, no ATTACH, no extensions) and the
configuration locked, and every query has a row limit and a time limit.
"""

from __future__ import annotations

import os
import threading

import duckdb
import polars as pl
from ranklens.analysis.views import apply_all_views
from ranklens.ingest.database import connect


class SqlError(Exception):
    """The query failed, was refused, or ran out of time; the message says which."""


def safe_connect(db_path: str | os.PathLike[str]) -> duckdb.DuckDBPyConnection:
    """A read-only, sandboxed connection with the analysis views installed (as temp views)."""
    connect(db_path).close()  # raises a clear error for a missing or foreign file
    try:
        con = duckdb.connect(
            str(db_path),
            read_only=True,
            config={
                "enable_external_access": False,
                "autoinstall_known_extensions": False,
                "autoload_known_extensions": False,
            },
        )
    except duckdb.Error as exc:
        raise SqlError(f"{db_path}: cannot open the database sandboxed ({exc})") from None
    con.execute("SET enable_progress_bar = false")
    apply_all_views(con)
    con.execute("SET lock_configuration = true")
    return con


def run_sql(
    db_path: str | os.PathLike[str],
    query: str,
    *,
    max_rows: int | None = 1000,
    timeout_s: float = 30.0,
    con: duckdb.DuckDBPyConnection | None = None,
) -> pl.DataFrame:
    """Run one query; at most `max_rows` rows (None: all) and `timeout_s` seconds."""
    own = con is None
    c = safe_connect(db_path) if con is None else con
    timer = threading.Timer(timeout_s, c.interrupt)
    timer.start()
    try:
        rel = c.sql(query)
        if rel is None:
            return pl.DataFrame()
        if max_rows is not None:
            rel = rel.limit(max_rows)
        df: pl.DataFrame = rel.pl()
        # SUM over BIGINT is HUGEINT in DuckDB; ns totals fit int64, which every client reads.
        whole = [n for n, t in df.schema.items() if isinstance(t, pl.Decimal) and t.scale == 0]
        return df.with_columns(
            pl.col(pl.Int128).cast(pl.Int64, strict=False),
            *[pl.col(n).cast(pl.Int64, strict=False) for n in whole],
        )
    except duckdb.InterruptException:
        raise SqlError(f"query stopped after {timeout_s:.0f} s") from None
    except duckdb.Error as exc:
        raise SqlError(str(exc).splitlines()[0]) from None
    finally:
        timer.cancel()
        if own:
            c.close()
