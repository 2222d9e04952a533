-- pipeline: pipeline bubbles per PP stage (rank) and step, the micro-batch Gantt, the schedule.
-- bubble = W \ (compute ∪ non-PP communication ∪ memcpy/memset): idle time plus time spent in
-- PP send/recv with nothing else running (a waiting stage spins in a SendRecv kernel or blocks
-- in gloo:recv: idle alone under-counts). Needs intervals.sql.

-- PP groups named as such (parallelism = 'PP'); groups with the same members are one pipeline.
CREATE OR REPLACE TEMP VIEW _pipeline_pp_labeled AS
SELECT first(pg_name ORDER BY length(pg_name), pg_name) AS pg_name, ranks,
       len(ranks) AS size, 'process group labeled PP' AS evidence
FROM process_groups
WHERE parallelism = 'PP' AND ranks IS NOT NULL AND len(ranks) > 1
GROUP BY ranks;

-- gloo p2p issue ops: the peer is the group-local rank in Concrete Inputs ["", "", peer, tag].
CREATE OR REPLACE TEMP VIEW _pipeline_gloo_issue AS
SELECT rank, step, tid, ts_ns AS s, ts_ns + dur_ns AS e, coll_op,
       CASE WHEN json_valid(concrete)
            THEN TRY_CAST(json_extract_string(concrete, '$[2]') AS INTEGER) END AS peer_local
FROM events
WHERE kind = 'cpu_op' AND device = -1 AND coll_op IN ('send', 'recv')
  AND name LIKE 'c10d::%' AND concrete IS NOT NULL AND step IS NOT NULL;

-- Without a PP label: groups whose p2p traffic shows they are the pipeline. Either the group
-- carries only send/recv (not SendRecv kernels alone: older NCCL runs all-to-all as SendRecv),
-- or (gloo) every member's group-local peers point at another member that
-- sends/receives back with this member's index (TP/DP/MP groups fail: a peer index lands on
-- the rank itself or on a rank that never talks back).
CREATE OR REPLACE TEMP VIEW _pipeline_pp_inferred AS
WITH cand AS MATERIALIZED (
  SELECT first(pg_name ORDER BY length(pg_name), pg_name) AS pg_name, ranks, len(ranks) AS size
  FROM process_groups
  WHERE ranks IS NOT NULL AND len(ranks) > 1
    AND coalesce(parallelism, 'OTHER') IN ('OTHER', 'WORLD', 'PP')
    AND NOT EXISTS (SELECT 1 FROM _pipeline_pp_labeled)
  GROUP BY ranks
), mem AS (
  SELECT pg_name, ranks, size, unnest(ranks) AS rank, unnest(range(size)) AS idx FROM cand
), named AS (
  SELECT c.pg_name
  FROM events e JOIN process_groups g ON g.pg_name = e.pg_name JOIN cand c ON c.ranks = g.ranks
  WHERE e.kind = 'comm' AND EXISTS (SELECT 1 FROM cand)
  GROUP BY c.pg_name HAVING bool_and(coalesce(e.coll_op IN ('send', 'recv'), false))
), ops AS (
  SELECT DISTINCT rank, peer_local FROM _pipeline_gloo_issue
  WHERE peer_local IS NOT NULL AND EXISTS (SELECT 1 FROM cand)
), chk AS (
  SELECT m.pg_name,
         o.peer_local IS NOT NULL AND o.peer_local < m.size AND o.peer_local <> m.idx
           AND EXISTS (SELECT 1 FROM ops o2
                       WHERE o2.rank = m.ranks[o.peer_local + 1] AND o2.peer_local = m.idx) AS ok
  FROM mem m LEFT JOIN ops o ON o.rank = m.rank
), gloo AS (
  SELECT pg_name FROM chk GROUP BY pg_name HAVING bool_and(coalesce(ok, false))
)
SELECT c.pg_name, c.ranks, c.size,
       CASE WHEN c.pg_name IN (SELECT pg_name FROM named) THEN 'the group carries only send/recv'
            ELSE 'gloo p2p peers (group-local ranks) are consistent only with this group'
       END AS evidence
FROM cand c
WHERE c.pg_name IN (SELECT pg_name FROM named) OR c.pg_name IN (SELECT pg_name FROM gloo);

-- One pipeline per rank: its stage is its rank within the PP group.
CREATE OR REPLACE TEMP VIEW pipeline_stages AS
WITH g AS (
  SELECT pg_name, ranks, size, evidence FROM _pipeline_pp_labeled
  UNION ALL
  SELECT pg_name, ranks, size, evidence FROM _pipeline_pp_inferred
  WHERE NOT EXISTS (SELECT 1 FROM _pipeline_pp_labeled)
), m AS (
  SELECT pg_name, ranks, size, evidence, unnest(ranks) AS rank, unnest(range(size)) AS stage
  FROM g
)
SELECT rank::INTEGER AS rank, pg_name AS pp_group, stage::INTEGER AS stage,
       size::INTEGER AS pp_size, ranks AS pp_ranks,
       CASE WHEN stage > 0 THEN ranks[stage] END AS prev_rank,
       CASE WHEN stage < size - 1 THEN ranks[stage + 2] END AS next_rank, evidence
FROM m
QUALIFY row_number() OVER (PARTITION BY rank ORDER BY size, length(pg_name), pg_name) = 1;

-- Device work of PP ranks (GPU ranks: their GPUs; CPU-only ranks: the host), split into PP
-- p2p (comm send/recv of the pipeline group; on a CPU-only rank also the p2p issue op, as
-- c10d::recv_ can block for ms) and everything else that keeps the device busy.
CREATE OR REPLACE TEMP VIEW _pipeline_devs AS
SELECT st.rank, r.has_gpu, st.pp_ranks FROM pipeline_stages st JOIN ranks r USING (rank);

CREATE OR REPLACE TEMP VIEW _pipeline_comm_ev AS
SELECT e.rank, e.step, e.ts_ns AS s, e.ts_ns + e.dur_ns AS e,
       coalesce(e.coll_op IN ('send', 'recv', 'send_recv'), false)
         AND (e.pg_name IS NULL OR g.pg_name IS NULL OR g.parallelism = 'PP'
              OR g.ranks = d.pp_ranks) AS is_pp
FROM events e JOIN _pipeline_devs d USING (rank)
LEFT JOIN process_groups g ON g.pg_name = e.pg_name
WHERE e.step IS NOT NULL
  AND (e.kind = 'comm' OR (e.kind = 'cpu_op' AND NOT d.has_gpu AND e.coll_op IN ('send', 'recv')))
  AND CASE WHEN d.has_gpu THEN e.device >= 0 ELSE e.device = -1 END;

CREATE OR REPLACE TEMP VIEW _pipeline_busy_ev AS
SELECT e.rank, e.step, e.ts_ns AS s, e.ts_ns + e.dur_ns AS e
FROM events e JOIN _pipeline_devs d USING (rank)
WHERE e.step IS NOT NULL AND e.kind IN ('compute', 'memcpy', 'memset')
  AND CASE WHEN d.has_gpu THEN e.device >= 0 ELSE e.device = -1 END
UNION ALL
SELECT rank, step, s, e FROM _pipeline_comm_ev WHERE NOT is_pp;

-- Phase annotations: forward_mb3 / backward-compute / wgrad_2 ..., or a trailing (F)/(B)/(W)
-- as in DeepSeek's attn(F), mlp(B), attn(W). mb is the micro-batch number when named.
CREATE OR REPLACE TEMP VIEW _pipeline_ann AS
WITH a AS (
  SELECT rank, step, device, tid, name, ts_ns AS s, ts_ns + dur_ns AS e,
         regexp_extract(lower(name),
           '^(forward|fwd|backward|bwd|wgrad|weight[-_ ]?grad)(?:[-_ ](?:compute|step|pass))?'
           || '[-_ #]*(?:(?:mb|microbatch|micro[-_ ]batch|chunk)[-_ #]*)?(\d*)$',
           ['word', 'mb']) AS m1,
         regexp_extract(name, '\(([FBW])\)$', 1) AS p2
  FROM events
  WHERE kind = 'annotation' AND step IS NOT NULL AND coalesce(cat, '') <> 'python_function'
)
SELECT rank, step, device, tid, name, s, e,
       CASE WHEN p2 <> '' THEN p2
            WHEN m1.word IN ('forward', 'fwd') THEN 'F'
            WHEN m1.word IN ('backward', 'bwd') THEN 'B'
            ELSE 'W' END AS phase,
       TRY_CAST(nullif(m1.mb, '') AS INTEGER) AS mb
FROM a WHERE p2 <> '' OR m1.word <> '';

-- GPU ranks without device-side phase ranges: a host range becomes the span of the kernels it
-- launched (runtime calls inside the range, matched to kernels by correlation id).
CREATE OR REPLACE TEMP VIEW _pipeline_proj AS
WITH need AS (
  SELECT DISTINCT a.rank FROM _pipeline_ann a JOIN ranks r USING (rank)
  WHERE r.has_gpu AND a.device = -1
    AND NOT EXISTS (SELECT 1 FROM _pipeline_ann d WHERE d.rank = a.rank AND d.device >= 0)
), ha AS (
  SELECT * FROM _pipeline_ann WHERE device = -1 AND rank IN (SELECT rank FROM need)
), rt AS (
  SELECT rank, tid, ts_ns, correlation FROM events
  WHERE kind IN ('runtime', 'sync') AND correlation IS NOT NULL
    AND rank IN (SELECT rank FROM need)
), hit AS (
  SELECT a.rank, a.tid, a.s AS a_s, a.name AS a_name, rt.correlation
  FROM rt ASOF JOIN ha a ON rt.rank = a.rank AND rt.tid = a.tid AND rt.ts_ns >= a.s
  WHERE rt.ts_ns < a.e
), span AS (
  SELECT h.rank, h.tid, h.a_s, h.a_name, min(k.ts_ns) AS s, max(k.ts_ns + k.dur_ns) AS e
  FROM hit h JOIN events k ON k.rank = h.rank AND k.correlation = h.correlation
  WHERE k.device >= 0 AND k.kind IN ('compute', 'comm', 'memcpy', 'memset')
  GROUP BY ALL
)
SELECT a.rank, a.step, a.phase, a.mb, a.name, sp.s, sp.e
FROM ha a JOIN span sp ON sp.rank = a.rank AND sp.tid = a.tid AND sp.a_s = a.s
  AND sp.a_name = a.name;

CREATE OR REPLACE TEMP VIEW _pipeline_ann_blocks AS
SELECT a.rank, a.step, a.phase, a.mb, a.name, a.s, a.e, 'annotation' AS source
FROM _pipeline_ann a JOIN ranks r USING (rank)
WHERE (NOT r.has_gpu AND a.device = -1) OR (r.has_gpu AND a.device >= 0)
UNION ALL
SELECT rank, step, phase, mb, name, s, e, 'annotation_launches' FROM _pipeline_proj;

-- p2p ops of PP ranks in steps with no phase annotation, with the side they talk to.
-- gloo: the issue op (peer in Concrete Inputs), a recv extended to the end of its wait span.
-- GPU: PP p2p kernels; the side is the peer column, else the neighbour stage whose p2p kernels
-- overlap this one most on the job clock (a send and its recv run together).
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
  SELECT e.rank, e.step, e.ts_ns AS s, e.ts_ns + e.dur_ns AS e, e.coll_op, e.peer,
         e.ts_ns + coalesce(r.clock_offset_ns, 0) AS a_s,
         e.ts_ns + e.dur_ns + coalesce(r.clock_offset_ns, 0) AS a_e,
         st.pp_group, st.stage, st.prev_rank, st.next_rank,
         (e.rank, e.step) IN (SELECT (rank, step) FROM todo) AS wanted
  FROM events e JOIN ranks r USING (rank) JOIN pipeline_stages st USING (rank)
  LEFT JOIN process_groups g ON g.pg_name = e.pg_name
  WHERE r.has_gpu AND e.device >= 0 AND e.kind = 'comm' AND e.step IS NOT NULL
    AND e.coll_op IN ('send', 'recv', 'send_recv')
    AND (e.pg_name IS NULL OR g.pg_name IS NULL OR g.parallelism = 'PP' OR g.ranks = st.pp_ranks)
    AND EXISTS (SELECT 1 FROM todo)
), side AS (
  SELECT a.rank, a.s,
         arg_max(CASE WHEN b.stage < a.stage THEN 'prev' ELSE 'next' END,
                 least(a.a_e, b.a_e) - greatest(a.a_s, b.a_s)) AS dir
  FROM gk a JOIN gk b ON a.pp_group = b.pp_group AND a.step = b.step
    AND abs(a.stage - b.stage) = 1 AND b.a_s < a.a_e AND b.a_e > a.a_s
  WHERE a.wanted
  GROUP BY a.rank, a.s
), gpu AS (
  SELECT gk.rank, gk.step, gk.s, gk.e, gk.coll_op IN ('send', 'send_recv') AS has_send,
         gk.coll_op IN ('recv', 'send_recv') AS has_recv,
         coalesce(CASE WHEN gk.peer = gk.prev_rank THEN 'prev'
                       WHEN gk.peer = gk.next_rank THEN 'next' END, side.dir) AS dir
  FROM gk LEFT JOIN side ON side.rank = gk.rank AND side.s = gk.s
  WHERE gk.wanted
)
SELECT rank, step, s, e, has_send, has_recv, dir, true AS host FROM gl
UNION ALL
SELECT rank, step, s, e, has_send, has_recv, dir, false FROM gpu;

-- Blocks between consecutive p2p ops: a block that follows a receive from the previous stage
-- starts with a forward (from the next stage: a backward); one that precedes a send to the
-- next stage ends with a forward (to the previous stage: a backward). First/last stages fuse
-- F and B between the same ops ('FB', 'BF'). The last block of a step ends at the first
-- non-PP collective after it (e.g. the DP gradient all-reduce) or at the end of W.
CREATE OR REPLACE TEMP VIEW _pipeline_p2p_blocks AS
WITH o AS (
  SELECT *, lag(e) OVER w AS pe, lag(s) OVER w AS ps, lag(has_recv) OVER w AS p_recv,
         lag(host) OVER w AS p_host, lag(dir) OVER w AS p_dir,
         lead(s) OVER w IS NULL AS is_last
  FROM _pipeline_ops WINDOW w AS (PARTITION BY rank, step ORDER BY s, e)
), seg AS (
  SELECT o.rank, o.step,
         CASE WHEN o.pe IS NULL THEN w.start_ns WHEN o.p_recv OR o.p_host THEN o.pe ELSE o.ps END
           AS s,
         o.s AS e,
         CASE WHEN o.p_recv THEN CASE o.p_dir WHEN 'prev' THEN 'F' WHEN 'next' THEN 'B' END END
           AS lin,
         CASE WHEN o.has_send THEN CASE o.dir WHEN 'next' THEN 'F' WHEN 'prev' THEN 'B' END END
           AS lout
  FROM o JOIN steps w USING (rank, step)
  UNION ALL
  SELECT o.rank, o.step, CASE WHEN o.has_recv OR o.host THEN o.e ELSE o.s END, NULL,
         CASE WHEN o.has_recv THEN CASE o.dir WHEN 'prev' THEN 'F' WHEN 'next' THEN 'B' END END,
         NULL
  FROM o WHERE o.is_last
), coll AS (
  SELECT c.rank, c.step, c.s FROM _pipeline_comm_ev c
  JOIN (SELECT DISTINCT rank, step FROM _pipeline_ops) t USING (rank, step)
  WHERE NOT c.is_pp
), tail AS (
  SELECT seg.rank, seg.step, seg.s, coalesce(seg.e, least(c.s, w.end_ns), w.end_ns) AS e,
         seg.lin, seg.lout
  FROM seg JOIN steps w USING (rank, step)
  ASOF LEFT JOIN coll c ON c.rank = seg.rank AND c.step = seg.step AND seg.s <= c.s
), lab AS (
  SELECT rank, step, s, e,
         CASE WHEN lin IS NULL THEN lout WHEN lout IS NULL OR lout = lin THEN lin
              ELSE lin || lout END AS phase
  FROM tail
)
SELECT rank, step, phase,
       CASE WHEN left(phase, 1) = 'F'
            THEN coalesce(sum(CASE WHEN contains(phase, 'F') THEN 1 ELSE 0 END) OVER x, 0)
            ELSE coalesce(sum(CASE WHEN contains(phase, 'B') THEN 1 ELSE 0 END) OVER x, 0)
       END::INTEGER AS mb,
       NULL::VARCHAR AS name, s, e, 'p2p_order' AS source
FROM lab WHERE phase IS NOT NULL AND e > s
WINDOW x AS (PARTITION BY rank, step ORDER BY s ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING);

CREATE OR REPLACE TEMP VIEW _pipeline_blocks_raw AS
SELECT * FROM _pipeline_ann_blocks
UNION ALL
SELECT rank, step, phase, mb, name, s, e, source FROM _pipeline_p2p_blocks;

-- The Gantt: one row per F/B/W block (fused FB/BF when inferred from p2p order), job clock.
CREATE OR REPLACE TEMP VIEW pipeline_blocks AS
SELECT b.rank, b.step, st.pp_group, st.stage, b.phase, b.mb, b.name,
       b.s + coalesce(r.clock_offset_ns, 0) AS start_ns,
       b.e + coalesce(r.clock_offset_ns, 0) AS end_ns, b.e - b.s AS dur_ns, b.source
FROM _pipeline_blocks_raw b JOIN ranks r USING (rank)
LEFT JOIN pipeline_stages st USING (rank);

-- Per stage and step. bubble = W minus busy minus micro-batch blocks (gaps inside a block are
-- the block's own idle, e.g. launch gaps, not pipeline bubble); pp_wait = the part of the
-- bubble spent in PP p2p; work = time inside blocks; other_busy = busy outside blocks;
-- bubble_fraction = bubble / (bubble + work), the fraction of the pipeline's time
-- (GPipe/1F1B convention), NULL without blocks. Phases: warm-up until the first backward (or
-- W) block starts, steady state until the last forward ends, cool-down after it.
-- Algorithm: one sort of busy events + blocks + an end sentinel per (rank, step); a running
-- max (streaming window, as in interval_union_sorted) marks the rows that open an island of
-- U = busy ∪ blocks, and each island ends at the reach seen by the next opening row (the
-- sentinel closes a key's last island). Coverage then runs on few intervals: U (class 0), PP
-- p2p islands (1), blocks (2), warm-up (3), steady state (4), W (5).
CREATE OR REPLACE TEMP VIEW pipeline_by_step AS
WITH st AS MATERIALIZED (
  SELECT * FROM pipeline_stages
), w AS MATERIALIZED (
  SELECT w.* FROM steps w WHERE w.rank IN (SELECT rank FROM st)
), b AS MATERIALIZED (
  SELECT b.rank, b.step, b.phase, b.source, greatest(b.s, w.start_ns) AS s,
         least(b.e, w.end_ns) AS e
  FROM _pipeline_blocks_raw b JOIN w USING (rank, step)
), ph AS MATERIALIZED (
  SELECT w.rank, w.step, w.start_ns, w.end_ns,
         coalesce(min(b.s) FILTER (WHERE contains(b.phase, 'B') OR contains(b.phase, 'W')),
                  w.end_ns) AS a,
         max(b.e) FILTER (WHERE contains(b.phase, 'F')) AS z,
         any_value(b.source) AS source
  FROM w JOIN b USING (rank, step)
  GROUP BY w.rank, w.step, w.start_ns, w.end_ns
), o AS (
  SELECT k, s, e FROM (
    SELECT rank::BIGINT * 16777216 + step + 1 AS k, s, e FROM _pipeline_busy_ev
    UNION ALL
    SELECT rank::BIGINT * 16777216 + step + 1, s, e FROM b WHERE e >= s
    UNION ALL
    SELECT rank::BIGINT * 16777216 + step + 1, 4611686018427387904, 4611686018427387904 FROM w
  ) ORDER BY k, s, e
), m AS (
  SELECT k, s, max((k::HUGEINT << 64) + e)
                 OVER (ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS reach
  FROM o
), f AS (
  SELECT k, s, lag(reach) OVER () AS prev FROM m
), g AS (
  SELECT k, s, prev FROM f
  WHERE prev IS NULL OR (prev >> 64) <> k OR s > (prev & 18446744073709551615::HUGEINT)
), y AS MATERIALIZED (
  SELECT k, s, lead(prev) OVER () AS fin FROM g
), pp AS (
  SELECT rank::BIGINT * 16777216 + step + 1 AS k, s, e FROM _pipeline_comm_ev WHERE is_pp
), biv AS (
  SELECT {'rank': rank, 'step': step} AS k, 0 AS cls, s, e FROM b
), cov_in AS MATERIALIZED (
  SELECT k, 0 AS cls, s, CAST(fin & 18446744073709551615::HUGEINT AS BIGINT) AS e
  FROM y WHERE s < 4611686018427387904
  UNION ALL
  SELECT k, 1, s, e FROM interval_union_sorted('pp')
  UNION ALL
  SELECT u.k.rank::BIGINT * 16777216 + u.k.step + 1, 2, u.s, u.e
  FROM interval_union('biv') u
  UNION ALL
  SELECT rank::BIGINT * 16777216 + step + 1, 3, start_ns, least(a, end_ns) FROM ph
  UNION ALL
  SELECT rank::BIGINT * 16777216 + step + 1, 4, a, least(greatest(a, z), end_ns)
  FROM ph WHERE z IS NOT NULL
  UNION ALL
  SELECT rank::BIGINT * 16777216 + step + 1, 5, start_ns, end_ns FROM w
), c AS (
  SELECT cv.k,
         sum(dur) FILTER (WHERE mask & 36 = 36) AS work_ns,
         sum(dur) FILTER (WHERE mask & 33 = 33) AS union_ns,
         sum(dur) FILTER (WHERE mask & 33 = 32) AS bubble_ns,
         sum(dur) FILTER (WHERE mask & 35 = 34) AS pp_wait_ns,
         sum(dur) FILTER (WHERE mask & 41 = 40) AS warmup_ns,
         sum(dur) FILTER (WHERE mask & 49 = 48) AS steady_ns,
         sum(dur) FILTER (WHERE mask & 57 = 32) AS cooldown_ns
  FROM interval_coverage_sorted('cov_in') cv GROUP BY cv.k
)
SELECT st.rank, w.step, st.pp_group, st.stage, st.pp_size,
       (w.end_ns - w.start_ns)::BIGINT AS window_ns,
       CASE WHEN ph.rank IS NOT NULL THEN coalesce(c.work_ns, 0) END::BIGINT AS work_ns,
       greatest(coalesce(c.union_ns, 0) - coalesce(c.work_ns, 0), 0)::BIGINT AS other_busy_ns,
       coalesce(c.bubble_ns, 0)::BIGINT AS bubble_ns,
       (coalesce(c.bubble_ns, 0) - coalesce(c.pp_wait_ns, 0))::BIGINT AS idle_ns,
       coalesce(c.pp_wait_ns, 0)::BIGINT AS pp_wait_ns,
       CASE WHEN ph.rank IS NOT NULL THEN coalesce(c.warmup_ns, 0) END::BIGINT
         AS warmup_bubble_ns,
       CASE WHEN ph.rank IS NOT NULL THEN coalesce(c.steady_ns, 0) END::BIGINT
         AS steady_bubble_ns,
       CASE WHEN ph.rank IS NOT NULL THEN coalesce(c.cooldown_ns, 0) END::BIGINT
         AS cooldown_bubble_ns,
       CASE WHEN ph.rank IS NOT NULL
            THEN coalesce(c.bubble_ns, 0)
                 / nullif(coalesce(c.bubble_ns, 0) + coalesce(c.work_ns, 0), 0) END
         AS bubble_fraction,
       coalesce(c.bubble_ns, 0) / nullif(w.end_ns - w.start_ns, 0) AS step_bubble_share,
       coalesce(ph.source, 'none') AS block_source
FROM st JOIN w USING (rank)
LEFT JOIN c ON c.k = w.rank::BIGINT * 16777216 + w.step + 1
LEFT JOIN ph ON ph.rank = w.rank AND ph.step = w.step;

-- Schedule per pipeline and step, inferred from the blocks: m = micro-batches (forwards on a
-- stage / v), v = forwards per micro-batch (virtual stages; annotated blocks only: p2p order
-- cannot tell model chunks apart), gpipe when every stage starts its
-- last forward before its first backward ends, zero_bubble when W (weight-gradient) blocks
-- exist. Closed forms as a fraction of total pipeline time: GPipe/1F1B (p-1)/(m+p-1);
-- interleaved x/(1+x) with Megatron's fraction of ideal x = (p-1)/(v*m); zero-bubble ZB-H1
-- x = (p-1)(tF+tB-tW)/(m(tF+tB+tW)) from the measured mean block times.
CREATE OR REPLACE TEMP VIEW pipeline_schedule AS
WITH b AS MATERIALIZED (
  SELECT b.*, st.pp_group, st.stage, st.pp_size FROM _pipeline_blocks_raw b
  JOIN pipeline_stages st USING (rank)
), per_stage AS (
  SELECT pp_group, step, stage, any_value(pp_size) AS p,
         count(*) FILTER (WHERE contains(phase, 'F')) AS n_f,
         count(DISTINCT mb) FILTER (WHERE left(phase, 1) = 'F') AS n_mb,
         count(*) FILTER (WHERE phase = 'W') AS n_w,
         max(s) FILTER (WHERE contains(phase, 'F')) AS last_f_start,
         min(e) FILTER (WHERE contains(phase, 'B')) AS first_b_end,
         avg(e - s) FILTER (WHERE phase = 'F') AS t_f,
         avg(e - s) FILTER (WHERE phase = 'B') AS t_b,
         avg(e - s) FILTER (WHERE phase = 'W') AS t_w,
         bool_and(mb IS NOT NULL) AS has_mb, any_value(source) AS source
  FROM b GROUP BY pp_group, step, stage
), g AS (
  SELECT pp_group, step, any_value(p) AS p,
         max(CASE WHEN has_mb AND n_mb > 0 THEN n_mb ELSE n_f END)::INTEGER AS m,
         max(CASE WHEN has_mb AND n_mb > 0 AND source LIKE 'annotation%'
                  THEN round(n_f / n_mb) ELSE 1 END)::INTEGER AS v,
         sum(n_w) > 0 AS has_w,
         bool_and(last_f_start IS NULL OR first_b_end IS NULL OR last_f_start < first_b_end)
           AS all_f_first,
         avg(t_f) AS t_f, avg(t_b) AS t_b, avg(t_w) AS t_w, any_value(source) AS source
  FROM per_stage GROUP BY pp_group, step
), s AS (
  SELECT *, CASE WHEN has_w THEN 'zero_bubble' WHEN v > 1 THEN 'interleaved'
                 WHEN all_f_first THEN 'gpipe' ELSE '1f1b' END AS schedule
  FROM g WHERE m > 0
), x AS (
  SELECT *,
         CASE schedule
           WHEN 'interleaved' THEN (p - 1) / (v * m)
           WHEN 'zero_bubble' THEN (p - 1) * greatest(t_f + t_b - t_w, 0) / (m * (t_f + t_b + t_w))
           ELSE (p - 1) / m END AS closed_form_ideal
  FROM s
)
SELECT pp_group, step, p::INTEGER AS p, m, v, schedule,
       closed_form_ideal / (1 + closed_form_ideal) AS closed_form, closed_form_ideal,
       CASE schedule
         WHEN 'interleaved' THEN 'fraction of total x/(1+x); Megatron fraction of ideal x = (p-1)/(v*m)'
         WHEN 'zero_bubble' THEN 'fraction of total x/(1+x); ZB-H1 x = (p-1)(tF+tB-tW)/(m(tF+tB+tW))'
         ELSE 'fraction of total (p-1)/(m+p-1); fraction of ideal (p-1)/m' END AS convention,
       source AS block_source
FROM x;
