"""collectives: bandwidth of every matched collective, by op, size and group; mismatches.

Per matched instance (all its ranks present, same op and size): time = the shortest duration
across its ranks, which is skew-free and needs no clock alignment (the last rank to arrive
waits for nobody); algbw = bytes / time; busbw = algbw * f(n) with n the group size and f as
nccl-tests defines it (all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all and grouped
send/recv (n-1)/n; broadcast, reduce and a send/recv pair 1). Bytes are the full array
(all-gather output, reduce-scatter input). The peak is the theoretical per-direction link
bandwidth of the GPU model (NVLink for SXM parts, else PCIe), or the network (25 GB/s per GPU
assumed) when the group spans hosts; `peak_fraction` = busbw / peak. An instance is slow when
its time exceeds `slow_factor` x the median of its group, op and size bucket; the finding's
time at stake is the worst rank's time per step beyond the median in the slow instances it took
part in, a union per rank (`slow_by_rank`), not a sum over instances of different groups;
only matched instances count (one whose peers are not in the run includes its waits). Its
window is the worst instance, so its timeline link lands there, not on its first step.

Mismatched instances (a present member that never joined - the first suspect of a hang -,
different ops or sizes, duplicates) are listed with their group, sequence number and ranks in
`collectives_mismatches`. Caveats: CPU (gloo) traces carry no element type in the fields
ranklens ingests, so their bytes and bandwidths are NULL; small messages are latency-bound and
never near the peak.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import polars as pl
from ranklens.analysis._base import Finding, Result, Severity
from ranklens.analysis._sql import HeldViews, query_pl
from ranklens.analysis.run_profile import group_labels
from ranklens.ingest.database import registered

NAME = "collectives"
VIEW_FILES: tuple[str, ...] = ("collectives",)  # its views, stored in the run (views.py)
USES_ACTIVITY = False  # reads the activity views (held once by report, ingest)

COLUMNS: dict[str, str] = {
    "pg_name": "Process group.",
    "parallelism": "Its parallelism (process_groups.parallelism).",
    "op": "Collective op ('p2p': a matched send/recv pair).",
    "size_bucket": "Size class of the full array.",
    "group_size": "n, ranks in the group.",
    "link": "nvlink, pcie, network (spans hosts), host (CPU) or unknown.",
    "instances": "Matched instances.",
    "bytes": "Median bytes of the full array.",
    "time_ns": "Median time (shortest duration across the instance's ranks).",
    "time_p90_ns": "90th percentile of the time.",
    "total_time_ns": "Summed time of the instances.",
    "algbw_gbps": "Median bytes / time, GB/s.",
    "busbw_gbps": "Median algbw x f(n), GB/s.",
    "peak_gbps": "Link peak, GB/s (NULL: unknown or CPU).",
    "peak_fraction": "Median busbw / peak.",
    "slow_instances": "Instances slower than slow_factor x the median of this row.",
}


@dataclass(frozen=True)
class Params:
    """Thresholds for findings.

    Attributes:
        slow_factor: an instance taking more than this x its row's median time is slow.
        min_excess_ns: ... and at least this much longer than the median.
        slow_warn_ns: report slow instances when their excess time per step exceeds this.
        low_busbw_fraction: bandwidth-bound rows below this fraction of the peak are reported.
        bandwidth_bound_bytes: messages from this size on are expected near the peak.
    """

    slow_factor: float = 3.0
    min_excess_ns: int = 100_000
    slow_warn_ns: int = 1_000_000
    low_busbw_fraction: float = 0.25
    bandwidth_bound_bytes: int = 64 * 1024 * 1024


def run(con: duckdb.DuckDBPyConnection, params: Params = Params()) -> Result:
    """Bandwidth per instance and aggregated; mismatches; findings."""
    # the instances feed three queries: computed once (a 1,024-rank job: 0.8 -> 0.6 s)
    with HeldViews(con, "collectives", "collectives_by_instance"):
        inst = query_pl(
            con,
            """SELECT *, time_vs_median > ? AND time_ns - time_ns / time_vs_median > ? AS slow
               FROM collectives_by_instance ORDER BY instance_id""",
            [params.slow_factor, params.min_excess_ns],
        )
        by_op = query_pl(con, "SELECT * FROM collectives_by_op")
        by_par = query_pl(con, "SELECT * FROM collectives_by_parallelism ORDER BY parallelism, op")
    slow = inst.group_by("pg_name", "op", "size_bucket").agg(
        pl.col("slow").fill_null(False).sum().cast(pl.Int64).alias("slow_instances")
    )
    table = (
        by_op.join(slow, on=["pg_name", "op", "size_bucket"], how="left")
        .with_columns(pl.col("peak_gbps").cast(pl.Float64))
        .sort("pg_name", "op", "size_bucket")
    )
    table = table.select(list(COLUMNS)) if table.height else _empty(table)
    mism = query_pl(con, "SELECT * FROM collectives_mismatches ORDER BY pg_name, seq")
    steps = int(con.execute("SELECT count(DISTINCT step) FROM steps").fetchall()[0][0]) or 1
    names = group_labels(con)
    # the slow instances the finding rests on, each with its time beyond the median (x): only
    # matched ones (skew_free); a rank whose peers are not in the run timed its waits too
    bad = inst.filter(pl.col("slow").fill_null(False) & pl.col("skew_free")).with_columns(
        x=pl.col("time_ns") - pl.col("time_ns") / pl.col("time_vs_median")
    )
    excess = _excess(con, bad)
    findings = _mismatch(mism, names) + _slow(bad, excess, steps, params, names)
    findings += _low(table, params, names)
    return Result(
        NAME,
        table,
        tuple(findings),
        params,
        {
            "by_instance": inst,
            "mismatches": mism,
            "by_parallelism": by_par,
            "slow_by_rank": excess,
        },
    )


def _excess(con: duckdb.DuckDBPyConnection, bad: pl.DataFrame) -> pl.DataFrame:
    """(rank, step, excess_ns): the union of the time each rank's slow instances (`bad`) ran
    beyond their median (collectives_excess)."""
    slow = bad.select("instance_id", pl.col("x").cast(pl.Int64))
    with registered(con, "_slow_instances", slow.to_arrow()):
        return query_pl(
            con, "SELECT * FROM collectives_excess('_slow_instances') ORDER BY rank, step"
        )


def _empty(table: pl.DataFrame) -> pl.DataFrame:
    cols = {c: table.schema.get(c, pl.Int64) for c in COLUMNS}
    return pl.DataFrame(schema=cols)


def _name(names: dict[str, str], pg: object) -> str:
    """A group by its parallelism and ranks (run_profile.group_labels), else by its id."""
    return names.get(str(pg), f"group {pg}")


def _mismatch(mism: pl.DataFrame, names: dict[str, str]) -> list[Finding]:
    if mism.is_empty():
        return []
    incomplete = mism.filter(pl.col("status") == "incomplete")
    first = (
        (incomplete if incomplete.height else mism)
        .sort("first_ts_ns", maintain_order=True)
        .row(0, named=True)
    )
    missing = sorted({int(r) for lst in incomplete["missing_ranks"].to_list() for r in (lst or [])})
    what = (
        f"rank(s) {missing} never joined {incomplete.height} collective(s); first: "
        f"{_name(names, first['pg_name'])} seq {first['seq']} ({', '.join(first['ops'])}) "
        f"joined by ranks {list(first['ranks'])}: if the job hung, rank(s) "
        f"{first['missing_ranks']} are the culprit"
        if incomplete.height
        else f"{mism.height} collective(s) disagree across ranks; first: "
        f"{_name(names, first['pg_name'])} seq {first['seq']} {first['status']} "
        f"(ops {list(first['ops'])}, sizes {list(first['sizes'])}, ranks {list(first['ranks'])})"
    )
    return [
        Finding(
            code="COLLECTIVE_MISMATCH",
            severity=Severity.CRITICAL if incomplete.height else Severity.WARNING,
            message=what,
            fix=(
                "a rank skipped or reordered a collective: check control flow that differs "
                "by rank (data-dependent branches, early exits, uneven batches); for a hang, "
                "look at what the missing rank was doing at that time (its last events)"
            ),
            ranks=tuple(missing) or tuple(int(r) for r in first["ranks"]),
            steps=(int(first["step"]),) if first["step"] is not None else (),
            evidence={"instances": mism.height, "incomplete": incomplete.height},
        )
    ]


def _slow(
    bad: pl.DataFrame, by_rank: pl.DataFrame, steps: int, p: Params, names: dict[str, str]
) -> list[Finding]:
    """Time at stake: the worst rank's time per step beyond the median in its slow instances
    (a union: collectives_excess says why not the sum over instances)."""
    if bad.is_empty() or by_rank.is_empty():
        return []
    per = (
        by_rank.group_by("rank")
        .agg(pl.col("excess_ns").sum())
        .sort(["excess_ns", "rank"], descending=[True, False])
    )
    top = per.row(0, named=True)
    per_step = int(top["excess_ns"] / steps)
    if per_step < p.slow_warn_ns:
        return []
    worst = bad.sort("x", descending=True, maintain_order=True).row(0, named=True)
    return [
        Finding(
            code="COLLECTIVE_SLOW",
            severity=Severity.WARNING,
            message=(
                f"{bad.height} collective instance(s) took over {p.slow_factor:g}x the median "
                f"of their kind; rank {top['rank']} spends {per_step / 1e6:.1f} ms per step "
                f"in them beyond it; worst: "
                f"{_name(names, worst['pg_name'])} {worst['op']} seq {worst['seq']}, "
                f"{worst['time_ns'] / 1e6:.2f} ms vs median "
                f"{worst['time_ns'] / worst['time_vs_median'] / 1e6:.2f} ms"
            ),
            fix=(
                "slow outliers of the same collective point at contention (other traffic "
                "on the same links), a flaky link/NIC, or the host "
                "descheduling the communication (CPU pinning); compare them with the "
                "contention analysis"
            ),
            time_at_stake_ns=per_step,
            ranks=tuple(int(r) for r in per.filter(pl.col("excess_ns") > 0)["rank"].sort()),
            steps=tuple(sorted({int(s) for s in bad["step"].drop_nulls()})),
            window_ns=_around(int(worst["start_ns"]), int(worst["end_ns"])),
            value=float(worst["time_vs_median"]),
            threshold=p.slow_factor,
        )
    ]


def _around(start: int, end: int) -> tuple[int, int]:
    """The worst instance with half its length either side: the timeline link lands on it
    (not on the first step, which may hold none) and shows what ran around it."""
    pad = (end - start) // 2
    return start - pad, end + pad


def _low(table: pl.DataFrame, p: Params, names: dict[str, str]) -> list[Finding]:
    bad = table.filter(
        (pl.col("bytes") >= p.bandwidth_bound_bytes)
        & (pl.col("peak_fraction") < p.low_busbw_fraction)
    )
    if bad.is_empty():
        return []
    worst = bad.sort("peak_fraction", maintain_order=True).row(0, named=True)
    return [
        Finding(
            code="COLLECTIVE_BUSBW_LOW",
            severity=Severity.WARNING,
            message=(
                f"{worst['op']} of {worst['bytes'] / 2**20:.0f} MiB on "
                f"{_name(names, worst['pg_name'])} ({worst['link']}) reaches "
                f"{worst['busbw_gbps']:.1f} GB/s bus bandwidth, {worst['peak_fraction']:.0%} "
                f"of the {worst['peak_gbps']:g} GB/s link peak"
            ),
            fix=(
                "large collectives should run near the link peak: check the NCCL topology "
                "(NCCL_DEBUG=INFO: NVLink/IB used?), channel count (NCCL_MIN_NCHANNELS), "
                "concurrent traffic and GPU placement of the group"
            ),
            value=float(worst["peak_fraction"]),
            threshold=p.low_busbw_fraction,
        )
    ]
