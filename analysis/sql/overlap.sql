-- requires: activity
-- overlap: how much communication ran under compute (hidden) and how much did not (exposed).
-- overlap_ratio = |M ∩ C| / |M| (HTA's definition); exposed = |M \ C|.

CREATE OR REPLACE TEMP VIEW overlap_by_step AS
WITH cov AS (
  SELECT rank, step,
         sum(dur) FILTER (WHERE mask & 2 <> 0) AS comm_ns,
         sum(dur) FILTER (WHERE mask & 3 = 3) AS hidden_ns,
         sum(dur) FILTER (WHERE mask & 1 <> 0) AS compute_ns
  FROM _activity_cov GROUP BY rank, step
)
SELECT w.rank, w.step, w.window_ns,
       coalesce(comm_ns, 0)::BIGINT AS comm_ns,
       coalesce(hidden_ns, 0)::BIGINT AS hidden_ns,
       (coalesce(comm_ns, 0) - coalesce(hidden_ns, 0))::BIGINT AS exposed_ns,
       coalesce(compute_ns, 0)::BIGINT AS compute_ns,
       coalesce(hidden_ns, 0) / nullif(comm_ns, 0) AS overlap_ratio,
       (coalesce(comm_ns, 0) - coalesce(hidden_ns, 0)) / nullif(w.window_ns, 0) AS exposed_share
FROM _activity_windows w LEFT JOIN cov USING (rank, step);

CREATE OR REPLACE TEMP VIEW overlap_by_rank AS
SELECT rank, count(*) AS steps, sum(window_ns)::BIGINT AS window_ns,
       sum(comm_ns)::BIGINT AS comm_ns, sum(hidden_ns)::BIGINT AS hidden_ns,
       sum(exposed_ns)::BIGINT AS exposed_ns, sum(compute_ns)::BIGINT AS compute_ns,
       sum(hidden_ns) / nullif(sum(comm_ns), 0) AS overlap_ratio,
       sum(exposed_ns) / nullif(sum(window_ns), 0) AS exposed_share
FROM overlap_by_step GROUP BY rank;

-- Per process group and collective op.
CREATE OR REPLACE TEMP VIEW overlap_by_group AS
WITH n AS (
  SELECT rank, step, pg AS pg_name, op AS coll_op, count(*) AS n_ops,
         sum(nullif(greatest(coalesce(in_nelems, 0), coalesce(out_nelems, 0)), 0)) AS nelems
  FROM _activity_comm GROUP BY ALL
)
SELECT c.rank, c.step, c.pg_name, g.pg_desc, c.parallelism, c.coll_op, any_value(n.n_ops) AS n_ops,
       sum(c.dur) FILTER (WHERE c.mask & 2 <> 0)::BIGINT AS comm_ns,
       coalesce(sum(c.dur) FILTER (WHERE c.mask = 3), 0)::BIGINT AS hidden_ns,
       coalesce(sum(c.dur) FILTER (WHERE c.mask = 2), 0)::BIGINT AS exposed_ns,
       coalesce(sum(c.dur) FILTER (WHERE c.mask = 3), 0)
         / nullif(sum(c.dur) FILTER (WHERE c.mask & 2 <> 0), 0) AS overlap_ratio
FROM _activity_group_cov c
LEFT JOIN process_groups g ON g.pg_name = c.pg_name
LEFT JOIN n ON n.rank = c.rank AND n.step = c.step AND n.pg_name = c.pg_name
           AND n.coll_op = c.coll_op
GROUP BY c.rank, c.step, c.pg_name, g.pg_desc, c.parallelism, c.coll_op;

-- Per parallelism (DP, TP, PP, ...): M_x against C.
CREATE OR REPLACE TEMP VIEW overlap_by_parallelism AS
SELECT c.rank, c.step, c.parallelism,
       sum(c.dur) FILTER (WHERE c.mask & 2 <> 0)::BIGINT AS comm_ns,
       coalesce(sum(c.dur) FILTER (WHERE c.mask = 3), 0)::BIGINT AS hidden_ns,
       coalesce(sum(c.dur) FILTER (WHERE c.mask = 2), 0)::BIGINT AS exposed_ns,
       coalesce(sum(c.dur) FILTER (WHERE c.mask = 3), 0)
         / nullif(sum(c.dur) FILTER (WHERE c.mask & 2 <> 0), 0) AS overlap_ratio,
       coalesce(sum(c.dur) FILTER (WHERE c.mask = 2), 0) / any_value(nullif(w.window_ns, 0))
         AS exposed_share
FROM _activity_par_cov c JOIN _activity_windows w USING (rank, step)
GROUP BY c.rank, c.step, c.parallelism;

-- Data-parallel communication as one: DP and DP_SHARD together (HSDP's replicate all-reduce and
-- shard reduce-scatter run on streams of their own and can run at once; their exposed times
-- do not add up). Per (rank, step), only where it has any.
CREATE OR REPLACE TEMP VIEW overlap_dp_by_step AS
WITH t AS MATERIALIZED (
  SELECT rank, step, device, 'DP' AS key, s, e FROM _activity_comm
  WHERE parallelism IN ('DP', 'DP_SHARD')
)
SELECT rank, step, sum(dur) FILTER (WHERE mask & 2 <> 0)::BIGINT AS comm_ns,
       coalesce(sum(dur) FILTER (WHERE mask = 2), 0)::BIGINT AS exposed_ns
FROM _activity_key_cov('t') GROUP BY rank, step;
