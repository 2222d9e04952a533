-- requires: pipeline_p2p
-- pipeline (continued): the Gantt, bubbles per stage and step, the schedule.

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

-- Per stage and step, design.md's bubble: bubble = idle + |M_PP \ C|, i.e. time in W with no
-- compute (C) that is either idle or inside PP send/recv, whether or not other communication
-- (DP, TP) or copies (O) run beside it; filled = the part of the bubble O already uses (what
-- moving DP into bubbles builds on); idle = nothing at all running; pp_wait = |M_PP \ C|;
-- work = time in micro-batch blocks that is not bubble; other_busy = the rest of W (compute
-- or O outside blocks, e.g. the optimizer). bubble + work + other_busy = |W|.
-- bubble_fraction = bubble / (bubble + work) (GPipe/1F1B convention), NULL without blocks.
-- Phases: warm-up until the first backward (or W) block starts, steady state until the last
-- forward ends, cool-down after it.
-- Algorithm: one interval_union_sorted over every class folded into the key (k * 8 + class),
-- then one coverage sweep: C (bit 1), PP (2), blocks (4), warm-up (8), steady (16), W (32),
-- O (64).
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
  SELECT step_key(rank, step) * 8 AS k, s, e FROM _pipeline_compute_ev
  WHERE e >= s
  UNION ALL
  SELECT step_key(rank, step) * 8 + 1, s, e FROM _pipeline_comm_ev
  WHERE is_pp AND e >= s
  UNION ALL
  SELECT step_key(rank, step) * 8 + 2, s, e FROM b WHERE e >= s
  UNION ALL
  -- CPU-only ranks: the interpreter's time between ops inside a block is the block's work
  SELECT step_key(rank, step) * 8, s, e FROM b
  WHERE e >= s AND rank IN (SELECT rank FROM ranks WHERE NOT has_gpu)
  UNION ALL
  SELECT step_key(rank, step) * 8 + 6, s, e FROM _pipeline_other_ev
  WHERE e >= s
), cov_in AS MATERIALIZED (
  SELECT k // 8 AS k, k % 8 AS cls, s, e FROM interval_union_sorted('o')
  UNION ALL
  SELECT step_key(rank, step), 3, start_ns, least(a, end_ns) FROM ph
  UNION ALL
  SELECT step_key(rank, step), 4, a, least(greatest(a, z), end_ns)
  FROM ph WHERE z IS NOT NULL
  UNION ALL
  SELECT step_key(rank, step), 5, start_ns, end_ns FROM w
), cv AS (
  SELECT k, mask, dur,
         mask & 33 = 32 AND (mask & 2 = 2 OR mask & 64 = 0) AS bub
  FROM interval_coverage_sorted('cov_in')
), c AS (
  SELECT k,
         sum(dur) FILTER (WHERE bub) AS bubble_ns,
         sum(dur) FILTER (WHERE mask & 36 = 36 AND NOT bub) AS work_ns,
         sum(dur) FILTER (WHERE mask & 99 = 32) AS idle_ns,
         sum(dur) FILTER (WHERE mask & 35 = 34) AS pp_wait_ns,
         sum(dur) FILTER (WHERE mask & 99 = 98) AS filled_ns,
         sum(dur) FILTER (WHERE bub AND mask & 8 = 8) AS warmup_ns,
         sum(dur) FILTER (WHERE bub AND mask & 16 = 16) AS steady_ns,
         sum(dur) FILTER (WHERE bub AND mask & 24 = 0) AS cooldown_ns
  FROM cv GROUP BY k
)
SELECT st.rank, w.step, st.pp_group, st.stage, st.pp_size,
       (w.end_ns - w.start_ns)::BIGINT AS window_ns,
       CASE WHEN ph.rank IS NOT NULL THEN coalesce(c.work_ns, 0) END::BIGINT AS work_ns,
       greatest(w.end_ns - w.start_ns - coalesce(c.bubble_ns, 0) - coalesce(c.work_ns, 0), 0)
         ::BIGINT AS other_busy_ns,
       coalesce(c.bubble_ns, 0)::BIGINT AS bubble_ns,
       coalesce(c.idle_ns, 0)::BIGINT AS idle_ns,
       coalesce(c.pp_wait_ns, 0)::BIGINT AS pp_wait_ns,
       coalesce(c.filled_ns, 0)::BIGINT AS bubble_filled_ns,
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
LEFT JOIN c ON c.k = step_key(w.rank, w.step)
LEFT JOIN ph ON ph.rank = w.rank AND ph.step = w.step;

-- The per-stage bubble fraction, defined once (the report's stage table and `check
-- --max-bubble` both read it): bubble / (bubble + work) as a ratio of sums over the steps that
-- have micro-batch blocks (work_ns not NULL: a step without blocks has no work to compare its
-- bubble with); NULL when no step has blocks or both sums are 0.
CREATE OR REPLACE TEMP VIEW pipeline_stage_bubble AS
SELECT rank, pp_group, stage,
       sum(bubble_ns) / nullif(sum(bubble_ns) + sum(work_ns), 0) AS bubble_fraction
FROM pipeline_by_step WHERE work_ns IS NOT NULL
GROUP BY rank, pp_group, stage;

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
), wrap AS (
  -- forward receives of the first stage from the last one: (v - 1) * m in interleaved 1F1B
  SELECT st.pp_group, o.step, count(*) AS n_wrap
  FROM _pipeline_ops o JOIN pipeline_stages st USING (rank)
  WHERE st.stage = 0 AND o.has_recv AND o.dir = 'prev' AND NOT o.host
  GROUP BY ALL
), g0 AS (
  SELECT pp_group, step, any_value(p) AS p,
         max(CASE WHEN has_mb AND n_mb > 0 THEN n_mb ELSE n_f END)::INTEGER AS m0,
         max(CASE WHEN has_mb AND n_mb > 0 AND source LIKE 'annotation%'
                  THEN round(n_f / n_mb) ELSE 1 END)::INTEGER AS v0,
         max(n_f) FILTER (WHERE stage = 0 AND source = 'p2p_order') AS n_f0,
         sum(n_w) > 0 AS has_w,
         bool_and(last_f_start IS NULL OR first_b_end IS NULL OR last_f_start < first_b_end)
           AS all_f_first,
         avg(t_f) AS t_f, avg(t_b) AS t_b, avg(t_w) AS t_w, any_value(source) AS source
  FROM per_stage GROUP BY pp_group, step
), g AS (
  -- p2p order: the first stage runs v * m forwards, (v - 1) * m of them fed by the last stage
  SELECT g0.* EXCLUDE (m0, v0, n_f0),
         CASE WHEN n_f0 > coalesce(n_wrap, 0) AND n_wrap > 0 THEN n_f0 - n_wrap ELSE m0 END
           ::INTEGER AS m,
         CASE WHEN n_f0 > coalesce(n_wrap, 0) AND n_wrap > 0
              THEN round(n_f0 / (n_f0 - n_wrap)) ELSE v0 END::INTEGER AS v
  FROM g0 LEFT JOIN wrap USING (pp_group, step)
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
