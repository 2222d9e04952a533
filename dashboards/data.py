"""The dashboard's access to one run: a sandboxed connection and the analysis results, cached.

Why one object per app: the factory gets a database path and nothing may be loaded at import
time; pages and callbacks reach this object through the Flask app that serves the request, so
several apps (tests) can live in one process. Results are computed once (analyses can take
seconds on a large run) and shared by every page; every caller gets its own cursor because one
DuckDB connection is not safe across threads. The connection is sandboxed like the SQL
console's (read-only, no file access, no extensions), so no page can do more than the console
can; the console's own queries run in processes of their own (analysis.sql_isolated).
"""

from __future__ import annotations

import os
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import duckdb
import flask
import polars as pl
from ranklens.analysis import Result, by_name, timeline_store
from ranklens.analysis import timeline as tl
from ranklens.analysis import timeline_lanes as tlz
from ranklens.analysis import timeline_overlays as ovl
from ranklens.analysis.report import Report, build_report, run_facts
from ranklens.analysis.sql_console import cursor as sandboxed_cursor
from ranklens.analysis.sql_console import safe_connect

CONFIG_KEY = "RANKLENS_RUN"
MEMO_SIZE = 64  # pages and figures kept per run (each page and deep link, a few figures)
RESULTS_KEPT = 8  # SQL console results kept for their grids to page through
RESULTS_BYTES = 256 << 20  # ... and at most this much of them (the newest always kept)
_JS_SAFE_INT = 2**53  # integers beyond this lose digits as JavaScript numbers
MAX_OUTLINES = 300  # evidence events outlined in one timeline window (the longest first)

# What a finding's evidence is on the timeline, by code prefix (first match wins): the events
# of these kinds, of this parallelism (None: any), only where communication was exposed.
EVIDENCE: tuple[tuple[str, tuple[str, ...], str | None, bool], ...] = (
    ("OVERLAP_", ("comm",), None, True),
    ("STRAGGLER_EXPOSED_WAIT", ("comm",), None, True),
    ("STRAGGLER_COMPUTE", ("compute",), None, False),
    ("STRAGGLER_", ("comm",), None, False),
    ("PIPELINE_DP_INTO_BUBBLES", ("comm",), "DP", False),
    ("PIPELINE_STAGE_IMBALANCE", ("compute",), None, False),
    ("PIPELINE_", ("comm",), "PP", False),
    ("CONTENTION_COMPUTE", ("compute",), None, False),
    ("CONTENTION_MEMCPY", ("memcpy",), None, False),  # the finding is about copies only
    ("CONTENTION_", ("comm",), None, False),
    ("COLLECTIVE_", ("comm",), None, False),
    ("BREAKDOWN_COMM", ("comm",), None, False),
)


class RunData:
    """One run's database, its analysis results and timeline facts, computed on first use."""

    def __init__(self, db_path: str | os.PathLike[str]) -> None:
        self.db_path = str(db_path)
        self._con = safe_connect(self.db_path, memory_limit=None)  # runs no user text
        self._lock = threading.RLock()
        self._report: Report | None = None
        self._errors: dict[str, str] = {}
        self._extent: tl.Extent | None = None
        self._cache: dict[str, Any] = {}
        self._memo: OrderedDict[Hashable, Any] = OrderedDict()
        self._building: dict[Hashable, threading.Lock] = {}  # memo keys being built
        self.results = ResultStore()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A fresh connection to the same sandboxed database, for one callback."""
        with self._lock:
            return sandboxed_cursor(self._con, self.db_path)

    def close(self) -> None:
        self._con.close()

    def report(self) -> Report:
        """Every registered analysis and the findings, ranked as the CLI report ranks them."""
        with self._lock:
            if self._report is None:
                self._report = self._build()
            return self._report

    def _build(self) -> Report:
        cur = self.cursor()
        try:
            try:
                return build_report(cur)
            except Exception:  # one analysis failing must not take the other pages down
                ok: list[str] = []
                for mod in by_name().values():
                    one = self.cursor()
                    try:
                        mod.run(one)
                        ok.append(mod.NAME)
                    except Exception as exc:
                        self._errors[mod.NAME] = f"{type(exc).__name__}: {exc}"
                    finally:
                        one.close()
                if ok:
                    return build_report(cur, tuple(ok))
                return Report(run_facts(cur), {}, ())
        finally:
            cur.close()

    def result(self, name: str) -> Result | None:
        """The named analysis' result; None when it is not registered or it failed."""
        if name not in by_name():
            return None
        return self.report().results.get(name)

    def error(self, name: str) -> str | None:
        """Why the named analysis has no result, or None."""
        self.report()
        if name in self._errors:
            return self._errors[name]
        if name not in by_name():
            return f"the {name} analysis is not available in this version of ranklens"
        return None

    def extent(self) -> tl.Extent:
        """The run's time range on the job clock (origin of every relative time shown)."""
        with self._lock:
            if self._extent is None:
                cur = self.cursor()
                try:
                    self._extent = tl.extent(cur)
                finally:
                    cur.close()
            return self._extent

    def cached(self, key: str, fn: Any) -> Any:
        """`fn(cursor)` computed once per run (step windows, rank lists: small, immutable)."""
        with self._lock:
            if key not in self._cache:
                cur = self.cursor()
                try:
                    self._cache[key] = fn(cur)
                finally:
                    cur.close()
            return self._cache[key]

    def memo(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """`build()` once per `key` (least recently used dropped past MEMO_SIZE). For pages and
        figures: the results they draw never change while the run is served, and building
        one (plotly validates every value) costs more than sending it. A caller that asks for
        a key being built waits for that build (the first page's request arriving while the
        warming thread renders it) instead of building it a second time beside it."""
        with self._lock:
            if key in self._memo:
                self._memo.move_to_end(key)
                return self._memo[key]
            building = self._building.setdefault(key, threading.Lock())
        with building:
            with self._lock:
                if key in self._memo:
                    self._memo.move_to_end(key)
                    return self._memo[key]
            try:
                value = build()
            except BaseException:
                with self._lock:
                    self._building.pop(key, None)
                raise
            with self._lock:
                self._memo[key] = value
                self._building.pop(key, None)
                while len(self._memo) > MEMO_SIZE:
                    self._memo.popitem(last=False)
        return value

    def timeline_base(self) -> tl.Overview:
        """The run's busy time in fixed buckets, which zoomed-out timeline views re-aggregate."""
        ext = self.extent()
        base = self.cached("timeline_base", lambda cur: timeline_store.overview(cur, ext))
        assert isinstance(base, tl.Overview)
        return base

    def timeline_lanes(self) -> pl.DataFrame:
        """Every lane of the run with its rows and name (analysis.timeline_lanes.lanes): the
        timeline shows the same lanes at every zoom."""
        lanes = self.cached("timeline_lanes", tlz.lanes)
        assert isinstance(lanes, pl.DataFrame)
        return lanes

    def grow_lanes(self, need: pl.DataFrame) -> None:
        """Lanes that a drawn window stacks deeper than their rows (rank, stream, rows: a
        sampled sweep missed those slices) get those rows from now on, at most MAX_ROWS."""
        lanes = self.timeline_lanes()
        grown = (
            lanes.join(need, on=["rank", "stream"], how="left", suffix="_need")
            .with_columns(
                pl.max_horizontal("rows", pl.col("rows_need").clip(upper_bound=tlz.MAX_ROWS))
                .fill_null(pl.col("rows"))
                .cast(lanes.schema["rows"])
            )
            .select(lanes.columns)
        )
        if not grown["rows"].equals(lanes["rows"]):
            with self._lock:
                self._cache["timeline_lanes"] = grown

    def warm(self) -> None:
        """Compute everything pages need up front (the CLI does this before serving)."""
        self.report()
        self.timeline_base()
        self.timeline_lanes()


def evidence(
    cur: duckdb.DuckDBPyConnection,
    win: tl.Window,
    code: str,
    ranks: list[int] | None,
    ext: tl.Extent | None = None,
) -> pl.DataFrame | None:
    """The events of a timeline window that are a finding's evidence (EVIDENCE), on `ranks`
    (None: all), at most MAX_OUTLINES, as rows (rank, stream, start_ns, end_ns) to outline;
    None when the code has no evidence events (idle time, alignment). From the window's own
    events (the longest first), or, when it is aggregated into buckets, from the database:
    there exposed-only evidence is computed from the raw events (analysis.timeline
    .exposed_events, the most exposed first; `ext`: the run's, else read here), since the
    window's own exposed segments are packed per bucket."""
    spec = next((e for e in EVIDENCE if code.startswith(e[0])), None)
    if spec is None:
        return None
    _, kinds, par, exposed = spec
    if win.mode != "events" and exposed:
        ext = ext if ext is not None else tl.extent(cur)
        hit = tl.exposed_events(cur, ext, win.start_ns, win.end_ns, ranks, kinds, par, MAX_OUTLINES)
        return hit.select("rank", "stream", "start_ns", "end_ns")
    if win.mode != "events":
        return _evidence_query(cur, win, kinds, par, ranks)
    ev = win.events.filter(pl.col("kind").is_in(kinds))
    if ranks:
        ev = ev.filter(pl.col("rank").is_in(ranks))
    if par is not None:
        ev = ev.filter(pl.col("parallelism") == par)
    if exposed:  # no exposed segment in view: no evidence (not every comm event)
        seg = (
            _segments(win)
            .filter(pl.col("label") == "exposed")
            .select("rank", pl.col("s").alias("xs"), pl.col("e").alias("xe"))
        )
        hit = ev.join(seg, on="rank").filter(
            (pl.col("xs") < pl.col("e")) & (pl.col("xe") > pl.col("s"))
        )
        ev = hit.select(ev.columns).unique(maintain_order=True)
    return (
        ev.sort("dur_ns", descending=True)
        .head(MAX_OUTLINES)
        .select("rank", "stream", pl.col("s").alias("start_ns"), pl.col("e").alias("end_ns"))
    )


def _segments(win: tl.Window) -> pl.DataFrame:
    return win.segments if "label" in win.segments.columns else ovl.empty()


def _evidence_query(
    cur: duckdb.DuckDBPyConnection,
    win: tl.Window,
    kinds: tuple[str, ...],
    par: str | None,
    ranks: list[int] | None,
) -> pl.DataFrame:
    table = cur.sql(
        """WITH g AS (SELECT pg_name, any_value(parallelism) AS parallelism
                      FROM process_groups GROUP BY pg_name)
        SELECT e.rank, e.stream, e.ats_ns AS start_ns, e.aend_ns AS end_ns
        FROM events_aligned e LEFT JOIN g USING (pg_name)
        WHERE list_contains($kinds, e.kind::VARCHAR) AND e.ats_ns < $end AND e.aend_ns > $start
          AND ($ranks IS NULL OR list_contains($ranks, e.rank))
          AND ($par IS NULL OR g.parallelism = $par)
        ORDER BY e.dur_ns DESC LIMIT $n""",
        params={
            "kinds": list(kinds),
            "start": win.start_ns,
            "end": win.end_ns,
            "ranks": ranks,
            "par": par,
            "n": MAX_OUTLINES,
        },
    ).to_arrow_table()
    out = pl.from_arrow(table)
    assert isinstance(out, pl.DataFrame)
    return out


class ResultStore:
    """SQL console results kept on the server under a random key, so the page's grid fetches
    only the rows it shows (a block at a time) instead of the browser receiving them all:
    100,000 rows sent as one table froze the page. Bounded in count and bytes."""

    def __init__(self, kept: int = RESULTS_KEPT, max_bytes: int = RESULTS_BYTES) -> None:
        self._kept, self._max_bytes = kept, max_bytes
        self._lock = threading.Lock()
        self._frames: OrderedDict[str, pl.DataFrame] = OrderedDict()

    def put(self, df: pl.DataFrame) -> str:
        key = secrets.token_hex(8)
        with self._lock:
            self._frames[key] = df
            while len(self._frames) > 1 and (
                len(self._frames) > self._kept
                or sum(f.estimated_size() for f in self._frames.values()) > self._max_bytes
            ):
                self._frames.popitem(last=False)
        return key

    def get(self, key: str) -> pl.DataFrame | None:
        with self._lock:
            return self._frames.get(key)


def result_rows(
    df: pl.DataFrame, start: int, end: int, sort: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Rows `start`..`end` of a console result as JSON-safe records keyed `c0`, `c1`, ...
    (by position: column names may hold dots or repeat), sorted as the grid asks
    ([{"colId": "c2", "sort": "desc"}]). Integers past 2**53, dates, durations, lists and
    structs become text, so the browser shows them exactly."""
    by = [(int(s["colId"][1:]), s.get("sort") == "desc") for s in sort or [] if _col_id(s, df)]
    if by:
        df = df.sort([df.columns[i] for i, _ in by], descending=[d for _, d in by], nulls_last=True)
    part = df.slice(start, max(end - start, 0))
    cols = [_json_safe(part[name]).alias(f"c{i}") for i, name in enumerate(part.columns)]
    return pl.DataFrame(cols).to_dicts() if cols else []


def _col_id(sort: dict[str, Any], df: pl.DataFrame) -> bool:
    cid = str(sort.get("colId", ""))
    return cid[:1] == "c" and cid[1:].isdigit() and int(cid[1:]) < df.width


def _json_safe(col: pl.Series) -> pl.Series:
    """`col` (a block of rows) as values JSON and JavaScript hold exactly."""
    dtype = col.dtype
    if dtype.is_integer():
        ends = [v for v in (col.min(), col.max()) if isinstance(v, int)]
        return col.cast(pl.Utf8) if any(abs(v) >= _JS_SAFE_INT for v in ends) else col
    if dtype.is_float():
        return col.fill_nan(None)
    if dtype in (pl.Utf8, pl.Boolean, pl.Null):
        return col
    if dtype.is_nested() or dtype in (pl.Object, pl.Binary):
        return pl.Series([None if v is None else str(v) for v in col.to_list()], dtype=pl.Utf8)
    return col.cast(pl.Utf8)


def current() -> RunData:
    """The run of the app serving this request."""
    data = flask.current_app.config[CONFIG_KEY]
    assert isinstance(data, RunData)
    return data
