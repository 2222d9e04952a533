-- requires: intervals
-- pipeline: pipeline bubbles per PP stage (rank) and step, the micro-batch Gantt, the schedule.
-- bubble = W \ (compute ∪ non-PP communication ∪ memcpy/memset): idle time plus time spent in
-- PP send/recv with nothing else running (a waiting stage spins in a SendRecv kernel or blocks
-- in gloo:recv: idle alone under-counts).

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
       CASE WHEN stage < size - 1 THEN ranks[stage + 2] END AS next_rank, evidence,
       -- interleaved schedules run the pipeline as a ring (last stage -> first stage)
       ranks[((stage + size - 1) % size) + 1] AS prev_ring,
       ranks[((stage + 1) % size) + 1] AS next_ring
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
  AND on_device(d.has_gpu, e.device);

-- C of design.md's bubble: compute only.
CREATE OR REPLACE TEMP VIEW _pipeline_compute_ev AS
SELECT e.rank, e.step, e.ts_ns AS s, e.ts_ns + e.dur_ns AS e
FROM events e JOIN _pipeline_devs d USING (rank)
WHERE e.step IS NOT NULL AND e.kind = 'compute'
  AND on_device(d.has_gpu, e.device);

-- Busy but neither compute nor PP p2p: other communication (DP, TP, ...) and copies.
CREATE OR REPLACE TEMP VIEW _pipeline_other_ev AS
SELECT e.rank, e.step, e.ts_ns AS s, e.ts_ns + e.dur_ns AS e
FROM events e JOIN _pipeline_devs d USING (rank)
WHERE e.step IS NOT NULL AND e.kind IN ('memcpy', 'memset')
  AND on_device(d.has_gpu, e.device)
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
  WHERE k.device >= 0 AND is_device_work(k.kind)
  GROUP BY ALL
)
SELECT a.rank, a.step, a.phase, a.mb, a.name, sp.s, sp.e
FROM ha a JOIN span sp ON sp.rank = a.rank AND sp.tid = a.tid AND sp.a_s = a.s
  AND sp.a_name = a.name;

CREATE OR REPLACE TEMP VIEW _pipeline_ann_blocks AS
SELECT a.rank, a.step, a.phase, a.mb, a.name, a.s, a.e, 'annotation' AS source
FROM _pipeline_ann a JOIN ranks r USING (rank)
WHERE on_device(r.has_gpu, a.device)
UNION ALL
SELECT rank, step, phase, mb, name, s, e, 'annotation_launches' FROM _pipeline_proj;

