"""Vectorised pieces of the graph build: union islands per lane, the waits between lanes,
the step windows of the nodes (numpy; a loop per event would take minutes at 10 M events)."""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np
import numpy.typing as npt
from ranklens.analysis import replay_c

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
NEG = -(1 << 62)


def dense_key(a: I64, b: I64) -> tuple[I64, int]:
    """Dense ids of (a, b) pairs, in sorted order, and how many there are. The pairs become
    one int64 key (np.unique over rows sorts void records: 0.6 s on 1.3 M units); when the
    keys are already in order (units in lane order) no sort at all."""
    if len(a) == 0:
        return np.zeros(0, dtype=np.int64), 0
    a0, b0 = int(a.min()), int(b.min())
    span_a, span_b = int(a.max()) - a0 + 1, int(b.max()) - b0 + 1
    if span_a * span_b >= 1 << 62:  # cannot be one int64: rows as they are
        _, inv = np.unique(np.stack([a, b], axis=1), axis=0, return_inverse=True)
        inv = np.asarray(inv, dtype=np.int64).reshape(-1)
        return inv, int(inv.max()) + 1
    key = (a - a0) * span_b + (b - b0)
    if bool(np.all(key[1:] >= key[:-1])):
        new = np.ones(len(key), dtype=bool)
        new[1:] = key[1:] != key[:-1]
        ids = np.cumsum(new) - 1
        return ids, int(ids[-1]) + 1
    _, inv = np.unique(key, return_inverse=True)
    inv = np.asarray(inv, dtype=np.int64).reshape(-1)
    return inv, int(inv.max()) + 1


def units(
    lane: I64,
    lane_new: npt.NDArray[np.bool_],
    member: npt.NDArray[np.bool_],
    cls: I64,
    s: I64,
    e: I64,
    alone: npt.NDArray[np.bool_],
) -> dict[str, npt.NDArray[Any]]:
    """Union islands of each lane's non-member events (nested host ops are one island) and
    every member (or `alone`: a host runtime call) event on its own, in lane order. busy: per
    unit (compute, comm, memory) ns, the island's length split by the classes' durations."""
    single = member | alone
    idx = np.flatnonzero(~single)
    n = len(idx)
    of_event = np.zeros(len(s), dtype=np.int64)
    i_first = i_s = i_e = isl = np.zeros(0, dtype=np.int64)
    busy = np.zeros((0, 3))
    if n:
        seg_new = np.ones(n, dtype=bool)
        seg_new[1:] = (lane[idx[1:]] != lane[idx[:-1]]) | (idx[1:] - idx[:-1] > 1)
        seg_new |= lane_new[idx]
        seg = np.cumsum(seg_new) - 1
        base = s[idx[seg_new]][seg]
        rel_e = np.maximum(e[idx] - base, 0)
        reach = segmented_max(seg, rel_e)
        prev_reach = np.zeros(n, dtype=np.int64)
        prev_reach[1:] = reach[:-1]
        opens = seg_new | (s[idx] - base > prev_reach)
        isl = np.cumsum(opens) - 1
        i_start = np.flatnonzero(opens)
        i_first = idx[i_start]
        i_s = s[i_first]
        i_e = np.maximum.reduceat(e[idx], i_start)
        dur = (e[idx] - s[idx]).astype(np.float64)
        # per island and class (0-2: a lone event is the only host call, class 3) at once
        n_isl = len(i_start)
        sums = np.bincount(isl * 3 + cls[idx], weights=dur, minlength=3 * n_isl).reshape(-1, 3)
        tot = sums.sum(axis=1)
        frac = np.divide(sums, tot[:, None], out=np.zeros_like(sums), where=tot[:, None] > 0)
        busy = frac * (i_e - i_s)[:, None]
    m_idx = np.flatnonzero(single)
    first = np.concatenate([i_first, m_idx])
    order = np.argsort(first, kind="stable")
    pos = np.empty(len(order), dtype=np.int64)
    pos[order] = np.arange(len(order))
    of_event[idx] = pos[isl]
    of_event[m_idx] = pos[len(i_first) + np.arange(len(m_idx))]
    u_busy = np.zeros((len(order), 3))  # a lone event's: zeros (scattered, not gathered)
    u_busy[pos[: len(i_first)]] = busy
    u_first = first[order]
    return {
        "first": u_first,
        "lane": lane[u_first],
        "s": np.concatenate([i_s, s[m_idx]])[order],
        "e": np.concatenate([i_e, e[m_idx]])[order],
        "busy": u_busy,
        "of_event": of_event,
    }


def segmented_max(seg: I64, v: I64) -> I64:
    """Running max of v (>= 0) restarting at each segment (seg ascending)."""
    if len(v) == 0:
        return v
    bits = max(int(v.max()).bit_length(), 1)
    if bits + int(seg[-1]).bit_length() <= 62:
        return np.maximum.accumulate((seg << bits) | v) & ((1 << bits) - 1)
    out = v.copy()  # keys too wide to pack: per segment
    starts = np.flatnonzero(np.r_[True, seg[1:] != seg[:-1]])
    for a, b in zip(starts, np.r_[starts[1:], len(v)], strict=True):
        out[a:b] = np.maximum.accumulate(v[a:b])
    return out


def sync_sources(rs: I64, u_lane: I64, u_s: I64, u_e: I64, prev_e: I64, tol: I64) -> I64:
    """For each unit, the unit of another lane of its rank and step that it waited for (-1:
    none): the latest to end at or before its start, after its own lane's previous unit
    ended, within tol. rs: dense (rank, step) id per unit."""
    n = len(u_s)
    out = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return out
    t0 = np.full(int(rs.max()) + 1, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(t0, rs, np.minimum(u_s, u_e))
    rel_s, rel_e = u_s - t0[rs], u_e - t0[rs]
    bits = max(int(max(rel_s.max(), rel_e.max())).bit_length(), 1)
    if bits + int(rs.max()).bit_length() > 62 and int(rs.max()) > 0:
        # steps too long to pack next to their key: one (rank, step) at a time
        for key in np.unique(rs).tolist():
            mine = np.flatnonzero(rs == key)
            sub = sync_sources(
                np.zeros(len(mine), np.int64),
                u_lane[mine],
                u_s[mine],
                u_e[mine],
                prev_e[mine],
                tol[mine],
            )
            out[mine] = np.where(sub >= 0, mine[np.maximum(sub, 0)], -1)
        return out
    key_e = (rs << bits) | rel_e
    by_end = np.argsort(key_e, kind="stable")
    k_sorted = key_e[by_end]
    k_end, k_lane, k_start = u_e[by_end], u_lane[by_end], u_s[by_end]
    pos = np.searchsorted(k_sorted, (rs << bits) | rel_s, side="right") - 1
    lo_bound = np.searchsorted(k_sorted, rs << bits, side="left")
    todo = np.arange(n)
    for _ in range(8):  # skip units of its own lane (few end within a gap)
        p = pos[todo]
        ok = p >= lo_bound[todo]
        todo, p = todo[ok], p[ok]
        e_w = k_end[p]
        # it ended in the gap and started before (two zero-length units at one instant
        # cannot wait for each other)
        ok = (u_s[todo] - e_w <= tol[todo]) & (e_w > prev_e[todo]) & (k_start[p] < u_s[todo])
        todo, p = todo[ok], p[ok]
        found = k_lane[p] != u_lane[todo]
        out[todo[found]] = by_end[p[found]]
        todo, p = todo[~found], p[~found]
        pos[todo] = p - 1
        if len(todo) == 0:
            break
    return out


def window_of(
    n_rs: I64,
    rs_rank: I64,
    rs_step: I64,
    w_rank: I64,
    w_step: I64,
    w_s: I64,
    w_e: I64,
    n_start: I64,
) -> tuple[I64, I64]:
    """Each node's rank-step window (start, end): the steps table's, its start no later than
    the rank's first node; a rank without a window starts at its first node, end unknown."""
    n_rs_count = len(rs_rank)
    first = np.full(n_rs_count, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, n_rs, n_start)
    ws, we = first.copy(), np.full(n_rs_count, NEG, dtype=np.int64)
    if len(w_rank) and n_rs_count:
        key = rs_rank * (1 << 32) + (rs_step + (1 << 31))
        wkey = w_rank * (1 << 32) + (w_step + (1 << 31))
        o = np.argsort(wkey)
        j = np.searchsorted(wkey[o], key)
        j = np.minimum(j, len(o) - 1)
        hit = wkey[o][j] == key
        ws[hit] = np.minimum(w_s[o][j][hit], first[hit])
        we[hit] = w_e[o][j][hit]
    return ws[n_rs], we[n_rs]


class Edges:
    """Edge lists gathered piecewise, then sorted by destination."""

    def __init__(self) -> None:
        self.parts: list[tuple[I64, I64, I64, I64, I64, F64]] = []

    def add(
        self,
        dst: I64,
        src: I64,
        lag: I64,
        kind: int,
        inst: I64 | None = None,
        frac: F64 | None = None,
    ) -> None:
        n = len(dst)
        ins = np.full(n, -1, dtype=np.int64) if inst is None else np.asarray(inst, np.int64)
        fr = np.zeros(n) if frac is None else np.asarray(frac, np.float64)
        self.parts.append(
            (
                np.asarray(dst, np.int64),
                np.asarray(src, np.int64),
                np.asarray(lag, np.int64),
                np.full(n, kind, dtype=np.int64),
                ins,
                fr,
            )
        )

    def redirect(self, vertex_of_node: I64) -> None:
        """Edges added so far leave from vertex_of_node[src] (a comm node's end)."""
        self.parts = [(d, vertex_of_node[s], lg, k, i, f) for d, s, lg, k, i, f in self.parts]

    def csr(self, n_vertices: int) -> tuple[I64, I64, I64, I64, I64, F64]:
        if not self.parts:
            z = np.zeros(0, dtype=np.int64)
            return np.zeros(n_vertices + 1, dtype=np.int64), z, z, z, z, np.zeros(0)
        # Column by column, each part released once joined and each joined column once
        # sorted: the parts, the joined columns and the sorted ones are never all held (the
        # graph's peak memory on a 1,024-rank job: a few hundred MB less).
        parts: list[list[npt.NDArray[Any] | None]] = [list(pt) for pt in self.parts]
        self.parts = []
        cols: list[npt.NDArray[Any]] = []
        for k in range(6):
            cols.append(np.concatenate([pt[k] for pt in parts]))
            for pt in parts:
                pt[k] = None
        dst = cols[0]
        o = np.argsort(dst, kind="stable")
        ptr = np.zeros(n_vertices + 1, dtype=np.int64)
        np.cumsum(np.bincount(dst, minlength=n_vertices), out=ptr[1:])
        del dst
        cols[0] = np.zeros(0)
        for k in range(1, 6):
            cols[k] = cols[k][o]
        return ptr, cols[1], cols[2], cols[3], cols[4], cols[5]


def topo_order(key: I64, ptr: I64, src: I64) -> tuple[I64, npt.NDArray[np.bool_]]:
    """Vertices in a topological order, and which in-edges (CSR order) to keep. By their
    measured-time key when every edge goes forward (a consistent trace); else Kahn's algorithm
    with the key breaking ties, and if a cycle remains (timestamps that contradict each other,
    e.g. zero-length events at one instant waiting on each other), the edges among the vertices
    left that go backwards in key order are dropped: any cycle holds one."""
    n = len(key)
    order = np.argsort(key, kind="stable")  # ties in vertex order
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    dst = np.repeat(np.arange(n), np.diff(ptr))
    keep = np.ones(len(src), dtype=bool)
    if np.all(pos[src] < pos[dst]):
        return order, keep
    out = _kahn(n, src, dst, keep, pos)
    if len(out) != n:
        placed = np.zeros(n, dtype=bool)
        placed[out] = True
        keep &= placed[src] | placed[dst] | (pos[src] < pos[dst])
        out = _kahn(n, src, dst, keep, pos)
    return np.asarray(out, dtype=np.int64), keep


def _kahn(n: int, src: I64, dst: I64, keep: npt.NDArray[np.bool_], pos: I64) -> I64:
    """Kahn's algorithm over the kept edges; the vertices it could place, in order (in C where
    built: replay_c.kahn; the same order)."""
    s, d = src[keep], dst[keep]
    out_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(s, minlength=n), out=out_ptr[1:])
    succ = d[np.argsort(s, kind="stable")]
    indeg = np.bincount(d, minlength=n)
    if replay_c.available():
        return replay_c.kahn(out_ptr, succ, indeg, pos)
    placed = _kahn_py(n, out_ptr.tolist(), succ.tolist(), indeg.tolist(), pos.tolist())
    return np.asarray(placed, dtype=np.int64)


def _kahn_py(
    n: int, optr: list[int], succ: list[int], indeg: list[int], rank_of: list[int]
) -> list[int]:
    """_kahn's loop where the C one is not built (lists: a loop over numpy items is slower)."""
    heap = [(rank_of[v], v) for v in range(n) if indeg[v] == 0]
    heapq.heapify(heap)
    out: list[int] = []
    while heap:
        _, v = heapq.heappop(heap)
        out.append(v)
        for k in range(optr[v], optr[v + 1]):
            w = succ[k]
            indeg[w] -= 1
            if indeg[w] == 0:
                heapq.heappush(heap, (rank_of[w], w))
    return out


def step_table(
    rs_step: I64, w_start: I64, w_end: I64, n_rs: int, node_rs: I64, n_end: I64
) -> tuple[I64, I64, I64, I64]:
    """Per step: first window start, last window end, last activity end (all ranks)."""
    act = np.full(n_rs, NEG, dtype=np.int64)
    np.maximum.at(act, node_rs, n_end)
    steps, inv = np.unique(rs_step, return_inverse=True)
    k = len(steps)
    st = np.full(k, np.iinfo(np.int64).max, dtype=np.int64)
    en = np.full(k, NEG, dtype=np.int64)
    ae = np.full(k, NEG, dtype=np.int64)
    np.minimum.at(st, inv, w_start)
    np.maximum.at(en, inv, w_end)
    np.maximum.at(ae, inv, act)
    return steps.astype(np.int64), st, np.maximum(en, ae), ae
