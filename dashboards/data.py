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
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import duckdb
import flask
from ranklens.analysis import BY_NAME, REGISTRY, Result
from ranklens.analysis import timeline as tl
from ranklens.analysis.report import Report, build_report, run_facts
from ranklens.analysis.sql_console import safe_connect

CONFIG_KEY = "RANKLENS_RUN"
MEMO_SIZE = 64  # pages and figures kept per run (each page and deep link, a few figures)


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

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A fresh connection to the same sandboxed database, for one callback."""
        with self._lock:
            return self._con.cursor()

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
                for mod in REGISTRY:
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
        if name not in BY_NAME:
            return None
        return self.report().results.get(name)

    def error(self, name: str) -> str | None:
        """Why the named analysis has no result, or None."""
        self.report()
        if name in self._errors:
            return self._errors[name]
        if name not in BY_NAME:
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
        one (plotly validates every value) costs more than sending it."""
        with self._lock:
            if key in self._memo:
                self._memo.move_to_end(key)
                return self._memo[key]
        value = build()
        with self._lock:
            self._memo[key] = value
            while len(self._memo) > MEMO_SIZE:
                self._memo.popitem(last=False)
        return value

    def timeline_base(self) -> tl.Overview:
        """The run's busy time in fixed buckets, which zoomed-out timeline views re-aggregate."""
        ext = self.extent()
        base = self.cached("timeline_base", lambda cur: tl.overview(cur, ext))
        assert isinstance(base, tl.Overview)
        return base

    def warm(self) -> None:
        """Compute everything pages need up front (the CLI does this before serving)."""
        self.report()
        self.timeline_base()


def current() -> RunData:
    """The run of the app serving this request."""
    data = flask.current_app.config[CONFIG_KEY]
    assert isinstance(data, RunData)
    return data
