"""collectives: algbw/busbw formulas on hand-built instances whose numbers are worked out by
hand, the link peak per GPU model, slow instances, and the hang/mismatch report."""

from __future__ import annotations

from collections.abc import Callable

import duckdb
import polars as pl
import pytest
from kineto_builder import PgConfig
from multirank import gpu_job
from ranklens.analysis import collectives

Ingest = Callable[..., duckdb.DuckDBPyConnection]
MIB = 1 << 20


def _inst(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    df: pl.DataFrame = collectives.run(con).tables["by_instance"].sort("instance_id")
    return df


@pytest.mark.parametrize(
    ("op", "nelems", "out_nelems", "n", "bytes_", "factor"),
    [
        # all-reduce of 64 Mi floats (256 MiB) on 4 ranks: f = 2(n-1)/n = 1.5
        ("all_reduce", 64 * MIB, None, 4, 256 * MIB, 1.5),
        # all-gather: bytes = the full output (4 x 16 Mi floats), f = (n-1)/n = 0.75
        ("all_gather", 16 * MIB, 64 * MIB, 4, 256 * MIB, 0.75),
        # reduce-scatter: bytes = the full input, f = (n-1)/n
        ("reduce_scatter", 64 * MIB, 16 * MIB, 4, 256 * MIB, 0.75),
        ("all_to_all", 64 * MIB, None, 4, 256 * MIB, 0.75),
        ("broadcast", 64 * MIB, None, 4, 256 * MIB, 1.0),
        # 8 ranks: all-reduce f = 2 * 7 / 8
        ("all_reduce", 64 * MIB, None, 8, 256 * MIB, 1.75),
    ],
)
def test_busbw_formulas(
    ingest: Ingest, op: str, nelems: int, out_nelems: int | None, n: int, bytes_: int, factor: float
) -> None:
    """Ranks arrive 0..300 µs apart and all end at 3,000 µs: the last arrival's duration,
    2,000 µs, is the skew-free time. algbw = bytes / 2 ms; busbw = algbw x f(n)."""
    job = gpu_job(n)
    starts = {r: 1000 - 100 * (r % 4) for r in range(n)}
    job.collective(op, starts, 3000, nelems=nelems, out_nelems=out_nelems)
    row = _inst(ingest(job.traces)).row(0, named=True)
    assert row["bytes"] == bytes_ and row["group_size"] == n
    assert row["time_ns"] == 2_000_000 and row["max_dur_ns"] == 2_300_000
    algbw = bytes_ / 2_000_000  # bytes per ns = GB/s
    assert row["algbw_gbps"] == pytest.approx(algbw)
    assert row["busbw_gbps"] == pytest.approx(algbw * factor)
    # H100 SXM, one host: NVLink 450 GB/s per direction
    assert row["link"] == "nvlink" and row["peak_gbps"] == 450.0
    assert row["peak_fraction"] == pytest.approx(algbw * factor / 450.0)


def test_p2p_pair_factor_one_and_network_peak(ingest: Ingest) -> None:
    """A send/recv pair moves its bytes once (f = 1); the two ranks are on two hosts, so the
    peak is the network's (25 GB/s per GPU assumed)."""
    pp = PgConfig("1", [0, 1], "PIPELINE_MODEL_PARALLEL_GROUP")
    job = gpu_job(2, hosts=["a", "b"], groups=[pp])
    job.collective("send", {0: 1000}, 2000, pg="1", nelems=4 * MIB)
    job.collective("recv", {1: 1500}, 2000, pg="1", nelems=4 * MIB)
    row = _inst(ingest(job.traces)).row(0, named=True)
    assert (row["op"], row["group_size"], row["bytes"]) == ("p2p", 2, 16 * MIB)
    assert row["time_ns"] == 500_000
    assert row["busbw_gbps"] == pytest.approx(16 * MIB / 500_000)
    assert (row["link"], row["peak_gbps"]) == ("network", 25.0)


def test_slow_instance_and_low_busbw(ingest: Ingest) -> None:
    """Ten 256 MiB all-reduces of 2 ms, one of 20 ms: that one is slow (10x the median), and
    all of them run far below NVLink's peak."""
    job = gpu_job(2)
    for k in range(11):
        t0 = 1000 + 30_000 * k
        dur = 20_000 if k == 5 else 2_000
        job.collective("all_reduce", {0: t0, 1: t0}, t0 + dur, nelems=64 * MIB)
    con = ingest(job.traces)
    res = collectives.run(con)
    inst = res.tables["by_instance"]
    assert inst.filter(pl.col("slow"))["seq"].to_list() == [5]
    (row,) = res.table.to_dicts()
    assert row["slow_instances"] == 1 and row["instances"] == 11
    codes = {f.code: f for f in res.findings}
    assert codes["COLLECTIVE_SLOW"].time_at_stake_ns == 18_000_000
    # the link lands on the slow one, [151, 171) ms (the first starts at 1 ms), with half its
    # length either side
    t = int(inst["start_ns"].min()) - 1_000_000
    w = codes["COLLECTIVE_SLOW"].window_ns
    assert w is not None and (w[0] - t, w[1] - t) == (141_000_000, 181_000_000)
    # busbw = 256 MiB / 2 ms x 2(2-1)/2 = 134 GB/s: 30% of 450
    assert "COLLECTIVE_BUSBW_LOW" not in codes
    res = collectives.run(con, collectives.Params(low_busbw_fraction=0.5))
    assert "COLLECTIVE_BUSBW_LOW" in {f.code for f in res.findings}


def test_slow_instances_of_two_groups_at_once_are_no_ranks_double_time(ingest: Ingest) -> None:
    """Groups [0, 1] and [2, 3] each run ten 2 ms all-reduces and one of 20 ms, at the same
    time: each of their ranks spends 18 ms beyond the median, [153, 171) ms. DP group [0, 2]
    runs ten 2 ms all-reduces on another stream and one of 20 ms at [161, 181) ms, whose
    excess [163, 181) overlaps the TP one by 8 ms: ranks 0 and 2 spend 18 + 18 - 8 = 28 ms.
    At stake: the worst rank's 28 ms (summing the three instances said 54 ms, a figure no
    rank spent, and one that grows with the number of groups)."""
    tp = [PgConfig("1", [0, 1], "TENSOR_MODEL_PARALLEL_GROUP")]
    tp += [PgConfig("2", [2, 3], "TENSOR_MODEL_PARALLEL_GROUP")]
    dp = PgConfig("3", [0, 2], "DATA_PARALLEL_GROUP")
    job = gpu_job(4, groups=[*tp, dp], step_us=1_000_000)
    for k in range(11):
        t0 = 1000 + 30_000 * k
        dur = 20_000 if k == 5 else 2_000
        for pg, ranks in (("1", (0, 1)), ("2", (2, 3))):
            job.collective("all_reduce", dict.fromkeys(ranks, t0), t0 + dur, pg=pg)
        # DP on stream 30: its slow one starts 10 ms after the slow TP ones
        t1 = 500_000 + 30_000 * k if k != 5 else t0 + 10_000
        job.collective("all_reduce", {0: t1, 2: t1}, t1 + dur, pg="3", nelems=1 << 22, stream=30)
    res = collectives.run(ingest(job.traces))
    assert res.tables["by_instance"]["slow"].sum() == 3
    by_rank = res.tables["slow_by_rank"].sort("rank")
    assert by_rank.select("rank", "excess_ns").rows() == [
        (0, 28_000_000),
        (1, 18_000_000),
        (2, 28_000_000),
        (3, 18_000_000),
    ]
    f = {f.code: f for f in res.findings}["COLLECTIVE_SLOW"]
    assert f.time_at_stake_ns == 28_000_000 and f.ranks == (0, 1, 2, 3)
    assert "rank 0 spends 28.0 ms per step in them beyond it" in f.message


def test_a_slow_instance_whose_peers_are_absent_is_no_finding(ingest: Ingest) -> None:
    """Rank 0 of a 2-rank group, traced alone: its 20 ms all-reduce among 2 ms ones is flagged
    slow in the table, but its duration includes waiting for a peer the run does not hold,
    so COLLECTIVE_SLOW does not rest on it."""
    job = gpu_job(2)
    for k in range(11):
        t0 = 1000 + 30_000 * k
        job.collective("all_reduce", {0: t0, 1: t0}, t0 + (20_000 if k == 5 else 2_000))
    res = collectives.run(ingest(job.traces[:1]))
    inst = res.tables["by_instance"]
    assert not inst["skew_free"].any() and inst.filter(pl.col("slow"))["seq"].to_list() == [5]
    assert "COLLECTIVE_SLOW" not in {f.code for f in res.findings}
    assert res.tables["slow_by_rank"].is_empty()


def test_hang_case_reported(ingest: Ingest) -> None:
    """Rank 3 of 4 never joins the last all-reduce: the instance is excluded from bandwidth
    and reported as the hang culprit."""
    job = gpu_job(4)
    job.collective("all_reduce", dict.fromkeys(range(4), 1000), 2000)
    job.collective("all_reduce", dict.fromkeys(range(3), 3000), 4000)
    res = collectives.run(ingest(job.traces))
    assert res.table["instances"].to_list() == [1]
    (f,) = [f for f in res.findings if f.code == "COLLECTIVE_MISMATCH"]
    assert f.ranks == (3,) and "never joined" in f.message
