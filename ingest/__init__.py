"""Readers per format into one normalized DuckDB schema (the only package that knows formats).

The public names below are imported on first use (PEP 562): a decoding worker imports only
`ranklens.ingest.rank_task` or `kineto` and what they need, not the loader's whole world
(0.39 -> ~0.15 s of every worker pool's start).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ranklens.ingest.errors import RanklensError
    from ranklens.ingest.loader import IngestReport, Skipped, find_traces, load_traces
    from ranklens.ingest.run import OpenOptions, Run, open_run, resolve_open_options

_WHERE = {
    "RanklensError": "errors",
    "IngestReport": "loader",
    "Skipped": "loader",
    "find_traces": "loader",
    "load_traces": "loader",
    "OpenOptions": "run",
    "Run": "run",
    "open_run": "run",
    "resolve_open_options": "run",
}

__all__ = [
    "IngestReport",
    "OpenOptions",
    "RanklensError",
    "Run",
    "Skipped",
    "find_traces",
    "load_traces",
    "open_run",
    "resolve_open_options",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
