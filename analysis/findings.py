"""Cross-analysis findings: rules that need the results of more than one analysis.

Why here: each analysis reports what it alone can see; a fix such as "move the DP gradient
communication into the pipeline bubbles" needs the exposed DP time (overlap) and the bubble
on the same rank and step (pipeline). `derive` runs after every analysis; the report ranks its
findings with the others by time at stake.
"""

from __future__ import annotations

import polars as pl
from ranklens.analysis._base import Finding, Result, Severity


def derive(results: dict[str, Result]) -> list[Finding]:
    """Findings that combine analyses (none when one of the inputs was not run)."""
    return _dp_into_bubbles(results)


def _dp_into_bubbles(results: dict[str, Result]) -> list[Finding]:
    """Exposed DP communication on pipeline stages that also sit in bubbles."""
    pipe, ov = results.get("pipeline"), results.get("overlap")
    if pipe is None or ov is None or pipe.table.is_empty():
        return []
    dp = ov.tables.get("dp_by_step")  # DP and DP_SHARD as one union, not a sum
    if dp is None or dp.is_empty():
        return []
    dp = dp.select("rank", "step", pl.col("exposed_ns").alias("dp_exposed_ns"))
    both = pipe.table.select("rank", "step", "stage", "bubble_ns", "window_ns").join(
        dp, on=["rank", "step"], how="inner"
    )
    if both.is_empty():
        return []
    per_rank = (
        both.group_by("rank", "stage")
        .agg(
            (pl.col("dp_exposed_ns").sum() / pl.len()).alias("dp"),
            (pl.col("bubble_ns").sum() / pl.len()).alias("bubble"),
            (pl.col("window_ns").sum() / pl.len()).alias("window"),
        )
        .with_columns(pl.min_horizontal("dp", "bubble").alias("movable"))
        .sort(["movable", "rank"], descending=[True, False])  # ties: the lowest rank, every run
    )
    top = per_rank.row(0, named=True)
    if not top["window"] or top["movable"] < 0.01 * top["window"]:
        return []
    steps = tuple(sorted({int(s) for s in both["step"]}))
    return [
        Finding(
            code="PIPELINE_DP_INTO_BUBBLES",
            severity=Severity.WARNING if top["movable"] > 0.05 * top["window"] else Severity.INFO,
            message=(
                f"stage {top['stage']} (rank {top['rank']}) spends "
                f"{top['dp'] / 1e6:.2f} ms per step in exposed DP communication while it also "
                f"sits {top['bubble'] / 1e6:.2f} ms per step in pipeline bubbles"
            ),
            fix=(
                "move the DP gradient communication into the bubbles the pipeline already has "
                "('vertical alignment'): start each stage's gradient reduce-scatter/all-reduce "
                "as soon as its last backward ends (cool-down) and the parameter all-gather "
                "during warm-up; re-bucket so the last bucket is small"
            ),
            time_at_stake_ns=int(top["movable"]),
            ranks=tuple(int(r) for r in per_rank.filter(pl.col("movable") > 0)["rank"]),
            steps=steps,
            value=float(top["movable"] / top["window"]),
            threshold=0.01,
            evidence={
                "per_rank_ms_per_step": [
                    {
                        "rank": int(r["rank"]),
                        "stage": int(r["stage"]),
                        "dp_exposed": round(r["dp"] / 1e6, 3),
                        "bubble": round(r["bubble"] / 1e6, 3),
                    }
                    for r in per_rank.head(8).iter_rows(named=True)
                ],
                "time_at_stake": "min(exposed DP, bubble) per step on the worst stage",
            },
        )
    ]
