"""The host side of the dependency graph on GPU ranks: launch and blocking edges.

Why: a kernel cannot start before the host thread launched it, and the host runs ahead of the
device until a call blocks it (synchronize, a blocking copy). Reading only the device lanes
keeps every gap between kernels fixed, so on a host-bound run (the device waits for launches)
a faster kernel would seem to shorten the step although the next launch comes no sooner.
Here a host thread is a lane of its launch and blocking calls; its time between blocking calls
is its own (Python, the launches) and does not move with the device. A device unit whose
launch began after its stream's previous unit ended was launch-bound: it starts a node with an
edge from the host node that ended before the launch. Queued kernels inside a node add the
constraint node start >= launch - offset in the node (their offset shrinks when the node's
work does: `frac`, used by what-ifs). A blocking call is a point at its return, waiting for the
device event that ended last before it returned.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class UnitMarks:
    """Per unit: launch-bound device unit, host unit whose launch starts a node, blocking."""

    launch_bound: B
    point: B
    blocking: B


def marks(
    u_host: B, u_first: I64, launch_of: I64, s: I64, prev_e: I64, of_event: I64, blocking: B
) -> UnitMarks:
    """launch_of: per event, the event id of its launch call (-1: none); prev_e: per unit,
    the end of its lane's previous unit (NEG when none or overlapping)."""
    n = len(u_first)
    lu = launch_of[u_first]
    has = ~u_host & (lu >= 0)
    lb = np.zeros(n, dtype=bool)
    lb[has] = s[lu[has]] >= prev_e[has]
    point = np.zeros(n, dtype=bool)
    point[of_event[lu[lb]]] = True
    return UnitMarks(lb, point & u_host, u_host & blocking[u_first])


@dataclass(frozen=True)
class LaunchEdges:
    """One edge per (device node, host node): dst, src, the ready time it gives the
    device node as measured (src end + lag0), lag0, and the share of the node before the
    kernel (its offset scales with the node's length in a what-if)."""

    dst: I64
    src: I64
    ready: I64
    lag0: I64
    frac: npt.NDArray[np.float64]


def launch_edges(
    launch_of: I64,
    s: I64,
    ev_node: I64,
    node_lane: I64,
    node_first_ev: I64,
    n_start: I64,
    n_end: I64,
) -> LaunchEdges:
    """Edges from the host node a launch belongs to (or the one before it, when the launch
    starts its node) to the device node of the kernel."""
    k = np.flatnonzero(launch_of >= 0)  # launched device events
    h = launch_of[k]
    d_node, h_node = ev_node[k], ev_node[h]
    prev = h_node - 1
    has_prev = (prev >= 0) & (node_lane[np.maximum(prev, 0)] == node_lane[h_node])
    # a launch that starts its host node follows the node before it (the lane's first: itself)
    src = np.where((node_first_ev[h_node] == h) & has_prev, prev, h_node)
    off = s[k] - n_start[d_node]
    # a kernel that starts before its launch (host and device clocks disagree, as in some
    # Kineto traces) cannot wait for it: clamped, the launch never pushes a measured start
    ready = np.minimum(s[h], s[k]) - off
    if len(k) == 0:
        z = np.zeros(0, dtype=np.int64)
        return LaunchEdges(z, z, z, z, np.zeros(0))
    span = (n_end[d_node] - n_start[d_node]).astype(np.float64)
    frac = np.clip(np.divide(off, span, out=np.zeros(len(off)), where=span > 0), 0.0, 1.0)
    # Per (dst, src) the constraint is max over its kernels of ready + shrink * frac, a line
    # per kernel: keep both ends of that envelope, the latest ready (no shrink) and the
    # steepest (the kernel furthest into the node: what binds once the node got much shorter).
    keep = np.zeros(len(k), dtype=bool)
    for o in (np.lexsort((-ready, src, d_node)), np.lexsort((-ready, -frac, src, d_node))):
        first = np.ones(len(o), dtype=bool)
        first[1:] = (d_node[o][1:] != d_node[o][:-1]) | (src[o][1:] != src[o][:-1])
        keep[o[first]] = True
    o = np.flatnonzero(keep)
    o = o[np.lexsort((src[o], d_node[o]))]
    return LaunchEdges(d_node[o], src[o], ready[o], ready[o] - n_end[src[o]], frac[o])


def order_key(e: LaunchEdges, n_start: I64) -> I64:
    """A node's place in a topological order: its start, or later, the start of a host node
    that launched into it (a queue the device began before the host node began; never
    after the node's end, which its successors start from)."""
    key = n_start.copy()
    np.maximum.at(key, e.dst, n_start[e.src])
    return key


def latest_per_node(e: LaunchEdges, n_nodes: int, neg: int) -> I64:
    """Per node, the latest ready time given by a launch whose host node ended before it
    (neg: none). Only such an edge may bind: its measured gap is time, where a queued kernel's
    constraint (negative lag) would put the path back inside the host's node."""
    out = np.full(n_nodes, neg, dtype=np.int64)
    ok = e.lag0 >= 0
    np.maximum.at(out, e.dst[ok], e.ready[ok])
    return out
