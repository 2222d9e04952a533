"""`ranklens dashboard` as a user starts it twice: the first start keeps its page; the second
answers that page from its port while it is still ingesting its traces, and the page the
browser then draws is the run's, every callback answered by the app (headless chromium)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from ranklens.analysis import results_store
from ranklens.dashboards import early_page
from ranklens.ingest.run import ingest_traces

from .conftest import REPO
from .test_browser import DRAWN, open_page, severe_logs, wait_for
from .test_early_page import _free_port

pytestmark = [pytest.mark.browser, pytest.mark.slow]

RANKLENS = str(Path(sys.executable).with_name("ranklens"))
SAMPLE = REPO / "sample_traces" / "megatron_tp2_pp2_dp2" / "raw"


class Server:
    """A `ranklens dashboard` process; when each stderr line came (monotonic seconds)."""

    def __init__(self, source: Path, port: int, env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen(
            [RANKLENS, "dashboard", str(source), "--port", str(port)], cwd=cwd, env=env,
            text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append((time.monotonic(), line))

    def served_at(self) -> float | None:
        return next((t for t, ln in self.lines if ln.startswith("ranklens dashboard on ")), None)

    def stop(self) -> str:
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self._reader.join(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return "".join(ln for _t, ln in self.lines)


def _get(url: str, deadline: float) -> tuple[float, bytes]:
    while True:
        try:
            with urllib.request.urlopen(url, timeout=60) as r:
                return time.monotonic(), r.read()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def test_a_second_start_answers_the_kept_page_while_it_loads(browser: Any, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {**os.environ, early_page.CACHE_ENV: str(cache)}
    db = tmp_path / "run.duckdb"
    ingest_traces([str(SAMPLE)], db, finalize=results_store.finalize_run)

    # 1. a first start, the page opened: it keeps its page once the browser has drawn it
    port = _free_port()
    first = Server(db, port, env, tmp_path)
    try:
        end = time.monotonic() + 180
        while first.served_at() is None and first.proc.poll() is None:
            assert time.monotonic() < end, first.lines
            time.sleep(0.05)
        open_page(browser, f"http://127.0.0.1:{port}/", ".dash-graph")
        while not list(cache.glob("pages/*/manifest.json")):
            assert time.monotonic() < end and first.proc.poll() is None, first.lines
            time.sleep(0.1)
    finally:
        said = first.stop()
    assert "Traceback" not in said, said

    # 2. a start on the traces (ingested at start: seconds): "/" is answered before the run is
    # ready, from the kept copy, with this start's URL
    port = _free_port()
    url = f"http://127.0.0.1:{port}/"
    second = Server(SAMPLE, port, env, tmp_path)
    try:
        answered, body = _get(url, time.monotonic() + 60)
        ready = second.served_at()
        assert ready is None or answered < ready, second.lines  # before the URL was printed
        assert f'content="{url}"'.encode() in body and b"dash_renderer" in body
        kept = early_page.load(root=cache / "pages")
        assert kept is not None  # the same key in both processes
        asked = {"REQUEST_METHOD": "GET", "PATH_INFO": "/", "HTTP_HOST": f"127.0.0.1:{port}"}
        got = kept.answer(asked)
        assert got is not None and got[2] == body

        # the browser, on that page, waits for the app and draws the run
        severe_logs(browser)  # (read: what the first start's page logged as it was stopped)
        open_page(browser, url, ".dash-graph", poll=0.1)
        wait_for(browser, DRAWN)
        about = browser.find_element("id", "run-about").text
        assert "8 ranks" in about, about
        assert second.served_at() is not None
        assert severe_logs(browser) == []
    finally:
        said = second.stop()
    assert "Traceback" not in said, said
