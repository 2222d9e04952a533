"""Serve the dashboard for a run given as a database or as trace files.

Why here and not in the CLI: the CLI stays a thin narrator; this owns the lifetime of the
temporary database made from trace files (kept while the server runs, removed after) and
computes the analyses before the port opens, so the first page is served from memory.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ranklens.dashboards.app import create_app, warm_pages
from ranklens.dashboards.data import RunData
from ranklens.ingest.database import is_database
from ranklens.ingest.loader import Progress, load_traces


@contextmanager
def database_for(
    source: list[str], *, on_error: str = "raise", progress: Progress | None = None
) -> Iterator[str]:
    """The path of a ranklens database for `source`: itself, or a temporary ingest of it."""
    if len(source) == 1 and is_database(source[0]):
        yield source[0]
        return
    tmp = tempfile.mkdtemp(prefix="ranklens-dashboard-")
    try:
        db = os.path.join(tmp, "run.duckdb")
        load_traces(source, db, on_error=on_error, progress=progress)
        yield db
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def serve(
    source: list[str],
    *,
    host: str = "127.0.0.1",
    port: int = 8050,
    on_error: str = "raise",
    log: Callable[[str], None] = print,
    debug: bool = False,
) -> None:
    """Ingest if needed, analyze, and serve until interrupted (127.0.0.1 unless told)."""
    if threading.current_thread() is threading.main_thread():
        # A terminated server (kill, timeout) still removes its temporary database.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with database_for(source, on_error=on_error) as db:
        data = RunData(db)
        try:
            log("analyzing the run ...")
            data.warm()
            app = create_app(db, data=data)
            warm_pages(app)
            log(f"ranklens dashboard on http://{host}:{port}/  (Ctrl+C to stop)")
            app.run(host=host, port=port, debug=debug, use_reloader=False)
        finally:
            data.close()
