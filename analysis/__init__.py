"""One module per analysis: a pure function over a DuckDB connection -> Result.

REGISTRY is explicit: adding an analysis is one module, one .sql file and one line here. The
module declares what the rest derives from it: `NAME`, `COLUMNS`, `Params`, `run(con)`,
`VIEW_FILES` (its SQL files, whose views the run stores: views.view_files) and `USES_ACTIVITY`
(it reads the activity views, held once for all of them: _activity.users).
"""

from __future__ import annotations

from types import ModuleType

from ranklens.analysis import (
    breakdown,
    collectives,
    contention,
    critical_path,
    overlap,
    pipeline,
    stragglers,
)
from ranklens.analysis._base import Finding, Result, Severity

REGISTRY: tuple[ModuleType, ...] = (
    breakdown,
    overlap,
    stragglers,
    collectives,
    pipeline,
    contention,
    critical_path,
)


def by_name() -> dict[str, ModuleType]:
    """The registered analyses by NAME, read from REGISTRY when asked (never a second list)."""
    return {m.NAME: m for m in REGISTRY}


__all__ = [
    "REGISTRY",
    "Finding",
    "Result",
    "Severity",
    "breakdown",
    "by_name",
    "collectives",
    "contention",
    "critical_path",
    "overlap",
    "pipeline",
    "stragglers",
]
