"""Clock links through send/recv: hosts that no collective joins (pipeline stages on their own
hosts) are aligned by the p2p messages between them.

Why: with Megatron's layout a host often holds one TP group of one stage, so DP and TP
collectives never leave a stage's hosts and only pipeline send/recv connect them. A large
NCCL send completes with its recv (rendezvous), so a message's two ends agree in true time:
end_recv(B) + o_B = end_send(A) + o_A. A buffered (eager) send ends before its recv, so the
differences are read by their densest window (the mode), not their mean: the rendezvous
messages pile up at the true offset, eager ones scatter above it.

Input: pairs of events that should end together, with their ranks, as a polars frame
(`a`, `ea`, `b`, `eb`). Before peers are known, the pairs are every send × recv of adjacent
stages (the true ones still pile up at one offset; wrong ones spread over the schedule).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import polars as pl

_WINDOW_NS = 4_000  # rendezvous ends agree within a few µs on real NCCL
_MIN_SUPPORT = 3


def link_components(
    pairs: pl.DataFrame, dom_of: dict[int, int], offsets: np.ndarray, comp: np.ndarray
) -> tuple[np.ndarray, np.ndarray, set[int]]:
    """Offsets per domain with components joined through p2p pairs.

    `offsets` are per-domain (added to raw times), `comp` the component of each domain after
    collective alignment. Returns new offsets, new components and the domains whose offset
    now comes from p2p links (those outside the reference domain's collective component).
    """
    if pairs.is_empty() or len(set(comp.tolist())) < 2:
        return offsets, comp, set()
    ranks = np.array(list(dom_of), dtype=np.int64)
    doms = np.array([dom_of[int(r)] for r in ranks], dtype=np.int64)
    lut = dict(zip(ranks.tolist(), doms.tolist(), strict=True))
    ha = pairs["a"].replace_strict(lut, return_dtype=pl.Int64).to_numpy()
    hb = pairs["b"].replace_strict(lut, return_dtype=pl.Int64).to_numpy()
    # int64 difference first: raw ns near 2^60 lose ~256 ns as float64
    raw = (pairs["eb"].cast(pl.Int64) - pairs["ea"].cast(pl.Int64)).to_numpy()
    d = raw.astype(np.float64) + offsets[hb] - offsets[ha]
    ca, cb = comp[ha], comp[hb]
    keep = ca != cb
    ca, cb, d = ca[keep], cb[keep], d[keep].astype(np.float64)
    flip = ca > cb
    ca, cb = np.where(flip, cb, ca), np.where(flip, ca, cb)
    d = np.where(flip, -d, d)
    edges = []
    for (x, y), idx in _group(ca, cb).items():
        delta, support = _densest(np.sort(d[idx]))
        if support >= _MIN_SUPPORT:
            edges.append((support, int(x), int(y), delta))
    shift = _spanning_shifts(edges, comp)
    if not shift:
        return offsets, comp, set()
    new = offsets.astype(np.float64).copy()
    new_comp = comp.copy()
    ref = comp[0]
    linked: set[int] = set()
    for c, (root, s) in shift.items():
        members = np.flatnonzero(comp == c)
        new[members] += s
        new_comp[members] = root
    for c in set(new_comp.tolist()):
        members = np.flatnonzero(new_comp == c)
        new[members] -= new[members.min()]
    for h in range(len(comp)):
        if comp[h] != ref and new_comp[h] == new_comp[0]:
            linked.add(h)
    return np.round(new), new_comp, linked


def _group(ca: np.ndarray, cb: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
    out: dict[tuple[int, int], list[int]] = defaultdict(list)
    for k, key in enumerate(zip(ca.tolist(), cb.tolist(), strict=True)):
        out[key].append(k)
    return {k: np.array(v) for k, v in out.items()}


def _densest(d: np.ndarray) -> tuple[float, int]:
    """Median of the densest window of width _WINDOW_NS in sorted d, and its count."""
    hi = np.searchsorted(d, d + _WINDOW_NS, side="right")
    counts = hi - np.arange(len(d))
    k = int(np.argmax(counts))
    return float(np.median(d[k : hi[k]])), int(counts[k])


def _spanning_shifts(
    edges: list[tuple[int, int, int, float]], comp: np.ndarray
) -> dict[int, tuple[int, float]]:
    """Best-supported spanning forest over components; each non-root component's shift.

    An edge (x, y, delta) says events of y end delta later than simultaneous ones of x, so
    y's offsets move by -delta relative to x. Returns {component: (root, shift)}.
    """
    adj: dict[int, list[tuple[int, float, int]]] = defaultdict(list)
    for support, x, y, delta in edges:
        adj[x].append((y, -delta, support))
        adj[y].append((x, delta, support))
    out: dict[int, tuple[int, float]] = {}
    seen: set[int] = set()
    roots = [int(c) for c in dict.fromkeys(comp.tolist())]  # reference component first
    for root in roots:
        if root in seen or root not in adj:
            continue
        seen.add(root)
        # Prim's algorithm: grow from the root along the best-supported edge first.
        frontier = [(-sup, nxt, sh) for nxt, sh, sup in adj[root]]
        while frontier:
            frontier.sort()
            _neg, node, total = frontier.pop(0)
            if node in seen:
                continue
            seen.add(node)
            out[node] = (root, total)
            frontier.extend(
                (-sup, nxt, total + sh) for nxt, sh, sup in adj[node] if nxt not in seen
            )
    return out
