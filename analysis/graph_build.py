"""The cross-rank dependency graph of every step, built as arrays from the database.

Why arrays: 1,024 ranks or 10 M events make hundreds of thousands of nodes, which networkx holds
at a gigabyte and walks at seconds per pass; replays need several passes. `to_networkx` gives
the same graph as a `networkx.DiGraph` for users and tests.

Model (the trace records kernels, not the events they wait on, so waits are read from timing):
- a *lane* is one stream (GPU) or thread (CPU) of a rank in a step, its communication apart;
- a *unit* is a union island of a lane's activity, or one matched communication event;
- a unit *waited* for another lane when it starts within `sync_tol_ns` after a unit of
  another lane of its rank ended, and after its own lane's previous unit ended
  (cudaStreamWaitEvent, a blocking wait on a collective or a recv, gloo's wait());
- runs of units with no such wait between them are one *node* (their gaps stay fixed: the
  device waited for the host launching it, or untraced host work);
- a matched collective instance joins its members: each member ends at the last arrival plus
  its own transfer time (no member's kernel ends before the last member arrived);
- every in-edge has a lag: the binding one (latest measured ready) keeps the measured gap, the
  others none, so the unchanged graph replays each measured start; a member that ended before
  its last member arrived (an eager send, or a clock error) follows its own arrival only, and is
  counted in `inconsistent`.
Vertices: one per node (a communication node's vertex is its arrival), one end vertex per
communication node, one join vertex per instance. value[v] = max(base[v], value[u] + lag over
in-edges) + add[v]: a node's end, an arrival, a join (last arrival) or a member's end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np
import numpy.typing as npt
from ranklens.analysis import graph_host as gh
from ranklens.analysis import graph_units as gu
from ranklens.analysis._sql import apply_sql

if TYPE_CHECKING:
    import networkx as nx

I64 = npt.NDArray[np.int64]
NEG = -(1 << 62)  # "no constraint" for a base or a dropped edge

# vertex kinds
V_NODE, V_ARRIVE, V_JOIN, V_END = 0, 1, 2, 3
# edge kinds (what a lag on the critical path is called)
E_LANE, E_SYNC, E_MEMBER, E_TRANSFER, E_OWN, E_LAUNCH, E_BLOCK = 0, 1, 2, 3, 4, 5, 6
EDGE_KINDS = ("lane", "sync", "member", "transfer", "own", "launch", "block")


@dataclass
class Graph:
    """Nodes, vertices and in-edges (sorted by destination, CSR) of all steps."""

    # nodes
    n_rank: I64
    n_step: I64
    n_device: I64
    n_stream: I64
    n_start: I64  # measured, job clock
    n_end: I64
    n_busy: npt.NDArray[np.float64]  # (nodes, 3): compute, unmatched comm, memory ns
    n_comm: npt.NDArray[np.bool_]  # a matched communication event
    n_first_eid: I64  # its first event (names)
    ev_node: I64  # event id -> node
    # vertices
    v_kind: I64
    v_node: I64  # the node of a node/arrival/end vertex; the instance index of a join
    v_step: I64
    v_base: I64
    v_add: I64
    # in-edges, sorted by destination
    ptr: I64
    e_src: I64
    e_lag: I64
    e_kind: I64
    e_inst: I64  # instance index of a transfer edge, -1 otherwise
    e_frac: npt.NDArray[np.float64]  # launch edge: the kernel's share of the way into its node
    # instances
    inst_id: I64
    inst_par: npt.NDArray[np.str_]
    inst_p2p: npt.NDArray[np.bool_]  # a send/recv: a data dependency, never hidden
    # steps: measured step time and what the replay keeps fixed
    steps: I64
    step_w_start: I64  # first start of a rank's window
    step_w_end: I64
    step_act_end: I64  # last measured activity end
    order: I64  # a topological order of the vertices
    inconsistent: int  # members that ended before their last member arrived (eager sends)
    dropped_edges: int  # edges dropped to break cycles of contradicting timestamps
    ranks_gpu: dict[int, bool]
    levels: list[I64] | None = field(default=None, repr=False)  # graph_replay.levels' cache


@dataclass(frozen=True)
class BuildParams:
    """A unit that starts this soon after another lane's unit ended waited for it. GPU: event
    waits take a few µs, and a longer gap is the host launching late. CPU: a thread that
    resumes after another lane ended (a gloo wait returning, then Python) waited for it, however
    long the Python took (kept as the edge's lag)."""

    sync_tol_gpu_ns: int = 20_000
    sync_tol_cpu_ns: int = 1 << 50


def build(
    con: duckdb.DuckDBPyConnection,
    p: BuildParams = BuildParams(),
    during: Callable[[duckdb.DuckDBPyConnection, Graph], None] | None = None,
) -> Graph:
    """Read the run's activity and matched collectives and build the graph of every step;
    `during(con, graph)` runs while the numbered events (temp table _critical_path_ev) exist."""
    try:
        apply_sql(con, "critical_path")  # numbers the events into temp table _critical_path_ev
        ev = con.execute(
            "SELECT rank, step, device, stream, is_comm, cls, s, e, has_gpu, blocking "
            "FROM _critical_path_ev ORDER BY eid"
        ).fetchnumpy()
        lnk = con.execute("SELECT dev, host FROM _critical_path_launch").fetchnumpy()
        blk = con.execute("SELECT host, dev FROM _critical_path_blocks").fetchnumpy()
        mem = con.execute(
            "SELECT eid, instance_id, arr, parallelism, p2p FROM _critical_path_members "
            "ORDER BY instance_id, eid"
        ).fetchnumpy()
        win = con.execute(
            "SELECT rank, step, w_start, w_end FROM _critical_path_windows"
        ).fetchnumpy()
        g = _assemble(ev, mem, win, p, lnk, blk)
        if during is not None:
            during(con, g)
    finally:
        for view in ("members", "launch", "blocks"):
            con.execute(f"DROP VIEW IF EXISTS temp._critical_path_{view}")
        con.execute("DROP TABLE IF EXISTS temp._critical_path_ev")
    return g


def _col(d: dict[str, npt.NDArray[Any]], k: str) -> I64:
    return np.asarray(d[k], dtype=np.int64)


def _assemble(
    ev: dict[str, Any],
    mem: dict[str, Any],
    win: dict[str, Any],
    p: BuildParams,
    lnk: dict[str, Any],
    blk: dict[str, Any],
) -> Graph:
    rank, step, dev = _col(ev, "rank"), _col(ev, "step"), _col(ev, "device")
    stream, is_comm, cls = _col(ev, "stream"), _col(ev, "is_comm"), _col(ev, "cls")
    s, e = _col(ev, "s"), _col(ev, "e")
    gpu = np.asarray(ev["has_gpu"], dtype=bool)
    n_ev = len(s)
    blocking = np.asarray(ev["blocking"], dtype=bool)
    launch_of = np.full(n_ev, -1, dtype=np.int64)
    launch_of[_col(lnk, "dev")] = _col(lnk, "host")
    m_eid, m_inst, m_arr = _col(mem, "eid"), _col(mem, "instance_id"), _col(mem, "arr")
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
    lane = np.cumsum(lane_new) - 1

    un = gu.units(lane, lane_new, member, cls, s, e, alone=cls == 3)
    u_lane, u_s, u_e, u_first = un["lane"], un["s"], un["e"], un["first"]
    u_member = member[u_first]
    rs, n_rs = gu.dense_key(rank[u_first], step[u_first])
    tol = np.where(gpu[u_first], p.sync_tol_gpu_ns, p.sync_tol_cpu_ns).astype(np.int64)
    n_u = len(u_s)
    first_on_lane = np.ones(n_u, dtype=bool)
    first_on_lane[1:] = u_lane[1:] != u_lane[:-1]
    prev_e = np.full(n_u, NEG, dtype=np.int64)
    prev_e[1:] = u_e[:-1]
    prev_e[first_on_lane] = NEG
    overlap = ~first_on_lane & (u_s < prev_e)
    prev_e[overlap] = NEG  # overlapping spans (gloo p2p waits) do not order each other
    u_host = cls[u_first] == 3
    dv = np.flatnonzero(~u_host)  # device lanes wait on each other; host lanes only block
    sub = gu.sync_sources(rs[dv], u_lane[dv], u_s[dv], u_e[dv], prev_e[dv], tol[dv])
    sync = np.full(n_u, -1, dtype=np.int64)
    sync[dv] = np.where(sub >= 0, dv[np.maximum(sub, 0)], -1)
    is_source = np.zeros(n_u, dtype=bool)
    is_source[sync[sync >= 0]] = True
    mk = gh.marks(u_host, u_first, launch_of, s, prev_e, un["of_event"], blocking)
    is_source[un["of_event"][_col(blk, "dev")]] = True  # what a blocking call waited for

    # a node: a run of units of one lane with nothing waited for inside it
    new_node = first_on_lane | u_member | (sync >= 0) | overlap
    new_node |= mk.launch_bound | mk.point | mk.blocking
    new_node[1:] |= u_member[:-1] | is_source[:-1] | mk.blocking[:-1]
    node_of_unit = np.cumsum(new_node) - 1
    starts = np.flatnonzero(new_node)
    nn = len(starts)
    n_start = u_s[starts]
    n_end = np.maximum.reduceat(u_e, starts) if n_u else u_e
    n_busy = (
        np.stack([np.add.reduceat(un["busy"][:, k], starts) for k in range(3)], axis=1)
        if n_u
        else np.zeros((0, 3))
    )
    n_first_eid, n_comm = u_first[starts], u_member[starts]
    n_block = mk.blocking[starts]
    n_start[n_block] = n_end[n_block]  # a blocking call is a point at its return
    n_rank, n_step = rank[n_first_eid], step[n_first_eid]
    ev_node = node_of_unit[un["of_event"]]
    rs_rank = np.zeros(n_rs, dtype=np.int64)
    rs_step = np.zeros(n_rs, dtype=np.int64)
    rs_rank[rs], rs_step[rs] = rank[u_first], step[u_first]
    rs_first = np.full(n_rs, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(rs_first, rs[starts], n_start)  # a launch a little before its window
    w_rs_start, w_rs_end = gu.window_of(
        np.arange(n_rs),
        rs_rank,
        rs_step,
        _col(win, "rank"),
        _col(win, "step"),
        _col(win, "w_start"),
        _col(win, "w_end"),
        rs_first,
    )
    w_start = w_rs_start[rs[starts]]  # each node's rank-step window

    # in-edges of each node: its lane's previous node, the node it waited for, the step start
    lane_src = np.where(first_on_lane[starts] | overlap[starts], -1, np.arange(nn) - 1)
    sync_u = sync[starts]
    sync_src = np.where(sync_u >= 0, node_of_unit[np.maximum(sync_u, 0)], -1)
    b_node, t_node = ev_node[_col(blk, "host")], ev_node[_col(blk, "dev")]
    keep = n_block[b_node] & (n_end[t_node] <= n_start[b_node])  # a blocking call waits
    sync_src[b_node[keep]] = t_node[keep]
    le = gh.launch_edges(launch_of, s, ev_node, u_lane[starts], n_first_eid, n_start, n_end)
    ready = np.stack(
        [
            np.where(lane_src >= 0, n_end[np.maximum(lane_src, 0)], NEG),
            np.where(sync_src >= 0, n_end[np.maximum(sync_src, 0)], NEG),
            w_start,
            gh.latest_per_node(le, nn, NEG),
        ],
        axis=1,
    )
    bind = np.argmax(ready, axis=1)
    lag = np.maximum(n_start - ready[np.arange(nn), bind], 0)
    g = gu.Edges()
    for col, kind, src, sel in (
        (0, E_LANE, lane_src, lane_src >= 0),
        (1, E_SYNC, sync_src, (sync_src >= 0) & ~n_block),
        (1, E_BLOCK, sync_src, (sync_src >= 0) & n_block),
    ):
        i = np.flatnonzero(sel)
        g.add(i, src[i], np.where(bind[i] == col, lag[i], 0), kind)
    # the launch that set the start keeps the measured gap; the others their own constraint
    top = (bind[le.dst] == 3) & (le.ready == ready[le.dst, 3]) & (le.lag0 >= 0)
    g.add(le.dst, le.src, le.lag0 + np.where(top, lag[le.dst], 0), E_LAUNCH, frac=le.frac)
    base = np.where(bind == 2, w_start + lag, w_start)

    # communication: a node's vertex is its arrival; an end vertex per node, a join per instance
    node_of_member = ev_node[m_eid]
    arrival = n_start.copy()
    arrival[node_of_member] = np.minimum(m_arr, n_start[node_of_member])
    add = np.where(n_comm, arrival - n_start, n_end - n_start)
    comm_nodes = np.flatnonzero(n_comm)
    nc = len(comm_nodes)
    end_vertex = np.arange(nn, dtype=np.int64)
    end_vertex[comm_nodes] = nn + np.arange(nc)
    g.redirect(end_vertex)  # successors of a comm node read its end
    inst_u, inst_idx = np.unique(m_inst, return_inverse=True)
    ni = len(inst_u)
    join_vertex = nn + nc + np.arange(ni)
    m_arrival = arrival[node_of_member]
    last_arr = np.full(ni, NEG, dtype=np.int64)
    np.maximum.at(last_arr, inst_idx, m_arrival)
    g.add(join_vertex[inst_idx], node_of_member, np.zeros(len(m_eid), np.int64), E_MEMBER)
    transfer = n_end[node_of_member] - np.maximum(last_arr[inst_idx], m_arrival)
    # A member that ended before the last one arrived did not wait for it: an eager send (NCCL
    # buffers small p2p messages) or a clock error; its end follows its own arrival only.
    linked = transfer >= 0
    inconsistent = int(np.count_nonzero(~linked))
    g.add(
        end_vertex[node_of_member[linked]],
        join_vertex[inst_idx[linked]],
        transfer[linked],
        E_TRANSFER,
        inst_idx[linked],
    )
    own = np.zeros(nn, dtype=np.int64)
    own_lag = np.where(linked, transfer, n_end[node_of_member] - m_arrival)
    np.maximum.at(own, node_of_member, np.maximum(own_lag, 0))
    g.add(end_vertex[comm_nodes], comm_nodes, own[comm_nodes], E_OWN)

    par = np.empty(ni, dtype=object)
    par[inst_idx] = np.asarray(mem["parallelism"], dtype=object)
    p2p = np.zeros(ni, dtype=bool)
    p2p[inst_idx] = np.asarray(mem["p2p"], dtype=bool)
    inst_step = np.zeros(ni, dtype=np.int64)
    inst_step[inst_idx] = n_step[node_of_member]
    v_kind = np.concatenate(
        [np.where(n_comm, V_ARRIVE, V_NODE), np.full(nc, V_END), np.full(ni, V_JOIN)]
    ).astype(np.int64)
    v_step = np.concatenate([n_step, n_step[comm_nodes], inst_step])
    ptr, src, elag, ekind, einst, efrac = g.csr(len(v_kind))
    # measured time orders the vertices: 4t+1 ends, 4t+2 nodes and arrivals, 4t+3 joins (at
    # the last member's start), so every edge of a consistent trace goes forward
    t0 = int(n_start.min()) if nn else 0
    join_s = np.full(ni, NEG, dtype=np.int64)
    np.maximum.at(join_s, inst_idx, n_start[node_of_member])
    end_t = n_end[comm_nodes].copy()
    np.maximum.at(end_t, np.searchsorted(comm_nodes, node_of_member), join_s[inst_idx] + 1)
    n_key = gh.order_key(le, n_start)
    key = np.concatenate([4 * (n_key - t0) + 2, 4 * (end_t - t0) + 1, 4 * (join_s - t0) + 3])
    order, keep = gu.topo_order(key, ptr, src)
    dropped = int(np.count_nonzero(~keep))
    if dropped:
        dst = np.repeat(np.arange(len(v_kind)), np.diff(ptr))[keep]
        src, elag, ekind, einst, efrac = (
            src[keep],
            elag[keep],
            ekind[keep],
            einst[keep],
            efrac[keep],
        )
        ptr = np.zeros(len(v_kind) + 1, dtype=np.int64)
        np.cumsum(np.bincount(dst, minlength=len(v_kind)), out=ptr[1:])
    steps, st_start, st_end, st_act = gu.step_table(
        rs_step, w_rs_start, w_rs_end, n_rs, rs[starts], n_end
    )
    return Graph(
        n_rank=n_rank,
        n_step=n_step,
        n_device=dev[n_first_eid],
        n_stream=stream[n_first_eid],
        n_start=n_start,
        n_end=n_end,
        n_busy=n_busy,
        n_comm=n_comm,
        n_first_eid=n_first_eid,
        ev_node=ev_node,
        v_kind=v_kind,
        v_node=np.concatenate([np.arange(nn), comm_nodes, np.arange(ni)]).astype(np.int64),
        v_step=v_step,
        v_base=np.concatenate([base, np.full(nc + ni, NEG)]).astype(np.int64),
        v_add=np.concatenate([add, np.zeros(nc + ni, np.int64)]).astype(np.int64),
        ptr=ptr,
        e_src=src,
        e_lag=elag,
        e_kind=ekind,
        e_inst=einst,
        e_frac=efrac,
        inst_id=inst_u.astype(np.int64),
        inst_par=par.astype(str),
        inst_p2p=p2p,
        steps=steps,
        step_w_start=st_start,
        step_w_end=st_end,
        step_act_end=st_act,
        order=order,
        dropped_edges=dropped,
        inconsistent=inconsistent,
        ranks_gpu=_last_per_rank(n_rank, gpu[n_first_eid]),
    )


def _last_per_rank(rank: I64, flag: npt.NDArray[np.bool_]) -> dict[int, bool]:
    """Rank -> the flag of its last node (one lookup per rank, not per node: millions)."""
    ranks, last = np.unique(rank[::-1], return_index=True)
    return {int(r): bool(flag[len(rank) - 1 - i]) for r, i in zip(ranks, last, strict=True)}


def to_networkx(g: Graph) -> nx.DiGraph:
    """The graph as a networkx DiGraph (vertices with kind/rank/step/base/add, edges with
    lag/kind), for users who want networkx's algorithms; replays use the arrays. (Imported
    here: ~0.1 s that every command, the dashboard's start included, would pay otherwise.)"""
    import networkx as nx

    d = nx.DiGraph()
    kinds = ("node", "arrival", "join", "end")
    for v in range(len(g.v_kind)):
        k = int(g.v_kind[v])
        rank = -1 if k == V_JOIN else int(g.n_rank[g.v_node[v]])
        d.add_node(
            v,
            kind=kinds[k],
            rank=rank,
            step=int(g.v_step[v]),
            base=int(g.v_base[v]),
            add=int(g.v_add[v]),
        )
    dst = np.repeat(np.arange(len(g.v_kind)), np.diff(g.ptr))
    for s, t_, lag, kind in zip(
        g.e_src.tolist(), dst.tolist(), g.e_lag.tolist(), g.e_kind.tolist(), strict=True
    ):
        d.add_edge(s, t_, lag=lag, kind=EDGE_KINDS[kind])
    return d
