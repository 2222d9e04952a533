"""contention: what running communication beside compute (and beside other communication) costs.

1. Compute: each compute event (GPU kernel; host op on a CPU-only rank) is `alone` when no
   communication ran on its device during it, `overlapped` when communication covered at least
   Params.min_overlap of it, else `partial` (left out). Per kernel class (name + launch
   configuration + the input shapes of the host op that launched it, linked by External id;
   for host ops name + input shapes): T_alone = median duration alone on the same rank,
   T_overlapped = mean duration overlapped, slowdown = T_overlapped / T_alone - 1 and time lost
   = sum over overlapped runs of (duration - T_alone). The input shapes matter because a
   persistent kernel launches the same grid (the SM count) for every problem size. Overlap
   with other compute streams is not controlled for.
2. Communication beside communication (e.g. DP all-reduce beside PP send/recv): each comm
   event against the comm on the device's other streams/threads, per (name, op, parallelism,
   size, dtype). Durations include waiting for peers: a slowdown here can also be a late peer.
3. H2D/D2H copies (activation offload): how much of the copy time ran under compute, per
   copy (`memcpy`) and in wall-clock time per step (`memcpy_steps`: concurrent copies once).

On CPU-only (gloo) ranks the comm that competes is the gloo worker threads' spans (the p2p
spans on the main thread are waits); many ranks time-sharing few cores make this qualitative.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb
import polars as pl
from ranklens.analysis._base import Finding, Result, Severity
from ranklens.analysis._sql import HeldViews, query_pl

NAME = "contention"
VIEW_FILES: tuple[str, ...] = ("contention",)  # its views, stored in the run (views.py)
USES_ACTIVITY = False  # reads the activity views (held once by report, ingest)

COLUMNS: dict[str, str] = {
    "name": "Compute kernel (or host op) name.",
    "shape": "Launch configuration (grid/block), + ' inputs=' the launching host op's input "
    "shapes when linked; a host op's input shapes; '' when unknown.",
    "ranks": "Ranks that ran this class.",
    "n_alone": "Runs with no communication beside them.",
    "n_overlapped": "Runs with communication beside them for >= min_overlap of their time.",
    "n_partial": "Runs partly overlapped (left out of the comparison).",
    "n_matched": "Overlapped runs on ranks that also ran the class alone (compared).",
    "t_alone_ns": "T_alone: median duration alone on a rank (mean over ranks, by their runs).",
    "t_overlapped_ns": "T_overlapped: mean duration of the compared overlapped runs.",
    "slowdown": "T_overlapped / T_alone - 1 (NULL: nothing to compare).",
    "time_lost_ns": "Sum over compared overlapped runs of (duration - T_alone).",
}


@dataclass(frozen=True)
class Params:
    """Classification and finding thresholds.

    Attributes:
        min_overlap: share of a run that communication must cover to count as overlapped.
        slowdown_warn: compute slowdown under overlap above which it is reported.
        comm_slowdown_warn: slowdown of communication beside other communication to report.
        exposed_copy_warn: share of H2D/D2H copy time not under compute to report.
        min_share: ignore losses below this share of the mean step.
        min_runs: runs alone needed for a baseline (compute), and on each side (comm).
    """

    min_overlap: float = 0.5
    slowdown_warn: float = 0.10
    comm_slowdown_warn: float = 0.20
    exposed_copy_warn: float = 0.20
    min_share: float = 0.01
    min_runs: int = 3


def run(con: duckdb.DuckDBPyConnection, params: Params = Params()) -> Result:
    """Kernel classes, per-step losses, comm-vs-comm classes and copy hiding."""
    # The comm islands are read by two queries; the kernel overlap (a join over every kernel)
    # by two more: each is computed once.
    with HeldViews(con, "contention", "_contention_comm", "_contention_comm_islands"):
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _contention_run AS SELECT * FROM contention_kernels($m)",
            {"m": params.min_overlap},
        )
        try:
            table = query_pl(
                con,
                "SELECT * FROM contention_classes('_contention_run', ?) "
                "ORDER BY time_lost_ns DESC NULLS LAST, name, shape",
                [params.min_runs],
            )
            by_step = query_pl(
                con,
                "SELECT * FROM contention_steps('_contention_run', ?) ORDER BY rank, step",
                [params.min_runs],
            )
        finally:
            con.execute("DROP TABLE IF EXISTS temp._contention_run")
        # each comm event against the others (an interval join): once, for both readers
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _contention_comm_run AS "
            "SELECT * FROM _contention_comm_runs($m)",
            {"m": params.min_overlap},
        )
        try:
            comm = query_pl(
                con,
                "SELECT * FROM _contention_comm_classes('_contention_comm_run', ?) "
                "ORDER BY time_lost_ns DESC NULLS LAST, name, coll_op, parallelism, nelems, dtype",
                [params.min_runs],
            )
            comm_steps = query_pl(
                con,
                "SELECT * FROM _contention_comm_lost('_contention_comm_run', ?, ?) "
                "ORDER BY rank, step",
                [params.min_runs, params.comm_slowdown_warn],
            )
        finally:
            con.execute("DROP TABLE IF EXISTS temp._contention_comm_run")
        memcpy = query_pl(con, "SELECT * FROM contention_memcpy ORDER BY rank, step, direction")
        copy_steps = query_pl(con, "SELECT * FROM contention_memcpy_steps ORDER BY rank, step")
    step_ns = con.execute("SELECT avg(end_ns - start_ns) FROM steps").fetchall()[0][0]
    mean_step = float(step_ns) if step_ns is not None else 0.0
    return Result(
        NAME,
        table.select(list(COLUMNS)),
        tuple(
            _findings(table, by_step, (comm, comm_steps), (memcpy, copy_steps), mean_step, params)
        ),
        params,
        {
            "by_step": by_step,
            "comm": comm,
            "comm_steps": comm_steps,
            "memcpy": memcpy,
            "memcpy_steps": copy_steps,
        },
    )


def _per_step_worst(df: pl.DataFrame, col: str) -> tuple[float, int | None]:
    """The worst rank's mean per step of `col`, and that rank (divided by the rank's distinct
    steps, not its rows, should a table hold several rows per step)."""
    if df.is_empty():
        return 0.0, None
    per = (
        df.group_by("rank")
        .agg(pl.col(col).sum() / pl.col("step").n_unique())
        .sort([col, "rank"], descending=[True, False])  # ties: the lowest rank
    )
    top = per.row(0, named=True)
    return float(top[col] or 0.0), int(top["rank"])


def _finding(code: str, lost: float, floor: float, **kw: Any) -> Finding:
    """A finding of `lost` ns per step: a warning past five times the floor of reporting."""
    return Finding(
        code=code,
        severity=Severity.WARNING if lost > 5 * floor else Severity.INFO,
        time_at_stake_ns=int(lost),
        **kw,
    )


def _findings(
    table: pl.DataFrame,
    by_step: pl.DataFrame,
    comm: tuple[pl.DataFrame, pl.DataFrame],
    copies: tuple[pl.DataFrame, pl.DataFrame],
    mean_step: float,
    p: Params,
) -> list[Finding]:
    out: list[Finding] = []
    floor = p.min_share * mean_step
    steps = tuple(sorted({int(s) for s in by_step["step"]})) if not by_step.is_empty() else ()
    cmp = table.filter(pl.col("n_matched") > 0)
    if not cmp.is_empty():
        base = float((cmp["n_matched"] * cmp["t_alone_ns"]).sum())
        slow = float((cmp["n_matched"] * cmp["t_overlapped_ns"]).sum()) / base - 1 if base else 0
        lost, rank = _per_step_worst(by_step, "time_lost_ns")
        if slow > p.slowdown_warn and lost > floor:
            top = cmp.sort("time_lost_ns", descending=True, maintain_order=True).head(5)
            first = top.row(0, named=True)
            out.append(
                _finding(
                    "CONTENTION_COMPUTE_SLOWDOWN",
                    lost,
                    floor,
                    message=(
                        f"compute runs {slow:.0%} slower beside communication (T_overlapped / "
                        f"T_alone - 1 over {int(cmp['n_matched'].sum())} runs); "
                        f"{lost / 1e6:.2f} ms lost per step on rank {rank}; worst class "
                        f"{first['name']} {first['slowdown']:+.0%}"
                    ),
                    fix=(
                        "communication kernels take SMs and memory bandwidth from the compute "
                        "they overlap: give NCCL fewer channels/CTAs (NCCL_MAX_NCHANNELS, "
                        "NCCL_MAX_CTAS) or overlap communication with less memory-bound "
                        "kernels; keep the overlap while the hidden communication is larger "
                        "than the time lost here (overlap analysis)"
                    ),
                    ranks=tuple(
                        int(r)
                        for r in by_step.filter(pl.col("time_lost_ns") > 0)
                        .get_column("rank")
                        .unique()
                        .sort()
                    ),
                    steps=steps,
                    value=slow,
                    threshold=p.slowdown_warn,
                    evidence={
                        "slowdown_all_classes": slow,
                        "worst_rank": rank,
                        "top_classes": [
                            {k: r[k] for k in ("name", "shape", "slowdown", "time_lost_ns")}
                            for r in top.iter_rows(named=True)
                        ],
                    },
                )
            )
    out += _comm_finding(*comm, mean_step, floor, p)
    out += _copy_finding(*copies, steps, floor, p)
    return out


def _comm_finding(
    comm: pl.DataFrame,
    per_step: pl.DataFrame,
    mean_step: float,
    floor: float,
    p: Params,
) -> list[Finding]:
    """Time at stake: the worst rank's mean per step of the wall-clock time its slowed classes
    lost (contention_comm_steps: a union, as both sides of a pair are slowed at once)."""
    bad = comm.filter((pl.col("slowdown") > p.comm_slowdown_warn) & (pl.col("time_lost_ns") > 0))
    if bad.is_empty():
        return []
    lost, rank = _per_step_worst(per_step, "lost_ns")
    if lost <= floor:
        return []
    hit = per_step.filter(pl.col("lost_ns") > 0)  # where it was lost: the finding's link
    top = bad.sort("time_lost_ns", descending=True, maintain_order=True).row(0, named=True)
    return [
        _finding(
            "CONTENTION_COMM_SLOWDOWN",
            lost,
            floor,
            message=(
                f"{top['parallelism']} {top['coll_op']} runs {top['slowdown']:.0%} slower when "
                f"other communication runs beside it; {lost / 1e6:.2f} ms lost per step on "
                f"rank {rank} (all classes)"
            ),
            fix=(
                "communications compete for the same links and copy engines: stagger them, "
                "put them on different NICs/rails, or lower the number of buckets in flight; "
                "durations include waits for late peers, so check the stragglers analysis "
                "before tuning"
            ),
            ranks=tuple(sorted({int(r) for r in hit["rank"]})),
            steps=tuple(sorted({int(s) for s in hit["step"]})),  # lost > floor: not empty
            value=float(top["slowdown"]),
            threshold=p.comm_slowdown_warn,
            evidence={
                "classes": [
                    {
                        k: r[k]
                        for k in (
                            "name",
                            "coll_op",
                            "parallelism",
                            "nelems",
                            "slowdown",
                            "time_lost_ns",
                        )
                    }
                    for r in bad.sort("time_lost_ns", descending=True, maintain_order=True)
                    .head(5)
                    .iter_rows(named=True)
                ],
                "mean_step_ns": int(mean_step),
            },
        )
    ]


def _copy_finding(
    memcpy: pl.DataFrame,
    per_step: pl.DataFrame,
    steps: tuple[int, ...],
    floor: float,
    p: Params,
) -> list[Finding]:
    """The share is of copy time (each copy's own); the time at stake is wall-clock (the
    union of a step's copies with no compute beside it, over all of the rank's steps), so
    concurrent copies never count twice and a step without copies counts as none."""
    if memcpy.is_empty():
        return []
    exposed, rank = _per_step_worst(per_step, "exposed_ns")
    total = float(memcpy["copy_ns"].sum())
    share = float(memcpy["exposed_ns"].sum()) / total if total else 0.0
    if share <= p.exposed_copy_warn or exposed <= floor:
        return []
    by_dir = (
        memcpy.group_by("direction")
        .agg(pl.col("copy_ns", "exposed_ns", "bytes").sum())
        .sort("direction")
    )
    return [
        _finding(
            "CONTENTION_MEMCPY_EXPOSED",
            exposed,
            floor,
            message=(
                f"{share:.0%} of H2D/D2H copy time runs with no compute beside it; "
                f"{exposed / 1e6:.2f} ms per step on rank {rank}"
            ),
            fix=(
                "the copies do not hide under compute: for activation offload, prefetch earlier "
                "on a side stream from pinned memory so the copy overlaps the next "
                "micro-batch's compute, or offload fewer layers (lower the offload ratio); for "
                "input batches, pin_memory=True with non_blocking copies issued a step ahead"
            ),
            ranks=tuple(
                sorted({int(r) for r in per_step.filter(pl.col("exposed_ns") > 0)["rank"]})
            ),
            steps=steps,
            value=share,
            threshold=p.exposed_copy_warn,
            evidence={"by_direction": by_dir.to_dicts()},
        )
    ]
