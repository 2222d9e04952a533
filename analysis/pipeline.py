"""pipeline: pipeline bubbles per stage and step, the micro-batch Gantt, and why.

Stages are the ranks of PP process groups (labeled PP; else the group the p2p traffic shows),
stage = rank within the group. Per stage and step window W, on unions of device activity,
design.md's bubble: idle + |M_PP \\ C| (time with no compute that is idle or inside PP
send/recv, whether or not DP/TP communication runs beside it; `bubble_filled_ns` says how much
of it other communication already uses). It is split into warm-up (before the first backward),
steady state (until the last forward ends) and cool-down.

Micro-batch blocks (F/B/W) come from annotations (`forward_mb3`, `backward-compute`, `wgrad_1`,
DeepSeek-style `attn(F)`; GPU ranks use device-side ranges, else the kernels a host range
launched), else from the PP send/recv around the compute (peers from the trace, inferred at
ingest, or the overlapping neighbour), in any issue order; first/last stages fuse F and B.
Schedule (p, m, v; gpipe/1f1b/interleaved/zero_bubble) is inferred from the blocks or given in
Params. Convention: `bubble_fraction` = bubble / (bubble + work), a fraction of the pipeline's
total time, compared with GPipe/1F1B (p-1)/(m+p-1); interleaved uses Megatron's fraction of
ideal x = (p-1)/(v*m) converted to x/(1+x). The excess over the closed form is split (schedule
replay, see pipeline_model) into block order, stage imbalance, micro-batch variance, p2p
latency and the unexplained rest, when every block is annotated with its micro-batch.

Caveats: CPU-only (gloo) ranks time-share cores, which inflates durations; a rank with several
GPUs counts as one device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb
import polars as pl
from ranklens.analysis._base import Result
from ranklens.analysis._sql import HeldViews, query_pl
from ranklens.analysis.pipeline_findings import findings
from ranklens.analysis.pipeline_model import Block, decompose

NAME = "pipeline"
# its views, stored in the run (views.py)
VIEW_FILES: tuple[str, ...] = ("pipeline", "pipeline_p2p", "pipeline_steps")
# Held while run() queries them (in dependency order): each of its queries would otherwise
# recompute the p2p ops and blocks from every event (on a sharded run, every shard read again).
# 8 ranks x 60 MB: 1.4 -> 0.8 s on one file, 9.3 -> 3.4 s sharded. The stages' device events
# first: the blocks read them three times and the bubbles twice more (a 1,024-rank job:
# 2.9-3.2 -> 2.4-2.7 s).
HELD: tuple[str, ...] = (
    "pipeline_stages",
    "_pipeline_comm_ev",
    "_pipeline_compute_ev",
    "_pipeline_other_ev",
    "_pipeline_ops",
    "_pipeline_blocks_raw",
    "pipeline_by_step",
)
USES_ACTIVITY = False  # reads the activity views (held once by report, ingest)

COLUMNS: dict[str, str] = {
    "rank": "Global rank (one pipeline stage).",
    "step": "Step number.",
    "pp_group": "PP process group (pg_name) of the pipeline.",
    "stage": "Stage: the rank's position in its PP group (0 = first).",
    "pp_size": "p: stages in the pipeline.",
    "microbatches": "m: micro-batches per step (inferred, or Params.microbatches).",
    "schedule": "gpipe, 1f1b, interleaved or zero_bubble (inferred, or Params.schedule).",
    "window_ns": "|W|: the stage's step window.",
    "work_ns": "Time inside micro-batch blocks that is not bubble (NULL: no blocks).",
    "other_busy_ns": "W minus bubble minus work (DP all-reduce, optimizer, ...).",
    "bubble_ns": "idle + |M_PP \\ C|: no compute, and idle or in PP send/recv (design.md).",
    "idle_ns": "Part of the bubble with nothing running at all.",
    "pp_wait_ns": "Part of the bubble inside PP send/recv with no compute: |M_PP \\ C|.",
    "bubble_filled_ns": "Part of the bubble other communication (e.g. DP) already runs in.",
    "warmup_bubble_ns": "Bubble before the stage's first backward block.",
    "steady_bubble_ns": "Bubble between the first backward and the end of the last forward.",
    "cooldown_bubble_ns": "Bubble after the last forward block.",
    "bubble_fraction": "bubble / (bubble + work): fraction of the pipeline's time.",
    "closed_form": "Closed-form bubble, same convention ((p-1)/(m+p-1) for GPipe/1F1B).",
    "excess": "bubble_fraction - closed_form.",
    "step_bubble_share": "bubble / |W|: fraction of the whole step.",
    "block_source": "annotation, annotation_launches (host range -> kernels), p2p_order, none.",
}

SCHEDULE_COLUMNS = [
    *("pp_group", "step", "p", "m", "v", "schedule", "schedule_source", "closed_form"),
    *("closed_form_ideal", "convention", "bubble_fraction", "bubble_over_ideal"),
    *("mean_bubble_ns", "mean_work_ns", "closed_bubble_ns", "excess_ns", "order_ns"),
    *("imbalance_ns", "microbatch_variance_ns", "p2p_ns", "unexplained_ns", "p2p_latency_ns"),
    *("busy_max_over_mean", "heavy_stage", "heavy_rank", "slow_blocks", "decomposition"),
]

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zero_bubble")


@dataclass(frozen=True)
class Params:
    """Schedule overrides and finding thresholds.

    Attributes:
        schedule: gpipe, 1f1b, interleaved or zero_bubble; None infers it from the blocks.
        microbatches: m; None infers it (forward blocks per stage / v).
        virtual_stages: v (interleaved model chunks per stage); None infers it.
        schedule_warn: closed-form bubble fraction above which more micro-batches pay off.
        imbalance_warn: max/mean busy time across stages above 1 + this flags a heavy stage.
        component_warn: a cause of excess bubble is reported above this share of the step.
    """

    schedule: str | None = None
    microbatches: int | None = None
    virtual_stages: int | None = None
    schedule_warn: float = 0.10
    imbalance_warn: float = 0.10
    component_warn: float = 0.03


def closed_ideal(schedule: str, p: int, m: int, v: int) -> float | None:
    """The closed-form bubble as a fraction of the ideal (bubble-free) time."""
    if m <= 0:
        return None
    if schedule == "interleaved":
        return (p - 1) / (max(v, 1) * m)
    if schedule in ("gpipe", "1f1b"):
        return (p - 1) / m
    return None


def run(con: duckdb.DuckDBPyConnection, params: Params = Params()) -> Result:
    """Bubbles per stage and step, the Gantt, the schedule and the excess decomposition."""
    if params.schedule is not None and params.schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}")
    with HeldViews(con, VIEW_FILES[-1], *HELD):
        by_step = query_pl(con, "SELECT * FROM pipeline_by_step ORDER BY pp_group, step, stage")
        blocks = query_pl(con, "SELECT * FROM pipeline_blocks ORDER BY rank, step, start_ns")
        inferred = query_pl(con, "SELECT * FROM pipeline_schedule ORDER BY pp_group, step")
        stages = query_pl(con, "SELECT * FROM pipeline_stages ORDER BY pp_group, stage")
        stage_bubble = query_pl(con, "SELECT * FROM pipeline_stage_bubble")
    sched = _schedule(by_step, blocks, inferred, params)
    keys = ["pp_group", "step"]
    table = (
        by_step.join(
            sched.select(*keys, pl.col("m").alias("microbatches"), "schedule", "closed_form"),
            on=keys,
            how="left",
        )
        .with_columns((pl.col("bubble_fraction") - pl.col("closed_form")).alias("excess"))
        .select(list(COLUMNS))
        .sort("rank", "step")
    )
    per_stage = _per_stage(table, stage_bubble)
    return Result(
        NAME,
        table,
        tuple(findings(sched, per_stage, blocks, params)),
        params,
        {"schedule": sched, "blocks": blocks, "stages": per_stage, "groups": stages},
    )


def _schedule(
    by_step: pl.DataFrame, blocks: pl.DataFrame, inferred: pl.DataFrame, p: Params
) -> pl.DataFrame:
    """One row per pipeline and step: schedule, closed form, measured bubble, decomposition."""
    rows: list[dict[str, Any]] = []
    inf = {(r["pp_group"], r["step"]): r for r in inferred.iter_rows(named=True)}
    # Grouped once in Python: a polars filter or sort per pipeline-step costs ~1 ms each,
    # seconds on a 1,024-rank job (256 pipelines x steps).
    parts: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for r in by_step.iter_rows(named=True):  # ordered by pp_group, step, stage
        parts.setdefault((r["pp_group"], r["step"]), []).append(r)
    known = blocks.filter(pl.col("mb").is_not_null())
    cols = ("pp_group", "step", "stage", "phase", "mb", "start_ns", "end_ns")
    block_rows: dict[tuple[Any, Any], list[tuple[Any, ...]]] = {}
    for b in known.select(cols).iter_rows():  # in the blocks' order (rank, step, start)
        block_rows.setdefault((b[0], b[1]), []).append(b[2:])
    for (group, step), part in parts.items():
        base = inf.get((group, step), {})
        size = int(part[0]["pp_size"])
        m = p.microbatches or base.get("m")
        v = p.virtual_stages or base.get("v") or 1
        schedule = p.schedule or base.get("schedule")
        user = any(x is not None for x in (p.schedule, p.microbatches, p.virtual_stages))
        convention: str | None
        if user and schedule is not None and m:
            ideal = closed_ideal(schedule, size, int(m), int(v))
            convention = (
                "fraction of total x/(1+x); Megatron fraction of ideal x = (p-1)/(v*m)"
                if schedule == "interleaved"
                else "fraction of total (p-1)/(m+p-1); fraction of ideal (p-1)/m"
            )
        else:
            ideal = base.get("closed_form_ideal")
            convention = base.get("convention")
        bub = [float(r["bubble_ns"]) for r in part]
        raw_work = [r["work_ns"] for r in part]
        has_work = None not in raw_work and sum(raw_work) > 0
        work = [float(w) for w in raw_work] if has_work else []
        mean_bubble = sum(bub) / len(bub) if bub else 0.0
        mean_work = sum(work) / len(work) if has_work else None
        heavy = max(part, key=lambda r: r["work_ns"]) if has_work else {}  # the first heaviest
        row: dict[str, Any] = {
            "pp_group": group,
            "step": step,
            "p": size,
            "m": int(m) if m else None,
            "v": int(v),
            "schedule": schedule,
            "schedule_source": "user" if user else ("inferred" if base else None),
            "closed_form": None if ideal is None else ideal / (1 + ideal),
            "closed_form_ideal": ideal,
            "convention": convention,
            "bubble_fraction": mean_bubble / (mean_bubble + mean_work)
            if mean_work is not None and mean_bubble + mean_work > 0
            else None,
            "bubble_over_ideal": mean_bubble / mean_work if mean_work else None,
            "mean_bubble_ns": int(mean_bubble),
            "mean_work_ns": None if mean_work is None else int(mean_work),
            "busy_max_over_mean": max(work) / mean_work if mean_work else None,
            "heavy_stage": heavy.get("stage"),
            "heavy_rank": heavy.get("rank"),
        }
        row.update(_decomposition(size, row, block_rows.get((group, step), []), mean_bubble))
        rows.append(row)
    schema = {c: _SCHEDULE_TYPES.get(c, pl.Int64) for c in SCHEDULE_COLUMNS}
    return pl.DataFrame(rows, schema=schema, orient="row").select(SCHEDULE_COLUMNS)


_SCHEDULE_TYPES: dict[str, Any] = {
    "pp_group": pl.Utf8,
    "step": pl.Int32,
    "schedule": pl.Utf8,
    "schedule_source": pl.Utf8,
    "convention": pl.Utf8,
    "decomposition": pl.Utf8,
    "slow_blocks": pl.Utf8,
    **{
        c: pl.Float64
        for c in (
            "closed_form",
            "closed_form_ideal",
            "bubble_fraction",
            "bubble_over_ideal",
            "busy_max_over_mean",
        )
    },
}


def _decomposition(
    p: int, row: dict[str, Any], blocks: list[tuple[Any, ...]], mean_bubble: float
) -> dict[str, Any]:
    """The bubble's decomposition for one pipeline-step, from its blocks of known microbatch
    (stage, phase, mb, start_ns, end_ns)."""
    out: dict[str, Any] = {
        k: None
        for k in (
            "closed_bubble_ns",
            "excess_ns",
            "order_ns",
            "imbalance_ns",
            "microbatch_variance_ns",
            "p2p_ns",
            "unexplained_ns",
            "p2p_latency_ns",
            "slow_blocks",
        )
    }
    ideal, m = row["closed_form_ideal"], row["m"]
    if ideal is not None and row["mean_work_ns"] is not None:
        out["closed_bubble_ns"] = int(ideal * row["mean_work_ns"])
        out["excess_ns"] = int(mean_bubble - ideal * row["mean_work_ns"])
    if row["schedule"] not in ("gpipe", "1f1b", "zero_bubble") or not m or ideal is None:
        out["decomposition"] = "needs a non-interleaved schedule with known m"
        return out
    bl = [Block(int(st), str(ph), int(mb), s, e) for st, ph, mb, s, e in blocks]
    dec, why = decompose(bl, p, int(m), float(ideal), mean_bubble)
    out["decomposition"] = why
    if dec is None:
        return out
    out.update(
        closed_bubble_ns=int(dec.closed_bubble_ns),
        excess_ns=int(mean_bubble - dec.closed_bubble_ns),
        order_ns=int(dec.order_ns),
        imbalance_ns=int(dec.imbalance_ns),
        microbatch_variance_ns=int(dec.variance_ns),
        p2p_ns=int(dec.p2p_ns),
        unexplained_ns=int(dec.unexplained_ns),
        p2p_latency_ns=int(dec.latency_ns),
        slow_blocks="; ".join(
            f"stage {s} {ph}{i} {d / 1e6:.1f} ms (median {med / 1e6:.1f})"
            for s, ph, i, d, med in dec.slow_blocks
        )
        or None,
    )
    return out


def _per_stage(table: pl.DataFrame, bubble: pl.DataFrame) -> pl.DataFrame:
    """Totals per stage over its steps, for reports, with the bubble fraction of `bubble`
    (pipeline_stage_bubble: the one definition, which `check --max-bubble` reads too)."""
    ns = [
        "window_ns",
        "work_ns",
        "bubble_ns",
        "idle_ns",
        "pp_wait_ns",
        "warmup_bubble_ns",
        "steady_bubble_ns",
        "cooldown_bubble_ns",
    ]
    return (
        table.group_by("rank", "pp_group", "stage", "pp_size")
        .agg(
            pl.len().alias("steps"),
            *[pl.col(c).sum() for c in ns],
            pl.col("closed_form").mean(),
            pl.col("schedule").first(),
            pl.col("microbatches").first(),
        )
        .join(bubble, on=["rank", "pp_group", "stage"], how="left")
        .sort("pp_group", "stage")
    )
