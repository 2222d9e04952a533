"""Serve the dashboard for a run given as a database or as trace files.

Why here and not in the CLI: the CLI stays a thin narrator; this computes the analyses before
the port opens, so the first page is served from memory. The run is opened like every other
command's (ingest.run.open_run: the same options, the same temporary ingest, removed when the
server stops, also on SIGTERM since the entry point turns it into an exception).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack

from ranklens.analysis.check_config import CheckConfig
from ranklens.dashboards.app import create_app, warm_pages
from ranklens.dashboards.data import RunData
from ranklens.dashboards.data_compare import Baseline, comparison
from ranklens.ingest.run import OpenOptions, open_run


def serve(
    source: list[str],
    options: OpenOptions | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8050,
    log: Callable[[str], None] = print,
    debug: bool = False,
    baseline: str | None = None,
    check_config: CheckConfig | None = None,
) -> None:
    """Ingest if needed, analyze, and serve until interrupted (127.0.0.1 unless told).
    `baseline`: a second run (database or traces, opened the same way, read-only) that the
    compare page sets the first against, judged with `check_config` (run_compare.baseline_config
    of `dashboard --config/--max-regression`, so the page says what `check` would; None:
    ./pyproject.toml's thresholds)."""
    with ExitStack() as stack:
        run = stack.enter_context(open_run(source, options))
        data = RunData(run.db_path)  # its own sandboxed connections: see Run
        stack.callback(data.close)
        base: Baseline | None = None
        if baseline is not None:
            base_run = stack.enter_context(open_run([baseline], options, for_baseline=True))
            base = Baseline(RunData(base_run.db_path), baseline, check_config)
            stack.callback(base.data.close)
        log("analyzing the run ...")
        data.warm()
        if base is not None:
            log(f"comparing with the baseline {baseline} ...")
            comparison(data, base)
        app = create_app(run.db_path, data=data, baseline=base)
        warm_pages(app)
        log(f"ranklens dashboard on http://{host}:{port}/  (Ctrl+C to stop)")
        app.run(host=host, port=port, debug=debug, use_reloader=False)
