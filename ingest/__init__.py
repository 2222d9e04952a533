"""Readers per format into one normalized DuckDB schema (the only package that knows formats)."""

from ranklens.ingest.errors import RanklensError
from ranklens.ingest.loader import IngestReport, Skipped, find_traces, load_traces

__all__ = ["IngestReport", "RanklensError", "Skipped", "find_traces", "load_traces"]
