"""Findings of the pipeline analysis: each cause of bubble with its time at stake and its fix.

Why separate: the rules read the schedule table (one row per pipeline and step) and say what a
practitioner changes; keeping them apart keeps pipeline.py about measuring. Times at stake are
per step: the mean over steps, the worst pipeline when there are several (they run side by side,
so the step waits for the worst).
"""

from __future__ import annotations

from typing import Any, Protocol

import polars as pl
from ranklens.analysis._base import Finding, Severity


class Thresholds(Protocol):
    """The Params fields the rules read."""

    @property
    def schedule_warn(self) -> float: ...
    @property
    def imbalance_warn(self) -> float: ...
    @property
    def component_warn(self) -> float: ...


def _mean(df: pl.DataFrame, col: str) -> float | None:
    s = df[col].drop_nulls()
    return float(s.cast(pl.Float64).mean()) if s.len() else None  # type: ignore[arg-type]


def _severity(at_stake: float, window: float, warn: float) -> Severity:
    share = at_stake / window if window else 0.0
    if share > 0.20:
        return Severity.CRITICAL
    return Severity.WARNING if share > warn else Severity.INFO


def findings(
    sched: pl.DataFrame, stages: pl.DataFrame, blocks: pl.DataFrame, p: Thresholds
) -> list[Finding]:
    """Findings over every pipeline (PP group) of the run."""
    if sched.is_empty():
        return []
    out: list[Finding] = []
    groups: list[dict[str, Any]] = []
    # split once (a filter of every stage and block per pipeline costs seconds on 256 pipelines)
    by_group = stages.partition_by("pp_group", as_dict=True)
    spans = {
        g: (int(s), int(e))
        for g, s, e in blocks.group_by("pp_group")
        .agg(pl.col("start_ns").min(), pl.col("end_ns").max())
        .iter_rows()
    }
    for (group,), part in sched.group_by("pp_group", maintain_order=True):
        st = by_group.get((group,), stages.clear())
        window = float((st["window_ns"].sum() / max(int(st["steps"].sum()), 1)) or 0)
        groups.append(
            {
                "group": group,
                "rows": part,
                "stages": st,
                "ranks": tuple(int(r) for r in st.sort("stage")["rank"]),
                "steps": tuple(int(s) for s in part["step"]),
                "window": window,
                "span": spans.get(group),
            }
        )
    out += _schedule_rule(groups, p)
    out += _imbalance_rule(groups, p)
    out += _component_rules(groups, p)
    return out


def _worst(groups: list[dict[str, Any]], values: list[float | None]) -> tuple[int, float]:
    pairs = [(i, v) for i, v in enumerate(values) if v is not None]
    if not pairs:
        return -1, 0.0
    return max(pairs, key=lambda x: x[1])


def _all_ranks(groups: list[dict[str, Any]]) -> tuple[int, ...]:
    return tuple(sorted({r for g in groups for r in g["ranks"]}))


def _schedule_rule(groups: list[dict[str, Any]], p: Thresholds) -> list[Finding]:
    cf = [_mean(g["rows"], "closed_form") for g in groups]
    i, worst = _worst(groups, cf)
    if i < 0 or worst <= p.schedule_warn:
        return []
    g = groups[i]
    row = g["rows"].row(0, named=True)
    pp, m, v, sched = row["p"], row["m"], row["v"] or 1, row["schedule"]
    bubble = [_mean(x["rows"], "closed_bubble_ns") for x in groups]
    at_stake = max((b for b in bubble if b is not None), default=0.0) / 2
    measured = _mean(g["rows"], "bubble_fraction")
    twice = (pp - 1) / (2 * m + pp - 1)
    inter = (pp - 1) / (2 * v * m)
    fix = (
        f"raise the micro-batches per step: m={2 * m} gives (p-1)/(m+p-1) = {twice:.0%} "
        f"(keep the global batch by halving the micro-batch size), or use an interleaved "
        f"schedule with v={2 * v} model chunks per stage ((p-1)/(v*m) = {inter:.0%} of the "
        f"ideal time), or a zero-bubble schedule (ZB-H1/ZB-V) that fills the bubble with "
        f"weight-gradient work"
    )
    return [
        Finding(
            code="PIPELINE_BUBBLE_SCHEDULE",
            severity=_severity(at_stake * 2, g["window"], p.component_warn),
            message=(
                f"{sched} with p={pp} stages and m={m} micro-batches has a closed-form bubble "
                f"of {worst:.0%} of the pipeline time ({row['convention']}); measured "
                + ("-" if measured is None else f"{measured:.0%}")
                + f" on PP {sorted(g['ranks'])}"
            ),
            fix=fix,
            time_at_stake_ns=int(at_stake),
            ranks=_all_ranks(groups),
            steps=g["steps"],
            window_ns=g["span"],
            value=worst,
            threshold=p.schedule_warn,
            evidence={
                "p": pp,
                "m": m,
                "v": v,
                "schedule": sched,
                "convention": row["convention"],
                "closed_form": worst,
                "measured_bubble_fraction": measured,
                "closed_form_bubble_ns_per_step": int(at_stake * 2),
                "closed_form_with_2x_microbatches": twice,
                "time_at_stake": "half the closed-form bubble (doubling m or v halves it)",
            },
        )
    ]


def _imbalance_rule(groups: list[dict[str, Any]], p: Thresholds) -> list[Finding]:
    ratios = [_mean(g["rows"], "busy_max_over_mean") for g in groups]
    i, worst = _worst(groups, ratios)
    if i < 0 or worst <= 1 + p.imbalance_warn:
        return []
    heavy: list[dict[str, Any]] = []
    stake = 0.0
    for g, ratio in zip(groups, ratios, strict=True):
        if ratio is None or ratio <= 1 + p.imbalance_warn:
            continue
        st = g["stages"].with_columns((pl.col("work_ns") / pl.col("steps")).alias("w"))
        top = st.sort("w", descending=True, maintain_order=True).row(0, named=True)
        low = st.sort("w", maintain_order=True).row(0, named=True)
        decomposed = _mean(g["rows"], "imbalance_ns")
        row = g["rows"].row(0, named=True)
        m, pp = row["m"] or 1, row["p"]
        mean_w = sum(st["w"].to_list()) / max(st.height, 1)
        estimate = (m + pp - 1) / m * (float(top["w"]) - mean_w)
        at = decomposed if decomposed is not None else estimate
        stake = max(stake, at)
        heavy.append(
            {
                "group": g["group"],
                "heavy_stage": top["stage"],
                "heavy_rank": top["rank"],
                "light_stage": low["stage"],
                "light_rank": low["rank"],
                "busy_max_over_mean": ratio,
                "work_ms_per_step_by_stage": {
                    str(r["stage"]): round(float(r["w"]) / 1e6, 3)  # JSON keys: stored as read
                    for r in st.sort("stage").iter_rows(named=True)
                },
                "imbalance_ns_per_step": int(at),
                "how": "schedule replay" if decomposed is not None else "(m+p-1)/m*(max-mean)",
            }
        )
    # A layout problem makes the same stage heavy in most pipelines; one slow rank makes its
    # own pipeline lopsided only, and the stragglers analysis names it with its evidence.
    counts: dict[int, int] = {}
    for x in heavy:
        counts[int(x["heavy_stage"])] = counts.get(int(x["heavy_stage"]), 0) + 1
    if 2 * max(counts.values()) < len(groups):
        return []
    h = max(heavy, key=lambda x: x["busy_max_over_mean"])
    stages_named = sorted({x["heavy_stage"] for x in heavy})
    return [
        Finding(
            code="PIPELINE_STAGE_IMBALANCE",
            severity=_severity(stake, groups[i]["window"], p.component_warn),
            message=(
                f"stage {h['heavy_stage']} (rank {h['heavy_rank']}) is the heavy stage: "
                f"{h['busy_max_over_mean']:.2f}x the mean busy time of its pipeline; the other "
                f"stages wait for it every micro-batch"
                + (f" (heavy stage in each pipeline: {stages_named})" if len(heavy) > 1 else "")
            ),
            fix=(
                f"rebalance layers: move layers off stage {h['heavy_stage']} (rank "
                f"{h['heavy_rank']}) onto the lightest stage {h['light_stage']} (rank "
                f"{h['light_rank']}); if the stage is not heavier by design, check that host "
                f"for a slow GPU or CPU"
            ),
            time_at_stake_ns=int(max(stake, 0.0)),
            ranks=tuple(sorted(int(x["heavy_rank"]) for x in heavy)),
            steps=groups[i]["steps"],
            window_ns=groups[i]["span"],
            value=worst,
            threshold=1 + p.imbalance_warn,
            evidence={"pipelines": heavy},
        )
    ]


_COMPONENTS: tuple[tuple[str, str, str, str], ...] = (
    (
        "microbatch_variance_ns",
        "PIPELINE_MICROBATCH_VARIANCE",
        "some micro-batches take longer than the others on the same stage and stall the pipeline",
        "find what stretches them: communication overlapped with those micro-batches (move "
        "it into the existing bubbles or re-bucket it so no single micro-batch carries a "
        "large part), or host stalls (data loading, GC) inside them",
    ),
    (
        "p2p_ns",
        "PIPELINE_P2P_LATENCY",
        "PP send/recv latency sits on the critical path between stages",
        "overlap p2p with compute (batched isend/irecv issued ahead of their use), "
        "keep adjacent stages on one node / NVLink domain or the same network rail, and check "
        "the PP link bandwidth (collectives analysis)",
    ),
    (
        "unexplained_ns",
        "PIPELINE_BUBBLE_UNEXPLAINED",
        "bubble that neither the schedule, stage imbalance, micro-batch variance nor p2p "
        "latency explains",
        "look at where it sits (warm-up/cool-down columns, idle vs pp_wait): host stalls "
        "before the first forward (data loading), a straggling DP peer delaying the next step, "
        "host syncs in the optimizer; replace or investigate a slow host",
    ),
    (
        "excess_ns",
        "PIPELINE_BUBBLE_EXCESS",
        "bubble above the closed form (no per-micro-batch annotations to split it by cause)",
        "annotate micro-batches (record_function('forward_mb{i}') / ('backward_mb{i}')) to "
        "split the excess into imbalance, variance and p2p latency; meanwhile check the stage "
        "imbalance and PP transfer times",
    ),
)


def _component_rules(groups: list[dict[str, Any]], p: Thresholds) -> list[Finding]:
    out: list[Finding] = []
    decomposed = any(
        (g["rows"]["decomposition"] == "ok").any() for g in groups if not g["rows"].is_empty()
    )
    for col, code, what, fix in _COMPONENTS:
        if (col == "excess_ns") == decomposed:
            continue
        vals = [_mean(g["rows"], col) for g in groups]
        shares = [
            None if v is None or not g["window"] else v / g["window"]
            for g, v in zip(groups, vals, strict=True)
        ]
        i, share = _worst(groups, shares)
        if i < 0 or share <= p.component_warn:
            continue
        g = groups[i]
        at = float(vals[i] or 0.0)
        row = g["rows"].row(0, named=True)
        slow = [s for s in g["rows"]["slow_blocks"].drop_nulls().to_list()][:3]
        out.append(
            Finding(
                code=code,
                severity=_severity(at, g["window"], p.component_warn),
                message=(
                    f"{what}: {at / 1e6:.1f} ms per step per stage ({share:.0%} of the step) "
                    f"on PP {sorted(g['ranks'])}"
                    + (f"; slowest blocks: {slow[0]}" if slow and "VARIANCE" in code else "")
                ),
                fix=fix,
                time_at_stake_ns=int(at),
                ranks=g["ranks"],
                steps=g["steps"],
                window_ns=g["span"],
                value=share,
                threshold=p.component_warn,
                evidence={
                    "pp_group": g["group"],
                    f"{col}_per_step": int(at),
                    "mean_step_window_ns": int(g["window"]),
                    "closed_form": row["closed_form"],
                    "measured_bubble_fraction": _mean(g["rows"], "bubble_fraction"),
                    "p2p_latency_ns": _mean(g["rows"], "p2p_latency_ns"),
                    "slow_blocks": slow,
                },
            )
        )
    return out
