"""The first half of the dependency graph: events -> units -> nodes, with each node's in-edges
from its lane, from what it waited for and from its launches (graph_build.py has the model).

Why a function of its own: the event-level arrays (millions of rows each: a 1,024-rank job's
2.5 M events) are needed only to find the nodes (hundreds of thousands). Taken from the
caller's dict and held only here, they are freed when this returns, before the edges are
gathered and sorted; held to the end of one function they were the graph's peak (0.9 GB of
arrays alive at the topological sort of that job).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from ranklens.analysis import graph_host as gh
from ranklens.analysis import graph_units as gu

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]
NEG = gu.NEG  # "no constraint"


@dataclass
class Nodes:
    """Per node (in lane order), per event (ev_node) and per (rank, step) of the graph."""

    rank: I64
    step: I64
    device: I64
    stream: I64
    start: I64
    end: I64
    busy: npt.NDArray[np.float64]  # (nodes, 3): compute, unmatched comm, memory ns
    comm: B
    first_eid: I64
    block: B  # a blocking host call (a point at its return)
    gpu: B  # the rank has a GPU
    lane_src: I64  # the lane's previous node (-1: none)
    sync_src: I64  # the node it waited for (-1: none)
    w_start: I64  # its rank-step window's start
    launch: gh.LaunchEdges
    ev_node: I64  # event id -> node
    rs: I64  # its (rank, step) index
    rs_step: I64  # per (rank, step) index
    rs_w_start: I64
    rs_w_end: I64


def col(d: dict[str, npt.NDArray[Any]], k: str) -> I64:
    """Column `k` taken out of `d` (so that `d` no longer holds it), as int64."""
    return np.asarray(d.pop(k), dtype=np.int64)


def nodes(
    ev: dict[str, Any],
    m_eid: I64,
    win: dict[str, Any],
    lnk: dict[str, Any],
    blk: dict[str, Any],
    tol_gpu: int,
    tol_cpu: int,
) -> Nodes:
    """Nodes of the numbered events `ev` (taken out of the dict: freed on return); `m_eid`: the
    matched members; `lnk`/`blk`: launch and blocking pairs (event ids); `win`: step windows."""
    rank, step, dev = col(ev, "rank"), col(ev, "step"), col(ev, "device")
    stream, is_comm, cls = col(ev, "stream"), col(ev, "is_comm"), col(ev, "cls")
    s, e = col(ev, "s"), col(ev, "e")
    gpu = np.asarray(ev.pop("has_gpu"), dtype=bool)
    blocking = np.asarray(ev.pop("blocking"), dtype=bool)
    n_ev = len(s)
    launch_of = np.full(n_ev, -1, dtype=np.int64)
    launch_of[col(lnk, "dev")] = col(lnk, "host")
    member = np.zeros(n_ev, dtype=bool)
    member[m_eid] = True
    lane_new = np.ones(n_ev, dtype=bool)
    if n_ev:
        lane_new[1:] = (
            (rank[1:] != rank[:-1])
            | (step[1:] != step[:-1])
            | (dev[1:] != dev[:-1])
            | (stream[1:] != stream[:-1])
            | (is_comm[1:] != is_comm[:-1])
        )
    del is_comm
    lane = np.cumsum(lane_new) - 1

    un = gu.units(lane, lane_new, member, cls, s, e, alone=cls == 3)
    del lane, lane_new
    u_lane, u_s, u_e, u_first = un["lane"], un["s"], un["e"], un["first"]
    u_member = member[u_first]
    del member
    rs, n_rs = gu.dense_key(rank[u_first], step[u_first])
    tol = np.where(gpu[u_first], tol_gpu, tol_cpu).astype(np.int64)
    n_u = len(u_s)
    first_on_lane = np.ones(n_u, dtype=bool)
    first_on_lane[1:] = u_lane[1:] != u_lane[:-1]
    prev_e = np.full(n_u, NEG, dtype=np.int64)
    prev_e[1:] = u_e[:-1]
    prev_e[first_on_lane] = NEG
    overlap = ~first_on_lane & (u_s < prev_e)
    prev_e[overlap] = NEG  # overlapping spans (gloo p2p waits) do not order each other
    u_host = cls[u_first] == 3
    del cls
    dv = np.flatnonzero(~u_host)  # device lanes wait on each other; host lanes only block
    sub = gu.sync_sources(rs[dv], u_lane[dv], u_s[dv], u_e[dv], prev_e[dv], tol[dv])
    del tol
    sync = np.full(n_u, -1, dtype=np.int64)
    sync[dv] = np.where(sub >= 0, dv[np.maximum(sub, 0)], -1)
    del sub, dv
    is_source = np.zeros(n_u, dtype=bool)
    is_source[sync[sync >= 0]] = True
    mk = gh.marks(u_host, u_first, launch_of, s, prev_e, un["of_event"], blocking)
    del prev_e, blocking
    b_host, b_dev = col(blk, "host"), col(blk, "dev")
    is_source[un["of_event"][b_dev]] = True  # what a blocking call waited for

    # a node: a run of units of one lane with nothing waited for inside it
    new_node = first_on_lane | u_member | (sync >= 0) | overlap
    new_node |= mk.launch_bound | mk.point | mk.blocking
    new_node[1:] |= u_member[:-1] | is_source[:-1] | mk.blocking[:-1]
    del is_source
    node_of_unit = np.cumsum(new_node) - 1
    starts = np.flatnonzero(new_node)
    del new_node
    nn = len(starts)
    n_start = u_s[starts]
    n_end = np.maximum.reduceat(u_e, starts) if n_u else u_e
    busy = un.pop("busy")
    n_busy = np.add.reduceat(busy, starts, axis=0) if n_u else np.zeros((0, 3))
    del busy, u_s, u_e
    n_first_eid, n_comm = u_first[starts], u_member[starts]
    n_block = mk.blocking[starts]
    del mk
    n_start[n_block] = n_end[n_block]  # a blocking call is a point at its return
    n_rank, n_step = rank[n_first_eid], step[n_first_eid]
    ev_node = node_of_unit[un.pop("of_event")]
    rs_rank = np.zeros(n_rs, dtype=np.int64)
    rs_step = np.zeros(n_rs, dtype=np.int64)
    rs_rank[rs], rs_step[rs] = rank[u_first], step[u_first]
    del rank, step, u_first
    node_rs = rs[starts]
    rs_first = np.full(n_rs, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(rs_first, node_rs, n_start)  # a launch a little before its window
    w_rs_start, w_rs_end = gu.window_of(
        np.arange(n_rs),
        rs_rank,
        rs_step,
        col(win, "rank"),
        col(win, "step"),
        col(win, "w_start"),
        col(win, "w_end"),
        rs_first,
    )

    # in-edges of each node: its lane's previous node, the node it waited for, the step start
    lane_src = np.where(first_on_lane[starts] | overlap[starts], -1, np.arange(nn) - 1)
    sync_u = sync[starts]
    sync_src = np.where(sync_u >= 0, node_of_unit[np.maximum(sync_u, 0)], -1)
    b_node, t_node = ev_node[b_host], ev_node[b_dev]
    keep = n_block[b_node] & (n_end[t_node] <= n_start[b_node])  # a blocking call waits
    sync_src[b_node[keep]] = t_node[keep]
    le = gh.launch_edges(launch_of, s, ev_node, u_lane[starts], n_first_eid, n_start, n_end)
    return Nodes(
        rank=n_rank,
        step=n_step,
        device=dev[n_first_eid],
        stream=stream[n_first_eid],
        start=n_start,
        end=n_end,
        busy=n_busy,
        comm=n_comm,
        first_eid=n_first_eid,
        block=n_block,
        gpu=gpu[n_first_eid],
        lane_src=lane_src,
        sync_src=sync_src,
        w_start=w_rs_start[node_rs],
        launch=le,
        ev_node=ev_node,
        rs=node_rs,
        rs_step=rs_step,
        rs_w_start=w_rs_start,
        rs_w_end=w_rs_end,
    )
