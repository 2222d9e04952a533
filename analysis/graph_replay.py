"""Replay of the dependency graph (graph_build.Graph) and its critical path.

Why a plain loop: the graph is a DAG in a known topological order, and a replay is one
longest-path pass over it (value = max over in-edges of pred value + lag, plus the vertex's
own time); vertices and edges are plain lists, so a pass over a million vertices takes about a
second. The critical path is the chain of binding in-edges back from the step's last end.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
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
    """One pass in topological order; `add`/`lag` replace the measured ones (a what-if)."""
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


def critical_path(g: Graph, r: Replay, add: I64 | None = None) -> list[Segment]:
    """The chain of binding edges back from each step's last end, as segments in time order;
    per step their lengths add up to the replayed step time."""
    assert r.arg is not None, "replay(track=True) first"
    val, arg = r.value, r.arg
    ad = g.v_add if add is None else add
    out: list[Segment] = []
    ends = np.flatnonzero(np.isin(g.v_kind, (V_NODE, V_END)))
    tail = np.maximum(g.step_w_end - g.step_act_end, 0)
    for si, step in enumerate(g.steps.tolist()):
        mine = ends[g.v_step[ends] == step]
        if len(mine) == 0:
            continue
        v = int(mine[np.argmax(val[mine])])
        segs: list[Segment] = []
        end_t = int(val[v])
        if tail[si] > 0:
            segs.append(Segment(step, _rank_of(g, v), -1, "idle", end_t, end_t + int(tail[si])))
        while v >= 0:
            v = _walk(g, val, arg, ad, v, step, segs)
        first = segs[-1].start_ns if segs else end_t
        head = int(g.step_w_start[si])
        if first > head:
            rank0 = segs[-1].rank if segs else -1
            segs.append(Segment(step, rank0, -1, "host_launch", head, first))
        out.extend(reversed(segs))
    return out


def _rank_of(g: Graph, v: int) -> int:
    if g.v_kind[v] == V_JOIN:
        return -1
    return int(g.n_rank[g.v_node[v]])


def _walk(g: Graph, val: I64, arg: I64, ad: I64, v: int, step: int, segs: list[Segment]) -> int:
    """Add vertex v's own time and its binding edge's lag; return the predecessor (-1: the
    step start)."""
    kind = int(g.v_kind[v])
    node = int(g.v_node[v])
    k = int(arg[v])
    rank = _rank_of(g, v)
    end = int(val[v])
    start = end - int(ad[v]) if kind in (V_NODE, V_ARRIVE) else end
    if kind == V_NODE and end > start:
        segs.extend(reversed(_node_parts(g, node, rank, step, start, end)))
    if k < 0:
        return -1
    u = int(g.e_src[k])
    lag_end = start
    lag_start = int(val[u])
    ek = int(g.e_kind[k])
    if kind == V_END:  # transfer: from the join (or own arrival) to this end
        segs.append(Segment(step, rank, node, "comm_transfer", lag_start, end))
        return u
    if kind == V_ARRIVE:  # a gloo isend arrives at its issue op, before its span starts
        lag_end = min(start, end)
    if lag_end > lag_start:
        cat = "idle" if ek in (E_SYNC, E_BLOCK) else "host_launch"
        segs.append(Segment(step, rank, node, cat, lag_start, lag_end))
    return u


def _node_parts(g: Graph, node: int, rank: int, step: int, start: int, end: int) -> list[Segment]:
    """A node's time in its measured proportions (compute, unmatched comm, memory, and the
    gaps inside it), scaled to its replayed length, in time order."""
    busy = g.n_busy[node]
    span = float(g.n_end[node] - g.n_start[node])
    scale = (end - start) / span if span > 0 else 0.0
    parts = [
        (c, round(float(b) * scale))
        for c, b in zip((*CATEGORIES[:1], "comm_wait", "memory"), busy, strict=True)
    ]
    parts.append(("host_launch", (end - start) - sum(d for _, d in parts)))
    out, t = [], start
    for cat, d in parts:
        if d > 0:
            out.append(Segment(step, rank, node, cat, t, t + d))
            t += d
    return out
