"""The timeline's whole-run overview kept in the run, so the dashboard's timeline opens at once.

Why: zoomed-out timeline windows are re-aggregated from one overview of the whole run (busy
time in 4,096 buckets per lane, exposed/idle time packed into the same buckets:
analysis.timeline.overview). On 10 M events that scan takes half a minute, and it never
changes after ingest, so ingest stores it with results_store's rule (same tool and schema
version, same bucket count, same state of the run) and the dashboard reads it back.
"""

from __future__ import annotations

import duckdb
import polars as pl
from ranklens.analysis import results_store
from ranklens.analysis import timeline as tl

NAME = "timeline_overview"
N_BUCKETS = 4096  # what analysis.timeline.overview uses by default
_OPTIONS = f"n_buckets={N_BUCKETS}"
# Lanes (rank, thread or stream) up to which ingest stores the overview: ~4 M bucket rows at
# most. A 64-rank x 10 M-event run has 320 (0.76 M rows, ~30 s to compute); a 1,024-rank GPU
# job ~4,600, whose overview would take ~1 GB and ~8 s of every ingest.
MAX_LANES = 1024


def store_overview(con: duckdb.DuckDBPyConnection) -> bool:
    """Compute the run's overview and keep it; False when the run has over MAX_LANES lanes
    (then the dashboard computes it when its timeline is first opened) or it would not read
    back identical."""
    lanes = con.execute("SELECT count(DISTINCT (rank, stream)) FROM events").fetchall()[0][0]
    if int(lanes) > MAX_LANES:
        return False
    ov = tl.overview(con, tl.extent(con), N_BUCKETS)
    span = pl.DataFrame(
        {"start_ns": [ov.start_ns], "end_ns": [ov.end_ns], "bucket_ns": [ov.bucket_ns]},
        schema={"start_ns": pl.Int64, "end_ns": pl.Int64, "bucket_ns": pl.Int64},
    )
    frames = {"span": span, "buckets": ov.buckets, "segments": ov.segments}
    return results_store.put(con, NAME, _OPTIONS, frames)


def stored_overview(con: duckdb.DuckDBPyConnection) -> tl.Overview | None:
    """The overview ingest stored, if fresh; else None (the caller computes it)."""
    got = results_store.get(con, NAME, _OPTIONS)
    if got is None:
        return None
    frames, _ = got
    span = frames["span"].row(0, named=True)
    return tl.Overview(
        int(span["start_ns"]),
        int(span["end_ns"]),
        int(span["bucket_ns"]),
        frames["buckets"],
        frames["segments"],
    )


def overview(con: duckdb.DuckDBPyConnection, ext: tl.Extent | None = None) -> tl.Overview:
    """The stored overview, else the one computed now (the same numbers); `ext`: the run's
    extent when the caller holds it."""
    kept = stored_overview(con)
    return kept or tl.overview(con, ext if ext is not None else tl.extent(con), N_BUCKETS)
