"""timeline_lanes: the timeline's lanes, the row of each slice on its lane, and the lookups a
selected event needs (all its columns, its launch/kernel partners, name search).

Why lanes of the whole run: a lane set taken from the events of the visible window makes
lanes appear and vanish while zooming; here every (rank, stream) that holds an event anywhere
in the run is a lane, with as many rows as slices ever overlap on it (nested host operators,
ProfilerStep ranges around them, a long gloo:send beside compute), so a lane keeps its place
and height at every zoom. A slice's row is the lowest free one when it starts (greedy interval
colouring, longer first at equal starts): properly nested slices get their nesting depth, and
never more rows than the lane has. A zero-length slice counts as 1 ns long, in both.

Lanes are keyed (rank, stream) as the rest of the timeline is: `stream` is the CUDA stream of
device events and the thread id of host ones (schema: events.stream).
"""

from __future__ import annotations

from typing import Any

import duckdb
import numpy as np
import numpy.typing as npt
import polars as pl
from ranklens.analysis._sql import query_pl
from ranklens.analysis.timeline import ACTIVITY_SQL, Extent, _params

MAX_ROWS = 16  # rows of one lane at most; deeper slices share the last row
EXACT_MAX = 400_000  # events up to which every slice counts in a lane's rows
SAMPLE_STEPS = 3  # past that, the slices of the first steps only (a step repeats the last)

# Per lane: host or device, whether it carries device activity, its name (over every event);
# how many slices overlap at most (a sweep: +1 at each start, -1 at each end, ends first at
# equal times, the running sum's maximum), over every event or the first steps' ones.
_LANES = f"""WITH r AS (SELECT rank, coalesce(has_gpu, false) AS gpu FROM ranks),
lane AS (SELECT e.rank, e.stream, bool_and(e.device < 0) AS host, bool_or({ACTIVITY_SQL})
                  AS activity, min(e.pid) AS pid, min(e.tid) AS tid, count(*) AS n_events
         FROM events e JOIN r USING (rank) GROUP BY e.rank, e.stream),
first_steps AS (SELECT DISTINCT step FROM steps ORDER BY step LIMIT $k),
ev AS (SELECT rank, stream, ts_ns AS s, greatest(ts_ns + dur_ns, ts_ns + 1) AS x1 FROM events
       WHERE (SELECT sum(n_events) FROM lane) <= $exact
          OR step IN (SELECT step FROM first_steps)),
p AS (SELECT rank, stream, s AS x, 1 AS d FROM ev
      UNION ALL SELECT rank, stream, x1 AS x, -1 AS d FROM ev),
c AS (SELECT rank, stream, sum(d) OVER (PARTITION BY rank, stream ORDER BY x, d
                                        ROWS UNBOUNDED PRECEDING) AS n FROM p),
deep AS (SELECT rank, stream, max(n)::INTEGER AS depth FROM c GROUP BY ALL),
nm AS (SELECT rank, pid, tid, min(name) AS name FROM threads GROUP BY ALL)
SELECT l.rank, l.stream, l.host, l.activity,
       least(coalesce(d.depth, 1), {MAX_ROWS})::INTEGER AS rows, coalesce(d.depth, 1) AS depth,
       nm.name, l.n_events
FROM lane l LEFT JOIN deep d USING (rank, stream)
LEFT JOIN nm ON nm.rank = l.rank AND nm.pid = l.pid AND nm.tid = l.tid
ORDER BY l.rank, l.host DESC, l.stream"""


def lanes(
    con: duckdb.DuckDBPyConnection, exact_max: int = EXACT_MAX, sample_steps: int = SAMPLE_STEPS
) -> pl.DataFrame:
    """Every lane of the run, top to bottom (per rank: host threads, then device streams):
    rank, stream, host, activity (carries device activity, what the exposed/idle overlays
    describe), rows (overlapping slices at most, capped at MAX_ROWS), depth (uncapped), name
    (from the `threads` table; NULL when the trace names none), n_events. Past EXACT_MAX
    events the rows come from the first SAMPLE_STEPS steps (a sweep over every event of a
    10 M-event run takes seconds); a face that draws a window deeper than that grows the lane
    (`need_rows`)."""
    return _df(con, _LANES, {"exact": exact_max, "k": sample_steps})


def need_rows(ev: pl.DataFrame) -> pl.DataFrame:
    """Rows each lane of a window's events (rank, stream, s, e) needs: rank, stream, rows."""
    if ev.is_empty():
        return pl.DataFrame(schema={"rank": pl.Int64, "stream": pl.Int64, "rows": pl.Int64})
    return (
        ev.select(pl.col("rank", "stream").cast(pl.Int64), depth=pl.Series(depths(ev)))
        .group_by("rank", "stream")
        .agg((pl.col("depth").max() + 1).alias("rows"))
    )


def depths(ev: pl.DataFrame) -> npt.NDArray[np.int64]:
    """The row of each event (columns rank, stream, s, e) on its lane, in `ev`'s order."""
    n = ev.height
    out = np.zeros(n, dtype=np.int64)
    if n == 0:
        return out
    rank = ev["rank"].to_numpy()
    stream = ev["stream"].to_numpy()
    s = ev["s"].to_numpy().astype(np.int64)
    e = np.maximum(ev["e"].to_numpy().astype(np.int64), s + 1)
    order = np.lexsort((-e, s, stream, rank))  # by lane, then start, longer first
    rs, ss, starts, ends = rank.tolist(), stream.tolist(), s.tolist(), e.tolist()
    busy: list[int] = []  # per row: when its last slice ends
    lane: tuple[int, int] | None = None
    for i in order.tolist():
        key = (rs[i], ss[i])
        if key != lane:
            busy, lane = [], key
        for row, end in enumerate(busy):
            if end <= starts[i]:
                busy[row] = ends[i]
                out[i] = row
                break
        else:
            out[i] = len(busy)
            busy.append(ends[i])
    return out


def event(con: duckdb.DuckDBPyConnection, rank: int, stream: int, ts_ns: int) -> pl.DataFrame:
    """Every column of the events (rank, stream, raw start ts_ns) (more than one where slices
    share a start), longest first, with the start/end on the job clock, the parallelism of
    its group and the lane's name."""
    return query_pl(
        con,
        """WITH g AS (SELECT pg_name, any_value(parallelism) AS parallelism
                      FROM process_groups GROUP BY pg_name),
           nm AS (SELECT rank, pid, tid, min(name) AS thread_name FROM threads GROUP BY ALL)
        SELECT e.*, g.parallelism, nm.thread_name
        FROM events_aligned e LEFT JOIN g USING (pg_name)
        LEFT JOIN nm ON nm.rank = e.rank AND nm.pid = e.pid AND nm.tid = e.tid
        WHERE e.rank = ? AND e.stream = ? AND e.ts_ns = ?
        ORDER BY e.dur_ns DESC, e.name""",
        [rank, stream, ts_ns],
    )


def flows(
    con: duckdb.DuckDBPyConnection,
    rank: int,
    stream: int,
    ts_ns: int,
    dur_ns: int,
    correlation: int | None,
    max_links: int = 64,
    near_ns: int = 5_000_000_000,
) -> pl.DataFrame:
    """The launch -> kernel links of the selected event: its own correlation id, or, for a
    host slice, those of the runtime calls inside it (an operator's launches), at most
    `max_links`. Rows: correlation, host (the launch) or not (the kernel/copy), rank, stream,
    kind, name, ts_ns (raw), start_ns/end_ns (job clock). Per id and side only the event
    nearest the selection (within `near_ns`): ids repeat when a trace restarts them."""
    return _df(
        con,
        """WITH ids AS (
             SELECT DISTINCT correlation FROM events
             WHERE rank = $rank AND correlation IS NOT NULL AND (correlation = $corr OR
                   (stream = $stream AND device < 0 AND kind = 'runtime' AND ts_ns >= $ts
                    AND ts_ns + dur_ns <= $ts + $dur))
             LIMIT $n)
        SELECT correlation, device < 0 AS host, rank, stream, kind::VARCHAR AS kind, name,
               ts_ns, ats_ns AS start_ns, aend_ns AS end_ns
        FROM events_aligned
        WHERE rank = $rank AND correlation IN (SELECT correlation FROM ids)
          AND ts_ns BETWEEN $ts - $near AND $ts + $dur + $near
        QUALIFY row_number() OVER (PARTITION BY correlation, device < 0
                                   ORDER BY abs(ts_ns - $ts)) = 1
        ORDER BY correlation, host DESC""",
        {
            "rank": rank,
            "stream": stream,
            "ts": ts_ns,
            "dur": dur_ns,
            "corr": correlation,
            "n": max_links,
            "near": near_ns,
        },
    )


def _df(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, object]) -> pl.DataFrame:
    df = pl.from_arrow(con.sql(sql, params=params).to_arrow_table())
    assert isinstance(df, pl.DataFrame)
    return df


def matches(
    con: duckdb.DuckDBPyConnection,
    ext: Extent,
    start_ns: int,
    end_ns: int,
    ranks: list[int] | None,
    text: str,
    limit: int = 500,
) -> tuple[pl.DataFrame, int]:
    """Events of the window (job clock) whose name contains `text` (any case, literally), on
    `ranks` (None: all): the longest `limit` as (rank, stream, start_ns, end_ns), and how many
    there are. For aggregated windows, whose events the figure does not hold."""
    sql = """FROM events_aligned
        WHERE ts_ns >= $lo AND ts_ns < $hi AND ats_ns < $end AND aend_ns > $start
          AND contains(lower(name), lower($q))
          AND ($ranks IS NULL OR list_contains($ranks, rank))"""
    params = {**_params(ext, start_ns, end_ns, ranks), "q": text}
    cols = "SELECT rank, stream, ats_ns AS start_ns, aend_ns AS end_ns, count(*) OVER () AS n "
    rows = _df(con, cols + sql + " ORDER BY dur_ns DESC LIMIT $n", {**params, "n": limit})
    total = int(rows["n"][0]) if rows.height else 0
    return rows.drop("n"), total


_FAR = 2**62  # beyond any key column: an anchor before (or after) every event
KEY_COLS = ("ats_ns", "rank", "stream", "ts_ns", "dur_ns")  # the time order of search steps
Key = tuple[int, int, int, int, int]


def step_match(
    con: duckdb.DuckDBPyConnection,
    text: str,
    ranks: list[int] | None,
    anchor: Key | None,
    forward: bool = True,
) -> tuple[dict[str, Any] | None, int, int]:
    """The event whose name contains `text` (any case, literally) that follows (`forward`) or
    precedes `anchor` in time order, on `ranks` (None: all), wrapping round at either end;
    with its position k (1-based) among the n matches: (row, k, n), (None, 0, 0) when none.

    Time order is KEY_COLS, a total order, so steps never skip or repeat an event; `anchor`
    is such a key: the selected event's, or (view start, -2**62, ...) for "the first one
    from here" (None: from the run's start or end). The row holds rank, stream, ts_ns (raw),
    dur_ns, ats_ns, aend_ns, name."""
    end: Key = (-_FAR,) * 5 if forward else (_FAR,) * 5
    key = ", ".join(KEY_COLS)
    order = ", ".join(f"{c} {'ASC' if forward else 'DESC'}" for c in KEY_COLS)
    sql = f"""WITH m AS MATERIALIZED (
          SELECT rank, stream, ts_ns, dur_ns, ats_ns, aend_ns, name FROM events_aligned
          WHERE contains(lower(name), lower($q))
            AND ($ranks IS NULL OR list_contains($ranks, rank))),
        f AS (SELECT * FROM m WHERE ({key}) {">" if forward else "<"} ($a, $r, $s, $t, $d)
              ORDER BY {order} LIMIT 1)
    SELECT f.*, (SELECT count(*) FROM m) AS n,
           (SELECT count(*) FROM m WHERE ({", ".join("m." + c for c in KEY_COLS)})
                                      <= ({", ".join("f." + c for c in KEY_COLS)})) AS k
    FROM f"""
    for at in (anchor, end) if anchor is not None else (end,):
        rows = _df(con, sql, {"q": text, "ranks": ranks, **dict(zip("arstd", at, strict=True))})
        if rows.height:
            row = rows.row(0, named=True)
            return {c: row[c] for c in rows.columns if c not in ("k", "n")}, row["k"], row["n"]
    return None, 0, 0
