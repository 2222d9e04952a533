"""Row lookups the tests share: one row of a result table, the rows of a query on an export.

Why a module: the hand-built analysis tests check single rows of result tables the same way,
and the Nsight tests read the export they ingested (read-only) to compute what to expect.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import polars as pl


def one(df: pl.DataFrame, **where: Any) -> dict[str, Any]:
    """The single row of `df` matching `where`."""
    for k, v in where.items():
        df = df.filter(pl.col(k) == v)
    assert df.height == 1, df
    return df.row(0, named=True)


def sqlite_rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    """The rows of `sql` on the SQLite file `path`, opened read-only (an input stays as it is)."""
    con = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()
