"""Loads an analysis' .sql file onto a connection (temp views and macros only)."""

from __future__ import annotations

from importlib import resources

import duckdb
import polars as pl

_LOADED_ATTR = "_ranklens_sql_loaded"


def sql_text(name: str) -> str:
    """The text of analysis/sql/<name>.sql, shipped as package data."""
    return resources.files("ranklens.analysis").joinpath(f"sql/{name}.sql").read_text()


def apply_sql(con: duckdb.DuckDBPyConnection, *names: str) -> None:
    """Create the temp views/macros of the named SQL files (idempotent: CREATE OR REPLACE)."""
    for name in names:
        con.execute(sql_text(name))


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
