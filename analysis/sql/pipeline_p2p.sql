-- requires: pipeline
-- pipeline (continued): PP p2p ops and the micro-batch blocks they delimit.

-- p2p ops of PP ranks in steps with no phase annotation, with the side they talk to.
-- gloo: the issue op (peer in Concrete Inputs), a recv extended to the end of its wait span.
-- GPU: PP p2p ops (`collectives`: a batched kernel gives one row per op); the side is the
-- peer's. An op without one (peer_unknown) has no side: guessing it (the neighbour whose p2p
-- kernels overlap it most) read an interleaved job without peers as 1F1B with m=6, and in
-- lockstep both neighbours overlap alike.
CREATE OR REPLACE TEMP VIEW _pipeline_ops AS
WITH todo AS MATERIALIZED (
  SELECT st.*, w.step, w.start_ns, w.end_ns FROM pipeline_stages st JOIN steps w USING (rank)
  WHERE NOT EXISTS (SELECT 1 FROM _pipeline_ann_blocks b
                    WHERE b.rank = w.rank AND b.step = w.step)
), waits AS (
  SELECT rank, tid, ts_ns AS s, ts_ns + dur_ns AS e FROM events
  WHERE kind = 'comm' AND device = -1 AND name = 'gloo:recv'
), gi AS (
  SELECT g.*, t.stage, t.prev_rank, t.next_rank
  FROM _pipeline_gloo_issue g JOIN todo t USING (rank, step)
), gl AS (
  SELECT gi.rank, gi.step, gi.s,
         CASE WHEN gi.coll_op = 'recv' THEN greatest(gi.e, coalesce(w.e, gi.e)) ELSE gi.e END AS e,
         gi.coll_op = 'send' AS has_send, gi.coll_op = 'recv' AS has_recv,
         CASE WHEN gi.peer_local = gi.stage - 1 THEN 'prev'
              WHEN gi.peer_local = gi.stage + 1 THEN 'next'
              WHEN gi.peer_local = gi.prev_rank THEN 'prev'
              WHEN gi.peer_local = gi.next_rank THEN 'next' END AS dir
  FROM gi ASOF LEFT JOIN waits w ON w.rank = gi.rank AND w.tid = gi.tid AND gi.s <= w.s
), gk AS MATERIALIZED (
  -- from `collectives`: one row per op (a batched kernel's ops each), peers inferred or given
  SELECT c.rank, c.step, c.ts_ns AS s, c.end_ns AS e, c.op AS coll_op, c.peer,
         st.pp_group, st.stage, st.prev_rank, st.next_rank, st.prev_ring, st.next_ring,
         (c.rank, c.step) IN (SELECT (rank, step) FROM todo) AS wanted
  FROM collectives c JOIN ranks r USING (rank) JOIN pipeline_stages st USING (rank)
  LEFT JOIN process_groups g ON g.pg_name = c.pg_name
  WHERE r.has_gpu AND c.device >= 0 AND c.step IS NOT NULL
    AND c.op IN ('send', 'recv', 'send_recv')
    AND (c.pg_name IS NULL OR g.pg_name IS NULL OR g.parallelism = 'PP' OR g.ranks = st.pp_ranks)
    AND EXISTS (SELECT 1 FROM todo)
), gpu AS (
  SELECT gk.rank, gk.step, gk.s, gk.e, gk.coll_op IN ('send', 'send_recv') AS has_send,
         gk.coll_op IN ('recv', 'send_recv') AS has_recv,
         CASE WHEN gk.peer = gk.prev_rank THEN 'prev'
              WHEN gk.peer = gk.next_rank THEN 'next'
              WHEN gk.peer = gk.next_ring THEN 'next'
              WHEN gk.peer = gk.prev_ring THEN 'prev' END AS dir
  FROM gk
  WHERE gk.wanted
)
SELECT rank, step, s, e, has_send, has_recv, dir, true AS host FROM gl
UNION ALL
SELECT rank, step, s, e, has_send, has_recv, dir, false FROM gpu;

-- Blocks from p2p order. A block is the compute between p2p ops: compute kernels (host ops on
-- CPU-only ranks) take the segment of the last p2p op that started before them, and a block
-- spans its segment's first compute start to last compute end, so it never holds time spent
-- waiting in a send or recv. Consecutive p2p ops with no compute between them form one gap,
-- whatever their issue order (Megatron posts them in parity order: odd stages receive first).
-- The label reads the gaps around a block: a receive from the previous stage (ring: the last
-- stage feeds the first in interleaved schedules) or a send to the next one means forward, the
-- reverse directions backward; first/last stages fuse F and B between the same gaps ('BF',
-- 'FB'). After a step's last p2p op the block ends before the first non-PP collective that
-- starts with no compute running (the DP all-reduce after the flush; an overlapped one runs
-- beside compute and does not end the block), else at the last compute of the step.
CREATE OR REPLACE TEMP VIEW _pipeline_p2p_blocks AS
WITH o AS MATERIALIZED (
  SELECT *, row_number() OVER (PARTITION BY rank, step ORDER BY s, e) AS j,
         count(*) OVER (PARTITION BY rank, step) AS n
  FROM _pipeline_ops
), last_op AS (
  SELECT rank, step, max(s) AS s FROM o GROUP BY ALL
), comp AS MATERIALIZED (
  SELECT c.rank, c.step, c.s, c.e FROM _pipeline_compute_ev c
  JOIN last_op USING (rank, step)
), coll AS (
  SELECT c.rank, c.step, c.s FROM _pipeline_comm_ev c JOIN last_op l USING (rank, step)
  WHERE NOT c.is_pp AND c.s >= l.s
), cut AS (
  SELECT c.rank, c.step, min(c.s) AS s
  FROM coll c ASOF LEFT JOIN comp k ON k.rank = c.rank AND k.step = c.step AND k.s <= c.s
  WHERE k.e IS NULL OR k.e <= c.s
  GROUP BY ALL
), seg AS (
  SELECT k.rank, k.step, coalesce(o.j, 0) AS j, k.s, k.e
  -- ops that start together (one batched kernel) are one gap: the compute after them takes
  -- the last of them
  FROM comp k ASOF LEFT JOIN (SELECT rank, step, s, max(j) AS j, any_value(n) AS n
                              FROM o GROUP BY ALL) o
    ON o.rank = k.rank AND o.step = k.step AND k.s >= o.s
  LEFT JOIN cut ON cut.rank = k.rank AND cut.step = k.step
  WHERE cut.s IS NULL OR coalesce(o.j, 0) < o.n OR k.s < cut.s
), blk AS (
  SELECT rank, step, j, min(s) AS s, max(e) AS e FROM seg GROUP BY ALL
), nb AS (
  SELECT b.*, coalesce(lag(j) OVER w, -1) AS j_prev,
         coalesce(lead(j) OVER w, 1 << 30) AS j_next
  FROM blk b WINDOW w AS (PARTITION BY rank, step ORDER BY j)
), lab AS (
  SELECT nb.rank, nb.step, nb.j, nb.s, nb.e,
         CASE WHEN bool_or(o.j > nb.j_prev AND o.j <= nb.j AND o.has_recv AND o.dir = 'prev')
              THEN 'F'
              WHEN bool_or(o.j > nb.j_prev AND o.j <= nb.j AND o.has_recv AND o.dir = 'next')
              THEN 'B' END AS lin,
         CASE WHEN bool_or(o.j > nb.j AND o.j <= nb.j_next AND o.has_send AND o.dir = 'next')
              THEN 'F'
              WHEN bool_or(o.j > nb.j AND o.j <= nb.j_next AND o.has_send AND o.dir = 'prev')
              THEN 'B' END AS lout
  FROM nb LEFT JOIN o ON o.rank = nb.rank AND o.step = nb.step
    AND o.j > nb.j_prev AND o.j <= nb.j_next
  GROUP BY ALL
), ph AS (
  SELECT rank, step, s, e,
         CASE WHEN lin IS NULL THEN lout WHEN lout IS NULL OR lout = lin THEN lin
              ELSE lin || lout END AS phase
  FROM lab
)
SELECT rank, step, phase,
       CASE WHEN left(phase, 1) = 'F'
            THEN coalesce(sum(CASE WHEN contains(phase, 'F') THEN 1 ELSE 0 END) OVER x, 0)
            ELSE coalesce(sum(CASE WHEN contains(phase, 'B') THEN 1 ELSE 0 END) OVER x, 0)
       END::INTEGER AS mb,
       NULL::VARCHAR AS name, s, e, 'p2p_order' AS source
FROM ph WHERE phase IS NOT NULL AND e > s
WINDOW x AS (PARTITION BY rank, step ORDER BY s ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING);
