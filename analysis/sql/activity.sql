-- Shared base of breakdown and overlap: device activity per rank and step.
-- The "device" of a rank is its GPU(s); for a CPU-only (gloo) rank it is the host (-1).
-- Classes: 0 = compute, 1 = comm, 2 = memory (memcpy/memset).

CREATE OR REPLACE TEMP VIEW _activity_events AS
SELECT e.rank, e.step, e.device, e.kind, e.ts_ns AS s, e.ts_ns + e.dur_ns AS e,
       e.pg_name, e.coll_op, e.in_nelems, e.out_nelems
FROM events e JOIN ranks r USING (rank)
WHERE e.step IS NOT NULL
  AND e.kind IN ('compute', 'comm', 'memcpy', 'memset')
  AND ((r.has_gpu AND e.device >= 0) OR (NOT r.has_gpu AND e.device = -1));

CREATE OR REPLACE TEMP VIEW _activity_iv AS
SELECT {'rank': rank, 'step': step, 'device': device} AS k,
       CASE kind WHEN 'compute' THEN 0 WHEN 'comm' THEN 1 ELSE 2 END AS cls, s, e
FROM _activity_events;

CREATE OR REPLACE TEMP VIEW _activity_union AS
SELECT * FROM interval_union('_activity_iv');

CREATE OR REPLACE TEMP VIEW _activity_cov AS
SELECT k.rank AS rank, k.step AS step, k.device AS device, mask, dur
FROM interval_coverage('_activity_union');

-- Per process group and op, and per parallelism: comm intervals of that key (cls 1) against the
-- step's compute islands (cls 0), so hidden/exposed are computed per key on unions.
CREATE OR REPLACE TEMP VIEW _activity_comm AS
SELECT a.*, coalesce(a.pg_name, '?') AS pg, coalesce(a.coll_op, '?') AS op,
       coalesce(g.parallelism, CASE WHEN a.pg_name IS NULL THEN 'UNKNOWN' ELSE 'OTHER' END)
         AS parallelism
FROM _activity_events a LEFT JOIN process_groups g ON g.pg_name = a.pg_name
WHERE a.kind = 'comm';

-- (Raw compute intervals, not islands: DuckDB refuses a table macro nested in itself.)
CREATE OR REPLACE TEMP VIEW _activity_compute_islands AS
SELECT rank, step, device, s, e FROM _activity_events WHERE kind = 'compute';

CREATE OR REPLACE TEMP VIEW _activity_group_iv AS
WITH keys AS (SELECT DISTINCT rank, step, device, pg, op, parallelism FROM _activity_comm)
SELECT {'rank': rank, 'step': step, 'device': device, 'pg': pg, 'op': op,
        'parallelism': parallelism} AS k, 1 AS cls, s, e
FROM _activity_comm
UNION ALL
SELECT {'rank': rank, 'step': step, 'device': device, 'pg': pg, 'op': op,
        'parallelism': parallelism} AS k, 0 AS cls, c.s, c.e
FROM _activity_compute_islands c JOIN keys USING (rank, step, device);

CREATE OR REPLACE TEMP VIEW _activity_group_union AS
SELECT * FROM interval_union('_activity_group_iv');

CREATE OR REPLACE TEMP VIEW _activity_group_cov AS
SELECT k.rank AS rank, k.step AS step, k.device AS device, k.pg AS pg_name, k.op AS coll_op,
       k.parallelism AS parallelism, mask, dur
FROM interval_coverage('_activity_group_union');

CREATE OR REPLACE TEMP VIEW _activity_par_iv AS
WITH keys AS (SELECT DISTINCT rank, step, device, parallelism FROM _activity_comm)
SELECT {'rank': rank, 'step': step, 'device': device, 'parallelism': parallelism} AS k,
       1 AS cls, s, e
FROM _activity_comm
UNION ALL
SELECT {'rank': rank, 'step': step, 'device': device, 'parallelism': parallelism} AS k,
       0 AS cls, c.s, c.e
FROM _activity_compute_islands c JOIN keys USING (rank, step, device);

CREATE OR REPLACE TEMP VIEW _activity_par_union AS
SELECT * FROM interval_union('_activity_par_iv');

CREATE OR REPLACE TEMP VIEW _activity_par_cov AS
SELECT k.rank AS rank, k.step AS step, k.device AS device, k.parallelism AS parallelism,
       mask, dur
FROM interval_coverage('_activity_par_union');

-- Step windows W with their length.
CREATE OR REPLACE TEMP VIEW _activity_windows AS
SELECT rank, step, start_ns, end_ns, end_ns - start_ns AS window_ns FROM steps;
