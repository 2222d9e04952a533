-- requires: activity
-- breakdown: where each rank's step time went, on unions of device activity.
-- compute + exposed_comm + exposed_memory + idle = window (an exclusive split of W).

CREATE OR REPLACE TEMP VIEW breakdown_by_step AS
WITH cov AS (
  SELECT rank, step,
         sum(dur) FILTER (WHERE mask & 1 <> 0) AS compute_ns,
         sum(dur) FILTER (WHERE mask & 2 <> 0) AS comm_ns,
         sum(dur) FILTER (WHERE mask & 4 <> 0) AS memory_ns,
         sum(dur) FILTER (WHERE mask & 3 = 2) AS exposed_comm_ns,
         sum(dur) FILTER (WHERE mask = 4) AS exposed_memory_ns,
         sum(dur) AS busy_ns
  FROM _activity_cov GROUP BY rank, step
)
SELECT w.rank, w.step, w.start_ns, w.window_ns,
       coalesce(compute_ns, 0)::BIGINT AS compute_ns,
       coalesce(comm_ns, 0)::BIGINT AS comm_ns,
       coalesce(memory_ns, 0)::BIGINT AS memory_ns,
       coalesce(exposed_comm_ns, 0)::BIGINT AS exposed_comm_ns,
       coalesce(exposed_memory_ns, 0)::BIGINT AS exposed_memory_ns,
       (w.window_ns - coalesce(busy_ns, 0))::BIGINT AS idle_ns,
       coalesce(compute_ns, 0) / nullif(w.window_ns, 0) AS compute_share,
       coalesce(comm_ns, 0) / nullif(w.window_ns, 0) AS comm_share,
       (w.window_ns - coalesce(busy_ns, 0)) / nullif(w.window_ns, 0) AS idle_share
FROM _activity_windows w LEFT JOIN cov USING (rank, step);

-- Totals per rank over its steps (shares are ratios of sums, not means of ratios).
CREATE OR REPLACE TEMP VIEW breakdown_by_rank AS
SELECT rank, count(*) AS steps, sum(window_ns)::BIGINT AS window_ns,
       sum(compute_ns)::BIGINT AS compute_ns, sum(comm_ns)::BIGINT AS comm_ns,
       sum(memory_ns)::BIGINT AS memory_ns, sum(exposed_comm_ns)::BIGINT AS exposed_comm_ns,
       sum(idle_ns)::BIGINT AS idle_ns,
       sum(compute_ns) / nullif(sum(window_ns), 0) AS compute_share,
       sum(comm_ns) / nullif(sum(window_ns), 0) AS comm_share,
       sum(idle_ns) / nullif(sum(window_ns), 0) AS idle_share
FROM breakdown_by_step GROUP BY rank;

-- Communication share per parallelism: |M_x| / |W|.
CREATE OR REPLACE TEMP VIEW breakdown_by_parallelism AS
SELECT c.rank, c.step, c.parallelism,
       sum(c.dur) FILTER (WHERE c.mask & 2 <> 0)::BIGINT AS comm_ns,
       sum(c.dur) FILTER (WHERE c.mask & 2 <> 0) / any_value(nullif(w.window_ns, 0))
         AS comm_share
FROM _activity_par_cov c JOIN _activity_windows w USING (rank, step)
GROUP BY c.rank, c.step, c.parallelism;
