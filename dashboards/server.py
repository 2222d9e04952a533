"""Serve the dashboard for a run given as a database or as trace files.

Why here and not in the CLI: the CLI stays a thin narrator; this holds the port first (a
taken one is an error before any work: dashboards.port), reads (or computes) the analyses,
renders the first page as it is served (while the browser loads the page's scripts) and the
other pages after (Warmer). The run is opened like every other
command's (ingest.run.open_run: the same options, the same temporary ingest, removed when the
server stops, also on SIGTERM since the entry point turns it into an exception).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial

import dash
import flask
from ranklens.analysis.check_config import CheckConfig
from ranklens.analysis.results_keep import keep_run
from ranklens.dashboards import page_record
from ranklens.dashboards.app import create_app, page_paths, warm_pages
from ranklens.dashboards.data import RunData
from ranklens.dashboards.data_compare import Baseline, comparison
from ranklens.dashboards.port import Port
from ranklens.ingest.run import OpenOptions, open_run
from ranklens.ingest.threads import Helper

FIRST_PAGE_WAIT_S = 5.0  # the warming waits this long at most for the first page's request
DRAW_WAIT_S = 2.0  # then this long, while the browser draws that page (its CPU, not ours)


def serve(
    source: list[str],
    options: OpenOptions | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8050,
    log: Callable[[str], None] = print,
    baseline: str | None = None,
    check_config: CheckConfig | None = None,
    store: bool = True,
) -> None:
    """Hold the port, ingest if needed, analyze, and serve until interrupted (127.0.0.1 unless
    told; port 0: any free one).
    `baseline`: a second run (database or traces, opened the same way, read-only) that the
    compare page sets the first against, judged with `check_config` (run_compare.baseline_config
    of `dashboard --config/--max-regression`, so the page says what `check` would; None:
    ./pyproject.toml's thresholds). `store`: a database whose results are missing or stale
    gets them stored first (results_keep), so the next start serves them."""
    with ExitStack() as stack:
        held = Port.take(host, port)  # held by the console script already, if it could
        stack.callback(held.close)
        run = stack.enter_context(open_run(source, options))
        if store:  # a database's results stored first, when they are not
            keep_run(run, log)
        data = RunData(run.db_path)  # its own sandboxed connections: see Run
        stack.callback(data.close)
        base: Baseline | None = None
        if baseline is not None:
            base_run = stack.enter_context(open_run([baseline], options, for_baseline=True))
            base = Baseline(RunData(base_run.db_path), baseline, check_config)
            stack.callback(base.data.close)
        log("analyzing the run ...")
        data.report()  # stored by ingest: read back, else computed now
        app = create_app(run.db_path, data=data, baseline=base)
        app.enable_dev_tools(debug=False)  # what Dash's own `run` sets up (no dev tools)
        rest = Warmer(app, data, base)  # the first page as it is served, then the others
        stack.callback(rest.stop)  # before the run is closed (callbacks run last-in first)
        stack.callback(held.stop)  # first: no new request, and those in flight end
        log(f"ranklens dashboard on {held.url}  (Ctrl+C to stop)")
        held.serve(app.server)


class Warmer:
    """Warms the pages on a thread as the port opens. First the first page, while the
    browser fetches and compiles the page's scripts (~0.1-0.25 s; it used to wait for the
    server rendering it before the port opened); its request, if earlier, waits for that
    render (RunData.memo). Then what the first page does not need (this start's page kept for
    the next start to serve while it imports: page_record; the timeline's overview and lanes,
    the comparison, every other page's default view), so the other pages are ready by the time
    they are clicked; a page asked for before that is computed on demand (RunData keeps one of
    each). Those start DRAW_WAIT_S after the first page's content was asked for (or
    FIRST_PAGE_WAIT_S after the start), not to slow that page down: on 2 cores the warming took
    the CPU the browser needed to draw it (0.3 s of a 1.3 s draw)."""

    def __init__(self, app: dash.Dash, data: RunData, base: Baseline | None) -> None:
        self._halt = threading.Event()
        self._first = partial(warm_pages, app, ["/"])
        # first the page for the next start to serve early (cheap), then the heavy ones
        self._steps: list[Callable[[], object]] = [partial(page_record.record, app)]
        self._steps += [data.timeline_base, data.timeline_lanes]
        if base is not None:
            self._steps.append(lambda: comparison(data, base))
        self._steps += [partial(warm_pages, app, [p]) for p in page_paths() if p != "/"]
        self._served = threading.Event()
        app.server.after_request(self._seen)
        self._helper = Helper(self._run, name="ranklens-warm", daemon=True).start()

    def _seen(self, response: flask.Response) -> flask.Response:
        """The first page's content was asked for: warming may compete for the CPU now."""
        if flask.request.path == "/_dash-update-component":
            self._served.set()
        return response

    def _run(self) -> None:
        # while the browser loads the page's scripts; its request waits for this (memo). On a
        # failure the page computes it on demand, and shows its own error.
        with contextlib.suppress(Exception):
            self._first()
        if self._served.wait(FIRST_PAGE_WAIT_S):
            self._halt.wait(DRAW_WAIT_S)
        for step in self._steps:
            if self._halt.is_set():
                return
            try:
                step()
            except Exception:
                continue

    def stop(self) -> None:
        """Let the step in progress finish (it holds a connection to the run), skip the rest."""
        self._halt.set()
        self._served.set()
        self._helper.wait()
