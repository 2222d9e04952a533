-- requires: intervals
-- Shared base of breakdown, overlap and stragglers: device activity per rank and step.
-- The "device" of a rank is its GPU(s); for a CPU-only (gloo) rank it is the host (-1).
-- Classes: 0 = compute, 1 = comm, 2 = memory (memcpy/memset).
-- Cost: every event is sorted once, into islands (_activity_union); the rest works on islands
-- and never copies compute per key or joins intervals by range. The analyses hold the islands
-- and what is read twice in temp tables for the queries they run (_activity.py).

CREATE OR REPLACE TEMP VIEW _activity_events AS
SELECT e.rank, e.step, e.device, e.kind, e.ts_ns AS s, e.ts_ns + e.dur_ns AS e,
       e.pg_name, e.coll_op, e.in_nelems, e.out_nelems
FROM events e JOIN ranks r USING (rank)
WHERE e.step IS NOT NULL AND is_device_work(e.kind) AND on_device(r.has_gpu, e.device);

-- The (rank, step, device) that have activity (zero-length events included).
CREATE OR REPLACE TEMP VIEW _activity_keys AS
SELECT DISTINCT rank, step, device FROM _activity_events;

-- Islands (disjoint, not touching) per (rank, step, device) and class, with aid, a key of the
-- (rank, step, device) in their order: the one sort of every event that the analyses need;
-- all else works on islands. Zero-length events are left out (they can neither add length nor
-- join two islands). The (rank, step, device, class) is folded into interval_union_sorted's
-- key (intervals.sql device_key) and read back from it: no join to number the keys.
CREATE OR REPLACE TEMP VIEW _activity_union AS
WITH iv AS (
  SELECT device_key(rank, step, device,
                    CASE kind WHEN 'compute' THEN 0 WHEN 'comm' THEN 1 ELSE 2 END) AS k, s, e
  FROM _activity_events WHERE e > s
)
SELECT device_key_rank(k) AS rank, device_key_step(k) AS step, device_key_device(k) AS device,
       k >> 2 AS aid, CAST(k & 3 AS INTEGER) AS cls, s, e
FROM interval_union_sorted('iv');

-- (rank, step, device, mask, dur): time during which exactly the classes in `mask` ran.
CREATE OR REPLACE TEMP VIEW _activity_cov AS
WITH u AS MATERIALIZED (
  SELECT aid AS k, rank, step, device, cls, s, e FROM _activity_union
), keys AS (
  SELECT DISTINCT k, rank, step, device FROM u
)
SELECT keys.rank, keys.step, keys.device, c.mask, c.dur
FROM interval_coverage_sorted('u') c JOIN keys USING (k);

-- Communication events with the keys of the per group/op and per parallelism views.
CREATE OR REPLACE TEMP VIEW _activity_comm AS
SELECT a.*, coalesce(a.pg_name, '?') AS pg, coalesce(a.coll_op, '?') AS op,
       coalesce(g.parallelism, CASE WHEN a.pg_name IS NULL THEN 'UNKNOWN' ELSE 'OTHER' END)
         AS parallelism
FROM _activity_events a LEFT JOIN process_groups g ON g.pg_name = a.pg_name
WHERE a.kind = 'comm';

-- Compute islands of each (rank, step, device) with `before` (interval_prefix), k = its aid:
-- the `c` of interval_inside.
CREATE OR REPLACE TEMP VIEW _activity_compute_islands AS
WITH c AS (SELECT aid AS k, rank, step, device, s, e FROM _activity_union WHERE cls = 0)
SELECT * FROM interval_prefix('c');

-- _activity_key_cov(t): for t (rank, step, device, key, s, e) of communication intervals under
-- any key, the coverage (rank, step, device, key, mask, dur) of the key's communication M
-- (cls 1) and its device's compute C (cls 0): mask 1 = |C \ M|, 2 = |M \ C|, 3 = |M ∩ C|,
-- rows with dur > 0 only, as interval_coverage gives them. Algorithm: M's islands per key
-- (comm is a few % of the events), |M ∩ C| by interval_inside against C's islands (no copy of
-- the device's compute per key), the rest as differences of lengths.
CREATE OR REPLACE TEMP MACRO _activity_key_cov(t) AS TABLE
WITH src AS MATERIALIZED (
  SELECT rank, step, device, key, s, e FROM query_table(t)
), c AS MATERIALIZED (
  SELECT * FROM _activity_compute_islands
), cn AS (
  SELECT k AS aid, rank, step, device, sum(e - s) AS c_ns FROM c GROUP BY ALL
), keys AS MATERIALIZED (
  SELECT d.rank, d.step, d.device, d.key, row_number() OVER ()::BIGINT AS kid, cn.aid,
         coalesce(cn.c_ns, 0) AS c_ns
  FROM (SELECT DISTINCT rank, step, device, key FROM src) d
  LEFT JOIN cn ON cn.rank = d.rank AND cn.step = d.step AND cn.device = d.device
), iv AS (
  SELECT keys.kid AS k, src.s, src.e
  FROM src JOIN keys ON keys.rank = src.rank AND keys.step = src.step
    AND keys.device = src.device AND keys.key = src.key
  WHERE src.e > src.s
), m AS (
  SELECT keys.aid AS k, u.s, u.e, u.k AS kid
  FROM interval_union_sorted('iv') u JOIN keys ON keys.kid = u.k
), h AS (
  SELECT kid, sum(e - s) AS m_ns, sum(inside) AS h_ns FROM interval_inside('m', 'c') GROUP BY kid
), per AS (
  SELECT keys.rank, keys.step, keys.device, keys.key, keys.c_ns,
         coalesce(h.m_ns, 0) AS m_ns, coalesce(h.h_ns, 0) AS h_ns
  FROM keys LEFT JOIN h USING (kid)
), cv AS (
  SELECT rank, step, device, key,
         unnest([{'mask': 1, 'dur': c_ns - h_ns}, {'mask': 2, 'dur': m_ns - h_ns},
                 {'mask': 3, 'dur': h_ns}]) AS md
  FROM per
)
SELECT rank, step, device, key, CAST(md.mask AS BIGINT) AS mask, CAST(md.dur AS BIGINT) AS dur
FROM cv WHERE md.dur > 0;

-- Per process group and op, and per parallelism: the key's comm (cls 1) against the step's
-- compute (cls 0), so hidden/exposed are computed per key on unions.
CREATE OR REPLACE TEMP VIEW _activity_group_cov AS
WITH t AS MATERIALIZED (
  SELECT rank, step, device, {'pg': pg, 'op': op, 'parallelism': parallelism} AS key, s, e
  FROM _activity_comm
)
SELECT rank, step, device, key.pg AS pg_name, key.op AS coll_op,
       key.parallelism AS parallelism, mask, dur
FROM _activity_key_cov('t');

CREATE OR REPLACE TEMP VIEW _activity_par_cov AS
WITH t AS MATERIALIZED (
  SELECT rank, step, device, parallelism AS key, s, e FROM _activity_comm
)
SELECT rank, step, device, key AS parallelism, mask, dur
FROM _activity_key_cov('t');

-- Step windows W with their length.
CREATE OR REPLACE TEMP VIEW _activity_windows AS
SELECT rank, step, start_ns, end_ns, end_ns - start_ns AS window_ns FROM steps;
