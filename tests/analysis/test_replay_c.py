"""The replay's C vertex loop and path walk (analysis/_replay.c via replay_c) against their
Python references, value for value and binding edge for binding edge; and bad input.

Why: every critical path and what-if saving of a capture without step marks stands on the C
loop, and a C loop that reads out of bounds corrupts silently. CI also runs this file against
a build with AddressSanitizer and UndefinedBehaviorSanitizer (`.ci/kscan-asan`,
RANKLENS_REPLAY_SO).
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any, cast
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ranklens.analysis import graph_replay as gr
from ranklens.analysis import replay_c
from ranklens.analysis.graph_build import NEG, Graph

from tests import random_dag
from tests.sanitized import sanitizer_build

_asan = sanitizer_build("RANKLENS_REPLAY_SO", "ranklens.analysis._replay")
if _asan is not None:  # the sanitizer build replaces the installed one for this file
    replay_c._c = _asan

I64 = np.ndarray


def test_built_where_required() -> None:
    """CI sets RANKLENS_REQUIRE_KSCAN=1 (both C builds): a broken build must not hide behind
    the Python loop."""
    if os.environ.get("RANKLENS_REQUIRE_KSCAN") == "1":
        assert replay_c.available(), "the C replay loop (ranklens.analysis._replay) is not built"
    elif not replay_c.available():
        pytest.skip("C replay loop not built (no compiler at install time)")


needs_c = pytest.mark.skipif(replay_c._c is None, reason="C replay loop not built")


def _graph(rng: np.random.Generator, n: int, e: int, spread: int = 3) -> Graph:
    """tests/random_dag.py's DAG, with only what a replay reads."""
    return cast(Graph, SimpleNamespace(**random_dag.arrays(rng, n, e, spread)))


def _same(g: Graph, add: I64 | None = None, lag: I64 | None = None) -> None:
    for track in (False, True):
        c = replay_c.loop(
            g.order, g.ptr, g.e_src, g.e_lag if lag is None else lag, g.v_base,
            g.v_add if add is None else add, track,
        )  # fmt: skip
        py = gr.replay_loop_py(g, add, lag, track)
        assert c is not None
        assert np.array_equal(c[0], py.value)
        if track:
            assert c[1] is not None and py.arg is not None
            assert np.array_equal(c[1], py.arg)
        else:
            assert c[1] is None


@needs_c
@settings(max_examples=150, deadline=None)
@given(st.integers(1, 60), st.integers(0, 240), st.integers(0, 2**32 - 1))
def test_random_dags_replay_the_same(n: int, e: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    g = _graph(rng, n, e)
    _same(g)
    add = rng.integers(0, 9, n).astype(np.int64)
    lag = np.maximum(g.e_lag + rng.integers(-2, 3, len(g.e_lag)), NEG)
    _same(g, add, lag)


@needs_c
def test_a_large_graph_and_its_paths_are_the_same() -> None:
    """20 k vertices; every vertex's walk back along its binding edges, C against Python."""
    rng = np.random.default_rng(3)
    g = _graph(rng, 20_000, 60_000, spread=50)
    _same(g)
    py = gr.replay_loop_py(g, track=True)
    assert py.arg is not None
    lists = (g.e_src.tolist(), py.arg.tolist())
    for v in rng.integers(0, 20_000, 200).tolist():
        c = gr._chain(v, py.arg, g.e_src, None)
        assert np.array_equal(c, gr._chain(v, py.arg, g.e_src, lists))
        assert c[0] == v and len(c) >= 1


@needs_c
def test_an_int64_overflow_runs_the_exact_loop() -> None:
    """A sum below int64's range is no candidate in Python (it loses to the base); C cannot
    hold it, says so (None), and replay_loop gives Python's answer."""
    g = cast(
        Graph,
        SimpleNamespace(
            ptr=np.array([0, 0, 1, 1], dtype=np.int64),
            e_src=np.array([0], dtype=np.int64),
            e_lag=np.array([-(2**63) + 1], dtype=np.int64),
            v_base=np.array([NEG, 7, 0], dtype=np.int64),
            v_add=np.array([0, 2, 1], dtype=np.int64),
            order=np.array([0, 1, 2], dtype=np.int64),
        ),
    )
    assert replay_c.loop(g.order, g.ptr, g.e_src, g.e_lag, g.v_base, g.v_add, True) is None
    got, py = gr.replay_loop(g, track=True), gr.replay_loop_py(g, track=True)
    assert got.value.tolist() == py.value.tolist() == [NEG, 9, 1]
    assert got.arg is not None and got.arg.tolist() == [-1, -1, -1]


def _call(**over: Any) -> Any:
    """The C loop on a 3-vertex chain 0 -> 1 -> 2, with some argument replaced."""
    args = {
        "order": np.array([0, 1, 2], dtype=np.int64),
        "ptr": np.array([0, 0, 1, 2], dtype=np.int64),
        "src": np.array([0, 1], dtype=np.int64),
        "lag": np.array([1, 1], dtype=np.int64),
        "base": np.zeros(3, dtype=np.int64),
        "add": np.ones(3, dtype=np.int64),
        "val": np.zeros(3, dtype=np.int64),
        "arg": np.full(3, -1, dtype=np.int64),
    }
    args.update(over)
    return replay_c._c.loop(*args.values())


@needs_c
def test_bad_input_is_refused_not_read() -> None:
    assert _call() is True
    i64 = np.int64
    for over in (
        {"src": np.array([0, 3], dtype=i64)},  # a source past the last vertex
        {"src": np.array([0, -2], dtype=i64)},
        {"order": np.array([0, 1, 3], dtype=i64)},
        {"order": np.array([-1, 1, 2], dtype=i64)},
        {"ptr": np.array([0, 0, 1, 5], dtype=i64)},  # past the edges
        {"ptr": np.array([0, 1, 0, 2], dtype=i64)},  # decreasing
        {"ptr": np.array([0, 0, 1], dtype=i64)},  # too short
        {"lag": np.array([1], dtype=i64)},
        {"val": np.zeros(2, dtype=i64)},
        {"arg": np.zeros(4, dtype=i64)},
    ):
        with pytest.raises(ValueError):
            _call(**over)
    for over in (
        {"lag": np.array([1.0, 1.0])},  # not int64
        {"src": np.array([0, 1], dtype=np.int32)},
        {"val": np.zeros(6, dtype=i64)[::2]},  # not contiguous
        {"val": np.frombuffer(bytes(24), dtype=i64)},  # read-only
    ):
        with pytest.raises((TypeError, ValueError, BufferError)):
            _call(**over)


@needs_c
def test_a_walk_refuses_a_loop_and_bad_indices() -> None:
    src = np.array([1, 0], dtype=np.int64)
    out = np.empty(2, dtype=np.int64)
    with pytest.raises(ValueError):  # 0 <- 1 <- 0 <- ...: a cycle
        replay_c._c.chain(0, np.array([0, 1], dtype=np.int64), src, out)
    with pytest.raises(ValueError):
        replay_c._c.chain(5, np.array([-1, -1], dtype=np.int64), src, out)
    with pytest.raises(ValueError):  # an edge past the last
        replay_c._c.chain(0, np.array([2, -1], dtype=np.int64), src, out)
    # vertex 1 bound by edge 1 (from vertex 0), vertex 0 a start: 1, then 0
    assert replay_c._c.chain(1, np.array([-1, 1], dtype=np.int64), src, out) == 2
    assert out.tolist() == [1, 0]


def test_pure_python_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANKLENS_PURE_PYTHON", "1")
    assert not replay_c.available()


def _topo(key: I64, ptr: I64, src: I64, c: bool) -> tuple[I64, I64]:
    from ranklens.analysis import graph_units as gu

    with mock.patch.object(replay_c, "available", return_value=c):
        return gu.topo_order(key, ptr, src)


@needs_c
@settings(max_examples=200, deadline=None)
@given(st.integers(1, 50), st.integers(0, 200), st.integers(0, 2**32 - 1))
def test_kahn_orders_as_the_python_loop(n: int, e: int, seed: int) -> None:
    """Random graphs whose keys (with ties) put some edges backwards, cycles included: the C
    Kahn gives the Python loop's order and kept edges, and the order places every vertex once,
    after the sources of its kept in-edges."""
    rng = np.random.default_rng(seed)
    key = rng.integers(0, max(2, n // 3), n).astype(np.int64)
    dst = np.sort(rng.integers(0, n, e))
    src = rng.integers(0, n, e).astype(np.int64)
    src, dst = src[src != dst], dst[src != dst]
    ptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=n))]).astype(np.int64)
    order, keep = _topo(key, ptr, src, True)
    py_order, py_keep = _topo(key, ptr, src, False)
    assert order.tolist() == py_order.tolist() and keep.tolist() == py_keep.tolist()
    assert sorted(order.tolist()) == list(range(n))
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    assert np.all(pos[src[keep]] < pos[dst[keep]])


@needs_c
def test_kahn_on_a_large_graph_with_backward_edges() -> None:
    """200 k vertices in key order but for 50 backward edges (what a real trace's clocks
    give): the same order in C as in Python, every kept edge forward."""
    rng = np.random.default_rng(7)
    n = 200_000
    key = np.arange(n, dtype=np.int64) // 2
    dst = np.sort(rng.integers(1, n, 400_000))
    src = (dst - rng.integers(1, 50, len(dst))).clip(0)
    back = rng.choice(len(dst), 50, replace=False)
    src[back] = np.minimum(dst[back] + rng.integers(1, 1000, 50), n - 1)
    src, dst = src[src != dst], dst[src != dst]
    ptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=n))]).astype(np.int64)
    order, keep = _topo(key, ptr, src, True)
    py_order, py_keep = _topo(key, ptr, src, False)
    assert np.array_equal(order, py_order) and np.array_equal(keep, py_keep)
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    assert np.all(pos[src[keep]] < pos[dst[keep]])
    assert not np.array_equal(order, np.arange(n))  # the backward edges moved vertices


@needs_c
def test_kahn_refuses_bad_input() -> None:
    i64 = np.int64

    def call(**over: Any) -> int:
        args = {
            "optr": np.array([0, 1, 2, 2], dtype=i64),  # 0 -> 1, 1 -> 2
            "succ": np.array([1, 2], dtype=i64),
            "indeg": np.array([0, 1, 1], dtype=i64),
            "pos": np.array([0, 1, 2], dtype=i64),
            "at": np.empty(3, dtype=i64),
            "heap": np.empty(3, dtype=i64),
            "out": np.empty(3, dtype=i64),
        }
        args.update(over)
        return int(replay_c._c.kahn(*args.values()))

    assert call() == 3
    for over in (
        {"pos": np.array([0, 0, 2], dtype=i64)},  # not a permutation
        {"pos": np.array([0, 1, 3], dtype=i64)},
        {"succ": np.array([1, 3], dtype=i64)},  # past the last vertex
        {"optr": np.array([0, 2, 1, 2], dtype=i64)},  # decreasing
        {"optr": np.array([0, 1, 2, 5], dtype=i64)},  # past the edges
        {"out": np.empty(2, dtype=i64)},
    ):
        with pytest.raises(ValueError):
            call(**over)
