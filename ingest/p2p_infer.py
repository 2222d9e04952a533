"""Peers of send/recv ops the trace left without one (older torch, Nsight), for any pipeline size.

Why: with pp >= 3 a stage talks to two neighbours, and pairing its sends and recvs by position
pairs a send with the wrong stage (or with a send). Megatron's pipeline group lists its ranks
in stage order and a stage only talks to the stages beside it (the last one to the first too,
when the schedule is interleaved), so each op has at most two candidate peers.

1. By stream (no clock needed): torch gives each pair of p2p peers its own NCCL communicator
   and stream, so a rank's unknown-peer ops fall into one class per stream, and the classes of
   two neighbours that talk to each other explain each other: a large NCCL send ends with its
   recv, so nearly every op of one class has an op of the other kind ending at one constant
   clock difference. Class pairs of adjacent ranks are taken best explained first, each class
   once; every op then takes its class's peer and matching pairs them in order.
2. Per op (what stays): on the aligned clock, the recv of the same size on an adjacent stage
   whose end is nearest the send's. Pairs are taken best first, each op once; what stays
   unpaired keeps status `peer_unknown`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
from ranklens.ingest.matching import BATCH_ORDINAL_SQL

_TOL_NS = 10_000  # clock residual and NCCL jitter between a send's end and its recv's end
_MAX_TOL_NS = 1_000_000

# Unknown-peer ops with their position in the group's (stage) order, 1-based. The last stage
# and the first talk (interleaved schedules) only when both are in the run: with a stage
# missing, its neighbours' messages to it must stay unpaired, not go round the ring.
_UNKNOWN = f"""
CREATE OR REPLACE TEMP TABLE _p2p_u AS
SELECT row_number() OVER (ORDER BY c.rank, c.ts_ns, c.stream, c.op, c.k) - 1 AS id,
       c.rank, c.op, c.k, c.batched, c.step, c.ts_ns, c.stream, c.pg_name, c.end_ns,
       c.end_ns + coalesce(k.clock_offset_ns, 0) AS aend,
       coalesce(c.bytes, c.nelems) AS size, list_position(g.ranks, c.rank) AS pos,
       len(g.ranks) AS n, list_has_all((SELECT list(rank) FROM ranks), g.ranks) AS complete
FROM (SELECT *, {BATCH_ORDINAL_SQL} AS k,
             coalesce((rank, ts_ns, stream) IN (SELECT (rank, ts_ns, stream)
                                                FROM _p2p_batch_ops), false) AS batched
      FROM collectives) c
JOIN process_groups g USING (pg_name) LEFT JOIN ranks k USING (rank)
WHERE c.status = 'peer_unknown' AND list_position(g.ranks, c.rank) IS NOT NULL
"""

# Every send x recv of adjacent stages in one step (next and previous in ring order).
_ADJACENT = """
WITH s AS (SELECT * FROM _p2p_u WHERE op = 'send'), r AS (SELECT * FROM _p2p_u WHERE op = 'recv'),
nb AS (
  SELECT s.*, s.pos % s.n + 1 AS to_pos FROM s
  UNION ALL SELECT s.*, (s.pos + s.n - 2) % s.n + 1 FROM s WHERE s.n > 2
)
SELECT nb.id AS sid, r.id AS rid, nb.rank AS a, nb.end_ns AS ea, r.rank AS b, r.end_ns AS eb,
       r.aend - nb.aend AS c
FROM nb JOIN r ON r.pg_name = nb.pg_name AND r.pos = nb.to_pos
 AND (abs(r.pos - nb.pos) = 1 OR nb.complete)
 AND r.step IS NOT DISTINCT FROM nb.step AND r.size IS NOT DISTINCT FROM nb.size
"""


_CLASS_FIT = 0.25  # share of a class's ops its partner must explain at one clock offset
_WINDOW_NS = 4_000

# Adjacent classes (y next to x in ring order) whose sends and recvs can answer each other in
# every step (x's sends = y's recvs, x's recvs = y's sends), then every send x recv between them.
_CLASS_DIFFS = """
WITH cs AS (SELECT rank, stream, pg_name, step, any_value(pos) AS pos, any_value(n) AS n,
                   bool_and(complete) AS complete, count(*) FILTER (op = 'send') AS ns,
                   count(*) FILTER (op = 'recv') AS nr
            FROM _p2p_u GROUP BY ALL),
tot AS (SELECT rank, stream, count(*) AS k FROM _p2p_u GROUP BY ALL),
pairs AS (SELECT x.rank AS ra, x.stream AS sa, y.rank AS rb, y.stream AS sb,
                 sum(x.ns + x.nr) AS kx, sum(y.ns + y.nr) AS ky
          FROM cs x JOIN cs y ON x.pg_name = y.pg_name AND y.pos = x.pos % x.n + 1
           AND (y.pos > x.pos OR x.complete) AND x.step IS NOT DISTINCT FROM y.step
          GROUP BY ALL HAVING bool_and(x.ns = y.nr AND x.nr = y.ns)),
-- every step of both classes took part (a step only one of them has is not answered)
adj AS (SELECT p.ra, p.sa, p.rb, p.sb, p.kx AS k FROM pairs p
        JOIN tot ta ON ta.rank = p.ra AND ta.stream IS NOT DISTINCT FROM p.sa
        JOIN tot tb ON tb.rank = p.rb AND tb.stream IS NOT DISTINCT FROM p.sb
        WHERE p.kx = ta.k AND p.ky = tb.k)
SELECT adj.ra, adj.sa, adj.rb, adj.sb, adj.k, ub.end_ns - ua.end_ns AS d
FROM adj JOIN _p2p_u ua ON ua.rank = adj.ra AND ua.stream IS NOT DISTINCT FROM adj.sa
JOIN _p2p_u ub ON ub.rank = adj.rb AND ub.stream IS NOT DISTINCT FROM adj.sb
 AND ub.op <> ua.op AND ub.step IS NOT DISTINCT FROM ua.step
 AND ub.size IS NOT DISTINCT FROM ua.size
ORDER BY adj.ra, adj.sa, adj.rb, adj.sb, d
"""


def infer_by_stream(con: duckdb.DuckDBPyConnection) -> pa.Table:
    """Class-level peers (see the module docstring, 1.): hint_table rows.

    Class pairs are taken best explained first, each class once, so a class whose partner is
    weakly explained (buffered sends end before their recvs) still gets the one left to it.
    """
    with unknown_ops(con):
        diffs = pl.from_arrow(con.sql(_CLASS_DIFFS).to_arrow_table())
        ops = con.execute("SELECT rank, stream, ts_ns, op, k, batched FROM _p2p_u").fetchall()
    assert isinstance(diffs, pl.DataFrame)
    cands: list[tuple[float, int, Any, Any]] = []
    for key, grp in diffs.group_by(["ra", "sa", "rb", "sb"], maintain_order=True):
        ra, sa, rb, sb = key
        d = grp["d"].to_numpy()
        hi = np.searchsorted(d, d + _WINDOW_NS, side="right")
        count = int((hi - np.arange(len(d))).max())
        score = min(count / max(int(grp["k"][0]), 1), 1.0)
        if score >= _CLASS_FIT:
            cands.append((score, count, (ra, sa), (rb, sb)))
    peer_of: dict[tuple[Any, Any], int] = {}
    for _score, _n, x, y in sorted(cands, key=lambda t: (-t[0], -t[1], t[2], t[3])):
        if x not in peer_of and y not in peer_of:
            peer_of[x], peer_of[y] = int(y[0]), int(x[0])
    # a batch's stream carries its ops to both neighbours: p2p_batch_peers names their peers
    rows = [
        (r, t, s, o, k, b, peer_of[r, s]) for r, s, t, o, k, b in ops if (r, s) in peer_of and not b
    ]
    return hint_table(rows)


def has_unknown(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether matching left send/recv ops without a peer."""
    row = con.execute("SELECT count(*) FROM collectives WHERE status = 'peer_unknown'").fetchone()
    return bool(row and row[0])


def candidate_pairs(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """Every send x recv of adjacent stages in a step, raw ends (`a`, `ea`, `b`, `eb`): what
    the clock links read before peers are known (the true pairs pile up at one offset)."""
    with unknown_ops(con):
        df = pl.from_arrow(con.sql(f"SELECT a, ea, b, eb FROM ({_ADJACENT})").to_arrow_table())
    assert isinstance(df, pl.DataFrame)
    return df


def infer_peers(con: duckdb.DuckDBPyConnection) -> pa.Table:
    """Peers for unknown-peer ops on the aligned clock: hint_table rows."""
    worst = con.execute("SELECT coalesce(max(align_residual_ns), 0) FROM ranks").fetchone()
    tol = min(_TOL_NS + 2 * int(worst[0] if worst else 0), _MAX_TOL_NS)
    # Each op's best candidate (smallest end difference not before the send's end), from
    # both sides, then best first: the rendezvous pairs (difference ~0) claim their ops first.
    with unknown_ops(con):
        edges = _best_edges(con, tol)
        ops = con.execute("SELECT id, rank, ts_ns, stream, op, k, batched FROM _p2p_u").fetchall()
    used_s: set[int] = set()
    used_r: set[int] = set()
    pairs: list[tuple[int, int]] = []
    for sid, rid, _c in edges:
        if sid in used_s or rid in used_r:
            continue
        used_s.add(sid)
        used_r.add(rid)
        pairs.append((int(sid), int(rid)))
    info = {int(i): (int(r), int(t), s, o, int(k), b) for i, r, t, s, o, k, b in ops}
    rows = []
    for sid, rid in pairs:
        send, recv = info[sid], info[rid]
        if not (send[5] or recv[5]):  # a batch's nearest end is often another pair's meeting
            rows += [(*send, recv[0]), (*recv, send[0])]
    return hint_table(rows)


def _best_edges(con: duckdb.DuckDBPyConnection, tol: int) -> list[tuple[Any, ...]]:
    """(send id, recv id, |end difference|) of each op's best candidate, best first."""
    return con.execute(
        f"""WITH e AS (SELECT sid, rid, c FROM ({_ADJACENT}) WHERE c >= -{tol}),
                 bs AS (SELECT * FROM e QUALIFY row_number() OVER (
                          PARTITION BY sid ORDER BY abs(c), rid) = 1),
                 br AS (SELECT * FROM e QUALIFY row_number() OVER (
                          PARTITION BY rid ORDER BY abs(c), sid) = 1)
            SELECT DISTINCT sid, rid, abs(c) AS c FROM (SELECT * FROM bs UNION ALL
                                                        SELECT * FROM br)
            ORDER BY c, sid, rid"""
    ).fetchall()


@contextmanager
def unknown_ops(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """`_p2p_u`, the unknown-peer ops with their stage and aligned end, while the block runs."""
    con.execute(_UNKNOWN)
    try:
        yield
    finally:
        con.execute("DROP TABLE IF EXISTS _p2p_u")


def hint_table(rows: list[tuple[Any, ...]]) -> pa.Table:
    """matching's `_peer_hints`: (rank, ts_ns, stream, op, k, batched) names an op, `peer` its
    peer; a batch's ops (batched) take only hints the batch rule gave."""
    cols = list(zip(*rows, strict=True)) if rows else [()] * 7
    return pa.table(
        {
            "rank": pa.array(cols[0], pa.int32()),
            "ts_ns": pa.array(cols[1], pa.int64()),
            "stream": pa.array(cols[2], pa.int64()),
            "op": pa.array(cols[3], pa.string()),
            "k": pa.array(cols[4], pa.int64()),
            "batched": pa.array(cols[5], pa.bool_()),
            "peer": pa.array(cols[6], pa.int32()),
        }
    )
