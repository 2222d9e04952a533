-- requires: intervals
-- critical_path / whatif: the inputs of the dependency graph (analysis/graph_build.py).
-- Device activity as the other analyses see it (a GPU rank's kernels and copies; a CPU-only
-- rank's host compute and gloo spans) on the job clock, one lane per (rank, step, device,
-- stream, communication or not): on a gloo rank the p2p spans share the main thread with the
-- compute they overlap, so they get their own lane. On a GPU rank the host threads' runtime
-- calls that launch that work, and the calls that block the host until the device is done
-- (synchronize, blocking memcpy), are lanes too (device -1, cls 3): the host runs ahead of
-- the device and waits only there.

CREATE OR REPLACE TEMP VIEW _critical_path_events AS
WITH dev AS (
  SELECT e.rank, e.step, e.device, e.stream, (e.kind = 'comm')::INTEGER AS is_comm,
         CASE e.kind WHEN 'compute' THEN 0 WHEN 'comm' THEN 1 ELSE 2 END AS cls,
         e.ts_ns + coalesce(r.clock_offset_ns, 0) AS s,
         e.ts_ns + coalesce(r.clock_offset_ns, 0) + greatest(e.dur_ns, 0) AS e,
         e.ts_ns AS raw_ts, e.name, r.has_gpu, e.correlation, FALSE AS blocking
  FROM events e JOIN ranks r USING (rank)
  WHERE e.step IS NOT NULL AND is_device_work(e.kind) AND on_device(r.has_gpu, e.device)
), host AS (
  SELECT e.rank, e.step, -1 AS device, e.stream, 0 AS is_comm, 3 AS cls,
         e.ts_ns + coalesce(r.clock_offset_ns, 0) AS s,
         e.ts_ns + coalesce(r.clock_offset_ns, 0) + greatest(e.dur_ns, 0) AS e,
         e.ts_ns AS raw_ts, e.name, r.has_gpu, e.correlation,
         (e.kind = 'sync' AND e.name ILIKE '%synchronize%')
           OR e.name IN ('cudaMemcpy', 'cuMemcpyDtoH_v2', 'cuMemcpyHtoD_v2') AS blocking
  FROM events e JOIN ranks r USING (rank)
  LEFT JOIN steps w ON w.rank = e.rank AND w.step = e.step
  WHERE r.has_gpu AND e.device = -1 AND e.step IS NOT NULL AND e.kind IN ('runtime', 'sync')
    -- inside the step's window, so the path never spans more than the step: a launch before
    -- its first kernel's start, or the last synchronize returning after it, are left out
    AND e.ts_ns >= coalesce(w.start_ns, e.ts_ns)
    AND e.ts_ns + greatest(e.dur_ns, 0) <= coalesce(w.end_ns, e.ts_ns + greatest(e.dur_ns, 0))
)
SELECT * FROM dev
UNION ALL
SELECT * FROM host h
WHERE h.blocking OR EXISTS (
  SELECT 1 FROM dev d WHERE d.rank = h.rank AND d.step = h.step AND d.correlation = h.correlation
);

-- The events numbered in lane order (running this file builds it; graph_build drops it): a
-- table written in that order, numbered by its order (an empty OVER () keeps a table's order:
-- DuckDB's documented order preservation; its rowid would not do, as rows a transaction has
-- not committed are numbered from 2^55). A row_number() over the sort keys sorted the events
-- once more, names and all: 2.1 s instead of 0.9 s on a 1,024-rank job under the ingest's
-- memory budget.
CREATE OR REPLACE TEMP TABLE _critical_path_ord AS
SELECT * FROM _critical_path_events ORDER BY rank, step, device, stream, is_comm, s, e;

CREATE OR REPLACE TEMP VIEW _critical_path_ev AS
SELECT (row_number() OVER () - 1)::BIGINT AS eid, * FROM _critical_path_ord;

-- Each device event's launch call (same rank, step and correlation id), as event ids: the
-- first host call of each id, joined to the device events (grouping the join's rows by device
-- event instead took 0.53 s against 0.30-0.34 on a 1,024-rank job's 1.26 M kernels).
CREATE OR REPLACE TEMP VIEW _critical_path_launch AS
SELECT d.eid AS dev, h.host
FROM _critical_path_ev d JOIN (
  SELECT rank, step, correlation, min(eid) AS host FROM _critical_path_ev
  WHERE cls = 3 AND correlation IS NOT NULL GROUP BY ALL) h
  ON h.rank = d.rank AND h.step = d.step AND h.correlation = d.correlation
WHERE d.cls <> 3 AND d.correlation IS NOT NULL;

-- What each blocking host call waited for: the device event of its rank and step that ended
-- last when the call returned, if it ended while the host was in the call (Kineto does not
-- say which stream a synchronize named; one that returned at once waited for nothing).
CREATE OR REPLACE TEMP VIEW _critical_path_blocks AS
SELECT b.eid AS host, d.eid AS dev
FROM (SELECT eid, rank, step, s, e FROM _critical_path_ev WHERE blocking) b
ASOF JOIN (SELECT eid, rank, step, e FROM _critical_path_ev WHERE cls <> 3) d
  ON d.rank = b.rank AND d.step = b.step AND b.e >= d.e
WHERE d.e > b.s;

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
