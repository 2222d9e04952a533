-- Generic interval macros. They know nothing of traces: columns k (any key), cls, s, e.

-- interval_union(t): disjoint islands per (k, cls) of the intervals [s, e).
-- Algorithm: sort by start; an interval opens a new island when it starts after the furthest
-- end seen so far (touching intervals merge; zero-length ones add no length).
CREATE OR REPLACE TEMP MACRO interval_union(t) AS TABLE
WITH o AS (
  SELECT k, cls, s, e,
         max(e) OVER (PARTITION BY k, cls ORDER BY s, e
                      ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
  FROM query_table(t)
), g AS (
  SELECT k, cls, s, e,
         sum(CASE WHEN reach IS NULL OR s > reach THEN 1 ELSE 0 END)
           OVER (PARTITION BY k, cls ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS island
  FROM o
)
SELECT k, cls, min(s) AS s, max(e) AS e FROM g GROUP BY k, cls, island;

-- interval_coverage(t): t holds islands already unioned per (k, cls), cls in 0..62.
-- Returns (k, mask, dur): time during which exactly the classes in bit-mask `mask` were active.
-- Algorithm: sweep the sorted endpoints; with one island per class active at a time, the running
-- sum of +/- 2^cls is the set of active classes.
CREATE OR REPLACE TEMP MACRO interval_coverage(t) AS TABLE
WITH p AS (
  SELECT k, s AS x, (1::BIGINT << cls) AS d FROM query_table(t) WHERE e > s
  UNION ALL
  SELECT k, e AS x, -(1::BIGINT << cls) AS d FROM query_table(t) WHERE e > s
), q AS (
  SELECT k, x, sum(d) AS d FROM p GROUP BY k, x
), r AS (
  SELECT k, x, sum(d) OVER (PARTITION BY k ORDER BY x ROWS UNBOUNDED PRECEDING) AS mask,
         lead(x) OVER (PARTITION BY k ORDER BY x) AS nx
  FROM q
)
SELECT k, CAST(mask AS BIGINT) AS mask, CAST(sum(nx - x) AS BIGINT) AS dur
FROM r WHERE mask <> 0 AND nx IS NOT NULL GROUP BY k, mask;
