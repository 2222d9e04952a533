"""Peers of batched send/recv the trace left without one (torch before 2.5 with Megatron's
batch_p2p_comm, its default): named where the batches' timing determines them, else left
`peer_unknown`.

Why not p2p_infer's rules: a batch's ops share one kernel and the pipeline group's stream, so
there are no per-pair stream classes, and in a pipeline's steady state neighbouring pairs
exchange at the same moment, so "the recv that ends nearest" often names the wrong neighbour.
Left unknown, they left the pipeline analysis to guess each batch's side from kernel overlap
(on a generated two-host tp2 x pp4 x dp2 1F1B job: m=9 instead of 8, and no clock link between
the hosts).

How: the hosts' clocks are placed by the rendezvous rule (p2p_batch_clock), then the rule
(p2p_rendezvous) names each op's peer, per group and clock part. Groups whose end stages talk
as much as the middle ones (interleaved schedules: the last stage feeds the first, and a call
batches ops with both neighbours) are left unknown.
"""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa
from ranklens.ingest.p2p_batch_clock import Groups, place
from ranklens.ingest.p2p_infer import hint_table, unknown_ops
from ranklens.ingest.p2p_rendezvous import Batch, Op, by, in_flight_together, ring, solve_all

_TOL_NS = 10_000  # clock residual and NCCL jitter between two ends of one rendezvous
_MAX_TOL_NS = 1_000_000

_OPS = """SELECT u.pg_name, u.pos, u.n, u.rank, u.ts_ns, u.stream, u.op, u.k, u.size,
                 u.aend - (u.end_ns - u.ts_ns) AS astart, u.aend, u.step, g.ranks
          FROM _p2p_u u JOIN process_groups g USING (pg_name)
          WHERE u.batched AND u.n > 2 ORDER BY u.pg_name, u.aend, u.rank, u.ts_ns"""

# Hosts a matched collective (not a send/recv) joins: their clocks agree after alignment.
_LINKS = """SELECT list(DISTINCT coalesce(k.host, k.rank::VARCHAR))
            FROM collectives c JOIN ranks k USING (rank)
            WHERE c.status = 'matched' AND c.op NOT IN ('send', 'recv')
            GROUP BY c.instance_id HAVING count(DISTINCT coalesce(k.host, k.rank::VARCHAR)) > 1"""


def infer_batched(con: duckdb.DuckDBPyConnection) -> pa.Table:
    """Hints (p2p_infer.hint_table) for the batched ops the rendezvous rule decides."""
    with unknown_ops(con):
        rows = con.execute(_OPS).fetchall()
    if not rows:
        return hint_table([])
    worst = con.execute("SELECT coalesce(max(align_residual_ns), 0) FROM ranks").fetchone()
    tol = min(_TOL_NS + 2 * int(worst[0] if worst else 0), _MAX_TOL_NS)
    part_of, ref = _parts(con)
    groups: Groups = {str(r[0]): (int(r[2]), [int(x) for x in r[12]]) for r in rows}
    batches = _batches(rows, part_of)
    straight = [
        b
        for g, bs in by(batches, lambda b: b.group).items()
        if not ring(bs, groups[g][0])
        for b in bs
    ]
    out: list[Op] = []
    for (g, _p), bs in by(place(straight, groups, ref, tol), lambda b: (b.group, b.part)).items():
        named = solve_all(bs, groups[g][1], tol)
        if in_flight_together(named, tol):
            out += [(*op, True, peer) for op, peer, _b in named]
    return hint_table(out)


def _parts(con: duckdb.DuckDBPyConnection) -> tuple[dict[int, str], str]:
    """rank -> its clock part (ranks whose clocks agree share one: a host, or hosts a
    collective joins; every rank when offsets were given or there is one host), and the part
    of the lowest rank (the clock reference)."""
    ranks = con.execute(
        "SELECT rank, coalesce(host, rank::VARCHAR), clock_method FROM ranks ORDER BY rank"
    ).fetchall()
    if any(m in ("single_host", "user") for _r, _h, m in ranks):
        return {int(r): "" for r, _h, _m in ranks}, ""
    root: dict[str, str] = {h: h for _r, h, _m in ranks}

    def find(h: str) -> str:
        while root[h] != h:
            root[h] = root[root[h]]
            h = root[h]
        return h

    for (hosts,) in con.execute(_LINKS).fetchall():
        for h in hosts[1:]:
            root[find(h)] = find(hosts[0])
    part_of = {int(r): find(h) for r, h, _m in ranks}
    return part_of, part_of[int(ranks[0][0])]


def _batches(rows: list[tuple[Any, ...]], part_of: dict[int, str]) -> list[Batch]:
    """One Batch per (rank, ts_ns, stream), by end, on its part's clock."""
    found: dict[tuple[Any, ...], Batch] = {}
    for g, pos, _n, rank, ts, stream, op, k, size, astart, aend, step, _r in rows:
        part = part_of.get(int(rank), str(rank))
        b = found.setdefault(
            (rank, ts, stream), Batch(str(g), part, int(pos), int(astart), int(aend), step)
        )
        (b.sends if op == "send" else b.recvs).append((rank, ts, stream, op, k))
        b.sizes.add(size)
    return sorted(found.values(), key=lambda b: (b.end, b.pos))
