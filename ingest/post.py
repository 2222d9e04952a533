"""Cross-event work done once after all ranks are in: steps, process groups, event order.

Why SQL: these are joins over millions of rows (host step spans -> launches -> kernels) that
DuckDB does in parallel and out of core; Python never loops over events here.
"""

from __future__ import annotations

from typing import Any

import duckdb
from ranklens.ingest.groups import label_from_description
from ranklens.ingest.schema import TABLE_BY_NAME

# Algorithm: host events take the ProfilerStep span that contains their start (ASOF join);
# device events take the step of the host launch with the same correlation id; device events
# with no launch (e.g. projected annotations) take the device window that contains them.
_STEP_SQL = r"""
CREATE OR REPLACE TEMP TABLE _cpu_steps AS
SELECT rank, CAST(regexp_extract(name, '#(\d+)$', 1) AS INTEGER) AS step,
       min(ts_ns) AS cpu_start_ns, max(ts_ns + dur_ns) AS cpu_end_ns
FROM events
WHERE kind = 'annotation' AND device = -1 AND regexp_matches(name, '^ProfilerStep#\d+$')
GROUP BY ALL;

CREATE OR REPLACE TEMP TABLE _host_step AS
SELECT e.rowid AS rid, s.step
FROM events e ASOF JOIN _cpu_steps s ON e.rank = s.rank AND e.ts_ns >= s.cpu_start_ns
WHERE e.device = -1 AND e.ts_ns < s.cpu_end_ns;

CREATE OR REPLACE TEMP TABLE _launch_step AS
SELECT e.rank, e.correlation, any_value(h.step) AS step
FROM events e JOIN _host_step h ON e.rowid = h.rid
WHERE e.kind IN ('runtime', 'sync') AND e.correlation IS NOT NULL
GROUP BY ALL;

CREATE OR REPLACE TEMP TABLE _dev_step AS
SELECT e.rowid AS rid, l.step
FROM events e JOIN _launch_step l ON e.rank = l.rank AND e.correlation = l.correlation
WHERE e.device >= 0;

CREATE OR REPLACE TEMP TABLE _windows AS
WITH dev AS (
  SELECT e.rank, d.step, min(e.ts_ns) AS s, max(e.ts_ns + e.dur_ns) AS t
  FROM events e JOIN _dev_step d ON e.rowid = d.rid
  WHERE e.kind IN ('compute', 'comm', 'memcpy', 'memset')
  GROUP BY ALL
), host AS (
  SELECT e.rank, h.step, max(e.ts_ns + e.dur_ns) AS t
  FROM events e JOIN _host_step h ON e.rowid = h.rid
  GROUP BY ALL
)
SELECT c.rank, c.step, c.cpu_start_ns, c.cpu_end_ns,
       CASE WHEN r.has_gpu AND dev.s IS NOT NULL THEN dev.s ELSE c.cpu_start_ns END AS start_ns,
       CASE WHEN r.has_gpu AND dev.t IS NOT NULL THEN dev.t
            ELSE greatest(c.cpu_end_ns, coalesce(host.t, c.cpu_end_ns)) END AS end_ns
FROM _cpu_steps c JOIN ranks r USING (rank)
LEFT JOIN dev USING (rank, step) LEFT JOIN host USING (rank, step);

-- Device events with no launch record (their runtime call fell outside the capture) belong to
-- the step whose host span or device window contains their start.
CREATE OR REPLACE TEMP TABLE _late_step AS
SELECT e.rowid AS rid, w.step
FROM events e ASOF JOIN (SELECT rank, step, least(start_ns, cpu_start_ns) AS lo, end_ns
                         FROM _windows) w ON e.rank = w.rank AND e.ts_ns >= w.lo
WHERE e.device >= 0 AND e.ts_ns < w.end_ns
  AND e.rowid NOT IN (SELECT rid FROM _dev_step);

UPDATE _windows SET start_ns = least(_windows.start_ns, x.s)
FROM (SELECT e.rank, l.step, min(e.ts_ns) AS s
      FROM events e JOIN _late_step l ON e.rowid = l.rid
      WHERE e.kind IN ('compute', 'comm', 'memcpy', 'memset') GROUP BY ALL) x
WHERE _windows.rank = x.rank AND _windows.step = x.step;

-- W is the hull of the step's device work: a late event (no launch) that starts inside W but
-- ends after it extends W, else the step's activity would exceed W (negative idle).
UPDATE _windows SET end_ns = greatest(_windows.end_ns, x.t)
FROM (SELECT e.rank, l.step, max(e.ts_ns + e.dur_ns) AS t
      FROM events e JOIN _late_step l ON e.rowid = l.rid
      WHERE e.kind IN ('compute', 'comm', 'memcpy', 'memset') GROUP BY ALL) x
WHERE _windows.rank = x.rank AND _windows.step = x.step;
"""

# Ranks without any ProfilerStep span: one pseudo-step (-1) covering the whole trace.
_WHOLE_TRACE_SQL = """
INSERT INTO _windows
SELECT e.rank, -1, min(e.ts_ns), max(e.ts_ns + e.dur_ns),
       min(e.ts_ns) FILTER (WHERE NOT r.has_gpu OR e.device >= 0),
       max(e.ts_ns + e.dur_ns) FILTER (WHERE NOT r.has_gpu OR e.device >= 0)
FROM events e JOIN ranks r USING (rank)
WHERE e.rank NOT IN (SELECT rank FROM _cpu_steps)
  AND e.kind IN ('compute', 'comm', 'memcpy', 'memset', 'cpu_op', 'runtime', 'sync')
GROUP BY e.rank;
"""


def finish_database(con: duckdb.DuckDBPyConnection, groups: list[dict[str, Any]]) -> None:
    """Assign steps, fill the steps and process_groups tables, order events for fast scans."""
    con.execute(_STEP_SQL)
    con.execute(_WHOLE_TRACE_SQL)
    con.execute(
        """INSERT INTO steps SELECT rank, step, cpu_start_ns, cpu_end_ns, start_ns, end_ns,
           CASE WHEN step = -1 THEN 'trace' ELSE 'profiler_step' END FROM _windows
           WHERE start_ns IS NOT NULL ORDER BY rank, step"""
    )
    _fill_comm_args(con)
    cols = TABLE_BY_NAME["events"].column_names
    select = ", ".join(
        "coalesce(h.step, d.step, l.step, CASE WHEN e.rank IN (SELECT rank FROM _windows "
        "WHERE step = -1) THEN -1 END) AS step"
        if c == "step"
        else f'e."{c}"'
        for c in cols
    )
    con.execute(
        f"""CREATE TABLE _events_sorted AS SELECT {select}
        FROM events e LEFT JOIN _host_step h ON e.rowid = h.rid
        LEFT JOIN _dev_step d ON e.rowid = d.rid LEFT JOIN _late_step l ON e.rowid = l.rid"""
    )
    con.execute("DROP TABLE events")
    con.execute("ALTER TABLE _events_sorted RENAME TO events")
    for t in ("_cpu_steps", "_host_step", "_launch_step", "_dev_step", "_windows", "_late_step"):
        con.execute(f"DROP TABLE IF EXISTS {t}")
    _insert_groups(con, groups)
    con.execute(
        """UPDATE ranks SET pid = p.pid FROM (SELECT rank, mode(pid) AS pid FROM events
           WHERE device = -1 GROUP BY rank) p WHERE ranks.rank = p.rank AND ranks.pid IS NULL"""
    )
    con.execute(
        "CREATE OR REPLACE VIEW events_aligned AS SELECT e.*, "
        "e.ts_ns + COALESCE(r.clock_offset_ns, 0) AS ats_ns, "
        "e.ts_ns + COALESCE(r.clock_offset_ns, 0) + e.dur_ns AS aend_ns "
        "FROM events e LEFT JOIN ranks r USING (rank)"
    )


def _fill_comm_args(con: duckdb.DuckDBPyConnection) -> None:
    """Comm kernels without args inherit them from the host op that launched them
    (record_param_comms / c10d op with the same External id)."""
    con.execute(
        """UPDATE events SET pg_name = src.pg_name, in_nelems = src.in_nelems,
             out_nelems = src.out_nelems, dtype = src.dtype, group_size = src.group_size,
             seq = coalesce(events.seq, src.seq),
             coll_op = coalesce(src.coll_op, events.coll_op)
           FROM (SELECT rank, external_id, any_value(pg_name) AS pg_name,
                   any_value(in_nelems) AS in_nelems, any_value(out_nelems) AS out_nelems,
                   any_value(dtype) AS dtype, any_value(group_size) AS group_size,
                   any_value(seq) AS seq, any_value(coll_op) AS coll_op
                 FROM events WHERE device = -1 AND pg_name IS NOT NULL
                   AND external_id IS NOT NULL GROUP BY ALL) src
           WHERE events.kind = 'comm' AND events.device >= 0 AND events.pg_name IS NULL
             AND events.rank = src.rank AND events.external_id = src.external_id"""
    )


def _insert_groups(con: duckdb.DuckDBPyConnection, groups: list[dict[str, Any]]) -> None:
    """Merge the groups every rank reported (same pg_name = same group) and label them."""
    merged: dict[str, dict[str, Any]] = {}
    for g in groups:
        cur = merged.setdefault(g["pg_name"], dict(g))
        for key in ("pg_desc", "backend", "size"):
            if cur.get(key) is None and g.get(key) is not None:
                cur[key] = g[key]
        if g.get("ranks"):
            # pg_config lists members in group-rank order: keep the first full list, add others
            known = list(cur.get("ranks") or [])
            cur["ranks"] = known + [r for r in g["ranks"] if r not in known]
        if g.get("source") == "pg_config":
            cur["source"] = "pg_config"
    world = con.execute("SELECT max(world_size) FROM ranks").fetchall()[0][0]
    rows = []
    for name in sorted(merged, key=lambda n: (len(n), n)):
        g = merged[name]
        size = g.get("size") or (len(g["ranks"]) if g.get("ranks") else None)
        label, evidence = label_from_description(g.get("pg_desc"), size, world)
        rows.append(
            [
                name,
                g.get("pg_desc"),
                g.get("ranks"),
                size,
                g.get("backend"),
                label,
                evidence,
                g.get("source"),
            ]
        )
    if rows:
        con.executemany("INSERT INTO process_groups VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
