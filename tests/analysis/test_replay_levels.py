"""The replay by topological levels (graph_replay.replay_levels, the path without the C loop)
and the replay the analyses use (graph_replay.replay: the C loop where built) are the
vertex-by-vertex loop (graph_replay.replay_loop_py), value for value and binding edge for
binding edge.

Why: the levels are a speed-up (1.5 -> 0.08 s a replay on a 1,024-rank job); every critical
path, saving and what-if stands on the replay, so it must not change one number. Checked on
random DAGs (ties, NEG bases and dropped edges, what-if durations), on every scenario of
generated GPU jobs and the bundled pipeline samples, and on a graph with a cycle (the loop).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
import pytest
from ranklens.analysis import critical_path as cp
from ranklens.analysis import graph_replay as gr
from ranklens.analysis import whatif as wi
from ranklens.analysis.graph_build import NEG, Graph
from ranklens.sample_traces.gpu_job import GpuJob, write_job

from tests import random_dag

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
Ingest = Callable[..., duckdb.DuckDBPyConnection]


def _same(g: Graph, add: np.ndarray | None = None, lag: np.ndarray | None = None) -> None:
    """replay_levels = replay (the C loop where built) = replay_loop = replay_loop_py."""
    lg = g.e_lag if lag is None else lag
    ad = g.v_add if add is None else add
    for track in (False, True):
        fast, loop = gr.replay_levels(g, lg, ad, track), gr.replay_loop(g, add, lag, track)
        used = gr.replay(g, add, lag, track)
        py = gr.replay_loop_py(g, add, lag, track)
        assert np.array_equal(fast.value, loop.value) and np.array_equal(loop.value, py.value)
        assert np.array_equal(used.value, py.value)
        if track:
            assert fast.arg is not None and loop.arg is not None and py.arg is not None
            assert np.array_equal(fast.arg, loop.arg) and np.array_equal(loop.arg, py.arg)
            assert used.arg is not None and np.array_equal(used.arg, py.arg)


def _random_dag(template: Graph, rng: np.random.Generator, n: int, e: int) -> Graph:
    """tests/random_dag.py's DAG in the shape of a real graph (template's other fields)."""
    return dataclasses.replace(template, **random_dag.arrays(rng, n, e), levels=None)


@pytest.fixture(scope="module")
def pp4(tmp_path_factory: pytest.TempPathFactory) -> cp.Model:
    from ranklens.ingest import load_traces

    db = tmp_path_factory.mktemp("pp4") / "run.duckdb"
    load_traces([str(SAMPLES / "pp4_1f1b_m8")], db, workers=1)
    con = duckdb.connect(str(db), read_only=True)
    try:
        return cp.model(con)
    finally:
        con.close()


def test_random_dags_replay_the_same(pp4: cp.Model) -> None:
    rng = np.random.default_rng(15)
    for n, e in [(1, 0), (2, 1), (50, 200), (400, 3_000), (2_000, 4_000)]:
        g = _random_dag(pp4.graph, rng, n, e)
        _same(g)
        assert g.levels is not None  # the fast path ran
        add = rng.integers(0, 9, n).astype(np.int64)
        lag = np.maximum(g.e_lag + rng.integers(-2, 3, len(g.e_lag)), NEG)
        _same(g, add, lag)


def test_a_cycle_falls_back_to_the_loop(pp4: cp.Model) -> None:
    g = _random_dag(pp4.graph, np.random.default_rng(1), 30, 60)
    # an edge back from the last vertex of the order to the first closes a cycle
    first, last = int(g.order[0]), int(g.order[-1])
    src = np.insert(g.e_src, g.ptr[first], last)
    ptr = g.ptr.copy()
    ptr[first + 1 :] += 1
    lag = np.insert(g.e_lag, g.ptr[first], 5)
    g = dataclasses.replace(g, ptr=ptr, e_src=src, e_lag=lag, levels=None)
    assert gr.levels(g) is None
    _same(g)


def test_a_deep_narrow_graph_takes_the_loop(pp4: cp.Model) -> None:
    """A capture without step marks is one step, its lanes chains of millions of kernels:
    numpy a level at a time cost 250 s a report there. Past PROBE_LEVELS levels of fewer
    than MIN_WIDTH vertices each on average, the levels are given up (once: cached)."""
    n = gr.PROBE_LEVELS * 3
    chain = _random_dag(pp4.graph, np.random.default_rng(7), n, 0)
    order = chain.order
    src = order[:-1]  # each vertex waits on the one before it in the order: n levels
    by_dst = np.argsort(order[1:], kind="stable")
    dst, src = order[1:][by_dst], src[by_dst]
    ptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=n))]).astype(np.int64)
    lag = np.random.default_rng(8).integers(-3, 4, n - 1).astype(np.int64)
    g = dataclasses.replace(chain, ptr=ptr, e_src=src.astype(np.int64), e_lag=lag, levels=None)
    assert gr.levels(g) is None
    assert g.levels == []  # given up once, not probed again at every replay
    _same(g)
    none = np.zeros(0, dtype=np.int64)
    flat = np.zeros(n + 1, dtype=np.int64)
    wide = dataclasses.replace(g, ptr=flat, e_src=none, e_lag=none, levels=None)
    lv = gr.levels(wide)  # no edges: one level of every vertex
    assert lv is not None and len(lv) == 1
    _same(wide)


def _every_scenario(m: cp.Model) -> None:
    _same(m.graph)
    names = ["straggler", "stage-balance", "contention", "scale-comm:dp=2"]
    names += [f"overlap:{p}" for p in ("dp", "tp", "pp")] + [f"balance:{p}" for p in ("dp", "tp")]
    ran = 0
    for name in names:
        add, lag, note = wi.durations(m.graph, wi.parse(name), m.ctx)
        if not note:
            _same(m.graph, add, lag)
            ran += 1
    assert ran >= 3


def test_every_scenario_on_the_pipeline_sample_replays_the_same(pp4: cp.Model) -> None:
    _every_scenario(pp4)


@pytest.mark.parametrize(
    "kw",
    [{}, {"peers": False, "batched": True}, {"schedule": "interleaved", "v": 2}],
    ids=["1f1b", "batched-no-peers", "interleaved"],
)
def test_every_scenario_on_gpu_jobs_replays_the_same(
    tmp_path: Path, ingest: Ingest, kw: dict[str, object]
) -> None:
    write_job(GpuJob(tp=2, dp=2, pp=4, m=8, steps=2, **kw), tmp_path / "job")  # type: ignore[arg-type]
    _every_scenario(cp.model(ingest([tmp_path / "job"])))
