"""Replay of the dependency graph (graph_build.Graph) and its critical path.

Why one pass: the graph is a DAG, and a replay is one longest-path pass over it (value = max
over in-edges of pred value + lag, plus the vertex's own time), done a topological level at a
time with numpy (`replay`). The critical path is the chain of binding in-edges back from the
step's last end.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from ranklens.analysis import replay_c
from ranklens.analysis.graph_build import (
    E_BLOCK,
    E_SYNC,
    NEG,
    V_ARRIVE,
    V_END,
    V_JOIN,
    V_NODE,
    Graph,
)

I64 = npt.NDArray[np.int64]

CATEGORIES: tuple[str, ...] = (
    "compute",
    "comm_transfer",
    "comm_wait",
    "memory",
    "host_launch",
    "idle",
)
# what each category holds, for the tables' docs and the report
CATEGORY_DOC: dict[str, str] = {
    "compute": "compute kernels (CPU ranks: compute ops) on the path",
    "comm_transfer": "a matched collective or send/recv after its last member arrived",
    "comm_wait": "communication no replay can split (unmatched: its peer's trace is absent)",
    "memory": "memcpy / memset",
    "host_launch": "the host thread's own time and launch latency on the path (GPU ranks), "
    "a lane waiting with nothing traced to wait for, the start of the step",
    "idle": "waiting on another lane after it ended (event waits), and the step's tail",
}


@dataclass(frozen=True)
class Replay:
    """Vertex values of one replay and, when tracked, each vertex's binding in-edge."""

    value: I64
    arg: I64 | None


def replay(g: Graph, add: I64 | None = None, lag: I64 | None = None, track: bool = False) -> Replay:
    """One longest-path pass; `add`/`lag` replace the measured ones (a what-if).

    Vertex by vertex this is: value = max(base, max over in-edges of pred value + lag) + own
    time, the binding in-edge the first that reaches that max above the base (`replay_loop`).
    The C loop over the graph's topological order does it when built (replay_c: exact, it
    declines on an int64 overflow): 0.06-0.09 s a replay of a 1,024-rank job's graph (1.19 M
    vertices, 3.2 M edges), where levels took 0.19-0.25 s. Without it the pass runs a
    topological level at a time (vertices of one level never depend on each other), with
    numpy over each level's in-edges: the graphs are wide and shallow (527 k vertices in 208
    levels on a 1,024-rank job), where a Python loop took 1.1 s a replay. A deep, narrow graph
    takes the loop (`levels` says when).
    Exact in int64: every value is >= NEG (a base is >= NEG, own times >= 0) and so is every
    lag (whatif clips them), so value + lag >= 2 * NEG = the smallest int64."""
    lg = g.e_lag if lag is None else lag
    ad = g.v_add if add is None else add
    if replay_c.available():
        got = replay_c.loop(g.order, g.ptr, g.e_src, lg, g.v_base, ad, track)
        if got is not None:
            return Replay(*got)
    return replay_levels(g, lg, ad, track)


def replay_levels(g: Graph, lg: I64, ad: I64, track: bool) -> Replay:
    """`replay` a topological level at a time with numpy (without the C loop; the tests
    compare it with the loop)."""
    lv = levels(g)
    low = (len(lg) and int(lg.min()) < NEG) or (len(ad) and int(ad.min()) < 0)
    if lv is None or low or (len(g.v_base) and int(g.v_base.min()) < NEG):
        return replay_loop_py(g, ad, lg, track)  # the C loop, if built, already declined
    val = np.zeros(len(g.v_base), dtype=np.int64)
    arg = np.full(len(g.v_base), -1, dtype=np.int64)
    for vs in lv:
        lo, hi = g.ptr[vs], g.ptr[vs + 1]
        best = g.v_base[vs].copy()
        fed = hi > lo
        if fed.any():
            deg = (hi - lo)[fed]
            k = _ranges(lo[fed], deg)
            cand = val[g.e_src[k]] + lg[k]
            starts = np.cumsum(deg) - deg
            top = np.maximum.reduceat(cand, starts)
            wins = top > best[fed]
            best[fed] = np.where(wins, top, best[fed])
            if track:
                at_top = cand == np.repeat(top, deg)
                first = np.minimum.reduceat(np.where(at_top, k, len(lg)), starts)
                arg[vs[fed]] = np.where(wins, first, -1)
        val[vs] = best + ad[vs]
    return Replay(val, arg if track else None)


def replay_loop(
    g: Graph, add: I64 | None = None, lag: I64 | None = None, track: bool = False
) -> Replay:
    """The same pass as a plain loop over a topological order (what `replay` computes by
    levels; used when the levels cannot be made, and by the tests as the reference). In C
    when built (replay_c), else, or when a sum leaves int64, in Python (exact)."""
    lg = g.e_lag if lag is None else lag
    ad = g.v_add if add is None else add
    if replay_c.available():
        got = replay_c.loop(g.order, g.ptr, g.e_src, lg, g.v_base, ad, track)
        if got is not None:
            return Replay(*got)
    return replay_loop_py(g, add, lag, track)


def replay_loop_py(
    g: Graph, add: I64 | None = None, lag: I64 | None = None, track: bool = False
) -> Replay:
    """replay_loop in Python, exact in any case (the reference the C loop is tested against)."""
    ptr = g.ptr.tolist()
    src = g.e_src.tolist()
    lg = (g.e_lag if lag is None else lag).tolist()
    base = g.v_base.tolist()
    ad = (g.v_add if add is None else add).tolist()
    val = [0] * len(base)
    arg = [-1] * len(base)
    for v in g.order.tolist():
        best, a = base[v], -1
        for k in range(ptr[v], ptr[v + 1]):
            r = val[src[k]] + lg[k]
            if r > best:
                best, a = r, k
        val[v] = best + ad[v]
        if track:
            arg[v] = a
    return Replay(np.asarray(val, dtype=np.int64), np.asarray(arg, np.int64) if track else None)


def levels(g: Graph) -> list[I64] | None:
    """The vertices by topological level (a vertex after all its in-edges' sources), made once
    per graph (Kahn's algorithm a level at a time). None if the edges hold a cycle, or if the
    graph is deep and narrow: past PROBE_LEVELS levels of fewer than MIN_WIDTH vertices on
    average, numpy per level costs more than the loop per vertex (a capture without step marks
    is one step, its lanes chains of millions of kernels: 250 s a report by levels)."""
    if g.levels is None:
        g.levels = _levels(g)
    return g.levels or None  # [] caches "no levels" (an empty graph takes the loop too)


PROBE_LEVELS = 1024
MIN_WIDTH = 32


def _levels(g: Graph) -> list[I64]:
    n = len(g.v_base)
    indeg = np.diff(g.ptr)
    dst = np.repeat(np.arange(n, dtype=np.int64), indeg)
    by_src = np.argsort(g.e_src, kind="stable")
    out_dst = dst[by_src]
    out_ptr = np.concatenate([[0], np.cumsum(np.bincount(g.e_src, minlength=n))])
    left = indeg.copy()
    front = np.flatnonzero(left == 0)
    out: list[I64] = []
    placed = 0
    while len(front):
        out.append(front)
        placed += len(front)
        if len(out) >= PROBE_LEVELS and placed < MIN_WIDTH * len(out):
            return []  # deep and narrow: the loop
        lo = out_ptr[front]
        nxt = out_dst[_ranges(lo, out_ptr[front + 1] - lo)]
        if not len(nxt):
            break
        hit, times = np.unique(nxt, return_counts=True)
        left[hit] -= times
        front = hit[left[hit] == 0]
    return out if placed == n else []


def _ranges(starts: I64, lengths: I64) -> I64:
    """The indices starts[i] .. starts[i] + lengths[i] - 1 of every i, concatenated."""
    total = int(lengths.sum())
    shift = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return np.asarray(np.arange(total, dtype=np.int64) + shift, dtype=np.int64)


def step_times(g: Graph, r: Replay) -> I64:
    """Replayed time of each step (g.steps): its last end plus the measured tail after the last
    activity, from the first rank's window start."""
    ends = np.isin(g.v_kind, (V_NODE, V_END))
    idx = np.searchsorted(g.steps, g.v_step[ends])
    last = np.full(len(g.steps), NEG, dtype=np.int64)
    np.maximum.at(last, idx, r.value[ends])
    tail = np.maximum(g.step_w_end - g.step_act_end, 0)
    return np.where(last > NEG, last + tail - g.step_w_start, 0)


def measured_step_times(g: Graph) -> I64:
    """First window start to the last window (or activity) end, over all ranks, per step."""
    return g.step_w_end - g.step_w_start


@dataclass(frozen=True)
class Segment:
    """One piece of a critical path."""

    step: int
    rank: int
    node: int  # -1 for the step's head and tail
    category: str
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class Path:
    """A critical path's segments column by column, in time order within each step.

    Why columns: a capture with no step marks is one step whose path can hold every kernel
    (millions); one object per segment took a minute and gigabytes there."""

    step: I64
    rank: I64
    node: I64  # -1 for the step's head and tail
    cat: I64  # index into CATEGORIES
    start_ns: I64
    end_ns: I64

    def __len__(self) -> int:
        return len(self.step)

    def __iter__(self) -> Iterator[Segment]:
        cols = (self.step, self.rank, self.node, self.cat, self.start_ns, self.end_ns)
        for st, rk, nd, c, a, b in zip(*(x.tolist() for x in cols), strict=True):
            yield Segment(st, rk, nd, CATEGORIES[c], a, b)


_CAT = {c: i for i, c in enumerate(CATEGORIES)}
# a node's own time, in this order: its measured busy columns (n_busy), then the rest
_NODE_CATS = np.array([_CAT[c] for c in ("compute", "comm_wait", "memory", "host_launch")])


def critical_path(g: Graph, r: Replay, add: I64 | None = None) -> Path:
    """The chain of binding edges back from each step's last end, as segments in time order;
    per step their lengths add up to the replayed step time."""
    assert r.arg is not None, "replay(track=True) first"
    val, arg = r.value, r.arg
    ad = g.v_add if add is None else add
    ends = np.flatnonzero(np.isin(g.v_kind, (V_NODE, V_END)))
    tail = np.maximum(g.step_w_end - g.step_act_end, 0)
    # the Python walk's lists, made once for every step
    lists = None if replay_c.available() else (g.e_src.tolist(), arg.tolist())
    cols: list[list[I64]] = [[] for _ in range(6)]
    for si, step in enumerate(g.steps.tolist()):
        mine = ends[g.v_step[ends] == step]
        if len(mine) == 0:
            continue
        back = _chain(int(mine[np.argmax(val[mine])]), arg, g.e_src, lists)
        vs = back[::-1]
        rank, node, cat, a, b = _segments_of(g, val, arg, ad, vs)
        end_t = int(val[back[0]])
        if tail[si] > 0:  # the step's tail, on the rank of its last end
            rank, node = np.append(rank, _ranks(g, vs[-1:])), np.append(node, -1)
            cat = np.append(cat, _CAT["idle"])
            a, b = np.append(a, end_t), np.append(b, end_t + int(tail[si]))
        first = int(a[0]) if len(a) else end_t
        head = int(g.step_w_start[si])
        if first > head:  # the step's start up to the path's first segment
            rank = np.insert(rank, 0, rank[0] if len(rank) else -1)
            node, cat = np.insert(node, 0, -1), np.insert(cat, 0, _CAT["host_launch"])
            a, b = np.insert(a, 0, head), np.insert(b, 0, first)
        for col, x in zip(cols, (np.full(len(a), step), rank, node, cat, a, b), strict=True):
            col.append(np.asarray(x, dtype=np.int64))
    out = [np.concatenate(c) if c else np.zeros(0, dtype=np.int64) for c in cols]
    return Path(*out)


def _chain(v: int, arg: I64, e_src: I64, lists: tuple[list[int], list[int]] | None) -> I64:
    """The vertices from v back along the binding in-edges to the step start, v first (in C,
    else in Python over `lists`: e_src and arg as lists)."""
    if lists is None:
        return replay_c.chain(v, arg, e_src)
    src, back = lists
    out: list[int] = []
    while v >= 0:
        out.append(v)
        k = back[v]
        v = src[k] if k >= 0 else -1
    return np.asarray(out, dtype=np.int64)


def _ranks(g: Graph, vs: I64) -> I64:
    """Each vertex's rank (-1: the join of a collective)."""
    node = g.v_node[vs]
    return np.where(g.v_kind[vs] == V_JOIN, -1, g.n_rank[np.maximum(node, 0)]).astype(np.int64)


SEGMENT_BLOCK = 1 << 18  # vertices whose segments are made at once


def _segments_of(g: Graph, val: I64, arg: I64, ad: I64, vs: I64) -> tuple[I64, ...]:
    """_segments of a chain, a block of vertices at a time: each vertex's segments are its
    own, and made at once those of a path of millions (a capture without step marks is one
    step) held ~1.5 GB of (vertices x 5) scratch arrays."""
    parts = [
        _segments(g, val, arg, ad, vs[i : i + SEGMENT_BLOCK])
        for i in range(0, len(vs), SEGMENT_BLOCK)
    ]
    return tuple(np.concatenate(cols) for cols in zip(*parts, strict=True))


def _segments(g: Graph, val: I64, arg: I64, ad: I64, vs: I64) -> tuple[I64, ...]:
    """Segments of a chain of vertices in time order: per vertex its binding edge's lag (a
    transfer for a collective's end), then its own time in its measured proportions
    (compute, unmatched comm, memory, the gaps inside it) scaled to its replayed length."""
    n = len(vs)
    kind, node, k = g.v_kind[vs], g.v_node[vs].astype(np.int64), arg[vs]
    rank = _ranks(g, vs)
    end = val[vs]
    own = (kind == V_NODE) | (kind == V_ARRIVE)
    start = np.where(own, end - ad[vs], end)
    has = k >= 0
    kk = np.where(has, k, 0) if len(g.e_src) else np.zeros(n, dtype=np.int64)
    e_src = g.e_src if len(g.e_src) else np.zeros(1, dtype=np.int64)  # no edge: none read
    e_kind = g.e_kind if len(g.e_kind) else np.zeros(1, dtype=g.e_kind.dtype)
    lag_start = np.where(has, val[e_src[kk]], 0)
    lag_end = np.where(kind == V_ARRIVE, np.minimum(start, end), start)  # gloo isend: its issue
    is_end = kind == V_END
    sync = np.isin(e_kind[kk], (E_SYNC, E_BLOCK))
    slot_a = np.zeros((n, 5), dtype=np.int64)
    slot_b = np.zeros((n, 5), dtype=np.int64)
    slot_c = np.zeros((n, 5), dtype=np.int64)
    ok = np.zeros((n, 5), dtype=bool)
    slot_a[:, 0] = lag_start
    slot_b[:, 0] = np.where(is_end, end, lag_end)
    slot_c[:, 0] = np.where(
        is_end, _CAT["comm_transfer"], np.where(sync, _CAT["idle"], _CAT["host_launch"])
    )
    ok[:, 0] = has & (is_end | (lag_end > lag_start))
    dur = end - start
    busy_node = (kind == V_NODE) & (dur > 0)
    nd = np.maximum(node, 0)
    span = (g.n_end[nd] - g.n_start[nd]).astype(np.float64)
    scale = np.divide(dur.astype(np.float64), span, out=np.zeros(n), where=span > 0)
    d = np.rint(g.n_busy[nd] * scale[:, None]).astype(np.int64)
    d = np.column_stack([d, dur - d.sum(axis=1)])
    at = start[:, None] + np.concatenate([np.zeros((n, 1), np.int64), np.cumsum(d, 1)[:, :3]], 1)
    slot_a[:, 1:], slot_b[:, 1:] = at, at + d
    slot_c[:, 1:] = _NODE_CATS
    ok[:, 1:] = busy_node[:, None] & (d > 0)
    pick = ok.ravel()
    rep = np.repeat(np.arange(n), 5)[pick]
    return rank[rep], node[rep], slot_c.ravel()[pick], slot_a.ravel()[pick], slot_b.ravel()[pick]
