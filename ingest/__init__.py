"""Readers per format into one normalized DuckDB schema (the only package that knows formats)."""

from ranklens.ingest.errors import RanklensError
from ranklens.ingest.loader import IngestReport, Skipped, find_traces, load_traces
from ranklens.ingest.run import OpenOptions, Run, open_run, resolve_open_options

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
