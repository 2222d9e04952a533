-- requires: intervals
-- critical_path / whatif: the inputs of the dependency graph (analysis/graph_build.py).
-- Device activity as the other analyses see it (a GPU rank's kernels and copies; a CPU-only
-- rank's host compute and gloo spans) on the job clock, one lane per (rank, step, device,
-- stream, communication or not): on a gloo rank the p2p spans share the main thread with the
-- compute they overlap, so they get their own lane.

CREATE OR REPLACE TEMP VIEW _critical_path_events AS
SELECT e.rank, e.step, e.device, e.stream, (e.kind = 'comm')::INTEGER AS is_comm,
       CASE e.kind WHEN 'compute' THEN 0 WHEN 'comm' THEN 1 ELSE 2 END AS cls,
       e.ts_ns + coalesce(r.clock_offset_ns, 0) AS s,
       e.ts_ns + coalesce(r.clock_offset_ns, 0) + greatest(e.dur_ns, 0) AS e,
       e.ts_ns AS raw_ts, e.name, r.has_gpu
FROM events e JOIN ranks r USING (rank)
WHERE e.step IS NOT NULL AND is_device_work(e.kind) AND on_device(r.has_gpu, e.device);

-- The events numbered in lane order (running this file builds it; graph_build drops it).
CREATE OR REPLACE TEMP TABLE _critical_path_ev AS
SELECT (row_number() OVER (ORDER BY rank, step, device, stream, is_comm, s, e) - 1)::BIGINT
         AS eid, *
FROM _critical_path_events;

-- Matched collective members (a batched p2p kernel is a member of each of its ops'
-- instances), with the arrival on the job clock and the parallelism of the instance.
CREATE OR REPLACE TEMP VIEW _critical_path_members AS
SELECT v.eid, c.instance_id, c.arrive_ns + coalesce(r.clock_offset_ns, 0) AS arr,
       coalesce(g.parallelism, 'OTHER') AS parallelism, c.op IN ('send', 'recv') AS p2p
FROM collectives c JOIN ranks r USING (rank)
JOIN _critical_path_ev v ON v.rank = c.rank AND v.device = c.device AND v.stream = c.stream
             AND v.raw_ts = c.ts_ns AND v.is_comm = 1
LEFT JOIN process_groups g ON g.pg_name = c.pg_name
WHERE c.status = 'matched';

-- Step windows per rank on the job clock.
CREATE OR REPLACE TEMP VIEW _critical_path_windows AS
SELECT s.rank, s.step, s.start_ns + coalesce(r.clock_offset_ns, 0) AS w_start,
       s.end_ns + coalesce(r.clock_offset_ns, 0) AS w_end
FROM steps s JOIN ranks r USING (rank)
WHERE s.start_ns IS NOT NULL AND s.end_ns IS NOT NULL;
