"""Batched send/recv (torch's batch_isend_irecv, Megatron's batch_p2p_comm): one NCCL kernel
that carries several p2p ops.

Why: torch records a `record_param_comms` for each send/recv of the batch (group, size, peer),
but those ops launch nothing; `ncclGroupEnd` launches the one `SendRecv` kernel afterwards,
under `nccl:coalesced`, so the kernel has no group, peer or size of its own. Matched as it is,
it looks like a collective of the whole pipeline group and pairs stage 0's batch with stage 3's.
Each host op that launched no kernel belongs to the next batched kernel its thread launches;
matching then sees one row per op with the kernel's timing (a message ends with its kernel),
and the kernel takes the ops' group so group inference leaves it alone.
"""

from __future__ import annotations

import duckdb

_LINK_SQL = """
CREATE OR REPLACE TEMP TABLE _p2p_batch_ops AS
WITH k AS (
  SELECT rank, ts_ns, dur_ns, stream, device, step, name, correlation FROM events
  WHERE kind = 'comm' AND device >= 0 AND coll_op = 'send_recv' AND peer IS NULL
    AND correlation IS NOT NULL
), l AS (
  SELECT k.*, r.tid, r.ts_ns AS launch_ns
  FROM k JOIN events r ON r.rank = k.rank AND r.correlation = k.correlation
   AND r.kind = 'runtime' AND r.device = -1
), kernel_ext AS (
  SELECT DISTINCT rank, external_id FROM events WHERE device >= 0 AND external_id IS NOT NULL
), h AS (
  SELECT h.* FROM events h ANTI JOIN kernel_ext x USING (rank, external_id)
  WHERE h.device = -1 AND h.coll_op IN ('send', 'recv') AND h.external_id IS NOT NULL
)
SELECT h.rank, h.pg_name, h.coll_op, l.name, h.peer, h.group_size, h.dtype, h.bytes,
       l.device, l.stream, l.step, l.ts_ns, l.dur_ns, h.seq, h.in_nelems, h.out_nelems,
       h.shapes, h.ts_ns AS issue_ns
FROM h ASOF JOIN l ON l.rank = h.rank AND l.tid = h.tid AND l.launch_ns >= h.ts_ns
"""

EMPTY_SQL = """
CREATE TEMP TABLE IF NOT EXISTS _p2p_batch_ops AS
SELECT rank, pg_name, coll_op, name, peer, group_size, dtype, bytes, device, stream, step,
       ts_ns, dur_ns, seq, in_nelems, out_nelems, shapes, ts_ns AS issue_ns
FROM events WHERE false
"""


def build_batches(con: duckdb.DuckDBPyConnection) -> None:
    """Build `_p2p_batch_ops` (one row per op of each batched kernel) from `events` alone.

    Realign calls it on a stored run: it reads the kernels and host ops link_batches read at
    ingest, which the rest of ingest leaves as they were, except that group inference names
    ops the traces left without a group (a batch's host ops without one would then be matched
    in the inferred group, where ingest left them `no_group`)."""
    con.execute("SET asof_loop_join_threshold = 0")
    con.execute(_LINK_SQL)


def link_batches(con: duckdb.DuckDBPyConnection) -> int:
    """Build `_p2p_batch_ops` and give each batched kernel its ops' group; returns how many
    kernels were batches."""
    build_batches(con)
    con.execute(
        """UPDATE events_rich AS e SET pg_name = b.pg FROM (
             SELECT rank, ts_ns, stream, min(pg_name) AS pg FROM _p2p_batch_ops
             GROUP BY ALL HAVING count(DISTINCT pg_name) = 1) b
           WHERE e.kind = 'comm' AND e.device >= 0 AND e.pg_name IS NULL
             AND e.rank = b.rank AND e.ts_ns = b.ts_ns
             AND e.stream IS NOT DISTINCT FROM b.stream"""
    )
    row = con.execute(
        "SELECT count(*) FROM (SELECT DISTINCT rank, ts_ns, stream FROM _p2p_batch_ops)"
    ).fetchone()
    return int(row[0]) if row else 0
