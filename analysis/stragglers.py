"""stragglers: which ranks arrive late at collectives, and what it costs the others.

On the job clock (raw timestamps + each rank's alignment offset) and over matched collective
instances only (`collectives.status = 'matched'`):
- per instance: arrival skew = last arrival - first arrival; the late rank is the last to
  arrive, named only when the skew exceeds the clock uncertainty (the alignment residual when
  the instance spans hosts; zero on one host, where ranks share a clock);
- per rank and instance: wait = last arrival - own arrival; transfer = own end - last arrival
  (what remains once everybody is there); the shortest duration across ranks is the skew-free
  cross-check of the transfer time (collectives analysis);
- per rank: held back = for the instances where it was late, the mean wait of the other members
  up to the delay it made itself (its lateness minus how late its previous communication
  released it: a rank late only because a recv before it ended late is not the cause), summed;
  caused wait = the others' summed wait; its own waits; net held back per step =
  (held back - own waits) / steps, which noise alone drives towards zero; late_z = how many
  standard deviations its late count is above chance (1/n per instance). STRAGGLER_RANK needs
  both: a net share of the step above `held_back_share` and late_z >= `min_late_z`;
- exposed communication |M \\ C| split into wait |Wait \\ C| and transfer (the rest), per rank
  and step on unions (this split lives here because it needs the matched instances);
- compute imbalance: compute per step / median of its peers - 1, peers being the ranks of the
  same pipeline stage (or all ranks), e.g. context parallel with a causal mask.

Arrival is the start of the communication event (a kernel, a gloo worker span); a gloo
isend's arrival is its issue op. Caveat: on CPU (gloo) runs that share few cores, arrivals
carry preemption noise of milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import polars as pl
from ranklens.analysis import _activity
from ranklens.analysis._base import Finding, Result, Severity
from ranklens.analysis._sql import HeldViews, query_pl

NAME = "stragglers"
VIEW_FILES: tuple[str, ...] = ("stragglers",)  # its views, stored in the run (views.py)
USES_ACTIVITY = True  # reads the activity views (held once by report, ingest)

COLUMNS: dict[str, str] = {
    "rank": "Global rank.",
    "steps": "Steps of the rank in the trace.",
    "instances": "Matched collective instances the rank took part in.",
    "late_count": "Instances where it arrived last (beyond the clock uncertainty) by a delay "
    "of its own (not one inherited from a late recv or collective before it).",
    "late_z": "(late_count - chance, 1/n per instance) / its standard deviation.",
    "held_back_ns": "Sum over those instances of the others' mean wait, up to its own delay.",
    "waited_ns": "Its own waits for later ranks at collectives (last - own arrival), summed.",
    "net_held_back_per_step_ns": "(held_back - waited) per step: how much it holds the job back.",
    "net_held_back_share": "(held_back - waited) / the rank's summed step windows.",
    "caused_wait_ns": "Sum of the other members' waits for it.",
    "exposed_wait_ns": "Exposed communication spent waiting: |Wait \\ C|.",
    "exposed_transfer_ns": "Exposed communication transferring: |M \\ C| - exposed wait.",
    "stage": "Pipeline stage used to pick its peers (0: no PP group).",
    "compute_per_step_ns": "|C| per step.",
    "compute_imbalance": "compute_per_step / median of its peers - 1.",
    "clock_method": "How its clock offset was obtained (ranks.clock_method).",
    "align_residual_ns": "Its alignment residual (ranks.align_residual_ns).",
}


@dataclass(frozen=True)
class Params:
    """Thresholds for findings.

    Attributes:
        held_back_share: a rank whose net held-back time (others' waits for it minus its own
            waits) exceeds this share of its step is a straggler.
        min_held_back_ns: ... if that is at least this much per step,
        min_late_z: ... and it arrives last more often than chance by this many standard
            deviations (a rank late by noise alone is last in about 1/n of its collectives).
        imbalance_warn: compute above the peers' median by more than this is reported.
        align_warn_ns: an alignment residual above this makes cross-host timings untrustworthy.
        wait_dominates: exposed wait above this share of exposed communication is reported.
        max_listed: up to this many stragglers get a finding each; more become one finding
            naming them all (a slow switch or a bad data shard makes many at once: one cause).
    """

    held_back_share: float = 0.05
    min_held_back_ns: int = 1_000_000
    min_late_z: float = 2.0
    imbalance_warn: float = 0.15
    align_warn_ns: int = 50_000
    wait_dominates: float = 0.5
    max_listed: int = 3


# Held while run() queries them, in dependency order (a 1,024-rank job: 2.1 -> 1.1-1.4 s).
HELD: tuple[str, ...] = (
    "_stragglers_rows",
    "stragglers_by_instance",
    "stragglers_by_rank_instance",
    "_stragglers_exposed",
)


def run(con: duckdb.DuckDBPyConnection, params: Params = Params()) -> Result:
    """Compute arrival skews, waits, held-back time and compute imbalance, with findings."""
    with (
        _activity.held(con, _activity.HELD_VIEWS[:2]),  # islands, compute islands
        # each read by several views below them (the instances six times): computed once
        HeldViews(con, "stragglers", *HELD),
    ):
        table = query_pl(con, "SELECT * FROM stragglers_by_rank ORDER BY rank")
        inst = query_pl(con, "SELECT * FROM stragglers_by_instance ORDER BY instance_id")
        by_step = query_pl(con, "SELECT * FROM stragglers_by_step ORDER BY rank, step")
        ranks = query_pl(
            con, "SELECT rank, host, clock_method, align_residual_ns FROM ranks ORDER BY rank"
        )
        findings = _straggler(table, inst, params) + _imbalance(table, params)
        findings += _alignment(ranks, params) + _wait(table, params)
    return Result(NAME, table, tuple(findings), params, {"by_instance": inst, "by_step": by_step})


def _straggler(table: pl.DataFrame, inst: pl.DataFrame, p: Params) -> list[Finding]:
    if table.is_empty():
        return []
    bad = table.filter(
        (pl.col("net_held_back_share") > p.held_back_share)
        & (pl.col("net_held_back_per_step_ns") >= p.min_held_back_ns)
        & (pl.col("late_z") >= p.min_late_z)
    ).sort(["net_held_back_per_step_ns", "rank"], descending=[True, False], maintain_order=True)
    if bad.height > p.max_listed:
        return [_many(bad, p)]
    out = []
    for row in bad.iter_rows(named=True):
        rank = int(row["rank"])
        mine = inst.filter(pl.col("late_rank") == rank)
        ops = (
            mine.group_by("parallelism", "op")
            .len()
            .sort(["len", "parallelism", "op"], descending=[True, False, False])
        )
        top = ops.row(0, named=True) if ops.height else {"parallelism": "?", "op": "?"}
        imb = row["compute_imbalance"]
        more = f"; its compute is {imb:+.0%} vs its peers" if imb is not None else ""
        out.append(
            Finding(
                code="STRAGGLER_RANK",
                severity=Severity.WARNING,
                message=(
                    f"rank {rank} holds the job back by "
                    f"{row['net_held_back_per_step_ns'] / 1e6:.1f} ms per step "
                    f"({row['net_held_back_share']:.0%} of its step): the others wait "
                    f"for it in {row['late_count']} of its {row['instances']} collectives, "
                    f"mostly {top['parallelism']} {top['op']}{more}"
                ),
                fix=(
                    f"find what rank {rank} does that its peers do not: more data or work "
                    "given to it, host-side stalls (data loader, GC), or a slow GPU/host "
                    "(replace it)"
                ),
                time_at_stake_ns=int(row["net_held_back_per_step_ns"]),
                ranks=(rank,),
                value=float(row["net_held_back_share"]),
                threshold=p.held_back_share,
                evidence={
                    "net_held_back_per_step_ns": int(row["net_held_back_per_step_ns"]),
                    "late_count": int(row["late_count"]),
                    "caused_wait_ns": int(row["caused_wait_ns"]),
                },
            )
        )
    return out


def _many(bad: pl.DataFrame, p: Params) -> Finding:
    """One finding for many stragglers: the worst few by name, all ranks in `ranks`."""
    worst = bad.row(0, named=True)
    named = ", ".join(
        f"rank {int(r['rank'])} {r['net_held_back_per_step_ns'] / 1e6:.1f} ms"
        for r in bad.head(p.max_listed).iter_rows(named=True)
    )
    hosts = bad["host"].drop_nulls().unique() if "host" in bad.columns else pl.Series([])
    where = f" on {hosts.len()} host(s)" if hosts.len() else ""
    return Finding(
        code="STRAGGLER_RANK",
        severity=Severity.WARNING,
        message=(
            f"{bad.height} ranks{where} hold the job back (per step: {named}, "
            f"{bad.height - p.max_listed} more in the stragglers table)"
        ),
        fix=(
            "many late ranks at once usually share one cause: look for what they have in "
            "common (a host, a switch, a data shard, a stage), then as for one straggler: "
            "uneven data, host-side stalls, a slow GPU/host"
        ),
        time_at_stake_ns=int(worst["net_held_back_per_step_ns"]),
        ranks=tuple(int(r) for r in bad["rank"]),
        value=float(worst["net_held_back_share"]),
        threshold=p.held_back_share,
        evidence={"stragglers": bad.height},
    )


def _imbalance(table: pl.DataFrame, p: Params) -> list[Finding]:
    bad = table.filter(pl.col("compute_imbalance") > p.imbalance_warn).sort(
        "compute_imbalance", descending=True, maintain_order=True
    )
    if bad.is_empty():
        return []
    worst = bad.row(0, named=True)
    imb = float(worst["compute_imbalance"])
    excess = int(worst["compute_per_step_ns"] * imb / (1 + imb))  # above the peers' median
    return [
        Finding(
            code="STRAGGLER_COMPUTE_IMBALANCE",
            severity=Severity.WARNING,
            message=(
                f"rank {worst['rank']} computes {worst['compute_imbalance']:+.0%} more per step "
                f"than the median of its peers ({bad.height} rank(s) above "
                f"{p.imbalance_warn:.0%})"
            ),
            fix=(
                "balance the work across ranks that should do the same amount (equal data "
                "per rank), or check those ranks for a slower device or host"
            ),
            time_at_stake_ns=excess,
            ranks=tuple(int(r) for r in bad["rank"]),
            value=float(worst["compute_imbalance"]),
            threshold=p.imbalance_warn,
        )
    ]


def _alignment(ranks: pl.DataFrame, p: Params) -> list[Finding]:
    out = []
    multi = ranks.filter(pl.col("clock_method") != "single_host")
    poor = multi.filter(pl.col("align_residual_ns") > p.align_warn_ns)
    if not poor.is_empty():
        worst = int(poor["align_residual_ns"].max())  # type: ignore[arg-type]
        out.append(
            Finding(
                code="ALIGN_RESIDUAL_POOR",
                severity=Severity.WARNING,
                message=(
                    f"clock alignment across hosts is poor: residual up to {worst / 1e3:.0f} µs "
                    f"on {poor.height} rank(s); cross-host skews and waits below that are not "
                    "attributed to any rank"
                ),
                fix=(
                    "check the host names and clock sync (NTP/PTP) of those ranks, or give "
                    "known offsets with --offsets; treat cross-host timings as approximate"
                ),
                ranks=tuple(int(r) for r in poor["rank"]),
                value=float(worst),
                threshold=float(p.align_warn_ns),
            )
        )
    lost = ranks.filter(pl.col("clock_method") == "unconnected")
    if not lost.is_empty():
        out.append(
            Finding(
                code="ALIGN_UNCONNECTED",
                severity=Severity.WARNING,
                message=(
                    f"{lost.height} rank(s) share no matched collective with the reference "
                    "host: their clocks are not aligned"
                ),
                fix="profile a window that contains a collective spanning all hosts",
                ranks=tuple(int(r) for r in lost["rank"]),
            )
        )
    return out


def _wait(table: pl.DataFrame, p: Params) -> list[Finding]:
    if table.is_empty():
        return []
    wait = int(table["exposed_wait_ns"].sum())
    total = wait + int(table["exposed_transfer_ns"].sum())
    if total <= 0 or wait / total <= p.wait_dominates:
        return []
    steps = max(int(table["steps"].sum()), 1)
    return [
        Finding(
            code="STRAGGLER_EXPOSED_WAIT",
            severity=Severity.INFO,
            message=(
                f"{wait / total:.0%} of exposed communication is waiting for late ranks, not "
                "moving data"
            ),
            fix=(
                "balance arrival at collectives (see the late ranks in stragglers_by_instance) "
                "before tuning the network or NCCL"
            ),
            time_at_stake_ns=wait // steps,
            value=wait / total,
            threshold=p.wait_dominates,
        )
    ]
