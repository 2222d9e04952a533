"""Collective matching: every communication op of every rank gets the id of its logical collective.

Why: skew, waits, stragglers, bandwidth and clock alignment all compare the *same* collective
across its ranks, and a rank that never joined one is the first suspect of a hang.

How (SQL, so a 1,024-rank run stays fast): the `collectives` table has one row per comm event.
Within a process group, collectives are matched by sequence number: the `Seq` the trace gives
when every op of the group has one, else the op's position in the rank's time-ordered ops of
that group. Send/recv with a known peer are paired per (group, sender, receiver) by order.
When members of a group hold different numbers of ops (a trace window that cuts an op on one
rank), each rank's positions are shifted to best agree with the fullest rank: most equal
(op, size) pairs, then the steadiest end-time difference (a clock offset is constant, a wrong
pairing is not). Every instance gets a status; mismatches are kept, never papered over:
`incomplete` (a present member never joined: the hang culprit), `op_mismatch`,
`size_mismatch`, `duplicate`, `others_absent` (no other member's trace is in the run),
`peer_unknown` (a send/recv in a group of 3+ whose peer neither the trace nor inference gave:
pairing it by position would pair sends with sends). Inferred peers come in as `_peer_hints`.
"""

from __future__ import annotations

from collections import defaultdict

import duckdb
import numpy as np
import pyarrow as pa
from ranklens.ingest.database import registered
from ranklens.ingest.p2p_batches import EMPTY_SQL

_MAX_SHIFT = 4
_NO_HINTS = pa.table(
    {
        "rank": pa.array([], pa.int32()),
        "ts_ns": pa.array([], pa.int64()),
        "stream": pa.array([], pa.int64()),
        "op": pa.array([], pa.string()),
        "k": pa.array([], pa.int64()),
        "batched": pa.array([], pa.bool_()),
        "peer": pa.array([], pa.int32()),
    }
)
# An op's place among the ops of its kind that share its kernel (a batch's sends, by size):
# what tells them apart in a peer hint. p2p_infer computes it the same way on `collectives`.
BATCH_ORDINAL_SQL = (
    "row_number() OVER (PARTITION BY rank, ts_ns, stream, op ORDER BY coalesce(bytes, nelems)) - 1"
)

# Bytes per element for the dtype spellings of Kineto args and profiler `Input type`.
_ELEM_BYTES_SQL = """CASE lower(dtype)
  WHEN 'float' THEN 4 WHEN 'float32' THEN 4 WHEN 'int' THEN 4 WHEN 'int32' THEN 4
  WHEN 'uint32' THEN 4 WHEN 'half' THEN 2 WHEN 'float16' THEN 2 WHEN 'bfloat16' THEN 2
  WHEN 'short' THEN 2 WHEN 'int16' THEN 2 WHEN 'double' THEN 8 WHEN 'float64' THEN 8
  WHEN 'long' THEN 8 WHEN 'int64' THEN 8 WHEN 'long int' THEN 8 WHEN 'uint64' THEN 8
  WHEN 'byte' THEN 1 WHEN 'char' THEN 1 WHEN 'bool' THEN 1 WHEN 'int8' THEN 1
  WHEN 'uint8' THEN 1 WHEN 'unsigned char' THEN 1 WHEN 'signed char' THEN 1
  ELSE CASE WHEN lower(dtype) LIKE 'float8%' THEN 1 END END"""

# Inferred peers by (rank, start, stream, op, k). The ops of one batch share the kernel's
# (rank, start, stream): op and k tell them apart, and only the batch rule (p2p_batch_peers)
# names a batch's ops' peers. Without hints, no join and no window (a sort of every comm op).
_HINTED = f"""SELECT ev.*, h.peer AS hint_peer
  FROM (SELECT *, {BATCH_ORDINAL_SQL} AS k FROM sized) ev LEFT JOIN _peer_hints h
    ON h.rank = ev.rank AND h.ts_ns = ev.ts_ns AND h.stream IS NOT DISTINCT FROM ev.stream
   AND h.op = ev.op AND h.k = ev.k AND h.batched = ev.batched"""
_UNHINTED = "SELECT *, NULL::INTEGER AS hint_peer FROM sized"

_BUILD = """
CREATE OR REPLACE TEMP TABLE _coll AS
WITH ev AS (
  SELECT e.rank, e.pg_name, coalesce(e.coll_op, regexp_replace(e.name, '^gloo:', '')) AS op,
         e.peer, e.group_size, e.dtype, e.bytes AS ev_bytes, e.device, e.stream, e.name, e.step,
         e.ts_ns, e.ts_ns + e.dur_ns AS end_ns, e.seq AS given_seq,
         CASE WHEN coalesce(e.coll_op, '') = 'all_gather' THEN coalesce(e.out_nelems, e.in_nelems)
              ELSE coalesce(e.in_nelems, e.out_nelems) END AS arg_nelems, e.shapes, e.batched
  FROM (SELECT rank, pg_name, coll_op, name, peer, group_size, dtype, bytes, device, stream,
               step, ts_ns, dur_ns, seq, in_nelems, out_nelems, shapes, false AS batched
        FROM events x WHERE x.kind = 'comm' AND NOT EXISTS (
          SELECT 1 FROM _p2p_batch_ops b WHERE b.rank = x.rank AND b.ts_ns = x.ts_ns
            AND b.stream IS NOT DISTINCT FROM x.stream AND x.device >= 0)
        UNION ALL  -- a batched kernel: one row per op it carries (p2p_batches.py)
        SELECT rank, pg_name, coll_op, name, peer, group_size, dtype, bytes, device, stream,
               step, ts_ns, dur_ns, seq, in_nelems, out_nelems, shapes, true
        FROM _p2p_batch_ops) e
), j AS (
  SELECT ev.*, g.ranks AS g_ranks, coalesce(g.size, ev.group_size) AS n,
         coalesce(ev.arg_nelems, CASE WHEN ev.shapes IS NOT NULL THEN CAST(list_max(
           list_transform(try_cast(try_cast(ev.shapes AS JSON) AS BIGINT[][]),
                          lambda x: list_aggregate(x, 'product'))) AS BIGINT) END) AS nelems
  FROM ev LEFT JOIN process_groups g USING (pg_name)
), sized AS (
  SELECT j.*, coalesce(ev_bytes, nelems * ({elem})) AS bytes FROM j
), hinted AS (
  {hinted}
), p AS (
  SELECT hinted.*,
         coalesce(peer, hint_peer,
                  CASE WHEN op IN ('send', 'recv') AND len(g_ranks) = 2
                       THEN list_filter(g_ranks, lambda x: x <> rank)[1] END) AS peer2,
         CASE WHEN peer IS NOT NULL THEN 'trace' WHEN hint_peer IS NOT NULL THEN 'inferred'
              WHEN op IN ('send', 'recv') AND len(g_ranks) = 2 THEN 'group_of_two'
         END AS peer_source,
         op IN ('send', 'recv') AND coalesce(peer, hint_peer) IS NULL
           AND coalesce(len(g_ranks), n) > 2 AS peer_unknown
  FROM hinted
), q AS (
  SELECT rank, pg_name, op, peer2 AS peer, peer_source, peer_unknown,
         CASE WHEN op IN ('send', 'recv') AND peer2 IS NOT NULL THEN 2 ELSE n END AS group_size,
         nelems, dtype, bytes,
         device, stream, name, step, ts_ns, end_ns, ts_ns AS arrive_ns, given_seq,
         (op IN ('send', 'recv') AND peer2 IS NOT NULL) AS p2p,
         -- sender and receiver of a p2p op (-1 for collectives, so keys compare with =)
         CASE WHEN op IN ('send', 'recv') AND peer2 IS NOT NULL
              THEN CASE WHEN op = 'send' THEN rank ELSE peer2 END ELSE -1 END AS src,
         CASE WHEN op IN ('send', 'recv') AND peer2 IS NOT NULL
              THEN CASE WHEN op = 'send' THEN peer2 ELSE rank END ELSE -1 END AS dst
  FROM p
)
SELECT q.*,
       -- one window: (group, rank) for collectives, (group, rank, peer, op) for send/recv
       CASE WHEN pg_name IS NOT NULL AND NOT peer_unknown
            THEN row_number() OVER (PARTITION BY pg_name, rank, p2p, src, dst
                                    ORDER BY ts_ns, stream) - 1 END AS seq
FROM q;

-- Sequence numbers the trace gives win when every op of the group has one.
UPDATE _coll SET seq = given_seq
WHERE NOT p2p AND NOT peer_unknown AND pg_name IN (
  SELECT pg_name FROM _coll WHERE NOT p2p AND NOT peer_unknown GROUP BY pg_name
  HAVING count(given_seq) = count(*));

-- A gloo isend's wait span starts when the program waits; the rank joined at the issue op.
UPDATE _coll SET arrive_ns = x.its FROM (
  WITH iss AS (
    SELECT rank, ts_ns AS its, row_number() OVER (PARTITION BY rank ORDER BY ts_ns) AS k,
           count(*) OVER (PARTITION BY rank) AS n
    FROM events WHERE device = -1 AND name = 'c10d::send'
  ), w AS (
    SELECT rank, ts_ns, row_number() OVER (PARTITION BY rank ORDER BY ts_ns) AS k,
           count(*) OVER (PARTITION BY rank) AS n
    FROM _coll WHERE name = 'gloo:send'
  )
  SELECT w.rank, w.ts_ns, iss.its FROM w JOIN iss USING (rank, k) WHERE w.n = iss.n
) x WHERE _coll.name = 'gloo:send' AND _coll.rank = x.rank AND _coll.ts_ns = x.ts_ns
  AND x.its <= _coll.ts_ns;
"""
_BUILD_SQL = _BUILD.format(elem=_ELEM_BYTES_SQL, hinted=_HINTED)
_BUILD_UNHINTED_SQL = _BUILD.format(elem=_ELEM_BYTES_SQL, hinted=_UNHINTED)

# Algorithm: instances are (group, p2p, sender, receiver, seq) keys, aggregated with hash
# aggregates (op/size agreement is min = max). Duplicates are impossible for positional
# sequences, so ranks are counted distinct only where the trace gave sequence numbers, and
# only when some op has one: DuckDB computes the aggregates a CASE does not choose (the
# distinct count was half of the instances' aggregate on 250 k ops).
_N_RANKS_GIVEN = (
    "CASE WHEN bool_or(given_seq IS NOT NULL) THEN count(DISTINCT rank) ELSE count(*) END"
)
_INSTANCE = """
CREATE OR REPLACE TEMP TABLE _present AS SELECT rank FROM ranks;

CREATE OR REPLACE TEMP TABLE _expected AS
SELECT g.pg_name,
       CASE WHEN g.ranks IS NOT NULL
            THEN len(list_filter(g.ranks, lambda x: list_contains(r.present, x)))
       END AS expected
FROM process_groups g, (SELECT list(rank) AS present FROM ranks) r;

CREATE OR REPLACE TEMP TABLE _inst AS
WITH seen AS (SELECT pg_name, count(DISTINCT rank) AS seen FROM _coll GROUP BY pg_name),
agg AS (
  SELECT pg_name, p2p, src, dst, seq, count(*) AS n_rows,
         {n_ranks} AS n_ranks,
         min(op) <> max(op) AS ops_differ,
         min(coalesce(bytes, nelems)) <> max(coalesce(bytes, nelems)) AS sizes_differ
  FROM _coll WHERE pg_name IS NOT NULL AND NOT peer_unknown GROUP BY ALL
)
SELECT agg.*, row_number() OVER (ORDER BY p2p, pg_name, src, dst, seq) - 1 AS instance_id,
       CASE WHEN p2p THEN (src IN (SELECT rank FROM _present))::INT
                          + (dst IN (SELECT rank FROM _present))::INT
            ELSE coalesce(x.expected, s.seen) END AS expected
FROM agg LEFT JOIN _expected x USING (pg_name) LEFT JOIN seen s USING (pg_name);

INSERT INTO collectives
SELECT c.rank, c.pg_name, c.op, c.seq, i.instance_id,
       CASE WHEN c.pg_name IS NULL THEN 'no_group'
            WHEN c.peer_unknown THEN 'peer_unknown'
            WHEN i.expected <= 1 THEN 'others_absent'
            WHEN i.n_ranks < i.expected THEN 'incomplete'
            WHEN i.n_rows > i.n_ranks THEN 'duplicate'
            WHEN NOT i.p2p AND i.ops_differ THEN 'op_mismatch'
            WHEN coalesce(i.sizes_differ, false) THEN 'size_mismatch'
            ELSE 'matched' END,
       c.peer, c.group_size, c.nelems, c.dtype, c.bytes, c.device, c.stream, c.name, c.step,
       c.ts_ns, c.end_ns, c.arrive_ns, c.peer_source
FROM _coll c LEFT JOIN _inst i
  ON i.pg_name = c.pg_name AND i.p2p = c.p2p AND i.seq = c.seq AND i.src = c.src
 AND i.dst = c.dst
ORDER BY c.rank, c.ts_ns;
"""
_INSTANCE_SQL = _INSTANCE.replace("{n_ranks}", _N_RANKS_GIVEN)
_INSTANCE_POSITIONAL_SQL = _INSTANCE.replace("{n_ranks}", "count(*)")


def match_collectives(
    con: duckdb.DuckDBPyConnection, hints: pa.Table | None = None
) -> dict[str, int]:
    """(Re)fill the `collectives` table from comm events; returns counts per status for meta.

    `hints`: inferred p2p peers (rank, ts_ns, stream, peer) for ops the trace left without one.
    """
    con.execute("DELETE FROM collectives")
    con.execute(EMPTY_SQL)  # no batched p2p linked (p2p_batches.link_batches): none
    hints = hints if hints is not None else _NO_HINTS
    with registered(con, "_peer_hints", hints):
        con.execute(_BUILD_SQL if hints.num_rows else _BUILD_UNHINTED_SQL)
    _repair_shifts(con)
    given = con.execute("SELECT 1 FROM _coll WHERE given_seq IS NOT NULL LIMIT 1").fetchall()
    con.execute(_INSTANCE_SQL if given else _INSTANCE_POSITIONAL_SQL)
    for t in ("_coll", "_inst", "_expected", "_present"):
        con.execute(f"DROP TABLE IF EXISTS {t}")
    rows = con.execute("SELECT status, count(*) FROM collectives GROUP BY ALL").fetchall()
    return {str(s): int(n) for s, n in rows}


def _repair_shifts(con: duckdb.DuckDBPyConnection) -> None:
    """Shift ordinal sequences of ranks whose op count differs from their group's fullest rank."""
    groups = [
        r[0]
        for r in con.execute(
            """SELECT pg_name FROM (
                 SELECT pg_name, rank, count(*) AS n, count(given_seq) AS g FROM _coll
                 WHERE pg_name IS NOT NULL AND NOT p2p AND NOT peer_unknown GROUP BY ALL)
               GROUP BY pg_name HAVING count(DISTINCT n) > 1 AND sum(g) < sum(n)"""
        ).fetchall()
    ]
    if not groups:
        return
    upd: dict[str, list[object]] = {"pg": [], "rank": [], "shift": []}
    for pg in groups:
        seqs: dict[int, list[tuple[str, int | None, int]]] = defaultdict(list)
        for rank, op, size, end in con.execute(
            """SELECT rank, op, coalesce(bytes, nelems), end_ns FROM _coll
               WHERE pg_name = ? AND NOT p2p AND NOT peer_unknown ORDER BY rank, seq""",
            [pg],
        ).fetchall():
            seqs[int(rank)].append((str(op), size, int(end)))
        ref_rank = max(seqs, key=lambda r: (len(seqs[r]), -r))
        ref = seqs[ref_rank]
        for rank, mine in seqs.items():
            if rank == ref_rank:
                continue
            shift = _best_shift(ref, mine)
            if shift:
                for k, v in zip(upd, (pg, rank, shift), strict=True):
                    upd[k].append(v)
    if not upd["pg"]:
        return
    with registered(
        con,
        "_shifts",
        pa.table(
            {
                "pg": pa.array(upd["pg"], pa.string()),
                "rank": pa.array(upd["rank"], pa.int32()),
                "shift": pa.array(upd["shift"], pa.int64()),
            }
        ),
    ):
        con.execute(
            """UPDATE _coll SET seq = _coll.seq + s.shift FROM _shifts s
               WHERE _coll.pg_name = s.pg AND _coll.rank = s.rank AND NOT _coll.p2p
                 AND NOT _coll.peer_unknown"""
        )


def _best_shift(
    ref: list[tuple[str, int | None, int]], mine: list[tuple[str, int | None, int]]
) -> int:
    """Offset s so that mine[k] pairs with ref[k + s]: most equal (op, size), then the
    smallest spread (MAD) of end-time differences."""
    lo = -_MAX_SHIFT
    hi = len(ref) - len(mine) + _MAX_SHIFT
    best: tuple[int, float, int] | None = None
    for s in range(lo, hi + 1):
        pairs = [(ref[k + s], m) for k, m in enumerate(mine) if 0 <= k + s < len(ref)]
        if not pairs:
            continue
        same = sum(1 for a, b in pairs if a[:2] == b[:2])
        diffs = np.array([a[2] - b[2] for a, b in pairs], dtype=np.float64)
        mad = float(np.median(np.abs(diffs - np.median(diffs))))
        key = (-same, mad, abs(s))
        if best is None or key < (best[0], best[1], abs(best[2])):
            best = (-same, mad, s)
    return 0 if best is None else best[2]
