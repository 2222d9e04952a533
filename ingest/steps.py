"""Step assignment and the one write of a rank's events.

Why per rank, before the write: a rank's steps depend only on its own events, so they are
computed on its staged pieces (Arrow, names dictionary-encoded) and each event is written to the
database once, with its step. Writing first and re-writing the table to add the step cost twice
the insert (DuckDB compresses every row group it writes), the largest part of an ingest.

Algorithm: host events take the ProfilerStep span that contains their start (ASOF join); device
events take the step of the host launch with the same correlation id; device events with no
launch (e.g. projected annotations) take the device window that contains them. A rank without
any ProfilerStep span gets one pseudo-step (-1) covering the whole trace.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
from ranklens.ingest import staging
from ranklens.ingest.schema import TABLE_BY_NAME

# `_ev` is the rank's staged events (with `rid`, the row number); `_gpu` whether it has a GPU.
_STEP_SQL = r"""
CREATE OR REPLACE TEMP TABLE _cpu_steps AS
SELECT CAST(regexp_extract(name, '#(\d+)$', 1) AS INTEGER) AS step,
       min(ts_ns) AS cpu_start_ns, max(ts_ns + dur_ns) AS cpu_end_ns
FROM _ev
WHERE kind = 'annotation' AND device = -1 AND regexp_matches(name, '^ProfilerStep#\d+$')
GROUP BY ALL;

CREATE OR REPLACE TEMP TABLE _host_step AS
SELECT e.rid, s.step
FROM _ev e ASOF JOIN _cpu_steps s ON e.ts_ns >= s.cpu_start_ns
WHERE e.device = -1 AND e.ts_ns < s.cpu_end_ns;

CREATE OR REPLACE TEMP TABLE _launch_step AS
SELECT e.correlation, any_value(h.step) AS step
FROM _ev e JOIN _host_step h USING (rid)
WHERE e.kind IN ('runtime', 'sync') AND e.correlation IS NOT NULL
GROUP BY ALL;

CREATE OR REPLACE TEMP TABLE _dev_step AS
SELECT e.rid, l.step
FROM _ev e JOIN _launch_step l USING (correlation)
WHERE e.device >= 0;

CREATE OR REPLACE TEMP TABLE _windows AS
WITH dev AS (
  SELECT d.step, min(e.ts_ns) AS s, max(e.ts_ns + e.dur_ns) AS t
  FROM _ev e JOIN _dev_step d USING (rid)
  WHERE e.kind IN ('compute', 'comm', 'memcpy', 'memset')
  GROUP BY ALL
), host AS (
  SELECT h.step, max(e.ts_ns + e.dur_ns) AS t
  FROM _ev e JOIN _host_step h USING (rid)
  GROUP BY ALL
)
SELECT c.step, c.cpu_start_ns, c.cpu_end_ns,
       CASE WHEN $gpu AND dev.s IS NOT NULL THEN dev.s ELSE c.cpu_start_ns END AS start_ns,
       CASE WHEN $gpu AND dev.t IS NOT NULL THEN dev.t
            ELSE greatest(c.cpu_end_ns, coalesce(host.t, c.cpu_end_ns)) END AS end_ns
FROM _cpu_steps c LEFT JOIN dev USING (step) LEFT JOIN host USING (step);

-- Device events with no launch record (their runtime call fell outside the capture) belong to
-- the step whose host span or device window contains their start.
CREATE OR REPLACE TEMP TABLE _late_step AS
SELECT e.rid, w.step
FROM _ev e ASOF JOIN (SELECT step, least(start_ns, cpu_start_ns) AS lo, end_ns
                      FROM _windows) w ON e.ts_ns >= w.lo
WHERE e.device >= 0 AND e.ts_ns < w.end_ns
  AND e.rid NOT IN (SELECT rid FROM _dev_step);

UPDATE _windows SET start_ns = least(_windows.start_ns, x.s)
FROM (SELECT l.step, min(e.ts_ns) AS s
      FROM _ev e JOIN _late_step l USING (rid)
      WHERE e.kind IN ('compute', 'comm', 'memcpy', 'memset') GROUP BY ALL) x
WHERE _windows.step = x.step;

-- W is the hull of the step's device work: a late event (no launch) that starts inside W but
-- ends after it extends W, else the step's activity would exceed W (negative idle).
UPDATE _windows SET end_ns = greatest(_windows.end_ns, x.t)
FROM (SELECT l.step, max(e.ts_ns + e.dur_ns) AS t
      FROM _ev e JOIN _late_step l USING (rid)
      WHERE e.kind IN ('compute', 'comm', 'memcpy', 'memset') GROUP BY ALL) x
WHERE _windows.step = x.step;

INSERT INTO _windows
SELECT -1, min(ts_ns), max(ts_ns + dur_ns),
       min(ts_ns) FILTER (WHERE NOT $gpu OR device >= 0),
       max(ts_ns + dur_ns) FILTER (WHERE NOT $gpu OR device >= 0)
FROM _ev
WHERE NOT EXISTS (SELECT 1 FROM _cpu_steps)
  AND kind IN ('compute', 'comm', 'memcpy', 'memset', 'cpu_op', 'runtime', 'sync')
HAVING count(*) > 0;
"""

# A rank with no ProfilerStep span (e.g. most Nsight exports): only the pseudo-step, without
# the joins above over every event.
_NO_STEP_SQL = r"""
CREATE OR REPLACE TEMP TABLE _cpu_steps (step INTEGER, cpu_start_ns BIGINT, cpu_end_ns BIGINT);
CREATE OR REPLACE TEMP TABLE _host_step (rid BIGINT, step INTEGER);
CREATE OR REPLACE TEMP TABLE _dev_step (rid BIGINT, step INTEGER);
CREATE OR REPLACE TEMP TABLE _late_step (rid BIGINT, step INTEGER);
CREATE OR REPLACE TEMP TABLE _windows AS
SELECT -1 AS step, min(ts_ns) AS cpu_start_ns, max(ts_ns + dur_ns) AS cpu_end_ns,
       min(ts_ns) FILTER (WHERE NOT $gpu OR device >= 0) AS start_ns,
       max(ts_ns + dur_ns) FILTER (WHERE NOT $gpu OR device >= 0) AS end_ns
FROM _ev
WHERE kind IN ('compute', 'comm', 'memcpy', 'memset', 'cpu_op', 'runtime', 'sync')
HAVING count(*) > 0;
"""

_HAS_STEPS_SQL = r"""SELECT EXISTS (SELECT 1 FROM _ev WHERE kind = 'annotation' AND device = -1
                      AND regexp_matches(name, '^ProfilerStep#\d+$'))"""

_TEMP = ("_cpu_steps", "_host_step", "_launch_step", "_dev_step", "_windows", "_late_step")


def write_rank(
    con: duckdb.DuckDBPyConnection, rank: int, has_gpu: bool, pieces: list[staging.Piece]
) -> None:
    """Assign steps to one rank's events (its staged pieces), then write them and its steps to
    the database, a piece at a time. Consumes `pieces`."""
    n = sum(p.rows for p in pieces)
    if n == 0:
        pieces.clear()
        return
    ev = staging.step_table(pieces)
    ev = ev.append_column("rid", pa.array(np.arange(n, dtype=np.int64)))
    con.register("_ev", ev)
    try:
        has_steps = con.execute(_HAS_STEPS_SQL).fetchall()[0][0]
        sql = _STEP_SQL if has_steps else _NO_STEP_SQL
        # One thread: the joins' hash tables are per thread, and the staged rank sits beside
        # them at the ingest's peak memory (~10% of the peak; ~0.1 s more on a 400 MB rank).
        threads = int(con.execute("SELECT current_setting('threads')").fetchall()[0][0])
        con.execute("SET threads = 1")
        try:
            con.execute(sql.replace("$gpu", "TRUE" if has_gpu else "FALSE"))
        finally:
            con.execute(f"SET threads = {threads}")
        con.execute(
            f"""INSERT INTO steps SELECT {rank}, step, cpu_start_ns, cpu_end_ns, start_ns, end_ns,
               CASE WHEN step = -1 THEN 'trace' ELSE 'profiler_step' END FROM _windows
               WHERE start_ns IS NOT NULL ORDER BY step"""
        )
        step = _step_column(con, n)
    finally:
        con.unregister("_ev")
        for t in _TEMP:
            con.execute(f"DROP TABLE IF EXISTS {t}")
    del ev
    events = TABLE_BY_NAME["events"].column_names
    at = 0
    for piece in staging.unpack_all(pieces):
        cols = [c for c in events if c in piece.column_names and c != "step"]
        out = piece.select(cols).append_column("step", step.slice(at, piece.num_rows))
        at += piece.num_rows
        del piece
        names = ", ".join(f'"{c}"' for c in out.column_names)
        con.register("_ev", out)
        try:
            con.execute(f"INSERT INTO events ({names}) SELECT {names} FROM _ev")
        finally:
            con.unregister("_ev")
        del out


def _step_column(con: duckdb.DuckDBPyConnection, n: int) -> pa.Array:
    """Each row's step: its host span's, else its launch's, else its window's, else -1 on a
    rank with only the pseudo-step (a join on 1 M rows costs more than these array writes)."""
    step = np.zeros(n, dtype=np.int32)
    known = np.zeros(n, dtype=np.bool_)
    if con.execute("SELECT count(*) FROM _windows WHERE step = -1").fetchall()[0][0]:
        step[:], known[:] = -1, True
    for table in ("_late_step", "_dev_step", "_host_step"):  # lowest precedence first
        got = con.execute(f"SELECT rid, step FROM {table}").fetchnumpy()
        rid = np.asarray(got["rid"], dtype=np.int64)
        step[rid] = np.asarray(got["step"], dtype=np.int32)
        known[rid] = True
    return pa.array(step, mask=~known)
