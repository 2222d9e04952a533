-- requires: activity
-- stragglers: who arrives last at matched collectives, and what it costs the others.
-- Times are on the job clock (raw + ranks.clock_offset_ns). Only `matched` instances count.

-- Clock uncertainty of a rank: none when its clock is its host's (single host), else the
-- alignment residual; a skew inside the uncertainty names no late rank.
CREATE OR REPLACE TEMP VIEW _stragglers_ranks AS
SELECT rank, coalesce(clock_offset_ns, 0) AS off, coalesce(host, 'rank:' || rank) AS dom,
       CASE WHEN clock_method = 'single_host' THEN 0 ELSE coalesce(align_residual_ns, 0) END AS unc,
       clock_method, align_residual_ns
FROM ranks;

-- ref = when the rank was last released (job clock): the end of its previous communication in
-- the step (NULL for its first). A rank that arrives late only because it was released late
-- (a pipeline recv that ended late) made no delay of its own and does not cause the others'
-- wait. Step starts are no release point: ranks start steps at their own pace. A send/recv
-- whose peer is unknown still releases the rank when it ends (without it, a stage waiting on
-- such a recv was named a straggler of its TP group). Only what arrived strictly before
-- releases: two ops that arrive at once (a batched send and recv) do not release each other,
-- and no row order decides which one would.
CREATE OR REPLACE TEMP VIEW _stragglers_rows AS
SELECT * EXCLUDE (status) FROM (
  SELECT c.instance_id, c.rank, c.pg_name, c.op, c.seq, c.step, c.device, c.ts_ns, c.end_ns,
         c.arrive_ns, c.arrive_ns + r.off AS arr, c.end_ns + r.off AS fin, r.dom, r.unc,
         r.off + max(c.end_ns) OVER (PARTITION BY c.rank, c.step ORDER BY c.arrive_ns
                                     RANGE BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS ref,
         c.status
  FROM collectives c JOIN _stragglers_ranks r USING (rank)
  WHERE (c.status = 'matched' AND c.instance_id IS NOT NULL) OR c.status = 'peer_unknown')
WHERE status = 'matched';

-- Algorithm: per instance, the last arrival; each rank waits from its own arrival to it, and
-- transfers from it to its end. The late rank is charged the others' mean wait ("held back"),
-- up to the delay it made itself (own_delay_ns).
-- Point-to-point instances name no late rank: a pipeline receiver waiting for its sender is
-- the schedule's bubble (pipeline analysis), not a straggler.
CREATE OR REPLACE TEMP VIEW stragglers_by_instance AS
WITH i AS (
  SELECT instance_id, any_value(pg_name) AS pg_name,
         CASE WHEN count(DISTINCT op) > 1 THEN 'p2p' ELSE any_value(op) END AS op,
         any_value(seq) AS seq, min(step) AS step, count(*) AS n_ranks,
         -- the last to arrive, ties to the highest rank: its rank and release from one row
         max(arr) - min(arr) AS skew_ns, arg_max(rank, (arr, rank)) AS last_rank,
         max(arr) AS last_arr, arg_max(ref, (arr, rank)) AS last_ref,
         min(end_ns - ts_ns) AS min_dur_ns, max(end_ns - ts_ns) AS max_dur_ns,
         count(DISTINCT dom) > 1 AS spans_hosts, max(unc) AS unc_ns
  FROM _stragglers_rows GROUP BY instance_id
), oth AS (
  -- the late rank's own delay: how late it arrived beyond how late it was released, both
  -- against the other members' means (then it equals their mean wait); a release lateness
  -- inside the others' clock uncertainty, or 1 µs, counts as none. Differences are taken
  -- before the mean: epoch ns lose precision as DOUBLE.
  SELECT r.instance_id,
         greatest(avg(i.last_arr - r.arr)
                  - CASE WHEN avg(i.last_ref - r.ref) > greatest(max(r.unc), 1000)
                         THEN avg(i.last_ref - r.ref) ELSE 0 END, 0)::BIGINT AS own_delay_ns
  FROM _stragglers_rows r JOIN i USING (instance_id) WHERE r.rank <> i.last_rank
  GROUP BY r.instance_id
)
SELECT i.instance_id, i.pg_name, coalesce(g.parallelism, 'UNKNOWN') AS parallelism, i.op,
       i.seq, i.step, i.n_ranks, i.skew_ns,
       CASE WHEN i.op <> 'p2p'
             AND i.skew_ns > CASE WHEN i.spans_hosts THEN i.unc_ns ELSE 0 END
            THEN i.last_rank END AS late_rank,
       i.min_dur_ns, i.max_dur_ns, i.spans_hosts,
       CASE WHEN i.spans_hosts THEN i.unc_ns ELSE 0 END AS clock_uncertainty_ns, i.last_arr,
       coalesce(oth.own_delay_ns, 0) AS own_delay_ns
FROM i LEFT JOIN process_groups g USING (pg_name) LEFT JOIN oth USING (instance_id);

-- Per rank and instance: wait and transfer (ns), and the raw-clock wait interval.
CREATE OR REPLACE TEMP VIEW stragglers_by_rank_instance AS
SELECT r.instance_id, r.rank, r.step, r.device, i.pg_name, i.parallelism, i.op,
       greatest(i.last_arr - r.arr, 0) AS wait_ns,
       greatest(r.fin - greatest(i.last_arr, r.arr), 0) AS transfer_ns,
       i.late_rank,
       greatest(r.ts_ns, r.arrive_ns) AS wait_s,
       least(r.end_ns, r.arrive_ns + greatest(i.last_arr - r.arr, 0)) AS wait_e
FROM _stragglers_rows r JOIN stragglers_by_instance i USING (instance_id);

-- Held back: per late rank and instance, the mean wait of the other members.
CREATE OR REPLACE TEMP VIEW _stragglers_held AS
-- Only the delay the late rank made itself counts (own_delay_ns): lateness inherited from a
-- late recv or collective before it belongs to whoever delayed that one.
SELECT i.late_rank AS rank, i.instance_id,
       sum(x.wait_ns) AS caused_wait_ns,
       least(sum(x.wait_ns) / (count(*) - 1), any_value(i.own_delay_ns)) AS held_back_ns
FROM stragglers_by_instance i JOIN stragglers_by_rank_instance x USING (instance_id)
WHERE i.late_rank IS NOT NULL AND i.n_ranks > 1
GROUP BY i.late_rank, i.instance_id;

-- Exposed communication split per rank and step, on unions per device: exposed = |M \ C|,
-- wait = |Wait \ C| with Wait the union of the wait intervals (inside communication).
-- Algorithm: M and C are the islands of _activity_union; the wait intervals (few: one per rank
-- and collective) are unioned per device, and interval_inside gives each island's part under
-- compute, so |X \ C| = |X| - |X ∩ C| without re-sorting the events.
CREATE OR REPLACE TEMP VIEW _stragglers_exposed AS
WITH c AS MATERIALIZED (
  SELECT * FROM _activity_compute_islands
), aids AS (
  SELECT DISTINCT k, rank, step, device FROM c
), m AS (
  SELECT u.aid AS k, u.rank, u.step, u.s, u.e, 1 AS cls FROM _activity_union u WHERE u.cls = 1
), wiv AS MATERIALIZED (
  SELECT x.rank, x.step, x.device, x.wait_s AS s, x.wait_e AS e
  FROM stragglers_by_rank_instance x SEMI JOIN _activity_keys a
    ON a.rank = x.rank AND a.step = x.step AND a.device = x.device
  WHERE x.wait_e > x.wait_s
), wkeys AS MATERIALIZED (
  SELECT rank, step, device, row_number() OVER ()::BIGINT AS wid
  FROM (SELECT DISTINCT rank, step, device FROM wiv)
), wk AS (
  SELECT wkeys.wid AS k, wiv.s, wiv.e FROM wiv JOIN wkeys USING (rank, step, device)
), x AS (
  SELECT * FROM m
  UNION ALL
  SELECT aids.k, wkeys.rank, wkeys.step, u.s, u.e, 2
  FROM interval_union_sorted('wk') u JOIN wkeys ON wkeys.wid = u.k
  LEFT JOIN aids USING (rank, step, device)
)
SELECT rank, step, sum(e - s - inside) FILTER (WHERE cls = 1) AS exposed_ns,
       sum(e - s - inside) FILTER (WHERE cls = 2) AS exposed_wait_ns
FROM interval_inside('x', 'c') GROUP BY rank, step;

CREATE OR REPLACE TEMP VIEW stragglers_by_step AS
SELECT w.rank, w.step, w.window_ns, coalesce(x.exposed_ns, 0)::BIGINT AS exposed_comm_ns,
       coalesce(x.exposed_wait_ns, 0)::BIGINT AS exposed_wait_ns,
       (coalesce(x.exposed_ns, 0) - coalesce(x.exposed_wait_ns, 0))::BIGINT AS exposed_transfer_ns
FROM _activity_windows w LEFT JOIN _stragglers_exposed x USING (rank, step);

-- Compute per step, compared with the rank's peers: ranks of the same pipeline stage (their
-- index in a PP group), or every rank when there is no PP group.
CREATE OR REPLACE TEMP VIEW _stragglers_compute AS
WITH c AS (
  SELECT rank, sum(e - s) AS compute_ns FROM _activity_compute_islands GROUP BY rank
), n AS (SELECT rank, count(*) AS steps FROM _activity_windows GROUP BY rank),
pp AS (
  SELECT unnest(ranks) AS rank, unnest(generate_series(1, len(ranks))) AS stage
  FROM process_groups WHERE parallelism = 'PP' AND ranks IS NOT NULL
), st AS (SELECT rank, min(stage) AS stage FROM pp GROUP BY rank)
SELECT n.rank, n.steps, coalesce(st.stage, 0) AS stage,
       coalesce(c.compute_ns, 0) / n.steps AS compute_per_step_ns
FROM n LEFT JOIN c USING (rank) LEFT JOIN st USING (rank);

CREATE OR REPLACE TEMP VIEW stragglers_by_rank AS
WITH h AS (
  SELECT rank, count(*) FILTER (WHERE held_back_ns > 0) AS late_count,
         sum(held_back_ns) AS held_back_ns,
         sum(caused_wait_ns) AS caused_wait_ns
  FROM _stragglers_held GROUP BY rank
), x AS (
  -- late_z: how far its late count is above chance (1/n per instance), in standard deviations
  SELECT r.rank, count(*) AS instances, sum(r.wait_ns) AS waited_ns,
         sum(1.0 / i.n_ranks) FILTER (WHERE i.late_rank IS NOT NULL) AS exp_late,
         sqrt(sum((1.0 / i.n_ranks) * (1 - 1.0 / i.n_ranks))
              FILTER (WHERE i.late_rank IS NOT NULL)) AS sd_late
  FROM stragglers_by_rank_instance r JOIN stragglers_by_instance i USING (instance_id)
  WHERE r.op <> 'p2p' GROUP BY r.rank
), s AS (
  SELECT rank, sum(window_ns) AS window_ns, sum(exposed_wait_ns) AS exposed_wait_ns,
         sum(exposed_transfer_ns) AS exposed_transfer_ns
  FROM stragglers_by_step GROUP BY rank
), c AS (
  SELECT *, compute_per_step_ns / nullif(median(compute_per_step_ns) OVER (PARTITION BY stage), 0)
              - 1 AS compute_imbalance
  FROM _stragglers_compute
)
SELECT c.rank, c.steps, coalesce(x.instances, 0) AS instances,
       coalesce(h.late_count, 0) AS late_count,
       (coalesce(h.late_count, 0) - x.exp_late) / nullif(x.sd_late, 0) AS late_z,
       coalesce(h.held_back_ns, 0)::BIGINT AS held_back_ns,
       coalesce(x.waited_ns, 0)::BIGINT AS waited_ns,
       -- never more than the step: instances that overlap (two streams) can hold the same
       -- delay twice, and a figure above the step is one no engineer would believe
       least((coalesce(h.held_back_ns, 0) - coalesce(x.waited_ns, 0)) / c.steps,
             coalesce(s.window_ns, 0) / c.steps)::BIGINT AS net_held_back_per_step_ns,
       least((coalesce(h.held_back_ns, 0) - coalesce(x.waited_ns, 0)) / nullif(s.window_ns, 0),
             1.0) AS net_held_back_share,
       coalesce(h.caused_wait_ns, 0)::BIGINT AS caused_wait_ns,
       coalesce(s.exposed_wait_ns, 0)::BIGINT AS exposed_wait_ns,
       coalesce(s.exposed_transfer_ns, 0)::BIGINT AS exposed_transfer_ns,
       c.stage, c.compute_per_step_ns::BIGINT AS compute_per_step_ns, c.compute_imbalance,
       r.clock_method, r.align_residual_ns
FROM c LEFT JOIN h USING (rank) LEFT JOIN x USING (rank) LEFT JOIN s USING (rank)
LEFT JOIN _stragglers_ranks r USING (rank);
