"""Analysis results as SQL views, so users can query them next to the tables.

`apply_all_views` creates them as temp views on any connection (read-only included);
`store_views` also stores them in the database file so any DuckDB client sees them.
"""

from __future__ import annotations

import os
import re

import duckdb
from ranklens.analysis._sql import apply_sql, sql_text

VIEW_FILES: tuple[str, ...] = (
    "intervals",
    "activity",
    "breakdown",
    "overlap",
    "stragglers",
    "collectives",
    "pipeline",
    "pipeline_p2p",
    "pipeline_steps",
    "contention",
)


def apply_all_views(con: duckdb.DuckDBPyConnection) -> None:
    """Create every analysis view and macro as temp objects on `con`."""
    apply_sql(con, *VIEW_FILES)


def store_views(con: duckdb.DuckDBPyConnection) -> None:
    """Store the analysis views and macros in the database `con` writes (an ingest passes
    this as its `finalize`, so the views are in the file before its one atomic rename)."""
    for name in VIEW_FILES:
        con.execute(re.sub(r"\bTEMP\s+", "", sql_text(name)))


def install_views(db_path: str | os.PathLike[str]) -> None:
    """Store the analysis views and macros in an existing database file."""
    con = duckdb.connect(str(db_path))
    try:
        store_views(con)
        con.execute("CHECKPOINT")
    finally:
        con.close()
