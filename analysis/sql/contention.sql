-- requires: intervals
-- contention: compute slowed by concurrent communication, communication slowed by other
-- communication, and whether H2D/D2H copies hide under compute.
-- A device is (rank, device) folded into one key: rank * 4096 + device + 1 (-1 = host).

CREATE OR REPLACE TEMP VIEW _contention_ev AS
SELECT e.rank, e.step, e.device, e.stream, e.kind, e.name,
       coalesce(e.launch, e.shapes, '') AS shape,
       hash(e.name, coalesce(e.launch, e.shapes, '')) AS cls, e.ts_ns AS s, e.ts_ns + e.dur_ns AS e,
       e.dur_ns AS dur, e.coll_op, e.pg_name, greatest(e.in_nelems, e.out_nelems) AS nelems,
       e.dtype, e.bytes, e.rank::BIGINT * 4096 + e.device + 1 AS dk,
       CASE WHEN e.device >= 0 THEN e.external_id END AS gpu_ext
FROM events e JOIN ranks r USING (rank)
WHERE e.step IS NOT NULL AND is_device_work(e.kind) AND on_device(r.has_gpu, e.device);

-- op = hash of the input shapes of the host op that launched a GPU event (same rank and
-- External id), 0 when none. Why: a persistent GEMM launches one grid (= the SM count) for
-- every problem size, so name + launch lumps sizes whose durations differ many-fold. An
-- External id whose host ops disagree on their shapes links none.
CREATE OR REPLACE TEMP VIEW _contention_op_shapes AS
SELECT rank, external_id, min(hash(shapes)) AS op
FROM events
WHERE device = -1 AND kind = 'cpu_op' AND external_id IS NOT NULL AND shapes IS NOT NULL
GROUP BY rank, external_id HAVING min(hash(shapes)) = max(hash(shapes));

-- Communication that competes with compute for the device: all of it on a GPU; on a CPU-only
-- rank only the spans on threads that run no compute (gloo worker threads): the gloo p2p
-- spans on the main thread are waits, not work.
CREATE OR REPLACE TEMP VIEW _contention_comm AS
WITH host_compute AS (
  SELECT DISTINCT rank, stream FROM _contention_ev WHERE kind = 'compute' AND device = -1
)
SELECT c.* FROM _contention_ev c
WHERE c.kind = 'comm'
  AND (c.device >= 0 OR NOT EXISTS (SELECT 1 FROM host_compute h
                                    WHERE h.rank = c.rank AND h.stream = c.stream));

-- Islands of communication per device (the union of its comm events).
CREATE OR REPLACE TEMP VIEW _contention_comm_islands AS
WITH iv AS (SELECT dk AS k, s, e FROM _contention_comm)
SELECT k, s, e FROM interval_union_sorted('iv');

-- One row per compute event: ov_ns = time communication ran beside it on the same device;
-- state alone (none), overlapped (ov >= min_overlap * dur) or partial. The class is (cls, op):
-- cls = hash(name, shape), op = hash of the launching host op's input shapes (0: none), a
-- small payload; contention_class_names and contention_classes map them back. The host op is
-- joined once, to the result (the overlap does not need it).
-- Algorithm: an event of at most 1 ms that starts in 1 ms bucket b lies in [b, b + 2) ms, so
-- each device's islands are listed under every bucket b whose [b, b + 2) they touch, and one
-- equi-join on (device, bucket) hands each event the few islands it can overlap (islands are
-- disjoint: the overlaps add up). Longer events take their part inside the islands from
-- interval_inside (a range join would compare each with every island of its device).
CREATE OR REPLACE TEMP MACRO contention_kernels(min_overlap) AS TABLE
WITH ib AS MATERIALIZED (
  SELECT k, bk, list({'s': s, 'e': e}) AS ivs FROM (
    SELECT k, s, e, unnest(range(s // 1000000 - 1, (e - 1) // 1000000 + 1)) AS bk
    FROM _contention_comm_islands WHERE e > s
  ) GROUP BY k, bk
), short AS (
  SELECT x.rank, x.step, x.cls, x.gpu_ext, x.dur, x.stream, x.s,
         coalesce(list_sum(list_transform(b.ivs,
           lambda v: greatest(least(x.e, v.e) - greatest(x.s, v.s), 0))), 0) AS ov_ns
  FROM _contention_ev x LEFT JOIN ib b ON b.k = x.dk AND b.bk = x.s // 1000000
  WHERE x.kind = 'compute' AND x.dur > 0 AND x.dur <= 1000000
), isl AS (
  SELECT k, s, e FROM _contention_comm_islands WHERE e > s
), ci AS MATERIALIZED (
  SELECT * FROM interval_prefix('isl')
), lx AS (
  SELECT rank, step, cls, gpu_ext, dur, dk AS k, stream, s, e FROM _contention_ev
  WHERE kind = 'compute' AND dur > 1000000
), long AS (
  SELECT rank, step, cls, gpu_ext, dur, stream, s, coalesce(sum(inside), 0) AS ov_ns
  FROM interval_inside('lx', 'ci')
  GROUP BY rank, step, cls, gpu_ext, dur, k, stream, s
), o AS (
  SELECT * FROM short UNION ALL SELECT * FROM long
)
SELECT o.rank, o.step, o.stream, o.s, o.cls, coalesce(p.op, 0)::UBIGINT AS op, o.dur, o.ov_ns,
       CASE WHEN o.ov_ns = 0 THEN 'alone' WHEN o.ov_ns >= min_overlap * o.dur THEN 'overlapped'
            ELSE 'partial' END AS state
FROM o LEFT JOIN _contention_op_shapes p ON p.rank = o.rank AND p.external_id = o.gpu_ext;

CREATE OR REPLACE TEMP VIEW contention_class_names AS
SELECT cls, any_value(name) AS name, any_value(shape) AS shape
FROM _contention_ev WHERE kind = 'compute' GROUP BY cls;

-- Per kernel class (name + launch shape + the launching op's input shapes; host ops: name +
-- input shapes) over a table t shaped like contention_kernels. The baseline is the median
-- duration of the class running alone on the same rank (at least min_alone runs);
-- T_overlapped the mean of its overlapped runs on ranks with a baseline; slowdown =
-- T_overlapped / T_alone - 1; time_lost = sum over those overlapped runs of (dur - T_alone).
CREATE OR REPLACE TEMP MACRO contention_classes(t, min_alone) AS TABLE
WITH pr AS (
  SELECT rank, cls, op,
         count(*) FILTER (WHERE state = 'alone') AS n_alone,
         median(dur) FILTER (WHERE state = 'alone') AS t_alone,
         count(*) FILTER (WHERE state = 'overlapped') AS n_ov,
         sum(dur) FILTER (WHERE state = 'overlapped') AS ov_sum,
         count(*) FILTER (WHERE state = 'partial') AS n_partial
  FROM query_table(t) GROUP BY rank, cls, op
), m AS (
  SELECT *, n_alone >= min_alone AND n_ov > 0 AS matched FROM pr
), c AS (
SELECT cls, op, count(*)::INTEGER AS ranks, sum(n_alone)::BIGINT AS n_alone,
       sum(n_ov)::BIGINT AS n_overlapped, sum(n_partial)::BIGINT AS n_partial,
       sum(n_ov) FILTER (WHERE matched)::BIGINT AS n_matched,
       coalesce(sum(n_ov * t_alone) FILTER (WHERE matched)
                  / nullif(sum(n_ov) FILTER (WHERE matched), 0),
                sum(n_alone * t_alone) / nullif(sum(n_alone), 0)) AS t_alone_ns,
       sum(ov_sum) FILTER (WHERE matched) / nullif(sum(n_ov) FILTER (WHERE matched), 0)
         AS t_overlapped_ns,
       sum(ov_sum) FILTER (WHERE matched)
         / nullif(sum(n_ov * t_alone) FILTER (WHERE matched), 0) - 1 AS slowdown,
       (sum(ov_sum) FILTER (WHERE matched) - sum(n_ov * t_alone) FILTER (WHERE matched))::BIGINT
         AS time_lost_ns
FROM m GROUP BY cls, op
), ops AS (
  SELECT hash(shapes) AS op, any_value(shapes) AS op_shapes FROM events
  WHERE device = -1 AND kind = 'cpu_op' AND shapes IS NOT NULL
    AND hash(shapes) IN (SELECT op FROM c WHERE op <> 0)
  GROUP BY 1
)
SELECT n.name, n.shape || coalesce(' inputs=' || ops.op_shapes, '') AS shape,
       c.* EXCLUDE (cls, op)
FROM c JOIN contention_class_names n USING (cls) LEFT JOIN ops USING (op);

-- Per rank and step over a table t shaped like contention_kernels: compute time (a sum over
-- events, host ops nest), how much of it ran beside communication, and the time lost to it.
CREATE OR REPLACE TEMP MACRO contention_steps(t, min_alone) AS TABLE
WITH base AS (
  SELECT rank, cls, op, median(dur) AS t_alone FROM query_table(t)
  WHERE state = 'alone' GROUP BY ALL HAVING count(*) >= min_alone
)
SELECT k.rank, k.step, count(*)::BIGINT AS kernels, sum(k.dur)::BIGINT AS compute_sum_ns,
       count(*) FILTER (WHERE k.state = 'overlapped')::BIGINT AS overlapped_kernels,
       coalesce(sum(k.dur) FILTER (WHERE k.state = 'overlapped'), 0)::BIGINT AS overlapped_ns,
       coalesce(sum(k.dur - b.t_alone) FILTER (WHERE k.state = 'overlapped'), 0)::BIGINT
         AS time_lost_ns
FROM query_table(t) k LEFT JOIN base b USING (rank, cls, op)
GROUP BY k.rank, k.step;

CREATE OR REPLACE TEMP VIEW contention_by_kernel AS
WITH k AS MATERIALIZED (SELECT * FROM contention_kernels(0.5))
SELECT * FROM contention_classes('k', 3);

-- Communication beside communication: each comm event against the union of communication on
-- the device's other streams/threads (e.g. DP all-reduce beside PP send/recv): alone,
-- overlapped (at least min_overlap of it beside other communication) or partial. Host p2p spans
-- on compute threads are waits and left out, as in _contention_comm. ck names the event's
-- class (name, op, parallelism, size, dtype).
CREATE OR REPLACE TEMP MACRO _contention_comm_runs(min_overlap) AS TABLE
WITH c AS MATERIALIZED (
  SELECT c.*, coalesce(g.parallelism, CASE WHEN c.pg_name IS NULL THEN 'UNKNOWN'
                                           ELSE 'OTHER' END) AS parallelism
  FROM _contention_comm c LEFT JOIN process_groups g ON g.pg_name = c.pg_name
  WHERE c.dur > 0
), ids AS MATERIALIZED (
  SELECT rank, device, stream, row_number() OVER (ORDER BY rank, device, stream) AS id
  FROM (SELECT DISTINCT rank, device, stream FROM c)
), iv AS (
  SELECT i.id AS k, c.s, c.e FROM c JOIN ids i ON i.rank = c.rank AND i.device = c.device
  AND i.stream <> c.stream
), u AS (
  SELECT * FROM interval_union_sorted('iv')
), isl AS MATERIALIZED (
  SELECT * FROM interval_prefix('u')
), x AS (
  SELECT i.id AS k, c.rank, c.step, c.name, c.coll_op, c.parallelism, c.nelems, c.dtype,
         hash(c.name, c.coll_op, c.parallelism, c.nelems, c.dtype) AS ck, c.dur, c.s, c.e
  FROM c JOIN ids i ON i.rank = c.rank AND i.device = c.device AND i.stream = c.stream
)
SELECT * EXCLUDE (k, inside),
       CASE WHEN inside = 0 THEN 'alone' WHEN inside >= min_overlap * dur THEN 'overlapped'
            ELSE 'partial' END AS state
FROM interval_inside('x', 'isl');

-- Per rank and class: runs alone and overlapped, their medians (durations include waiting for
-- peers, so medians, per rank, both sides), and whether both sides have min_runs runs.
CREATE OR REPLACE TEMP MACRO _contention_comm_pairs(t, min_runs) AS TABLE
SELECT rank, ck, any_value(name) AS name, any_value(coll_op) AS coll_op,
       any_value(parallelism) AS parallelism, any_value(nelems) AS nelems,
       any_value(dtype) AS dtype,
       count(*) FILTER (WHERE state = 'alone') AS n_alone,
       median(dur) FILTER (WHERE state = 'alone') AS t_alone,
       count(*) FILTER (WHERE state = 'overlapped') AS n_ov,
       median(dur) FILTER (WHERE state = 'overlapped') AS t_ov,
       count(*) FILTER (WHERE state = 'alone') >= min_runs
         AND count(*) FILTER (WHERE state = 'overlapped') >= min_runs AS matched
FROM query_table(t) GROUP BY rank, ck;

-- Per class: slowdown = median beside / median alone - 1 over the ranks with both sides, from
-- the runs in t (_contention_comm_runs, held once by contention.run for both of its readers).
CREATE OR REPLACE TEMP MACRO _contention_comm_classes(t, min_runs) AS TABLE
WITH m AS (
  SELECT * FROM _contention_comm_pairs(t, min_runs)
)
SELECT any_value(name) AS name, any_value(coll_op) AS coll_op,
       any_value(parallelism) AS parallelism, any_value(nelems) AS nelems,
       any_value(dtype) AS dtype, count(*)::INTEGER AS ranks,
       sum(n_alone)::BIGINT AS n_alone, sum(n_ov)::BIGINT AS n_concurrent,
       sum(n_ov) FILTER (WHERE matched)::BIGINT AS n_matched,
       sum(n_ov * t_alone) FILTER (WHERE matched)
         / nullif(sum(n_ov) FILTER (WHERE matched), 0) AS t_alone_ns,
       sum(n_ov * t_ov) FILTER (WHERE matched) / nullif(sum(n_ov) FILTER (WHERE matched), 0)
         AS t_concurrent_ns,
       sum(n_ov * t_ov) FILTER (WHERE matched)
         / nullif(sum(n_ov * t_alone) FILTER (WHERE matched), 0) - 1 AS slowdown,
       (sum(n_ov * t_ov) FILTER (WHERE matched)
          - sum(n_ov * t_alone) FILTER (WHERE matched))::BIGINT AS time_lost_ns,
       list(rank ORDER BY rank) FILTER (WHERE matched) AS compared_ranks
FROM m GROUP BY ck;

-- Per rank and step (every step of every rank, zero where none), the wall-clock time lost by
-- the communication classes slower than warn beside other communication, from the runs in t:
-- each overlapped run of its rank's class loses the last (t_ov - t_alone) ns of itself, and
-- those pieces are unioned per rank and step. Why a union: communication beside communication
-- is slowed on both sides at once (a DP all-reduce and a PP send/recv slowing each other), and
-- the sum of their losses is no time the rank spent.
CREATE OR REPLACE TEMP MACRO _contention_comm_lost(t, min_runs, warn) AS TABLE
WITH m AS MATERIALIZED (
  SELECT * FROM _contention_comm_pairs(t, min_runs) WHERE matched
), bad AS (
  SELECT ck FROM m GROUP BY ck
  HAVING sum(n_ov * t_ov) / nullif(sum(n_ov * t_alone), 0) - 1 > warn
     AND sum(n_ov * t_ov) > sum(n_ov * t_alone)
), iv AS (
  SELECT st.rank AS k, st.step AS cls,
         greatest(st.s, st.e - CAST(m.t_ov - m.t_alone AS BIGINT)) AS s, st.e AS e
  FROM query_table(t) st JOIN m USING (rank, ck) JOIN bad USING (ck)
  WHERE st.state = 'overlapped' AND m.t_ov > m.t_alone
), lost AS (
  SELECT k AS rank, cls AS step, sum(e - s)::BIGINT AS lost_ns FROM interval_union('iv')
  GROUP BY ALL
)
SELECT s.rank, s.step, coalesce(l.lost_ns, 0)::BIGINT AS lost_ns
FROM steps s LEFT JOIN lost l USING (rank, step);

-- The two above on their own (for `ranklens sql`): per class, and per rank and step.
CREATE OR REPLACE TEMP MACRO contention_comm(min_overlap, min_runs) AS TABLE
WITH st AS MATERIALIZED (SELECT * FROM _contention_comm_runs(min_overlap))
SELECT * FROM _contention_comm_classes('st', min_runs);

CREATE OR REPLACE TEMP MACRO contention_comm_steps(min_overlap, min_runs, warn) AS TABLE
WITH st AS MATERIALIZED (SELECT * FROM _contention_comm_runs(min_overlap))
SELECT * FROM _contention_comm_lost('st', min_runs, warn);

-- contention_hidden(t): per interval of t (id, dk, s, e), the time compute ran beside it on
-- the same device (dk), as a union. Algorithm: the intervals (copies) are few. A compute event
-- of at most 1 ms that overlaps one starts in its 1 ms buckets or the one before, so an
-- equi-join on (device, bucket) finds it (no interval join over every kernel); longer events
-- join by range. The clipped pieces are then unioned per interval.
CREATE OR REPLACE TEMP MACRO contention_hidden(t) AS TABLE
WITH c AS (
  SELECT id, dk, s, e FROM query_table(t)
), cb AS (
  SELECT id, dk, s, e, unnest(range(s // 1000000 - 1, e // 1000000 + 1)) AS bk FROM c
), piece AS (
  SELECT c.id AS k, 0 AS cls, greatest(x.s, c.s) AS s, least(x.e, c.e) AS e
  FROM _contention_ev x JOIN cb c ON c.dk = x.dk AND c.bk = x.s // 1000000
  WHERE x.kind = 'compute' AND x.dur <= 1000000 AND x.s < c.e AND x.e > c.s
  UNION ALL
  SELECT c.id, 0, greatest(x.s, c.s), least(x.e, c.e)
  FROM _contention_ev x JOIN c ON c.dk = x.dk AND x.s < c.e AND x.e > c.s
  WHERE x.kind = 'compute' AND x.dur > 1000000
)
SELECT k AS id, sum(e - s) AS hidden FROM interval_union('piece') GROUP BY k;

-- The H2D/D2H copies (activation offload, input batches) with their direction.
CREATE OR REPLACE TEMP VIEW _contention_copies AS
SELECT rank, step, dk, s, e, dur, bytes, regexp_extract(name, 'Memcpy (\w+)', 1) AS direction
FROM _contention_ev WHERE kind = 'memcpy' AND regexp_matches(name, 'Memcpy (HtoD|DtoH)');

-- Every one of those copies against the union of compute on its device.
CREATE OR REPLACE TEMP VIEW contention_memcpy AS
WITH cp AS MATERIALIZED (
  SELECT row_number() OVER (ORDER BY rank, dk, s, e) AS id, * FROM _contention_copies
), hid AS (
  SELECT * FROM contention_hidden('cp')
)
SELECT rank, step, direction, count(*)::BIGINT AS copies, sum(bytes)::BIGINT AS bytes,
       sum(dur)::BIGINT AS copy_ns, coalesce(sum(hidden), 0)::BIGINT AS hidden_ns,
       (sum(dur) - coalesce(sum(hidden), 0))::BIGINT AS exposed_ns,
       coalesce(sum(hidden), 0) / nullif(sum(dur), 0) AS hidden_ratio,
       sum(bytes) / nullif(sum(dur), 0) AS gb_per_s
FROM cp LEFT JOIN hid USING (id) GROUP BY rank, step, direction;

-- One row per step of each rank with H2D/D2H copies (zeros in its steps without any), in
-- wall-clock time, not sums over the copies: copy_ns = the union of the copies; exposed_ns =
-- the time of that union with no compute beside it on the same device. Why: an H2D and a D2H
-- on two DMA engines (or copies on several streams) run at the same time, and summing each
-- one's exposed time counts that time twice.
CREATE OR REPLACE TEMP VIEW contention_memcpy_steps AS
WITH cp AS MATERIALIZED (
  SELECT rank, step, dk, s, e FROM _contention_copies
), iv AS (
  SELECT dk AS k, step AS cls, s, e FROM cp
), isl AS MATERIALIZED (
  SELECT row_number() OVER (ORDER BY k, cls, s) AS id, k AS dk, cls AS step, s, e,
         e - s AS dur
  FROM interval_union('iv')
), hid AS (
  SELECT * FROM contention_hidden('isl')
), rk AS (
  SELECT DISTINCT dk, rank FROM cp
), per AS (
  SELECT rank, step, sum(dur) AS copy_ns, sum(dur) - coalesce(sum(hidden), 0) AS exposed_ns
  FROM isl JOIN rk USING (dk) LEFT JOIN hid USING (id) GROUP BY rank, step
)
SELECT rank, step, coalesce(copy_ns, 0)::BIGINT AS copy_ns,
       coalesce(exposed_ns, 0)::BIGINT AS exposed_ns
FROM (SELECT DISTINCT rank, step FROM steps) JOIN (SELECT DISTINCT rank FROM per) USING (rank)
     LEFT JOIN per USING (rank, step);
