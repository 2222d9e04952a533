"""breakdown and overlap on tiny hand-built traces whose answers are worked out by hand.

Times in the traces are µs from the trace origin; the tables are in ns, hence the `* US`.
Notation: C = union of compute, M = union of communication, Mem = union of memcpy/memset,
W = [first start, last end] of the step's device work, idle = |W| - |C ∪ M ∪ Mem|.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest
from kineto_builder import BASE_NS, Flavour, KinetoTrace, PgConfig, cpu_trace
from lookups import one
from ranklens.analysis import breakdown, overlap

US = 1000  # ns per µs
Ingest = Callable[..., duckdb.DuckDBPyConnection]


def rows(df: pl.DataFrame, *cols: str) -> list[dict[str, Any]]:
    return df.select(cols).to_dicts() if cols else df.to_dicts()


# -- one GPU step: touching, nested, concurrent streams, zero-length, memcpy under compute -----
def mixed_step(flavour: Flavour = "new") -> KinetoTrace:
    """rank 0, ProfilerStep#1 on the host [0, 1000); kernels launched 1 µs before they start.

    stream 7: gemm_a [100,200) touching gemm_b [200,300); memset [120,140); empty [410,410);
              tail [480,500)
    stream 8: gemm_c [150,250)  (a second compute stream, overlapping both gemms)
    stream 9: AllReduce [250,400)
    stream 10: memcpy [420,460)
    """
    t = KinetoTrace(rank=0, world_size=1, flavour=flavour)
    t.step(1, 0, 1000)
    t.kernel("gemm_a", 100, 100, stream=7)
    t.kernel("gemm_b", 200, 100, stream=7)
    t.kernel("gemm_c", 150, 100, stream=8)
    t.memset(120, 20, stream=7)
    t.nccl("AllReduce", 250, 150, stream=9)
    t.kernel("empty", 410, 0, stream=7)
    t.memcpy(420, 40, stream=10)
    t.kernel("tail", 480, 20, stream=7)
    return t


def test_mixed_step_breakdown(ingest: Ingest) -> None:
    con = ingest(mixed_step())
    row = one(breakdown.run(con).table, rank=0, step=1)
    # W = [100, 500): first start gemm_a 100, last end tail 500 -> 400
    # C = [100,300) (gemm_a ∪ gemm_b touching ∪ gemm_c nested across streams) ∪ [480,500)
    #   = 200 + 20 = 220 (not 100+100+100+20 = 320: concurrent streams do not double count);
    #   the zero-length kernel at 410 adds 0
    # M = [250,400) = 150; exposed comm = M \ C = [300,400) = 100
    # Mem = [120,140) ∪ [420,460) = 20 + 40 = 60; exposed memory (nothing else) = [420,460) = 40
    # busy = [100,400) ∪ [420,460) ∪ [480,500) = 300 + 40 + 20 = 360; idle = 400 - 360 = 40
    # exclusive split: 220 + 100 + 40 + 40 = 400 = W
    assert row["start_ns"] == BASE_NS + 100 * US
    assert {
        k: row[k]
        for k in (
            "window_ns",
            "compute_ns",
            "comm_ns",
            "memory_ns",
            "exposed_comm_ns",
            "exposed_memory_ns",
            "idle_ns",
        )
    } == {
        "window_ns": 400 * US,
        "compute_ns": 220 * US,
        "comm_ns": 150 * US,
        "memory_ns": 60 * US,
        "exposed_comm_ns": 100 * US,
        "exposed_memory_ns": 40 * US,
        "idle_ns": 40 * US,
    }
    assert row["compute_share"] == pytest.approx(220 / 400)
    assert row["comm_share"] == pytest.approx(150 / 400)
    assert row["idle_share"] == pytest.approx(40 / 400)


def test_mixed_step_overlap(ingest: Ingest) -> None:
    con = ingest(mixed_step())
    res = overlap.run(con)
    row = one(res.table, rank=0, step=1)
    # hidden = M ∩ C = [250,300) = 50; exposed = 150 - 50 = 100; ratio 50/150; share 100/400
    # (the memset under compute and the memcpy are neither C nor M)
    assert (
        row["window_ns"],
        row["comm_ns"],
        row["hidden_ns"],
        row["exposed_ns"],
        row["compute_ns"],
    ) == (400 * US, 150 * US, 50 * US, 100 * US, 220 * US)
    assert row["overlap_ratio"] == pytest.approx(1 / 3)
    assert row["exposed_share"] == pytest.approx(0.25)
    # the AllReduce has no group args: by_group keys it as '?' / all_reduce, parallelism UNKNOWN
    g = one(res.tables["by_group"], rank=0, step=1)
    assert (g["pg_name"], g["coll_op"], g["parallelism"], g["n_ops"]) == (
        "?",
        "all_reduce",
        "UNKNOWN",
        1,
    )
    assert (g["comm_ns"], g["hidden_ns"], g["exposed_ns"]) == (150 * US, 50 * US, 100 * US)


def test_old_and_new_flavour_give_identical_results(ingest: Ingest) -> None:
    # new: ts relative + baseTimeNanoseconds; old: ts = absolute epoch µs. Same instants.
    new = ingest(mixed_step("new"))
    old = ingest(mixed_step("old"))
    q = "SELECT kind, name, stream, ts_ns, dur_ns, step FROM events ORDER BY ALL"
    assert new.sql(q).fetchall() == old.sql(q).fetchall()
    assert new.sql("SELECT * FROM steps").fetchall() == old.sql("SELECT * FROM steps").fetchall()
    for mod in (breakdown, overlap):
        a, b = mod.run(new), mod.run(old)
        assert a.table.equals(b.table), mod.NAME
        for name in a.tables:
            assert a.tables[name].equals(b.tables[name]), (mod.NAME, name)


# -- two steps: kernels belong to the step that launched them, not the one they run in ---------
def test_two_steps_follow_the_launch(ingest: Ingest) -> None:
    t = KinetoTrace(rank=0)
    t.step(1, 0, 100)
    t.step(2, 100, 200)
    # launched in step 1 (host 10, 20) but running during host step 2 (GPU lag)
    t.kernel("fwd", 150, 100, launch=10)
    t.kernel("fwd2", 250, 50, launch=20)
    # launched in step 2
    t.nccl("AllReduce", 300, 100, stream=9, launch=110)
    t.kernel("opt", 320, 30, stream=7, launch=120)
    con = ingest(t)
    steps = con.sql(
        "SELECT step, start_ns - $b, end_ns - $b FROM steps ORDER BY step", params={"b": BASE_NS}
    ).fetchall()
    # step 1: W = [150, 300); step 2: W = [300, 400)
    assert steps == [(1, 150 * US, 300 * US), (2, 300 * US, 400 * US)]
    b = breakdown.run(con).table
    # step 1: C = [150,300) = 150 = W, idle 0
    s1 = one(b, step=1)
    assert (s1["window_ns"], s1["compute_ns"], s1["comm_ns"], s1["idle_ns"]) == (
        150 * US,
        150 * US,
        0,
        0,
    )
    # step 2: C = [320,350) = 30, M = [300,400) = 100, hidden 30, exposed 70, idle 0
    s2 = one(b, step=2)
    assert (
        s2["window_ns"],
        s2["compute_ns"],
        s2["comm_ns"],
        s2["exposed_comm_ns"],
        s2["idle_ns"],
    ) == (100 * US, 30 * US, 100 * US, 70 * US, 0)
    res = overlap.run(con)
    o2 = one(res.table, step=2)
    assert (o2["hidden_ns"], o2["exposed_ns"]) == (30 * US, 70 * US)
    assert o2["overlap_ratio"] == pytest.approx(0.3)
    assert one(res.table, step=1)["overlap_ratio"] is None
    # per rank: ratios of sums over the steps: W 250, M 100, hidden 30, exposed 70
    r = one(res.tables["by_rank"], rank=0)
    assert (r["steps"], r["window_ns"], r["comm_ns"], r["hidden_ns"], r["exposed_ns"]) == (
        2,
        250 * US,
        100 * US,
        30 * US,
        70 * US,
    )
    assert r["overlap_ratio"] == pytest.approx(0.3)
    assert r["exposed_share"] == pytest.approx(70 / 250)


# -- a kernel with no launch event (e.g. the runtime call was not recorded) ----------------------
def test_unlaunched_kernel_inside_the_window_extends_it(ingest: Ingest) -> None:
    t = KinetoTrace(rank=0)
    t.step(1, 0, 1000)
    t.kernel("gemm", 100, 100, stream=7)  # launched: W starts as [100, 200)
    t.kernel("orphan", 150, 200, stream=8, launched=False)  # [150,350): starts inside W
    con = ingest(t)
    # the orphan joins the step whose window holds its start, so W = [100, 350) = 250
    # C = [100,200) ∪ [150,350) = [100,350) = 250; idle 0 (never negative)
    assert con.sql("SELECT step FROM events WHERE name = 'orphan'").fetchall() == [(1,)]
    row = one(breakdown.run(con).table, step=1)
    assert (row["window_ns"], row["compute_ns"], row["idle_ns"]) == (250 * US, 250 * US, 0)
    assert row["compute_share"] == pytest.approx(1.0)


# -- a rank without communication ------------------------------------------------------------
def test_rank_without_communication(ingest: Ingest) -> None:
    busy = KinetoTrace(rank=0, world_size=2)
    busy.step(1, 0, 100)
    busy.kernel("k", 10, 20)
    busy.nccl("AllReduce", 20, 20, stream=9)
    quiet = KinetoTrace(rank=1, world_size=2)
    quiet.step(1, 0, 100)
    quiet.kernel("k", 10, 20)
    quiet.kernel("k", 40, 10)
    con = ingest([busy, quiet])
    res = overlap.run(con)
    # rank 1: W = [10,50) = 40, C = 20 + 10 = 30, M = 0 -> ratio undefined (None), exposed 0
    q = one(res.table, rank=1)
    assert (q["window_ns"], q["comm_ns"], q["hidden_ns"], q["exposed_ns"], q["compute_ns"]) == (
        40 * US,
        0,
        0,
        0,
        30 * US,
    )
    assert q["overlap_ratio"] is None
    assert q["exposed_share"] == 0
    assert one(res.tables["by_rank"], rank=1)["overlap_ratio"] is None
    assert res.tables["by_group"].filter(pl.col("rank") == 1).is_empty()
    # rank 0: W = [10,40) = 30, C = [10,30) = 20, M = [20,40) = 20, hidden [20,30) = 10
    b = one(res.table, rank=0)
    assert (b["comm_ns"], b["hidden_ns"], b["exposed_ns"]) == (20 * US, 10 * US, 10 * US)
    assert b["overlap_ratio"] == pytest.approx(0.5)
    bd = one(breakdown.run(con).table, rank=1)
    # rank 1 idle = [30,40) = 10
    assert (bd["comm_ns"], bd["exposed_comm_ns"], bd["idle_ns"]) == (0, 0, 10 * US)


# -- CPU-only (gloo) rank -------------------------------------------------------------------
def test_cpu_only_gloo_rank(ingest: Ingest) -> None:
    t = cpu_trace(rank=0, world_size=2)
    t.thread_name(7777, "pt_gloo_runloop")
    t.step(3, 0, 1000, cat="cpu_op")
    t.host("aten::mm", 100, 200)  # [100,300)
    t.host("aten::addmm", 150, 100)  # [150,250): nested in aten::mm
    t.host("c10d::allreduce_", 300, 10)  # the issue op: cpu_op, neither C nor M
    t.gloo("all_reduce", 305, 195)  # [305,500) on the gloo worker thread
    t.host("aten::add", 450, 150)  # [450,600)
    t.gloo("all_gather", 900, 200)  # [900,1100): starts in the step, ends after the span
    con = ingest(t)
    kinds = dict(con.sql("SELECT name, kind::VARCHAR FROM events").fetchall())
    assert kinds["aten::mm"] == "compute" and kinds["gloo:all_reduce"] == "comm"
    assert kinds["c10d::allreduce_"] == "cpu_op" and kinds["ProfilerStep#3"] == "annotation"
    # W = the host span [0,1000) extended to the last event of the step (1100) -> 1100
    # C = [100,300) ∪ [450,600) = 200 + 150 = 350
    # M = [305,500) ∪ [900,1100) = 195 + 200 = 395; hidden = [450,500) = 50; exposed = 345
    # busy = [100,300) ∪ [305,600) ∪ [900,1100) = 200 + 295 + 200 = 695; idle = 1100-695 = 405
    # exclusive split: 350 + 345 + 405 = 1100
    row = one(breakdown.run(con).table, rank=0, step=3)
    assert row["start_ns"] == BASE_NS
    assert (
        row["window_ns"],
        row["compute_ns"],
        row["comm_ns"],
        row["exposed_comm_ns"],
        row["idle_ns"],
        row["memory_ns"],
    ) == (1100 * US, 350 * US, 395 * US, 345 * US, 405 * US, 0)
    o = one(overlap.run(con).table, rank=0, step=3)
    assert (o["hidden_ns"], o["exposed_ns"]) == (50 * US, 345 * US)
    assert o["overlap_ratio"] == pytest.approx(50 / 395)


# -- process groups: by_group and by_parallelism with Megatron names --------------------------
def megatron_rank0() -> KinetoTrace:
    """rank 0 of 4: TP group '1' = [0,1], DP group '2' = [0,2] (Megatron descriptions).

    stream 7: compute [100,200)
    stream 9: TP AllReduce [150,250)
    stream 10: DP AllGather [180,220), DP ReduceScatter [300,340)
    """
    t = KinetoTrace(
        rank=0,
        world_size=4,
        pg_config=[
            PgConfig("0", [0, 1, 2, 3], "default_pg"),
            PgConfig("1", [0, 1], "TENSOR_MODEL_PARALLEL_GROUP"),
            PgConfig("2", [0, 2], "DATA_PARALLEL_GROUP"),
        ],
    )
    t.step(1, 0, 1000)
    t.kernel("gemm", 100, 100, stream=7)
    tp: dict[str, Any] = {
        "pg_name": "1",
        "pg_desc": "TENSOR_MODEL_PARALLEL_GROUP",
        "pg_ranks": [0, 1],
        "group_size": 2,
        "dtype": "BFloat16",
        "nelems": 1024,
    }
    dp: dict[str, Any] = {
        "pg_name": "2",
        "pg_desc": "DATA_PARALLEL_GROUP",
        "pg_ranks": [0, 2],
        "group_size": 2,
        "dtype": "Float",
        "nelems": 4096,
    }
    t.nccl("AllReduce", 150, 100, stream=9, coll="allreduce", **tp)
    t.nccl("AllGather", 180, 40, stream=10, coll="_allgather_base", **dp)
    t.nccl("ReduceScatter", 300, 40, stream=10, coll="_reduce_scatter_base", **dp)
    return t


def test_by_group_and_parallelism(ingest: Ingest) -> None:
    con = ingest(megatron_rank0())
    res = overlap.run(con)
    g = res.tables["by_group"]
    cols = (
        "pg_name",
        "pg_desc",
        "parallelism",
        "coll_op",
        "n_ops",
        "comm_ns",
        "hidden_ns",
        "exposed_ns",
    )
    # TP all_reduce [150,250) vs C [100,200): hidden 50, exposed 50
    # DP all_gather [180,220): hidden [180,200) = 20, exposed 20
    # DP reduce_scatter [300,340): hidden 0, exposed 40
    assert rows(g.sort("pg_name", "coll_op"), *cols) == [
        dict(
            zip(
                cols,
                (
                    "1",
                    "TENSOR_MODEL_PARALLEL_GROUP",
                    "TP",
                    "all_reduce",
                    1,
                    100 * US,
                    50 * US,
                    50 * US,
                ),
                strict=True,
            )
        ),
        dict(
            zip(
                cols,
                ("2", "DATA_PARALLEL_GROUP", "DP", "all_gather", 1, 40 * US, 20 * US, 20 * US),
                strict=True,
            )
        ),
        dict(
            zip(
                cols,
                ("2", "DATA_PARALLEL_GROUP", "DP", "reduce_scatter", 1, 40 * US, 0, 40 * US),
                strict=True,
            )
        ),
    ]
    assert g.sort("pg_name", "coll_op")["overlap_ratio"].to_list() == pytest.approx([0.5, 0.5, 0.0])
    # per parallelism: DP M_x = [180,220) ∪ [300,340) = 80, hidden 20, exposed 60
    p = res.tables["by_parallelism"].sort("parallelism")
    assert rows(p, "parallelism", "comm_ns", "hidden_ns", "exposed_ns") == [
        {"parallelism": "DP", "comm_ns": 80 * US, "hidden_ns": 20 * US, "exposed_ns": 60 * US},
        {"parallelism": "TP", "comm_ns": 100 * US, "hidden_ns": 50 * US, "exposed_ns": 50 * US},
    ]
    assert p["overlap_ratio"].to_list() == pytest.approx([0.25, 0.5])
    # W = [100,340) = 240 -> exposed share DP 60/240, TP 50/240
    assert p["exposed_share"].to_list() == pytest.approx([60 / 240, 50 / 240])
    # whole step: M = [150,250) ∪ [300,340) = 140, hidden [150,200) = 50, exposed 90;
    # busy = [100,250) ∪ [300,340) = 190 -> idle 50
    o = one(res.table, step=1)
    assert (o["window_ns"], o["comm_ns"], o["hidden_ns"], o["exposed_ns"]) == (
        240 * US,
        140 * US,
        50 * US,
        90 * US,
    )
    b = breakdown.run(con)
    assert one(b.table, step=1)["idle_ns"] == 50 * US
    bp = b.tables["by_parallelism"].sort("parallelism")
    assert rows(bp, "parallelism", "comm_ns") == [
        {"parallelism": "DP", "comm_ns": 80 * US},
        {"parallelism": "TP", "comm_ns": 100 * US},
    ]
    assert bp["comm_share"].to_list() == pytest.approx([80 / 240, 100 / 240])


# -- real traces: invariants that hold whatever the numbers -----------------------------------
def test_invariants_on_a_real_trace(ingest: Ingest, shared_traces: Path) -> None:
    con = ingest([shared_traces / "hta-testdata" / "nccl_parser_config" / "nccl_data.json.gz"])
    b = breakdown.run(con).table
    assert b.height > 0
    split = b["compute_ns"] + b["exposed_comm_ns"] + b["exposed_memory_ns"] + b["idle_ns"]
    assert (split == b["window_ns"]).all()
    assert (b["idle_ns"] >= 0).all() and (b["compute_ns"] <= b["window_ns"]).all()
    o = overlap.run(con).table
    assert (o["hidden_ns"] + o["exposed_ns"] == o["comm_ns"]).all()
    assert o["comm_ns"].sum() > 0
    assert o["overlap_ratio"].drop_nulls().is_between(0, 1).all()
