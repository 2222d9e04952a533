"""timeline: the aligned multi-rank timeline, one visible window at a time.

Why a module of its own: a run can hold tens of millions of events, so no face may ever fetch
"the timeline". Every query here takes a window on the job clock (raw timestamps + each rank's
`ranks.clock_offset_ns`, as in the `events_aligned` view) and returns either the device activity
in it (at most `max_events` rows) or, when the window holds more, that activity aggregated into
time buckets per rank and stream (busy time per kind and parallelism). The raw-time prefilter
on `events.ts_ns` lets DuckDB skip row groups outside the window.

Also here: the exposed-communication and idle/bubble segments of a window (a sweep over the
classes compute, non-PP comm, PP comm, memory per rank; exposed = comm with no compute;
idle = none of compute, non-PP comm or memory, i.e. idle time plus PP waits, as the pipeline
analysis counts bubbles; for an aggregated window packed per bucket, so its overlays stay:
timeline_overlays.py), the events of a window that are exposed and by how much (exact from
raw events, for a finding's evidence in an aggregated window), and the ranks of one
collective instance.

Device activity is what the other analyses count: GPU kernels, memcpy and memset of GPU ranks,
host compute/comm spans of CPU-only (gloo) ranks; the exposed/idle segments come from it alone.
What a window draws is every event: on GPU ranks the host threads too (operators, runtime
calls, synchronizations, ProfilerStep / record_function / NVTX ranges), as Perfetto and Nsight
show them, so device idle time can be explained by what the host was doing. Buckets leave
annotations out: a range is no work, and would fill every bucket of its thread. Not a
registered analysis: it has no findings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb
import polars as pl
from ranklens.analysis import timeline_overlays as ovl
from ranklens.analysis import timeline_sweep as sweep
from ranklens.analysis._sql import apply_sql, query_pl

Params = dict[str, object]

ACTIVITY_KINDS: tuple[str, ...] = ("compute", "comm", "memcpy", "memset")

_RANKS = """r AS (SELECT rank, coalesce(clock_offset_ns, 0) AS off, coalesce(has_gpu, false) AS gpu
              FROM ranks),
g AS (SELECT pg_name, any_value(parallelism) AS parallelism FROM process_groups GROUP BY pg_name)"""

# Device activity (what the other analyses count).
ACTIVITY_SQL = """e.kind IN ('compute', 'comm', 'memcpy', 'memset')
  AND ((r.gpu AND e.device >= 0) OR (NOT r.gpu AND e.device = -1))"""


def _events_sql(which: str) -> str:
    """The window's events (`which`: a condition on e and r) on the job clock; $lo/$hi prune
    on the raw clock first."""
    return f"""WITH {_RANKS}
SELECT e.rank, e.stream, e.kind::VARCHAR AS kind, e.name, e.step, e.ts_ns,
       e.ts_ns + r.off AS s, e.ts_ns + r.off + e.dur_ns AS e, e.dur_ns, e.pg_name, e.coll_op,
       CASE WHEN e.kind = 'comm' THEN coalesce(g.parallelism, 'UNKNOWN') END AS parallelism
FROM events e JOIN r USING (rank) LEFT JOIN g USING (pg_name)
WHERE {which}
  AND e.ts_ns >= $lo AND e.ts_ns < $hi
  AND e.ts_ns + r.off < $end AND e.ts_ns + r.off + e.dur_ns > $start
  AND ($ranks IS NULL OR list_contains($ranks, e.rank))"""


_EVENTS = _events_sql(ACTIVITY_SQL)
_DRAWN = _events_sql("true")  # every event: device activity and the host threads

# Algorithm: clip to the window; an event inside one bucket adds to it directly, the few that
# span several are split over them (unnest), then busy time is summed per lane/bucket/kind.
_BUCKETS = f"""WITH ev AS ({_DRAWN}),
c AS (SELECT rank, stream, kind, parallelism, greatest(s, $start) AS cs, least(e, $end) AS ce
      FROM ev WHERE kind <> 'annotation'),
b AS (SELECT *, ((cs - $start) // $w)::BIGINT AS b0, ((ce - 1 - $start) // $w)::BIGINT AS b1
      FROM c WHERE ce > cs),
one AS (SELECT rank, stream, kind, parallelism, b0 AS bucket, sum(ce - cs) AS busy, count(*) AS n
        FROM b WHERE b0 = b1 GROUP BY ALL),
many AS (SELECT rank, stream, kind, parallelism, bucket,
                sum(least(ce, $start + (bucket + 1) * $w) - greatest(cs, $start + bucket * $w))
                  AS busy, count(*) AS n
         FROM (SELECT *, unnest(range(b0, b1 + 1)) AS bucket FROM b WHERE b0 < b1) GROUP BY ALL)
SELECT rank, stream, kind, parallelism, bucket, $start + bucket * $w AS s,
       sum(busy)::BIGINT AS busy_ns, sum(n)::BIGINT AS n_events
FROM (SELECT * FROM one UNION ALL SELECT * FROM many)
GROUP BY ALL ORDER BY rank, stream, bucket, kind"""

# The window's device activity, clipped to it, by class (`bit`: 1 compute, 2 comm, 4 PP comm,
# 8 memory), for the exposed/idle sweep (timeline_sweep, in numpy: as five window functions
# here it took 9-11 s on a one-step capture of 5 M kernels).
_IV = f"""WITH ev AS ({_EVENTS})
SELECT rank, greatest(s, $start) AS s, least(e, $end) AS e,
       CASE WHEN kind = 'compute' THEN 1
            WHEN kind = 'comm' AND parallelism = 'PP' THEN 4
            WHEN kind = 'comm' THEN 2 ELSE 8 END AS bit
FROM ev WHERE least(e, $end) > greatest(s, $start)"""

# An event's exposed time is its time in the window that no compute of its rank covers (what
# timeline_sweep labels exposed, for a comm event): the window's compute of the candidates' ranks
# unioned into islands, and each candidate's covered part from them, by the shared interval
# macros (intervals.sql: interval_union_sorted, interval_prefix, interval_inside).
_EXPOSED = f"""WITH ev AS ({_EVENTS}),
x AS (SELECT rank::BIGINT AS k, rank, stream, s AS es, e AS ee, dur_ns,
             greatest(s, $start) AS s, least(e, $end) AS e
      FROM ev WHERE list_contains($kinds, kind) AND ($par IS NULL OR parallelism = $par)
        AND least(e, $end) > greatest(s, $start)),
c AS (SELECT rank::BIGINT AS k, greatest(s, $start) AS s, least(e, $end) AS e FROM ev
      WHERE kind = 'compute' AND e > s AND rank IN (SELECT DISTINCT rank FROM x)),
u AS (SELECT * FROM interval_union_sorted('c')),
isl AS (SELECT * FROM interval_prefix('u')),
xp AS (SELECT *, (e - s) - inside AS exposed_ns FROM interval_inside('x', 'isl'))
SELECT rank, stream, es AS start_ns, ee AS end_ns, exposed_ns::BIGINT AS exposed_ns
FROM xp WHERE exposed_ns > 0
ORDER BY exposed_ns DESC, dur_ns DESC, rank, stream, start_ns LIMIT $n"""


@dataclass(frozen=True)
class Extent:
    """What every window query needs to know about the run, computed once.

    Attributes:
        t0_ns: origin of the relative time axis: the earliest step start on the job clock
            (the earliest activity when the run has no steps).
        t1_ns: the latest step end (or activity end) on the job clock.
        min_off_ns / max_off_ns: range of the ranks' clock offsets (for the raw-time prefilter).
        max_dur_ns: the longest event drawn (so a window never misses one that started early).
    """

    t0_ns: int
    t1_ns: int
    min_off_ns: int
    max_off_ns: int
    max_dur_ns: int


@dataclass(frozen=True)
class Window:
    """The visible window: raw events (`mode == "events"`) or buckets (`mode == "buckets"`)."""

    start_ns: int
    end_ns: int
    mode: str
    events: pl.DataFrame
    buckets: pl.DataFrame
    bucket_ns: int
    segments: pl.DataFrame
    n_lanes: int


def extent(con: duckdb.DuckDBPyConnection) -> Extent:
    """Time range of the run on the job clock and the facts the window prefilter needs."""
    row = con.execute(
        """WITH r AS (SELECT rank, coalesce(clock_offset_ns, 0) AS off FROM ranks)
        SELECT min(s.start_ns + r.off), max(s.end_ns + r.off),
               (SELECT min(off) FROM r), (SELECT max(off) FROM r)
        FROM steps s JOIN r USING (rank)"""
    ).fetchall()[0]
    stats = con.execute(
        "SELECT min(ats_ns) FILTER (WHERE act), max(aend_ns) FILTER (WHERE act), max(dur_ns) "
        "FROM (SELECT *, kind IN ('compute', 'comm', 'memcpy', 'memset') AS act "
        "FROM events_aligned)"
    ).fetchall()[0]
    t0 = row[0] if row[0] is not None else stats[0]
    t1 = row[1] if row[1] is not None else stats[1]
    return Extent(
        t0_ns=int(t0 or 0),
        t1_ns=int(t1 or 0),
        min_off_ns=int(row[2] or 0),
        max_off_ns=int(row[3] or 0),
        max_dur_ns=int(stats[2] or 0),
    )


def step_windows(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """Each step's window W per rank on the job clock: rank, step, start_ns, end_ns."""
    return query_pl(
        con,
        """SELECT s.rank, s.step, s.start_ns + coalesce(r.clock_offset_ns, 0) AS start_ns,
                  s.end_ns + coalesce(r.clock_offset_ns, 0) AS end_ns
           FROM steps s JOIN ranks r USING (rank) ORDER BY s.step, s.rank""",
    )


def _query(con: duckdb.DuckDBPyConnection, sql: str, params: Params) -> pl.DataFrame:
    df = pl.from_arrow(con.sql(sql, params=params).to_arrow_table())
    assert isinstance(df, pl.DataFrame)
    return df


def _params(ext: Extent, start_ns: int, end_ns: int, ranks: list[int] | None) -> Params:
    return {
        "start": start_ns,
        "end": end_ns,
        "lo": start_ns - ext.max_off_ns - ext.max_dur_ns - 1,
        "hi": end_ns - ext.min_off_ns + 1,
        "ranks": ranks,
    }


@dataclass(frozen=True)
class Overview:
    """Busy time of the whole run [t0, t1) in fixed buckets, computed once per run, so a
    zoomed-out window is re-aggregated from it instead of scanning every event again; with
    the exposed/idle time packed into the same buckets (rank, label, s, e), for its overlays."""

    start_ns: int
    end_ns: int
    bucket_ns: int
    buckets: pl.DataFrame
    segments: pl.DataFrame = field(default_factory=ovl.empty)


def overview(con: duckdb.DuckDBPyConnection, ext: Extent, n_buckets: int = 4096) -> Overview:
    """The run's busy time per (rank, stream, kind, parallelism) in `n_buckets` buckets."""
    start, end = ext.t0_ns, max(ext.t1_ns, ext.t0_ns + 1)
    width = max(1, -(-(end - start) // n_buckets))
    p = _params(ext, start, end, None)
    segs = ovl.islands(sweep.packed(_query(con, _IV, p), start, end, width))
    return Overview(start, end, width, _query(con, _BUCKETS, {**p, "w": width}), segs)


def window(
    con: duckdb.DuckDBPyConnection,
    ext: Extent,
    start_ns: int,
    end_ns: int,
    ranks: list[int] | None = None,
    *,
    base: Overview | None = None,
    max_events: int = 4000,
    max_cells: int = 6000,
    min_segment_frac: float = 0.001,
) -> Window:
    """Every event in [start_ns, end_ns) on the job clock, for `ranks` (None: all).

    Returns the raw events when there are at most `max_events`, else busy time per
    (rank, stream, kind, parallelism, bucket) with about `max_cells` lane-buckets in all;
    from `base` when its buckets are fine enough for the window (each base bucket counts in
    the window bucket holding its start, so the edges are exact to one base bucket).
    Exposed/idle segments (rank, label, s, e; at least `min_segment_frac` of the window) come
    with both: exact with raw events, packed per bucket with buckets (timeline_overlays).
    """
    end_ns = max(end_ns, start_ns + 1)
    p = _params(ext, start_ns, end_ns, ranks)
    events = _query(con, _DRAWN + f"\nLIMIT {int(max_events) + 1}", p)
    min_ns = int((end_ns - start_ns) * min_segment_frac)
    if events.height <= max_events:
        segs = sweep.segments(_query(con, _IV, p), min_ns)
        lanes = events.select("rank", "stream").unique().height
        ev = events.sort("rank", "stream", "s")
        return Window(start_ns, end_ns, "events", ev, pl.DataFrame(), 0, segs, lanes)
    coarse = base.buckets if base is not None else None
    if coarse is not None and ranks:
        coarse = coarse.filter(pl.col("rank").is_in(ranks))
    n_lanes = (
        coarse.select("rank", "stream").unique().height
        if coarse is not None
        else _count_lanes(con, p)
    )
    n_buckets = max(20, min(400, max_cells // max(n_lanes, 1)))
    width = max(1, -(-(end_ns - start_ns) // n_buckets))
    if (
        base is not None
        and coarse is not None
        and width >= 4 * base.bucket_ns
        and start_ns >= base.start_ns
        and end_ns <= base.end_ns
    ):
        buckets = _rebucket(coarse, base.bucket_ns, start_ns, end_ns, width)
        packed = base.segments
        if ranks:
            packed = packed.filter(pl.col("rank").is_in(ranks))
        packed = ovl.rebucket(packed, start_ns, end_ns, width)
    else:
        buckets = _query(con, _BUCKETS, {**p, "w": width})
        packed = sweep.packed(_query(con, _IV, p), start_ns, end_ns, width)
    segs = ovl.islands(packed, min_ns)
    empty = events.clear()
    return Window(start_ns, end_ns, "buckets", empty, buckets, width, segs, n_lanes)


def _rebucket(coarse: pl.DataFrame, base_w: int, start: int, end: int, w: int) -> pl.DataFrame:
    keys = ["rank", "stream", "kind", "parallelism"]
    return (
        coarse.filter((pl.col("s") + base_w > start) & (pl.col("s") < end))
        .with_columns(((pl.max_horizontal(pl.col("s"), pl.lit(start)) - start) // w).alias("b"))
        .group_by(*keys, "b")
        .agg(pl.col("busy_ns").sum(), pl.col("n_events").sum())
        .select(
            *keys,
            pl.col("b").cast(pl.Int64).alias("bucket"),
            (start + pl.col("b") * w).cast(pl.Int64).alias("s"),
            "busy_ns",
            "n_events",
        )
        .sort("rank", "stream", "bucket", "kind")
    )


def _count_lanes(con: duckdb.DuckDBPyConnection, p: Params) -> int:
    sql = f"WITH ev AS ({_DRAWN}) SELECT count(*) AS n FROM (SELECT DISTINCT rank, stream FROM ev)"
    return int(_query(con, sql, p)["n"][0])


def exposed_events(
    con: duckdb.DuckDBPyConnection,
    ext: Extent,
    start_ns: int,
    end_ns: int,
    ranks: list[int] | None,
    kinds: tuple[str, ...] = ("comm",),
    parallelism: str | None = None,
    limit: int = 300,
) -> pl.DataFrame:
    """The device events of `kinds` (of `parallelism`; None: any) in [start_ns, end_ns) on
    `ranks` (None: all) that are exposed: part of their time in the window has no compute on
    their rank. Columns rank, stream, start_ns, end_ns (job clock), exposed_ns; the most
    exposed first, at most `limit`. Exact from raw events, yet reads only the window's events
    (for an aggregated view, whose segments are packed per bucket)."""
    apply_sql(con, "intervals")  # the interval macros (temp: per connection)
    p = {**_params(ext, start_ns, end_ns, ranks), "kinds": list(kinds), "par": parallelism}
    return _query(con, _EXPOSED, {**p, "n": int(limit)})


def instance(con: duckdb.DuckDBPyConnection, rank: int, stream: int, ts_ns: int) -> pl.DataFrame:
    """Every rank's part of the collective instance the event (rank, stream, raw start) is in.

    Columns: instance_id, rank, op, pg_name, parallelism, status, bytes, stream, and on the job
    clock arrive_ns, start_ns, end_ns. Empty when the event is no matched collective.
    """
    return _query(
        con,
        """WITH i AS (SELECT instance_id FROM collectives
                      WHERE rank = $rank AND stream = $stream AND ts_ns = $ts
                        AND instance_id IS NOT NULL LIMIT 1),
           g AS (SELECT pg_name, any_value(parallelism) AS parallelism
                 FROM process_groups GROUP BY pg_name)
        SELECT c.instance_id, c.rank, c.op, c.pg_name, g.parallelism, c.status, c.bytes,
               c.stream, c.aarrive_ns AS arrive_ns, c.ats_ns AS start_ns, c.aend_ns AS end_ns
        FROM collectives_aligned c JOIN i USING (instance_id) LEFT JOIN g USING (pg_name)
        ORDER BY c.rank""",
        {"rank": rank, "stream": stream, "ts": ts_ns},
    )
