"""One module per analysis: a pure function over a DuckDB connection -> Result.

REGISTRY is explicit: adding an analysis is one module, one .sql file and one line here.
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
BY_NAME: dict[str, ModuleType] = {m.NAME: m for m in REGISTRY}

__all__ = [
    "BY_NAME",
    "REGISTRY",
    "Finding",
    "Result",
    "Severity",
    "breakdown",
    "collectives",
    "contention",
    "critical_path",
    "overlap",
    "pipeline",
    "stragglers",
]
