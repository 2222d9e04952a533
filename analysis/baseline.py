"""Regression checks against a baseline run: what got slower, by more than the noise.

A change counts as a regression only when it exceeds both the threshold and the run's own
step-to-step noise: noise = 3·sqrt(sd_cur²/n_cur + sd_base²/n_base) over the per-step values of
the metric on that rank. Three standard errors, not two: every (rank, metric, parallelism) pair
is compared, and with dozens of pairs a ~95% band would flag some unchanged pair in most runs
(seen on two captures of one CPU configuration). With one step per run the noise cannot be
measured and is reported as such.

Metrics: step time (relative change), and as absolute change in share of the step: exposed
communication and communication per parallelism.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import duckdb
import polars as pl
from ranklens.analysis import _activity
from ranklens.analysis._sql import query_pl
from ranklens.analysis.check import Verdict
from ranklens.analysis.check_config import THRESHOLDS
from ranklens.analysis.views import apply_all_views

_PER_STEP: dict[str, str] = {
    "step_time": "SELECT rank, 'all' AS key, step, window_ns::DOUBLE AS v FROM breakdown_by_step",
    "exposed_comm": """SELECT p.rank, p.parallelism AS key, p.step,
        p.exposed_ns / nullif(w.window_ns, 0) AS v
        FROM overlap_by_parallelism p JOIN overlap_by_step w USING (rank, step)""",
    "comm_share": """SELECT rank, parallelism AS key, step, comm_share AS v
        FROM breakdown_by_parallelism""",
}
_RELATIVE = {"step_time"}
NOISE_SIGMAS = 3.0


@dataclass(frozen=True)
class Change:
    """One metric on one rank (and parallelism), baseline vs current."""

    metric: str
    key: str
    rank: int
    base: float
    cur: float
    delta: float  # relative for step_time, absolute share points otherwise
    noise: float | None
    regression: bool


def _stats(con: duckdb.DuckDBPyConnection, metric: str) -> pl.DataFrame:
    df = query_pl(con, _PER_STEP[metric])
    return df.group_by("rank", "key").agg(
        pl.col("v").mean().alias("mean"), pl.col("v").std().alias("sd"), pl.len().alias("n")
    )


def compare(
    cur: duckdb.DuckDBPyConnection, base: duckdb.DuckDBPyConnection, max_regression: float
) -> list[Change]:
    """Every (metric, rank, key) present in both runs, with its verdict."""
    apply_all_views(cur)
    apply_all_views(base)
    with _activity.held(cur), _activity.held(base):  # every metric reads the activity views
        stats = {m: (_stats(cur, m), _stats(base, m)) for m in _PER_STEP}
    out: list[Change] = []
    for metric, (s_cur, s_base) in stats.items():
        joined = s_cur.join(s_base, on=["rank", "key"], suffix="_b", how="inner")
        for r in joined.iter_rows(named=True):
            noise = _noise(r["sd"], r["n"], r["sd_b"], r["n_b"])
            raw = r["mean"] - r["mean_b"]
            if metric in _RELATIVE:
                delta = raw / r["mean_b"] if r["mean_b"] else 0.0
                noise_rel = noise / r["mean_b"] if noise is not None and r["mean_b"] else None
            else:
                delta, noise_rel = raw, noise
            reg = delta > max_regression and (noise_rel is None or delta > noise_rel)
            out.append(
                Change(
                    metric,
                    str(r["key"]),
                    int(r["rank"]),
                    float(r["mean_b"]),
                    float(r["mean"]),
                    float(delta),
                    noise_rel,
                    reg,
                )
            )
    return out


def _noise(sd: float | None, n: int, sd_b: float | None, n_b: int) -> float | None:
    if n < 2 or n_b < 2 or sd is None or sd_b is None:
        return None
    return NOISE_SIGMAS * math.sqrt(sd * sd / n + sd_b * sd_b / n_b)


def summarize(changes: list[Change]) -> list[str]:
    """Lines naming what regressed most, e.g. 'DP exposed comm +4.1% of step on ranks 8-15'."""
    lines = []
    regs = [c for c in changes if c.regression]
    by: dict[tuple[str, str], list[Change]] = {}
    for c in regs:
        by.setdefault((c.metric, c.key), []).append(c)
    ranked = sorted(by.items(), key=lambda kv: -max(c.delta for c in kv[1]))
    for (metric, key), cs in ranked:
        ranks = _ranges(sorted(c.rank for c in cs))
        worst = max(cs, key=lambda c: c.delta)
        if metric in _RELATIVE:
            what = f"step time +{100 * worst.delta:.1f}%"
        else:
            name = "exposed comm" if metric == "exposed_comm" else "comm share"
            what = f"{key} {name} +{100 * worst.delta:.1f}% of step"
        noise = (
            "noise not measurable (1 step)"
            if worst.noise is None
            else (f"noise ±{100 * worst.noise:.1f}%")
        )
        lines.append(f"{what} on ranks {ranks} ({noise})")
    return lines


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0–2, 5'."""
    parts: list[str] = []
    start = prev = ranks[0]
    for r in ranks[1:]:
        if r != prev + 1:
            parts.append(f"{start}" if start == prev else f"{start}–{prev}")
            start = r
        prev = r
    parts.append(f"{start}" if start == prev else f"{start}–{prev}")
    return ", ".join(parts)


def verdict(changes: list[Change], limit: float, source: str) -> Verdict:
    """The max_regression check as a Verdict, naming the largest regression."""
    regs = [c for c in changes if c.regression]
    label = THRESHOLDS["max_regression"][1]
    if not changes:
        return Verdict(
            "max_regression",
            label,
            limit,
            "skipped",
            None,
            None,
            f"{label}: skipped, no metric in common with the baseline",
            source,
        )
    worst = max(regs or changes, key=lambda c: c.delta)
    subject = f"rank {worst.rank} {worst.metric}" + ("" if worst.key == "all" else f" {worst.key}")
    if regs:
        msg = f"{label}: " + "; ".join(summarize(changes)[:3])
        return Verdict(
            "max_regression", label, limit, "fail", subject, worst.delta, msg, source, len(changes)
        )
    msg = f"{label}: no regression beyond {100 * limit:.1f}% and the noise"
    return Verdict(
        "max_regression", label, limit, "pass", subject, worst.delta, msg, source, len(changes)
    )
