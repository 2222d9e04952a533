"""Loads an analysis' .sql file onto a connection (temp views and macros only)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources

import duckdb
import polars as pl

_LOADED_ATTR = "_ranklens_sql_loaded"
_HELD = "_ranklens_held_"  # prefix of the temp tables that hold a view's rows (materialized)


def sql_text(name: str) -> str:
    """The text of analysis/sql/<name>.sql, shipped as package data."""
    return resources.files("ranklens.analysis").joinpath(f"sql/{name}.sql").read_text()


def apply_sql(con: duckdb.DuckDBPyConnection, *names: str) -> None:
    """Create the temp views/macros of the named SQL files (idempotent: CREATE OR REPLACE).

    Views held by an enclosing `materialized` scope keep reading their temp table. ASOF joins
    stay ASOF joins: DuckDB turns one whose left side it *estimates* small into a nested loop
    (asof_loop_join_threshold), and its estimate of a materialized CTE can be far too small
    (the pipeline blocks of 1,024 ranks: 35 s as a loop, 0.7 s as an ASOF join)."""
    # a sandboxed connection (sql_console.safe_connect) has it from its config, locked
    if con.execute("SELECT current_setting('asof_loop_join_threshold')").fetchone() != (0,):
        con.execute("SET asof_loop_join_threshold = 0")
    for name in names:
        con.execute(sql_text(name))
    _redirect(con, _held(con))


def _held(con: duckdb.DuckDBPyConnection) -> list[str]:
    rows = con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE temporary AND starts_with(table_name, ?)",
        [_HELD],
    ).fetchall()
    return [str(r[0])[len(_HELD) :] for r in rows]


def _redirect(con: duckdb.DuckDBPyConnection, views: list[str]) -> None:
    for view in views:
        con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS SELECT * FROM temp.{_HELD}{view}")


@contextmanager
def materialized(con: duckdb.DuckDBPyConnection, sql_file: str, *views: str) -> Iterator[None]:
    """Apply `sql_file`, hold the rows of these of its views (in dependency order) in temp
    tables while the block runs, then restore the views.

    Why: a view is recomputed by every query that reads it, and an analysis reads its interval
    unions from several queries (the report from several analyses), each a sort of every event.
    Only for a block during which the database does not change. A scope nested in one that
    already holds a view leaves it to the outer one."""
    apply_sql(con, sql_file)
    held = set(_held(con))
    mine: list[str] = []
    try:
        for view in views:
            if view in held:
                continue
            mine.append(view)
            con.execute(f"CREATE OR REPLACE TEMP TABLE {_HELD}{view} AS SELECT * FROM {view}")
            _redirect(con, [view])
        yield
    finally:
        if mine:
            for view in mine:
                con.execute(f"DROP TABLE IF EXISTS temp.{_HELD}{view}")
            apply_sql(con, sql_file)


def query_pl(
    con: duckdb.DuckDBPyConnection, sql: str, params: list[object] | None = None
) -> pl.DataFrame:
    """Run a query and return every row as a polars DataFrame (the result is fully consumed)."""
    table = (
        con.sql(sql, params=params).to_arrow_table() if params else con.sql(sql).to_arrow_table()
    )
    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    return df
