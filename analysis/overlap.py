"""overlap: how much communication ran under compute, and how much was exposed.

Per rank r and step window W, on unions per device: overlap ratio = |M ∩ C| / |M| (the
definition HolisticTraceAnalysis uses), hidden = |M ∩ C|, exposed = |M \\ C|, also per process
group and op, and per parallelism (M_x). Totals per rank are ratios of sums over steps.

Kernels belong to the step whose host span launched them (as in HTA); memcpy/memset are in
neither C nor M. Exposed communication still contains the time a rank waited for the others to
arrive; the stragglers analysis splits it into wait and transfer.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import polars as pl
from ranklens.analysis import _activity
from ranklens.analysis._base import Finding, Result, Severity

NAME = "overlap"
VIEW_FILES: tuple[str, ...] = ("overlap",)  # its views, stored in the run (views.py)
USES_ACTIVITY = True  # reads the activity views (held once by report, ingest)

COLUMNS: dict[str, str] = {
    "rank": "Global rank.",
    "step": "Step number (-1: whole trace).",
    "window_ns": "|W|: length of the step window.",
    "comm_ns": "|M|: union of communication.",
    "hidden_ns": "|M ∩ C|: communication under compute.",
    "exposed_ns": "|M \\ C|: communication with no compute running.",
    "compute_ns": "|C|: union of compute.",
    "overlap_ratio": "|M ∩ C| / |M| (NULL when there is no communication).",
    "exposed_share": "|M \\ C| / |W|.",
}


@dataclass(frozen=True)
class Params:
    """Thresholds for findings.

    Attributes:
        exposed_warn: exposed communication share of the step above which it is reported.
        min_comm_share: ignore ranks whose communication is below this share of the step.
    """

    exposed_warn: float = 0.10
    min_comm_share: float = 0.01


def run(con: duckdb.DuckDBPyConnection, params: Params = Params()) -> Result:
    """Compute overlap per step, per rank, per group/op and per parallelism."""
    table, by_rank, by_group, by_par, dp = _activity.read(
        con,
        "overlap",
        "SELECT * FROM overlap_by_step ORDER BY rank, step",
        "SELECT * FROM overlap_by_rank ORDER BY rank",
        "SELECT * FROM overlap_by_group ORDER BY rank, step, pg_name, coll_op",
        "SELECT * FROM overlap_by_parallelism ORDER BY rank, step, parallelism",
        "SELECT * FROM overlap_dp_by_step ORDER BY rank, step",
    )
    return Result(
        NAME,
        table,
        tuple(_findings(by_rank, by_par, params)),
        params,
        {"by_rank": by_rank, "by_group": by_group, "by_parallelism": by_par, "dp_by_step": dp},
    )


def _findings(by_rank: pl.DataFrame, by_par: pl.DataFrame, p: Params) -> list[Finding]:
    if by_rank.is_empty():
        return []
    bad = by_rank.filter(
        (pl.col("exposed_share") > p.exposed_warn)
        & (pl.col("comm_ns") > p.min_comm_share * pl.col("window_ns"))
    )
    if bad.is_empty():
        return []
    worst = bad.sort(["exposed_share", "rank"], descending=[True, False]).row(0, named=True)
    per_step = int(bad["exposed_ns"].sum() / max(int(bad["steps"].sum()), 1))
    par = (
        by_par.filter(pl.col("rank").is_in(bad["rank"].to_list()))
        .group_by("parallelism")
        .agg(pl.col("exposed_ns").sum())
        .sort(["exposed_ns", "parallelism"], descending=[True, False])
    )
    top = par.row(0, named=True)["parallelism"] if not par.is_empty() else "UNKNOWN"
    fixes = {
        "DP": "overlap the DP gradient reduction with backward (DDP/FSDP bucketing, "
        "overlap_grad_reduce) and tune bucket sizes",
        "TP": "enable TP communication overlap (tp_comm_overlap / userbuffers) or keep TP "
        "inside one NVLink domain",
        "PP": "PP send/recv is on the critical path: more micro-batches or an interleaved "
        "schedule shortens the waits",
        "EP": "overlap all-to-all dispatch/combine with expert compute (e.g. DualPipe-style "
        "chunk overlap) and balance tokens per expert",
    }
    return [
        Finding(
            code="OVERLAP_EXPOSED_COMM_HIGH",
            severity=Severity.WARNING,
            message=(
                f"{worst['exposed_share']:.0%} of the step is exposed communication on rank "
                f"{worst['rank']}{_how_many(bad.height, by_rank.height, p.exposed_warn)} "
                f"(overlap ratio {worst['overlap_ratio'] or 0:.0%}); most of it is {top}"
            ),
            fix=fixes.get(
                top,
                "find the collective with the largest exposed time (overlap_by_group) "
                "and overlap it with independent compute",
            ),
            time_at_stake_ns=per_step,
            ranks=tuple(int(r) for r in bad["rank"]),
            value=float(worst["exposed_share"]),
            threshold=p.exposed_warn,
            evidence={
                "exposed_ns_by_parallelism": dict(
                    zip(par["parallelism"], par["exposed_ns"], strict=True)
                )
            },
        )
    ]


def _how_many(bad: int, ranks: int, threshold: float) -> str:
    """What follows the worst rank's number in the message (", the worst of 6 of 8 ranks above
    10%") when the finding covers more than one rank: it must not read as if that rank were
    the only one."""
    if bad <= 1:
        return ""
    return f", the worst of {bad} of {ranks} ranks above {threshold:.0%}"
