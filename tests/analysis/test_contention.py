"""contention on hand-built GPU traces whose slowdowns are worked out by hand.

Times in the traces are µs; tables are ns (`* US`). One rank, one step [0, 1100):

stream 7 (compute), class gemm grid [128,1,1] block [256,1,1]:
  alone      [0,100) [100,200) [200,300)                  -> T_alone = median = 100
  overlapped [300,420) [420,560)  (AllReduce beside)       -> T_overlapped = mean = 130
  partial    [680,780)  (AllReduce covers [680,700): 20%)  -> left out
  slowdown = 130 / 100 - 1 = 0.30; time lost = 20 + 40 = 60
class gemm grid [64,1,1]: only overlapped [560,600)          -> no baseline, slowdown NULL
stream 9: AllReduce (DP group) [300,700)
stream 20: SendRecv (PP group) alone [800,850) [850,900) [900,950) durations 50;
           beside the AllReduce [300,380) [380,460) [460,540) durations 80
           -> slowdown 80 / 50 - 1 = 0.6, time lost 3 * 30 = 90
stream 11: H2D copy [1000,1100); compute (stream 7, 'attn') [1050,1100) -> hidden 50, exposed 50
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest
from kineto_builder import KinetoTrace, PgConfig, cpu_trace
from lookups import one
from ranklens.analysis import contention

US = 1000
Ingest = Callable[..., duckdb.DuckDBPyConnection]
BIG = {"grid": [128, 1, 1], "block": [256, 1, 1]}
SMALL = {"grid": [64, 1, 1], "block": [256, 1, 1]}


def _trace() -> KinetoTrace:
    dp = PgConfig("1", [0, 1], "DATA_PARALLEL_GROUP")
    pp = PgConfig("2", [0, 2], "PIPELINE_MODEL_PARALLEL_GROUP")
    t = KinetoTrace(rank=0, world_size=4, pg_config=[dp, pp])
    t.step(1, -10, 1200)
    for s, d in ((0, 100), (100, 100), (200, 100), (300, 120), (420, 140), (680, 100)):
        t.kernel("gemm", s, d, stream=7, args=BIG)
    t.kernel("gemm", 560, 40, stream=7, args=SMALL)
    t.nccl("AllReduce", 300, 400, stream=9, coll="allreduce", pg_name="1", group_size=2)
    for s, d in ((800, 50), (850, 50), (900, 50), (300, 80), (380, 80), (460, 80)):
        t.nccl("SendRecv", s, d, stream=20, coll="send", pg_name="2", group_size=2)
    t.memcpy(1000, 100, nbytes=10_000_000, direction="HtoD (Pinned -> Device)", stream=11)
    t.kernel("attn", 1050, 50, stream=7, args=BIG)
    return t


def test_compute_slowdown_by_hand(ingest: Ingest) -> None:
    res = contention.run(ingest(_trace()))
    big = one(res.table, name="gemm", shape="grid=[128, 1, 1] block=[256, 1, 1]")
    got = (big["n_alone"], big["n_overlapped"], big["n_partial"], big["n_matched"])
    assert got == (3, 2, 1, 2)
    assert big["t_alone_ns"] == 100 * US and big["t_overlapped_ns"] == 130 * US
    assert big["slowdown"] == pytest.approx(0.30)
    assert big["time_lost_ns"] == 60 * US
    small = one(res.table, name="gemm", shape="grid=[64, 1, 1] block=[256, 1, 1]")
    assert small["n_overlapped"] == 1 and small["slowdown"] is None
    step = one(res.tables["by_step"], rank=0, step=1)
    # overlapped kernels: gemm x2 (big) + gemm (small); only the big ones have a baseline
    assert (step["overlapped_kernels"], step["overlapped_ns"]) == (3, 300 * US)
    assert step["time_lost_ns"] == 60 * US


def test_comm_beside_comm_by_hand(ingest: Ingest) -> None:
    res = contention.run(ingest(_trace()))
    pp = one(res.tables["comm"], parallelism="PP")
    assert (pp["n_alone"], pp["n_concurrent"], pp["n_matched"]) == (3, 3, 3)
    assert pp["t_alone_ns"] == 50 * US and pp["t_concurrent_ns"] == 80 * US
    assert pp["slowdown"] == pytest.approx(0.6) and pp["time_lost_ns"] == 90 * US
    # the AllReduce ran once, always beside SendRecv: nothing to compare it with
    assert one(res.tables["comm"], parallelism="DP")["slowdown"] is None


def test_comm_slowing_each_other_counts_once_per_rank_and_step(ingest: Ingest) -> None:
    """A PP SendRecv (stream 20) and a DP AllGather (stream 21) slow each other: in step 1 both
    run [100, 180), [180, 260), [260, 340) (80 µs each), in step 2 alone for 50 µs each. Both
    classes are 60% slower, 90 µs lost each; but each pair of runs loses the same last 30 µs
    of wall-clock time on the rank: 90 µs in step 1, none in step 2, so 45 µs per step. Summing
    the classes over the rank's steps said 180."""
    dp = PgConfig("1", [0, 1], "DATA_PARALLEL_GROUP")
    pp = PgConfig("2", [0, 2], "PIPELINE_MODEL_PARALLEL_GROUP")
    t = KinetoTrace(rank=0, world_size=4, pg_config=[dp, pp])
    t.step(1, 0, 600)
    t.step(2, 600, 1200)
    for start in (100, 180, 260):
        t.nccl("SendRecv", start, 80, stream=20, coll="send", pg_name="2", group_size=2)
        t.nccl("AllGather", start, 80, stream=21, coll="all_gather", pg_name="1", group_size=2)
    for start in (700, 750, 800):
        t.nccl("SendRecv", start, 50, stream=20, coll="send", pg_name="2", group_size=2)
        t.nccl("AllGather", start + 200, 50, stream=21, coll="all_gather", pg_name="1")
    res = contention.run(ingest(t))
    comm = res.tables["comm"].sort("parallelism")
    assert comm.select("parallelism", "slowdown", "time_lost_ns").rows() == [
        ("DP", pytest.approx(0.6), 90 * US),
        ("PP", pytest.approx(0.6), 90 * US),
    ]
    per_step = res.tables["comm_steps"].select("rank", "step", "lost_ns").rows()
    assert per_step == [(0, 1, 90 * US), (0, 2, 0)]
    f = {f.code: f for f in res.findings}["CONTENTION_COMM_SLOWDOWN"]
    assert f.time_at_stake_ns == 45 * US and f.ranks == (0,) and f.steps == (1,)
    assert "ms lost per step on rank 0" in f.message


def test_memcpy_hiding_by_hand(ingest: Ingest) -> None:
    res = contention.run(ingest(_trace()))
    cp = one(res.tables["memcpy"], rank=0, step=1)
    assert (cp["direction"], cp["copies"], cp["bytes"]) == ("HtoD", 1, 10_000_000)
    assert (cp["copy_ns"], cp["hidden_ns"], cp["exposed_ns"]) == (100 * US, 50 * US, 50 * US)
    assert cp["hidden_ratio"] == pytest.approx(0.5)
    assert cp["gb_per_s"] == pytest.approx(10_000_000 / (100 * US))


def test_findings_name_the_fix(ingest: Ingest) -> None:
    res = contention.run(ingest(_trace()))
    codes = {f.code: f for f in res.findings}
    f = codes["CONTENTION_COMPUTE_SLOWDOWN"]
    assert f.time_at_stake_ns == 60 * US and f.ranks == (0,)
    assert "NCCL" in f.fix and f.evidence["top_classes"][0]["name"] == "gemm"
    c = codes["CONTENTION_COMM_SLOWDOWN"]
    assert c.time_at_stake_ns == 90 * US and "stagger" in c.fix
    m = codes["CONTENTION_MEMCPY_EXPOSED"]
    assert m.time_at_stake_ns == 50 * US and "prefetch" in m.fix


def test_long_kernels_by_hand(ingest: Ingest) -> None:
    """Kernels over 1 ms take the range-join path: alone 3 x 2000 µs, then 1 x 2600 µs with
    an AllReduce [7000,9000) covering 2000 of it (77%), one with nothing beside it."""
    t = KinetoTrace(rank=0, world_size=2, pg_config=[PgConfig("1", [0, 1])])
    t.step(1, -10, 20000)
    for s, d in ((0, 2000), (2000, 2000), (4000, 2000), (6500, 2600), (12000, 2000)):
        t.kernel("big_gemm", s, d, stream=7, args=BIG)
    t.nccl("AllReduce", 7000, 2000, stream=9, coll="allreduce", pg_name="1", group_size=2)
    g = one(contention.run(ingest(t)).table, name="big_gemm")
    # alone: 2000, 2000, 2000, 2000 -> T_alone 2000; overlapped: 2600 -> +30%, 600 lost
    assert (g["n_alone"], g["n_overlapped"], g["n_partial"]) == (4, 1, 0)
    assert g["slowdown"] == pytest.approx(0.3) and g["time_lost_ns"] == 600 * US


def test_cpu_main_thread_p2p_waits_are_not_contention(ingest: Ingest) -> None:
    """gloo: a p2p span on the compute thread is a wait; only worker-thread spans compete."""
    t = cpu_trace(0)
    t.step(1, 0, 1000)
    for s in (0, 100, 200, 300, 400):
        t.host("aten::mm", s, 50, args={"Input Dims": [[16, 16], [16, 16]]})
    t.host("gloo:send", 0, 260, cat="user_annotation")  # main thread: a wait
    t.gloo("all_reduce", 390, 100)  # worker thread: competes for the cores
    res = contention.run(ingest(t))
    mm = one(res.table, name="aten::mm")
    assert (mm["n_alone"], mm["n_overlapped"]) == (4, 1)


def test_empty_database_has_the_documented_columns() -> None:
    from ranklens.ingest.schema import ddl

    con = duckdb.connect()
    con.execute(ddl())
    res = contention.run(con)
    assert list(res.table.columns) == list(contention.COLUMNS)
    assert not res.findings


# Persistent GEMM: one launch (grid = the 132 SMs) for every problem size. Per size: the host
# op's Input Dims, duration alone (µs), runs alone, runs beside an AllReduce (25% slower).
PERSISTENT = {"grid": [132, 1, 1], "block": [384, 1, 1]}
SIZES = (
    ([[1024, 1024], [1024, 1024]], 100, 3, 8),
    ([[2048, 2048], [2048, 1024]], 400, 3, 2),
    ([[4096, 4096], [4096, 1024]], 1600, 5, 1),
)


def _persistent_gemm_trace() -> tuple[KinetoTrace, float]:
    """One rank: the runs of SIZES back to back on stream 7, each overlapped run exactly under
    an NCCL AllReduce on stream 9; returns the trace and the injected time lost (µs)."""
    t = KinetoTrace(rank=0, world_size=2, pg_config=[PgConfig("1", [0, 1])])
    runs = [(dims, d, False) for dims, d, n, _ in SIZES for _ in range(n)]
    runs += [(dims, d, True) for dims, d, _, n in SIZES for _ in range(n)]
    cursor, ext = 0.0, 1
    for dims, alone, beside in runs:
        dur = alone * 1.25 if beside else alone
        t.host("aten::mm", cursor - 3, 2.5, args={"External id": ext, "Input Dims": dims})
        t.kernel("sm90_gemm_persistent", cursor, dur, args={**PERSISTENT, "External id": ext})
        if beside:
            t.nccl("AllReduce", cursor, dur, stream=9, coll="allreduce", pg_name="1", group_size=2)
        cursor, ext = cursor + dur + 10, ext + 1
    t.step(1, -10, cursor)
    return t, sum(0.25 * d * n for _, d, _, n in SIZES)


def test_persistent_gemm_classed_by_input_shapes(ingest: Ingest) -> None:
    """Three problem sizes share one kernel name and launch: classed by name + launch only,
    mostly-small overlapped runs against a mostly-large alone median read as a speed-up."""
    trace, lost_us = _persistent_gemm_trace()
    alone = sorted(d for _, d, n, _ in SIZES for _ in range(n))
    beside = [d * 1.25 for _, d, _, n in SIZES for _ in range(n)]
    pooled = sum(beside) / len(beside) / alone[len(alone) // 2] - 1
    assert pooled < 0  # what name + launch alone would report: about -9%
    res = contention.run(ingest(trace))
    (f,) = [f for f in res.findings if f.code == "CONTENTION_COMPUTE_SLOWDOWN"]
    assert f.value == pytest.approx(0.25, abs=0.03)
    assert f.time_at_stake_ns == pytest.approx(lost_us * US, rel=0.10)
    assert res.table.height == 3  # one class per size
    for row in res.table.iter_rows(named=True):
        assert "inputs=[[" in row["shape"] and row["slowdown"] == pytest.approx(0.25)
    assert int(res.table["time_lost_ns"].sum()) == pytest.approx(lost_us * US, rel=0.10)
    step = one(res.tables["by_step"], rank=0, step=1)
    assert step["time_lost_ns"] == pytest.approx(lost_us * US, rel=0.10)


def test_kernel_without_a_host_op_keeps_its_launch_class(ingest: Ingest) -> None:
    """A kernel whose External id names no host op is classed by name + launch, as before."""
    t = KinetoTrace(rank=0, world_size=2, pg_config=[PgConfig("1", [0, 1])])
    t.step(1, -10, 1000)
    for s in (0, 100, 200):
        t.kernel("gemm", s, 50, stream=7, args={**BIG, "External id": 99})
    t.host("aten::mm", 400, 10, args={"External id": 77, "Input Dims": [[8, 8], [8, 8]]})
    res = contention.run(ingest(t))
    assert list(res.table["shape"]) == ["grid=[128, 1, 1] block=[256, 1, 1]"]


def test_copies_both_ways_are_one_steps_exposed_time(ingest: Ingest) -> None:
    """H2D exposed 50 µs and D2H [1120,1150) exposed 30 µs in the one step: 80 µs per step.
    The finding divided by rows (one per direction) and said 40 (a public Nsight capture of
    copies only: "460 ms per step" in a 969 ms step where 920 ms of copies were exposed)."""
    t = _trace()
    t.memcpy(1120, 30, nbytes=1_000, direction="DtoH (Device -> Pageable)", stream=11)
    res = contention.run(ingest(t))
    dirs = res.tables["memcpy"].sort("direction")
    assert dirs["direction"].to_list() == ["DtoH", "HtoD"]
    assert dirs["exposed_ns"].to_list() == [30 * US, 50 * US]
    m = {f.code: f for f in res.findings}["CONTENTION_MEMCPY_EXPOSED"]
    assert m.time_at_stake_ns == 80 * US
    assert f"{80 * US / 1e6:.2f} ms per step" in m.message


def test_concurrent_copies_count_once(ingest: Ingest) -> None:
    """A D2H [1020,1080) on its own stream beside the H2D [1000,1100); compute [1050,1100).
    Per copy: H2D exposed 50, D2H exposed 30 ([1020,1050)), 80 in all. In wall-clock time
    the copies cover [1000,1100), of which [1000,1050) has no compute: 50 µs, the finding's
    figure (summing the copies said 80)."""
    t = _trace()
    t.memcpy(1020, 60, nbytes=1_000, direction="DtoH (Device -> Pinned)", stream=12)
    res = contention.run(ingest(t))
    assert int(res.tables["memcpy"]["exposed_ns"].sum()) == 80 * US
    wall = one(res.tables["memcpy_steps"], rank=0, step=1)
    assert (wall["copy_ns"], wall["exposed_ns"]) == (100 * US, 50 * US)
    m = {f.code: f for f in res.findings}["CONTENTION_MEMCPY_EXPOSED"]
    assert m.time_at_stake_ns == 50 * US


def test_a_step_without_copies_counts(ingest: Ingest) -> None:
    """Step 2 has compute and no copies: the rank's exposed copy time, 50 µs in step 1, is
    25 µs per step over its two steps (not 50 over the one step that had copies)."""
    t = _trace()
    t.step(2, 1200, 2200)
    t.kernel("gemm", 1300, 100, stream=7, args=BIG)
    res = contention.run(ingest(t))
    wall = res.tables["memcpy_steps"].sort("step")
    assert wall.select("step", "copy_ns", "exposed_ns").rows() == [
        (1, 100 * US, 50 * US),
        (2, 0, 0),
    ]
    m = {f.code: f for f in res.findings}["CONTENTION_MEMCPY_EXPOSED"]
    assert m.time_at_stake_ns == 25 * US


def test_public_copies_per_step(shared_traces: Path, tmp_path: Path) -> None:
    """HTA's trace_diff test trace (rank 1, 6 steps, H2D and D2H copies in each): the finding's
    figure is all exposed copy time over the rank's steps, 14.787 ms / 6 = 2.4645 ms (worked
    out by hand from the per-direction rows: 14,749 µs H2D + 38 µs D2H)."""
    from ranklens.ingest import load_traces

    db = tmp_path / "t.duckdb"
    load_traces([shared_traces / "hta-testdata/trace_diff/test/test.json.gz"], db)
    con = duckdb.connect(str(db), read_only=True)
    res = contention.run(con)
    n_steps = con.execute("SELECT count(DISTINCT step) FROM steps WHERE rank = 1").fetchone()
    assert n_steps == (6,)
    mem = res.tables["memcpy"]
    assert mem.height == 12 and int(mem["exposed_ns"].sum()) == 14_787_000
    m = {f.code: f for f in res.findings}["CONTENTION_MEMCPY_EXPOSED"]
    assert m.time_at_stake_ns == 2_464_500 and m.ranks == (1,)
