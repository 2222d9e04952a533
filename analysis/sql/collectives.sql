-- requires: intervals
-- collectives: bandwidth of each matched collective instance and its aggregates, mismatches.
-- Bytes per design.md: the full array (all-gather output, reduce-scatter input); n = group size.

-- Theoretical per-direction bandwidth (GB/s) of a GPU's link to its peers in one host: NVLink
-- through NVSwitch/bridges for SXM parts, the PCIe slot otherwise. NULL: unknown model.
CREATE OR REPLACE TEMP MACRO collectives_link_gbps(device_name) AS
CAST(CASE
  WHEN device_name IS NULL THEN NULL
  WHEN regexp_matches(device_name, 'GB200|B200|B100') THEN 900.0
  WHEN regexp_matches(device_name, 'H100.*PCIe|H100 NVL') THEN 64.0
  WHEN regexp_matches(device_name, 'H800') THEN 200.0
  WHEN regexp_matches(device_name, 'H100|H200|H20|GH200') THEN 450.0
  WHEN regexp_matches(device_name, 'A800') THEN 200.0
  WHEN regexp_matches(device_name, 'A100.*PCIE|A100.*PCIe') THEN 32.0
  WHEN regexp_matches(device_name, 'A100') THEN 300.0
  WHEN regexp_matches(device_name, 'V100.*PCIE|V100.*PCIe') THEN 16.0
  WHEN regexp_matches(device_name, 'V100') THEN 150.0
  WHEN regexp_matches(device_name, 'P100.*SXM') THEN 80.0
  WHEN regexp_matches(device_name, 'T4|P4|P40') THEN 16.0
  WHEN regexp_matches(device_name, 'RTX|A10|A30|A40|L4|L40|A6000|A5000') THEN 32.0
END AS DOUBLE);

-- Per-GPU network bandwidth (GB/s) assumed for groups that span hosts: 200 Gb/s per GPU.
CREATE OR REPLACE TEMP MACRO collectives_network_gbps() AS CAST(25.0 AS DOUBLE);

-- busbw factor f(n) (nccl-tests): all-reduce 2(n-1)/n; all-gather, reduce-scatter,
-- all-to-all and grouped send/recv (n-1)/n; broadcast, reduce, a send/recv pair (p2p) 1.
CREATE OR REPLACE TEMP MACRO collectives_busbw_factor(op, n) AS
CASE WHEN n IS NULL OR n < 1 THEN NULL
     WHEN op = 'all_reduce' THEN 2.0 * (n - 1) / n
     WHEN op IN ('all_gather', 'reduce_scatter', 'all_to_all', 'send_recv') THEN (n - 1.0) / n
     ELSE 1.0 END;

CREATE OR REPLACE TEMP MACRO collectives_size_bucket(b) AS
CASE WHEN b IS NULL THEN 'unknown' WHEN b < 65536 THEN '<64KiB' WHEN b < 1048576 THEN '64KiB-1MiB'
     WHEN b < 16777216 THEN '1-16MiB' WHEN b < 268435456 THEN '16-256MiB' ELSE '>=256MiB' END;

-- Algorithm: per instance, time = the shortest duration across its ranks (the last rank to
-- arrive waits for nobody, so its duration is the transfer: skew-free and clock-free);
-- algbw = bytes / time; busbw = algbw * f(n). Instances whose other members are not in the run
-- (one rank's trace) are kept with skew_free = false: their time includes any wait.
-- Hosts: a group spans hosts when its ranks name different hosts; when hosts are unknown, a
-- group of up to 8 GPUs is taken as one host's. time_vs_median compares an instance with the
-- median of its group, op and size bucket (p2p excluded: its time includes pipeline waits).
-- start_ns, end_ns: the instance's span on the job clock (first start, last end of its ranks),
-- where the timeline shows it.
CREATE OR REPLACE TEMP VIEW collectives_by_instance AS
WITH r AS (
  SELECT rank, host, device_name, has_gpu, coalesce(clock_offset_ns, 0) AS off FROM ranks
), i AS (
  SELECT c.instance_id, any_value(c.pg_name) AS pg_name,
         CASE WHEN count(DISTINCT c.op) > 1 THEN 'p2p' ELSE any_value(c.op) END AS op,
         any_value(c.seq) AS seq, min(c.step) AS step, count(*) AS n_ranks,
         min(c.ts_ns + r.off) AS start_ns, max(c.end_ns + r.off) AS end_ns,
         bool_and(c.status = 'matched') AND count(*) > 1 AS skew_free,
         max(c.group_size) AS group_size, max(c.bytes) AS bytes, any_value(c.dtype) AS dtype,
         min(c.end_ns - c.ts_ns) AS time_ns, max(c.end_ns - c.ts_ns) AS max_dur_ns,
         count(DISTINCT r.host) > 1 AS spans_hosts, bool_or(r.host IS NULL) AS host_unknown,
         bool_and(r.has_gpu) AS gpu, min(collectives_link_gbps(r.device_name)) AS nvlink_gbps
  FROM collectives c JOIN r USING (rank)
  WHERE c.status IN ('matched', 'others_absent') GROUP BY c.instance_id
), b AS (
  SELECT i.*, coalesce(g.parallelism, 'UNKNOWN') AS parallelism,
         collectives_size_bucket(bytes) AS size_bucket,
         bytes / nullif(time_ns, 0) AS algbw_gbps,
         CASE WHEN NOT gpu THEN 'host'
              WHEN spans_hosts OR (host_unknown AND group_size > 8) THEN 'network'
              WHEN nvlink_gbps IS NULL THEN 'unknown'
              WHEN nvlink_gbps > 64 THEN 'nvlink' ELSE 'pcie' END AS link
  FROM i LEFT JOIN process_groups g USING (pg_name)
), c AS (
  SELECT b.*, CASE link WHEN 'network' THEN collectives_network_gbps()
                        WHEN 'host' THEN NULL ELSE nvlink_gbps END AS peak_gbps
  FROM b
)
SELECT instance_id, pg_name, parallelism, op, seq, step, start_ns, end_ns, n_ranks, group_size,
       skew_free, bytes,
       dtype, size_bucket, time_ns, max_dur_ns, algbw_gbps,
       algbw_gbps * collectives_busbw_factor(op, group_size) AS busbw_gbps,
       link, peak_gbps,
       algbw_gbps * collectives_busbw_factor(op, group_size) / nullif(peak_gbps, 0)
         AS peak_fraction,
       CASE WHEN op <> 'p2p' THEN time_ns / nullif(median(time_ns) OVER (
         PARTITION BY pg_name, op, size_bucket), 0) END AS time_vs_median
FROM c;

-- collectives_excess(t): per rank and step, the time its slow instances ran beyond their
-- median, as a union. t holds (instance_id, x): the slow instances and each one's excess
-- x = time - median. On each member rank the excess is the last x ns of its op (its transfer
-- ends the op; any wait for peers comes first). Why a union per rank, not a sum over
-- instances: instances of different groups run at the same time on different ranks, and
-- those of one rank can overlap (two streams); their sum is no rank's time and can exceed a
-- step.
CREATE OR REPLACE TEMP MACRO collectives_excess(t) AS TABLE
WITH iv AS (
  SELECT c.rank AS k, coalesce(c.step, -1) AS cls, greatest(c.end_ns - x.x, c.ts_ns) AS s,
         c.end_ns AS e
  FROM collectives c JOIN query_table(t) x USING (instance_id)
)
SELECT k AS rank, cls AS step, sum(e - s)::BIGINT AS excess_ns
FROM interval_union('iv') GROUP BY ALL;

-- Per group, op and size bucket (the main table).
CREATE OR REPLACE TEMP VIEW collectives_by_op AS
SELECT pg_name, parallelism, op, size_bucket, any_value(group_size) AS group_size,
       any_value(link) AS link, count(*) AS instances,
       median(bytes)::BIGINT AS bytes, median(time_ns)::BIGINT AS time_ns,
       quantile_disc(time_ns, 0.9) AS time_p90_ns, sum(time_ns)::BIGINT AS total_time_ns,
       median(algbw_gbps) AS algbw_gbps, median(busbw_gbps) AS busbw_gbps,
       any_value(peak_gbps) AS peak_gbps, median(peak_fraction) AS peak_fraction
FROM collectives_by_instance GROUP BY pg_name, parallelism, op, size_bucket;

-- Per parallelism and op, across groups.
CREATE OR REPLACE TEMP VIEW collectives_by_parallelism AS
SELECT parallelism, op, count(*) AS instances, sum(bytes)::BIGINT AS bytes,
       sum(time_ns)::BIGINT AS total_time_ns, sum(bytes) / nullif(sum(time_ns), 0) AS algbw_gbps,
       median(busbw_gbps) AS busbw_gbps, median(peak_fraction) AS peak_fraction
FROM collectives_by_instance GROUP BY parallelism, op;

-- Instances that did not match, with the members that never joined.
CREATE OR REPLACE TEMP VIEW collectives_mismatches AS
WITH p AS (SELECT list(rank ORDER BY rank) AS present FROM ranks)
SELECT c.pg_name, c.instance_id, c.seq, any_value(c.status) AS status,
       list(DISTINCT c.op ORDER BY c.op) AS ops,
       list(DISTINCT coalesce(c.bytes, c.nelems) ORDER BY coalesce(c.bytes, c.nelems)) AS sizes,
       list(c.rank ORDER BY c.rank) AS ranks,
       list_filter(any_value(g.ranks),
                   lambda x: list_contains(any_value(p.present), x)
                             AND NOT list_contains(list(c.rank), x)) AS missing_ranks,
       min(c.step) AS step, min(c.ts_ns) AS first_ts_ns
FROM collectives c LEFT JOIN process_groups g USING (pg_name), p
WHERE c.status NOT IN ('matched', 'others_absent', 'no_group', 'peer_unknown')
GROUP BY c.pg_name, c.instance_id, c.seq;
