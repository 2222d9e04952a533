"""breakdown: where each rank's step time went.

Per rank r and step window W (the hull of the device work launched in that step; the host
ProfilerStep span for CPU-only ranks), on unions per device, never sums:
C = compute, M = communication, Mem = memcpy/memset, idle = W minus all of them. The exclusive
split compute + exposed_comm + exposed_memory + idle adds up to W. Communication share per
parallelism is |M_x| / |W|.

Caveats: a rank whose trace holds several GPUs has their time summed; CPU-only (gloo) ranks
count host operators as compute, so time-slicing of many ranks on few cores inflates it.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import polars as pl
from ranklens.analysis import _activity
from ranklens.analysis._base import Finding, Result, Severity

NAME = "breakdown"
VIEW_FILES: tuple[str, ...] = ("breakdown",)  # its views, stored in the run (views.py)
USES_ACTIVITY = True  # reads the activity views (held once by report, ingest)

COLUMNS: dict[str, str] = {
    "rank": "Global rank.",
    "step": "Step number (-1: whole trace, no step markers).",
    "start_ns": "Start of the step window W (raw clock of the rank).",
    "window_ns": "|W|: length of the step window.",
    "compute_ns": "|C|: union of compute.",
    "comm_ns": "|M|: union of communication.",
    "memory_ns": "Union of memcpy/memset.",
    "exposed_comm_ns": "|M \\ C|: communication with no compute running.",
    "exposed_memory_ns": "Memory copies with neither compute nor communication running.",
    "idle_ns": "|W| minus the union of all device activity.",
    "compute_share": "|C| / |W|.",
    "comm_share": "|M| / |W|.",
    "idle_share": "idle / |W|.",
}


@dataclass(frozen=True)
class Params:
    """Thresholds for findings.

    Attributes:
        idle_warn: idle share of a step above which the device is reported as starved.
        comm_share_warn: communication share above which communication dominates the step.
    """

    idle_warn: float = 0.25
    comm_share_warn: float = 0.30


def run(con: duckdb.DuckDBPyConnection, params: Params = Params()) -> Result:
    """Compute the breakdown tables and findings."""
    table, by_rank, by_par = _activity.read(
        con,
        "breakdown",
        "SELECT * FROM breakdown_by_step ORDER BY rank, step",
        "SELECT * FROM breakdown_by_rank ORDER BY rank",
        "SELECT * FROM breakdown_by_parallelism ORDER BY rank, step, parallelism",
    )
    return Result(
        NAME,
        table,
        tuple(_findings(by_rank, params)),
        params,
        {"by_rank": by_rank, "by_parallelism": by_par},
    )


def _findings(by_rank: pl.DataFrame, p: Params) -> list[Finding]:
    out: list[Finding] = []
    if by_rank.is_empty():
        return out
    idle = by_rank.filter(pl.col("idle_share") > p.idle_warn)
    if not idle.is_empty():
        worst = idle.sort("idle_share", descending=True, maintain_order=True).row(0, named=True)
        per_step = int(idle["idle_ns"].sum() / max(int(idle["steps"].sum()), 1))
        out.append(
            Finding(
                code="BREAKDOWN_IDLE_HIGH",
                severity=Severity.WARNING,
                message=(
                    f"device idle {worst['idle_share']:.0%} of the step on rank {worst['rank']} "
                    f"({idle.height} rank(s) above {p.idle_warn:.0%})"
                ),
                fix=(
                    "the device waits on the host: look for data-loader stalls, host syncs "
                    "(.item(), cudaStreamSynchronize) and small kernels launched one by one "
                    "(CUDA graphs, torch.compile, larger micro-batches)"
                ),
                time_at_stake_ns=per_step,
                ranks=tuple(int(r) for r in idle["rank"]),
                value=float(worst["idle_share"]),
                threshold=p.idle_warn,
                evidence={
                    "idle_share_by_rank": dict(zip(idle["rank"], idle["idle_share"], strict=True))
                },
            )
        )
    heavy = by_rank.filter(pl.col("comm_share") > p.comm_share_warn)
    if not heavy.is_empty():
        worst = heavy.sort("comm_share", descending=True, maintain_order=True).row(0, named=True)
        out.append(
            Finding(
                code="BREAKDOWN_COMM_SHARE_HIGH",
                severity=Severity.INFO,
                message=(
                    f"communication runs {worst['comm_share']:.0%} of the step on rank "
                    f"{worst['rank']} (exposed or not)"
                ),
                fix=(
                    "check which parallelism carries it (breakdown_by_parallelism) and whether "
                    "it is hidden (overlap); shrink it with fewer, larger collectives or "
                    "lower-precision communication"
                ),
                time_at_stake_ns=0,
                ranks=tuple(int(r) for r in heavy["rank"]),
                value=float(worst["comm_share"]),
                threshold=p.comm_share_warn,
            )
        )
    return out
