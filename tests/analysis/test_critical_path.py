"""Critical path and what-if replay against truths that could fail: the generator's measured step
times (the replay of the unchanged graph must reproduce them), the same job generated without its
fault (a fix's prediction must land within 5% of it), the injected straggler (the path must run
through it), networkx's own topological order (the replay must give the same values), and the
path adding up to the step."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from pathlib import Path

import duckdb
import networkx as nx
import numpy as np
import pytest
from ranklens.analysis import critical_path as cp
from ranklens.analysis import graph_build as gb
from ranklens.analysis import graph_replay as gr
from ranklens.analysis import whatif as wi
from ranklens.sample_traces.gpu_job import GpuJob, write_job

Ingest = Callable[..., duckdb.DuckDBPyConnection]
BASE = {"tp": 2, "dp": 2, "pp": 4, "m": 8, "steps": 2}


def _job(tmp_path: Path, ingest: Ingest, name: str, **kw: object) -> duckdb.DuckDBPyConnection:
    write_job(GpuJob(**{**BASE, **kw}), tmp_path / name)  # type: ignore[arg-type]
    return ingest([tmp_path / name])


def _predict(con: duckdb.DuckDBPyConnection, scenario: str) -> np.ndarray:
    m = cp.model(con)
    (o,) = wi.run_scenarios(m.graph, [wi.parse(scenario)], m.ctx)
    assert o.predicted is not None, o.note
    return o.predicted


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"peers": False},
        {"batched": True},
        {"schedule": "interleaved", "v": 2},
        {"schedule": "gpipe", "peers": False},
        {"dp_overlap": True, "contention": 1.25},
    ],
    ids=["1f1b", "no-peers", "batched", "interleaved", "gpipe", "dp-overlap"],
)
def test_replay_reproduces_generated_steps(tmp_path: Path, ingest: Ingest, kw: dict) -> None:
    """Unchanged replay = the generator's step windows (within 2%; Lumos reports 3.3%), and
    the critical path of each step adds up to it without gaps or overlaps."""
    con = _job(tmp_path, ingest, "run", **kw)
    m = cp.model(con)
    measured = gr.measured_step_times(m.graph)
    replayed = gr.step_times(m.graph, m.base)
    assert len(measured) == BASE["steps"]
    assert np.all(np.abs(replayed / measured - 1) <= 0.02)
    for i, step in enumerate(m.graph.steps.tolist()):
        segs = [s for s in m.path if s.step == step]
        assert all(a.end_ns == b.start_ns for a, b in itertools.pairwise(segs))
        assert segs[-1].end_ns - segs[0].start_ns == replayed[i]


@pytest.mark.parametrize(
    ("fault", "fixed", "scenario"),
    [
        ({"rank_factor": {13: 1.3}}, {}, "straggler:13"),
        ({"rank_factor": {13: 1.3}}, {}, "straggler"),
        (
            {"stage_factor": {3: 1.15}},
            {"stage_factor": dict.fromkeys(range(4), 1.0375)},
            "stage-balance",
        ),
        ({"dp_overlap": True, "contention": 1.25}, {"dp_overlap": True}, "contention"),
        # an uneven split over a group's ranks (a causal mask over CP ranks; the generator has
        # no CP dimension, so its TP pairs carry the split): 1.25x / 0.75x -> both at the mean
        ({"rank_factor": {r: 1.25 if r % 2 == 0 else 0.75 for r in range(16)}}, {}, "balance:tp"),
    ],
    ids=["straggler-13", "straggler-all", "slow-stage", "contention", "split-imbalance"],
)
def test_fix_predicts_the_job_without_the_fault(
    tmp_path: Path, ingest: Ingest, fault: dict, fixed: dict, scenario: str
) -> None:
    """The fix replayed on the faulty job = the step time of the same job generated without
    the fault (a slow stage's layers rebalanced: every stage at the mean factor), within 5%;
    and the fault cost something to begin with (else the check proves nothing)."""
    bad = _job(tmp_path, ingest, "bad", **fault)
    good = _job(tmp_path, ingest, "good", **fixed)
    truth = gr.measured_step_times(gb.build(good))
    measured_bad = gr.measured_step_times(gb.build(bad))
    assert np.all(measured_bad > truth * 1.02)
    predicted = _predict(bad, scenario)
    assert np.all(np.abs(predicted / truth - 1) <= 0.05), (predicted, truth)


def test_critical_path_runs_through_the_straggler(tmp_path: Path, ingest: Ingest) -> None:
    """Rank 13 computes 1.3x slower: it holds the largest share of every step's path."""
    con = _job(tmp_path, ingest, "run", rank_factor={13: 1.3})
    res = cp.run(con)
    assert res.table["top_rank"].to_list() == [13, 13]
    assert (res.table["replay_error"].abs() <= 0.02).all()
    path = res.tables["critical_path"]
    assert path.filter(path["rank"] == 13)["category"].unique().to_list().count("compute") == 1
    cats = [c for c in res.table.columns if c.endswith("_ns") and "step" not in c]
    total = res.table.select(cats).sum_horizontal()
    assert (total == res.table["replayed_step_ns"]).all()


def test_replay_equals_networkx_longest_path(tmp_path: Path, ingest: Ingest) -> None:
    """networkx's topological order (independent of ours) gives the same vertex values."""
    con = _job(tmp_path, ingest, "run", tp=1, dp=2, m=4, rank_factor={5: 1.2})
    g = gb.build(con)
    d = gb.to_networkx(g)
    assert nx.is_directed_acyclic_graph(d)
    val: dict[int, int] = {}
    for v in nx.topological_sort(d):
        best = d.nodes[v]["base"]
        for u in d.predecessors(v):
            best = max(best, val[u] + d.edges[u, v]["lag"])
        val[v] = best + d.nodes[v]["add"]
    ours = gr.replay(g).value
    assert [val[v] for v in range(len(ours))] == ours.tolist()


def test_overlap_and_scale_comm_order(tmp_path: Path, ingest: Ingest) -> None:
    """Hiding DP communication saves at least as much as making it 2x faster, which saves
    something; scaling kernels to 0.8 shortens the step by no more than 20%."""
    con = _job(tmp_path, ingest, "run", dp_overlap=False, dp_us=3000.0)
    m = cp.model(con, patterns=("gemm",))
    base = gr.step_times(m.graph, m.base)
    out = {
        o.scenario.name: o.predicted
        for o in wi.run_scenarios(
            m.graph,
            [wi.parse(s) for s in ("overlap:dp", "scale-comm:dp=2", "scale-kernels:gemm=0.8")],
            m.ctx,
        )
    }
    hidden, faster, kernels = (
        out["overlap:dp"],
        out["scale-comm:dp=2"],
        out["scale-kernels:gemm=0.8"],
    )
    assert hidden is not None and faster is not None and kernels is not None
    assert np.all(hidden <= faster) and np.all(faster < base)
    assert np.all(kernels < base) and np.all(kernels >= base * 0.8)


def test_overlap_dp_is_data_parallelism_whole(tmp_path: Path, ingest: Ingest) -> None:
    """The same graph with its DP instances labelled DP_SHARD (an FSDP/HSDP mesh's shard
    groups): overlap:dp and scale-comm:dp predict exactly what they predict with DP, and
    overlap:dp_shard too; on the DP-labelled run overlap:dp_shard finds nothing to hide."""
    con = _job(tmp_path, ingest, "run", dp_overlap=False, dp_us=3000.0)
    m = cp.model(con)
    assert "DP" in set(m.graph.inst_par.tolist())
    shard = dataclasses.replace(
        m.graph, inst_par=np.where(m.graph.inst_par == "DP", "DP_SHARD", m.graph.inst_par)
    )
    names = ("overlap:dp", "scale-comm:dp=2", "overlap:dp_shard")

    def run(g: gb.Graph) -> dict[str, wi.Outcome]:
        return {
            o.scenario.name: o for o in wi.run_scenarios(g, [wi.parse(n) for n in names], m.ctx)
        }

    dp, sh = run(m.graph), run(shard)
    base = gr.step_times(m.graph, m.base)
    for name in ("overlap:dp", "scale-comm:dp=2"):
        want, got = dp[name].predicted, sh[name].predicted
        assert want is not None and got is not None and np.all(want < base)
        assert got.tolist() == want.tolist(), name
    only_shard, whole = sh["overlap:dp_shard"].predicted, dp["overlap:dp"].predicted
    assert only_shard is not None and whole is not None
    assert only_shard.tolist() == whole.tolist()
    assert dp["overlap:dp_shard"].predicted is None
    assert dp["overlap:dp_shard"].note == "no matched DP_SHARD communication in this run"


@pytest.mark.parametrize("bad", ["bogus", "straggler:x", "scale-comm:dp", "scale-kernels:(=2"])
def test_bad_scenarios_are_errors(bad: str) -> None:
    with pytest.raises(wi.WhatIfError):
        wi.parse(bad)


SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


@pytest.mark.parametrize(
    "name", ["megatron_tp2_pp2_dp2", "straggler_rank3", "pp4_1f1b_m8", "pp4_slow_stage2"]
)
def test_replay_of_real_gloo_runs(ingest: Ingest, name: str) -> None:
    """Real torch CPU/gloo runs (the bundled samples): the unchanged replay is within 2% of
    every measured step; on the run whose rank 3 burns 40 ms a step, rank 3 holds the path."""
    con = ingest([SAMPLES / name / "raw"])
    res = cp.run(con)
    assert res.table.height == 3
    assert (res.table["replay_error"].abs() <= 0.02).all()
    if name == "straggler_rank3":
        assert res.table["top_rank"].to_list() == [3, 3, 3]


def test_replay_of_public_dlrm_nccl(ingest: Ingest, shared_traces: Path) -> None:
    """8 V100 ranks of a real NCCL run (param-dlrm-kineto): all collectives matched, the
    replay reproduces the step within 2%, and the path is a chain that spans it."""
    con = ingest([shared_traces / "param-dlrm-kineto" / "extracted"])
    m = cp.model(con)
    assert m.graph.inconsistent == 0
    measured, replayed = gr.measured_step_times(m.graph), gr.step_times(m.graph, m.base)
    assert np.all(np.abs(replayed / measured - 1) <= 0.02)
    assert sum(s.end_ns - s.start_ns for s in m.path) == int(replayed.sum())


def test_contradicting_timestamps_never_make_a_cycle() -> None:
    """Two vertices whose edges point at each other (timestamps that contradict): one edge is
    dropped, and the order places every vertex after its kept predecessors."""
    from ranklens.analysis import graph_units as gu

    key = np.array([5, 5, 9], dtype=np.int64)
    # in-edges by destination: 0 <- 1, 1 <- 0, 2 <- 1
    ptr = np.array([0, 1, 2, 3], dtype=np.int64)
    src = np.array([1, 0, 1], dtype=np.int64)
    order, keep = gu.topo_order(key, ptr, src)
    assert sorted(order.tolist()) == [0, 1, 2] and int((~keep).sum()) == 1
    pos = {v: i for i, v in enumerate(order.tolist())}
    dst = [0, 1, 2]
    assert all(pos[s] < pos[d] for s, d, k in zip(src.tolist(), dst, keep, strict=True) if k)


@pytest.mark.parametrize("seed", range(40))
def test_dense_key_numbers_pairs_in_sorted_order(seed: int) -> None:
    """dense_key's fast paths (one int64 key; no sort when the pairs come in order) give the
    ids that numbering the distinct (a, b) rows in sorted order gives, including negative and
    far-apart values and pairs too wide for one int64."""
    from ranklens.analysis import graph_units as gu

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    a = rng.integers(-3, 5, n).astype(np.int64) * (1 << (20 * (seed % 4)))
    b = rng.integers(-2, 4, n).astype(np.int64) * (1 << (20 * (seed % 3)))
    if seed % 2:
        order = np.lexsort((b, a))
        a, b = a[order], b[order]
    ids, count = gu.dense_key(a, b)
    distinct = sorted(set(zip(a.tolist(), b.tolist(), strict=True)))
    rank_of = {pair: i for i, pair in enumerate(distinct)}
    assert count == len(distinct)
    assert ids.tolist() == [rank_of[p] for p in zip(a.tolist(), b.tolist(), strict=True)]


def test_events_are_numbered_in_lane_order(tmp_path: Path, ingest: Ingest) -> None:
    """critical_path.sql numbers the events 0..n-1 (a table's rowid) in the order of the lane
    keys, which graph_build reads them in; a numbering read out of order is put back in order."""
    from ranklens.analysis._sql import apply_sql

    con = _job(tmp_path, ingest, "run")
    keys = ["rank", "step", "device", "stream", "is_comm", "s", "e"]
    # in a transaction too (ingest stores its results in one), where DuckDB numbers the rowid
    # of rows not yet committed from 2^55
    con.execute("BEGIN TRANSACTION")
    apply_sql(con, "critical_path")
    inside = con.execute("SELECT eid FROM _critical_path_ev").fetchnumpy()["eid"]
    con.execute("ROLLBACK")
    apply_sql(con, "critical_path")
    ev = con.execute(f"SELECT eid, {', '.join(keys)} FROM _critical_path_ev").fetchnumpy()
    gb.drop_inputs(con)
    n = len(ev["eid"])
    assert n > 1000 and np.array_equal(ev["eid"], np.arange(n))
    assert np.array_equal(inside, np.arange(n))
    rows = list(zip(*(ev[k].tolist() for k in keys), strict=True))
    assert rows == sorted(rows)
    shuffled = np.random.default_rng(0).permutation(n)
    back = gb._in_eid_order({k: np.asarray(v)[shuffled] for k, v in ev.items()})
    assert sorted(back) == sorted(keys)  # the check's eid column is dropped
    assert all(np.array_equal(back[k], ev[k]) for k in keys)
    assert con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name LIKE '_critical_path%'"
    ).fetchone() == (0,)
