"""Serve the dashboard for a run given as a database or as trace files.

Why here and not in the CLI: the CLI stays a thin narrator; this computes the analyses before
the port opens, so the first page is served from memory. The run is opened like every other
command's (ingest.run.open_run: the same options, the same temporary ingest, removed when the
server stops, also on SIGTERM since the entry point turns it into an exception).
"""

from __future__ import annotations

from collections.abc import Callable

from ranklens.dashboards.app import create_app, warm_pages
from ranklens.dashboards.data import RunData
from ranklens.ingest.run import OpenOptions, open_run


def serve(
    source: list[str],
    options: OpenOptions | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8050,
    log: Callable[[str], None] = print,
    debug: bool = False,
) -> None:
    """Ingest if needed, analyze, and serve until interrupted (127.0.0.1 unless told)."""
    with open_run(source, options) as run:
        data = RunData(run.db_path)  # its own sandboxed connections: see Run
        try:
            log("analyzing the run ...")
            data.warm()
            app = create_app(run.db_path, data=data)
            warm_pages(app)
            log(f"ranklens dashboard on http://{host}:{port}/  (Ctrl+C to stop)")
            app.run(host=host, port=port, debug=debug, use_reloader=False)
        finally:
            data.close()
