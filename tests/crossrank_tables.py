"""What the cross-rank stage writes, read back for comparison: realign must give exactly the
tables an ingest with the same options gives (tests/ingest/test_realign_run.py, tests/cli/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb

QUERIES = {
    "collectives": "SELECT * FROM collectives ORDER BY ALL",
    "ranks": "SELECT * FROM ranks ORDER BY rank",
    "process_groups": "SELECT * FROM process_groups ORDER BY ALL",
    # the facts it records; the stamps of the ingest and the realign (and the stored results'
    # mark, made of them) differ by design
    "meta": "SELECT * FROM meta "
    "WHERE key NOT IN ('ingested_at', 'realigned_at', 'results_made_by') ORDER BY ALL",
}


def crossrank_tables(db: Path) -> dict[str, list[Any]]:
    """Every row of the tables the cross-rank stage writes, sorted."""
    with duckdb.connect(str(db), read_only=True) as con:
        return {k: con.execute(q).fetchall() for k, q in QUERIES.items()}
