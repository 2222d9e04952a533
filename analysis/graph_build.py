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
from ranklens.analysis import graph_nodes
from ranklens.analysis import graph_units as gu
from ranklens.analysis._sql import apply_sql

if TYPE_CHECKING:
    import networkx as nx

I64 = npt.NDArray[np.int64]
NEG = gu.NEG  # "no constraint" for a base or a dropped edge

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
    `during(con, graph)` runs while the numbered events (view _critical_path_ev) exist."""
    try:
        apply_sql(con, "critical_path")  # numbers the events (view _critical_path_ev)
        g = _assemble(_inputs(con), p)
        if during is not None:
            during(con, g)
    finally:
        drop_inputs(con)
    return g


def _inputs(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, Any]]:
    """The query results the graph is built from (column arrays), in one dict that _assemble
    empties: what it no longer needs is freed as it goes."""
    ev = con.execute(
        "SELECT eid, rank, step, device, stream, is_comm, cls, s, e, has_gpu, blocking "
        "FROM _critical_path_ev"
    ).fetchnumpy()
    return {
        "ev": _in_eid_order(ev),
        "lnk": con.execute("SELECT dev, host FROM _critical_path_launch").fetchnumpy(),
        "blk": con.execute("SELECT host, dev FROM _critical_path_blocks").fetchnumpy(),
        "mem": con.execute(
            "SELECT eid, instance_id, arr, parallelism, p2p FROM _critical_path_members "
            "ORDER BY instance_id, eid"
        ).fetchnumpy(),
        "win": con.execute(
            "SELECT rank, step, w_start, w_end FROM _critical_path_windows"
        ).fetchnumpy(),
    }


def drop_inputs(con: duckdb.DuckDBPyConnection) -> None:
    """Forget what critical_path.sql built on `con` (the numbered events are data of the
    moment, and hold memory)."""
    for view in ("ev", "members", "launch", "blocks"):
        con.execute(f"DROP VIEW IF EXISTS temp._critical_path_{view}")
    con.execute("DROP TABLE IF EXISTS temp._critical_path_ord")


def _in_eid_order(ev: dict[str, npt.NDArray[Any]]) -> dict[str, npt.NDArray[Any]]:
    """The numbered events by eid (without it). A scan of one table keeps its order (DuckDB's
    documented order preservation), so this is a check that costs one comparison, not a sort."""
    eid = np.asarray(ev.pop("eid"), dtype=np.int64)
    if np.array_equal(eid, np.arange(len(eid))):
        return ev
    order = np.argsort(eid, kind="stable")
    return {k: np.asarray(v)[order] for k, v in ev.items()}


def _assemble(inputs: dict[str, dict[str, Any]], p: BuildParams) -> Graph:
    """The graph from build's query results, which it takes out of `inputs` (graph_nodes)."""
    mem, win = inputs.pop("mem"), inputs.pop("win")
    m_eid, m_inst, m_arr = (graph_nodes.col(mem, k) for k in ("eid", "instance_id", "arr"))
    nd = graph_nodes.nodes(
        inputs.pop("ev"),
        m_eid,
        win,
        inputs.pop("lnk"),
        inputs.pop("blk"),
        p.sync_tol_gpu_ns,
        p.sync_tol_cpu_ns,
    )
    nn = len(nd.start)
    n_start, n_end, n_comm, n_step, ev_node = nd.start, nd.end, nd.comm, nd.step, nd.ev_node
    lane_src, sync_src, n_block, le = nd.lane_src, nd.sync_src, nd.block, nd.launch
    ready = np.stack(
        [
            np.where(lane_src >= 0, n_end[np.maximum(lane_src, 0)], NEG),
            np.where(sync_src >= 0, n_end[np.maximum(sync_src, 0)], NEG),
            nd.w_start,
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
    base = np.where(bind == 2, nd.w_start + lag, nd.w_start)
    del ready, bind, lag, top

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
        nd.rs_step, nd.rs_w_start, nd.rs_w_end, len(nd.rs_step), nd.rs, n_end
    )
    return Graph(
        n_rank=nd.rank,
        n_step=n_step,
        n_device=nd.device,
        n_stream=nd.stream,
        n_start=n_start,
        n_end=n_end,
        n_busy=nd.busy,
        n_comm=n_comm,
        n_first_eid=nd.first_eid,
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
        ranks_gpu=_last_per_rank(nd.rank, nd.gpu),
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
