"""pipeline on hand-built GPU traces whose bubbles, phases and decomposition are worked out by
hand, plus the replay model and the SQL helpers on their own.

Times in the traces are µs (the tables are ns, hence `* US`). Two stages (ranks 0 and 1, PP
group "5"), GPipe with m = 2, F = 100 µs and B = 200 µs on both stages, NCCL SendRecv kernels
on stream 20 (a waiting stage spins in a long recv kernel), compute on stream 7, one step:

stage 0: F0 [0,100) send [100,110) F1 [110,210) send [210,220) recv(spin) [220,530)
         B0 [530,730) recv [730,740) B1 [740,940) opt [940,960)
stage 1: recv(spin) [0,110) F0 [110,210) recv [210,220) F1 [220,320) B0 [320,520)
         send [520,530) B1 [530,730) send [730,740) idle opt [940,960)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import duckdb
import polars as pl
import pytest
from kineto_builder import KinetoTrace, PgConfig
from lookups import one
from ranklens.analysis import Result, pipeline
from ranklens.analysis._sql import sql_text
from ranklens.analysis.pipeline_model import Block, decompose, replay
from ranklens.sample_traces.gpu_sim import stage_order

US = 1000
Ingest = Callable[..., duckdb.DuckDBPyConnection]
PP = PgConfig("5", [0, 1], "PIPELINE_MODEL_PARALLEL_GROUP")


def _stage(rank: int, annotate: bool = True) -> KinetoTrace:
    t = KinetoTrace(rank=rank, world_size=2, pg_config=[PP])
    t.step(1, -10, 1000)
    p2p: dict[str, Any] = {"pg_name": "5", "pg_ranks": [0, 1], "group_size": 2, "stream": 20}
    if rank == 0:
        blocks = [("forward_mb0", 0, 100), ("forward_mb1", 110, 100)]
        blocks += [("backward_mb0", 530, 200), ("backward_mb1", 740, 200)]
        ops = [(100, 10, "send"), (210, 10, "send"), (220, 310, "recv"), (730, 10, "recv")]
    else:
        blocks = [("forward_mb0", 110, 100), ("forward_mb1", 220, 100)]
        blocks += [("backward_mb0", 320, 200), ("backward_mb1", 530, 200)]
        ops = [(0, 110, "recv"), (210, 10, "recv"), (520, 10, "send"), (730, 10, "send")]
    for s, d, coll in ops:
        t.nccl("SendRecv", s, d, coll=coll, **p2p)
    for name, s, d in blocks:
        t.kernel("gemm_" + name.split("_")[0], s, d, stream=7)
        if annotate:
            t.device_event("gpu_user_annotation", name, s, d, stream=7, launched=False)
    t.kernel("sgd", 940, 20, stream=7)
    return t


def in_us(row: dict[str, Any], cols: Iterable[str]) -> dict[str, int]:
    """The ns columns `cols` of `row`, in whole µs."""
    return {k: row[k] // US for k in cols}


@pytest.fixture
def gpipe(ingest: Ingest) -> Result:
    return pipeline.run(ingest([_stage(0), _stage(1)]))


def test_bubble_and_phases_by_hand(gpipe: Result) -> None:
    t = gpipe.table
    s0, s1 = one(t, rank=0), one(t, rank=1)
    assert (s0["stage"], s1["stage"], s0["pp_size"]) == (0, 1, 2)
    # W = [0, 960) on both; work = F0 + F1 + B0 + B1 = 100 + 100 + 200 + 200 = 600.
    # stage 0 bubble: send [100,110) + send/recv spin [210,530) + recv [730,740) = 340, all of
    # it inside SendRecv kernels (pp_wait), none idle; opt [940,960) is other busy.
    # Phases: first backward starts 530 (warm-up [0,530): 10 + 320 = 330), last forward ends
    # 210 (< 530: no steady state), cool-down [530,960): 10.
    want = {
        "window_ns": 960,
        "work_ns": 600,
        "other_busy_ns": 20,
        "bubble_ns": 340,
        "pp_wait_ns": 340,
        "idle_ns": 0,
        "warmup_bubble_ns": 330,
        "steady_bubble_ns": 0,
        "cooldown_bubble_ns": 10,
    }
    assert in_us(s0, want) == want
    # stage 1: recv spin [0,110) + recv [210,220) + send [520,530) + send [730,740) = 140 in
    # PP kernels, idle [740,940) = 200 -> bubble 340. First backward at 320 = last forward end:
    # warm-up [0,320) holds 110 + 10, cool-down the other 220.
    want = {
        "bubble_ns": 340,
        "pp_wait_ns": 140,
        "idle_ns": 200,
        "warmup_bubble_ns": 120,
        "steady_bubble_ns": 0,
        "cooldown_bubble_ns": 220,
    }
    assert in_us(s1, want) == want
    assert s0["bubble_fraction"] == pytest.approx(340 / 940)
    # GPipe, p = 2, m = 2: fraction of total (p-1)/(m+p-1) = 1/3.
    assert (s0["schedule"], s0["microbatches"]) == ("gpipe", 2)
    assert s0["closed_form"] == pytest.approx(1 / 3)
    assert s0["excess"] == pytest.approx(340 / 940 - 1 / 3)
    assert s0["block_source"] == "annotation"


def test_gantt_blocks(gpipe: Result) -> None:
    b = gpipe.tables["blocks"].filter(pl.col("rank") == 1).sort("start_ns")
    assert [(r["phase"], r["mb"], r["dur_ns"] // US) for r in b.iter_rows(named=True)] == [
        ("F", 0, 100),
        ("F", 1, 100),
        ("B", 0, 200),
        ("B", 1, 200),
    ]


def test_decomposition_by_hand(gpipe: Result) -> None:
    s = gpipe.tables["schedule"].row(0, named=True)
    # closed-form bubble = (p-1)/m * mean work = 1/2 * 600 = 300; measured mean 340: excess 40.
    # Uniform replay: 900 = 600 + 300 (order 0); stages equal (imbalance 0); all F = 100 and
    # B = 200 (variance 0). Waiting edges F(1,0) and B(0,0) lag 10 -> latency 10; replay with
    # it ends at 920: p2p = 20; unexplained = 340 - (920 - 600) = 20.
    assert s["decomposition"] == "ok"
    want = {
        "closed_bubble_ns": 300,
        "excess_ns": 40,
        "order_ns": 0,
        "imbalance_ns": 0,
        "microbatch_variance_ns": 0,
        "p2p_ns": 20,
        "unexplained_ns": 20,
        "p2p_latency_ns": 10,
    }
    assert in_us(s, want) == want
    assert (s["p"], s["m"], s["v"], s["schedule_source"]) == (2, 2, 1, "inferred")
    assert "(p-1)/(m+p-1)" in s["convention"]


def test_schedule_finding_has_fix_and_evidence(gpipe: Result) -> None:
    f = next(x for x in gpipe.findings if x.code == "PIPELINE_BUBBLE_SCHEDULE")
    assert f.ranks == (0, 1) and f.steps == (1,) and f.window_ns is not None
    assert "m=4" in f.fix and "interleaved" in f.fix
    assert f.time_at_stake_ns == 150 * US  # half the closed-form bubble (doubling m)


def test_user_schedule_overrides_inference(ingest: Ingest) -> None:
    con = ingest([_stage(0), _stage(1)])
    res = pipeline.run(
        con, pipeline.Params(schedule="interleaved", microbatches=2, virtual_stages=2)
    )
    s = res.tables["schedule"].row(0, named=True)
    # Megatron's fraction of ideal (p-1)/(v*m) = 1/4, as a fraction of total 0.25/1.25 = 0.2
    assert s["closed_form_ideal"] == pytest.approx(0.25)
    assert s["closed_form"] == pytest.approx(0.2)
    assert s["schedule_source"] == "user" and "(v*m)" in s["convention"]


def test_blocks_from_p2p_order_without_annotations(ingest: Ingest) -> None:
    """No phase ranges: blocks between SendRecv kernels, direction from the neighbour stage's
    kernel that runs at the same time. Stage 1 (last) fuses F1 and B0 between the recv of F1
    and the send of B0's gradient: F0 [110,210), FB1 [220,520), B1 [530,730): the send of
    B0's gradient [520,530) before B1 is waiting, not micro-batch work."""
    res = pipeline.run(ingest([_stage(0, annotate=False), _stage(1, annotate=False)]))
    b = res.tables["blocks"].sort("rank", "start_ns")
    seq = {
        r: [
            (x["phase"], x["mb"], x["dur_ns"] // US)
            for x in b.filter(pl.col("rank") == r).iter_rows(named=True)
        ]
        for r in (0, 1)
    }
    assert [p[:2] for p in seq[0]] == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    assert seq[1] == [("F", 0, 100), ("FB", 1, 300), ("B", 1, 200)]
    s1 = one(res.table, rank=1)
    # blocks cover [110,210) [220,520) [520,730): bubble = [0,110) + [210,220) + [730,940)
    # = 330, of which PP kernels 110 + 10 + 10 = 130, idle 200.
    assert (s1["bubble_ns"], s1["pp_wait_ns"], s1["idle_ns"]) == (340 * US, 140 * US, 200 * US)
    assert s1["block_source"] == "p2p_order"
    assert one(res.tables["schedule"], step=1)["schedule"] == "gpipe"


def test_no_pipeline_no_rows(ingest: Ingest) -> None:
    t = KinetoTrace(rank=0, world_size=1)
    t.step(1, 0, 100)
    t.kernel("gemm", 10, 50)
    res = pipeline.run(ingest(t))
    assert res.table.is_empty() and not res.findings


# -- the replay model alone ---------------------------------------------------------------------
def _one_f_one_b(p: int, m: int, tf: float, tb: float) -> float | None:
    order = {s: [(s, ph, i) for ph, _, i in stage_order("1f1b", p, m, 1, s)] for s in range(p)}
    dur = {k: (tf if k[1] == "F" else tb) for seq in order.values() for k in seq}
    return replay(p, order, dur)


@pytest.mark.parametrize(("p", "m"), [(2, 2), (4, 8), (4, 2), (8, 3)])
def test_replay_uniform_1f1b_is_closed_form(p: int, m: int) -> None:
    # (m + p - 1) (tF + tB): the textbook makespan behind (p-1)/(m+p-1)
    assert _one_f_one_b(p, m, 3.0, 5.0) == pytest.approx((m + p - 1) * 8.0)


def test_decompose_slow_stage_is_imbalance() -> None:
    """Stage 1 of 2 takes twice as long for every block: all excess is imbalance."""
    blocks, t = [], {0: 0.0, 1: 0.0}
    order = [
        (0, "F", 0),
        (0, "F", 1),
        (1, "F", 0),
        (1, "F", 1),
        (1, "B", 0),
        (1, "B", 1),
        (0, "B", 0),
        (0, "B", 1),
    ]
    dur = {0: {"F": 10, "B": 20}, 1: {"F": 20, "B": 40}}
    ends: dict[tuple[int, str, int], float] = {}
    for s, ph, i in order:
        dep = (
            (s - 1, "F", i) if ph == "F" and s else (s + 1, "B", i) if ph == "B" and s < 1 else None
        )
        start = max(t[s], ends.get(dep, 0.0) if dep else 0.0)
        ends[(s, ph, i)] = t[s] = start + dur[s][ph]
        blocks.append(Block(s, ph, i, int(start), int(t[s])))
    makespan = max(ends.values())
    work = (60 + 120) / 2
    dec, why = decompose(blocks, 2, 2, 0.5, makespan - work)
    assert why == "ok" and dec is not None
    assert dec.variance_ns == pytest.approx(0) and dec.p2p_ns == pytest.approx(0)
    assert dec.unexplained_ns == pytest.approx(0)
    assert dec.imbalance_ns > 0
    assert dec.order_ns + dec.imbalance_ns == pytest.approx(makespan - work - 0.5 * work)


def test_stage_inference_from_gloo_peers() -> None:
    """Unlabeled groups: only the group whose group-local peers are consistent is a pipeline."""
    con = duckdb.connect()
    from ranklens.ingest.schema import ddl

    con.execute(ddl())
    con.execute(
        "INSERT INTO process_groups (pg_name, ranks, size) VALUES "
        "('a', [0, 1], 2), ('b', [0, 2], 2), ('c', [1, 3], 2), ('d', [2, 3], 2)"
    )
    # pipeline [0, 2] and [1, 3]: rank 0 sends to group-local 1, rank 2 receives from 0, ...
    rows = []
    for rank, peer, op in ((0, 1, "send"), (2, 0, "recv"), (1, 1, "send"), (3, 0, "recv")):
        rows.append(
            f"({rank}, 'cpu_op', 'c10d::{'recv_' if op == 'recv' else op}', -1, 1, "
            f'\'{op}\', \'["", "", "{peer}", "0"]\')'
        )
    con.execute(
        "INSERT INTO events_rich (rank, kind, name, device, step, coll_op, concrete) VALUES "
        + ", ".join(rows)
    )
    con.execute(sql_text("intervals"))
    con.execute(sql_text("pipeline"))
    got = con.sql("SELECT rank, pp_group, stage FROM pipeline_stages ORDER BY rank").fetchall()
    assert got == [(0, "b", 0), (1, "c", 0), (2, "b", 1), (3, "c", 1)]
