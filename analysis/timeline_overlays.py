"""timeline_overlays: the exposed-communication and idle overlays of an aggregated timeline window.

Why: a window too busy to draw event by event is drawn as busy-time buckets, but the exposed
and idle time it holds must still show. Per (rank, label, bucket) the labelled time is packed
into one interval that starts at the bucket's first labelled instant and is as long as the
labelled time in it (never past the bucket's end); touching intervals are then merged. An
isolated stretch (one exposed all-reduce, one bubble) is so drawn exactly where it lies;
several in one bucket are drawn together, their total kept: the error is within one bucket.

`rebucket` packs the exposed/idle segments of raw events (timeline_sweep: a window, or the
whole run once, analysis.timeline.overview), and re-buckets the run's packed rows for a
zoomed-out window, as the busy-time buckets are.
"""

from __future__ import annotations

import polars as pl

SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "label": pl.String(),
    "s": pl.Int64(),
    "e": pl.Int64(),
}


def empty() -> pl.DataFrame:
    """No overlay: the columns of a window's segments (rank, label, s, e)."""
    return pl.DataFrame(schema=SCHEMA)


def rebucket(seg: pl.DataFrame, start: int, end: int, width: int) -> pl.DataFrame:
    """`seg` (rank, label, s, e) clipped to [start, end) and packed into buckets of `width`."""
    if seg.is_empty():
        return empty()
    lo, hi = pl.max_horizontal("s", pl.lit(start)), pl.min_horizontal("e", pl.lit(end))
    clipped = seg.select("rank", "label", lo.alias("s"), hi.alias("e")).filter(
        pl.col("e") > pl.col("s")
    )
    first = (pl.col("s") - start) // width
    last = (pl.col("e") - 1 - start) // width
    edge = start + pl.col("bucket") * width
    split = (
        clipped.with_columns(bucket=pl.int_ranges(first, last + 1))
        .explode("bucket")
        .with_columns(
            pl.max_horizontal("s", edge).alias("s"), pl.min_horizontal("e", edge + width).alias("e")
        )
    )
    return (
        split.group_by("rank", "label", "bucket")
        .agg(pl.col("s").min(), (pl.col("e") - pl.col("s")).sum().alias("ns"))
        .select(
            pl.col("rank").cast(pl.Int64),
            "label",
            pl.col("s").cast(pl.Int64),
            (pl.col("s") + pl.col("ns")).cast(pl.Int64).alias("e"),
        )
    )


def islands(seg: pl.DataFrame, min_ns: int = 0) -> pl.DataFrame:
    """Touching intervals of one rank and label merged, those shorter than `min_ns` left out
    (as the per-event view leaves out slivers), sorted by rank and start."""
    if seg.is_empty():
        return empty()
    key = ("rank", "label")
    return (
        seg.sort(*key, "s")
        .with_columns(
            (pl.col("s") != pl.col("e").shift().over(key))
            .fill_null(True)
            .cum_sum()
            .over(key)
            .alias("island")
        )
        .group_by(*key, "island")
        .agg(pl.col("s").min(), pl.col("e").max())
        .filter(pl.col("e") - pl.col("s") >= min_ns)
        .select(pl.col("rank").cast(pl.Int64), "label", "s", "e")
        .sort("rank", "s", "label")
    )
