"""The shared base of breakdown, overlap and stragglers (activity.sql), held once per scope.

Why: the islands of every rank's device activity cost one sort of every event (seconds on a
10 M-event run) and feed several views; holding them in temp tables makes each analysis (and
the report, which runs them back to back) compute them once instead of once per query.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType

import duckdb
import polars as pl
from ranklens.analysis._sql import HeldViews, apply_sql, query_pl

# In dependency order: each is computed from the ones before it once those are held.
HELD_VIEWS: tuple[str, ...] = (
    "_activity_union",
    "_activity_compute_islands",
    "_activity_cov",
    "_activity_comm",
)


def users(mods: Iterable[ModuleType]) -> tuple[str, ...]:
    """The analyses of `mods` that read the activity views: those declaring USES_ACTIVITY = True
    (derived, so that registering an analysis stays one line in REGISTRY)."""
    return tuple(m.NAME for m in mods if getattr(m, "USES_ACTIVITY", False))


def held(con: duckdb.DuckDBPyConnection, views: tuple[str, ...] = HELD_VIEWS) -> HeldViews:
    """Apply activity.sql (and what it requires) and hold the activity views (all, or `views`, in
    dependency order) while the block runs; the database must not change meanwhile."""
    return HeldViews(con, "activity", *views)


def read(con: duckdb.DuckDBPyConnection, sql_file: str, *queries: str) -> list[pl.DataFrame]:
    """Run an analysis' `queries` over its `sql_file` views with the activity views held."""
    with held(con):
        apply_sql(con, sql_file)
        return [query_pl(con, q) for q in queries]
