"""`ranklens dashboard` on a run ingested before: the first page is rendered first, as the port
opens, from the results ingest stored (no dependency graph, no analysis recomputed), then every
other page, on a thread that stops before the run is closed; a request for a page being
rendered waits for that render instead of doing it twice."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import dash
import pytest
from ranklens.analysis import REGISTRY, critical_path, results_store
from ranklens.analysis import timeline as tl
from ranklens.dashboards import server
from ranklens.dashboards.app import page_paths
from ranklens.dashboards.data import current
from ranklens.ingest.run import ingest_traces

from .conftest import REPO

SAMPLE = REPO / "sample_traces" / "megatron_tp2_pp2_dp2" / "raw"


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("start") / "run.duckdb"
    ingest_traces([str(SAMPLE)], db, finalize=results_store.finalize_run)
    return db


def _page_keys(memo: Any) -> set[str]:
    return {k[1] for k in memo if isinstance(k, tuple) and k and k[0] == "page"}


def test_first_page_ready_at_start_and_the_rest_warmed_from_stored_results(
    stored: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("computed at start although ingest stored it")

    monkeypatch.setattr(critical_path, "model", refuse)  # the what-if fixes come stored
    monkeypatch.setattr(tl, "overview", refuse)  # the timeline overview comes stored
    for mod in REGISTRY:
        monkeypatch.setattr(mod, "run", refuse)
    seen: dict[str, Any] = {}
    real_init = server.Warmer.__init__

    def init(self: server.Warmer, app: dash.Dash, data: Any, base: Any) -> None:
        seen["at_port"] = _page_keys(data._memo)  # what is kept before the warming starts
        real_init(self, app, data, base)

    monkeypatch.setattr(server.Warmer, "__init__", init)
    real_warm = server.warm_pages
    order: list[list[str] | None] = []

    def warm(app: dash.Dash, paths: list[str] | None = None) -> None:
        order.append(paths)
        real_warm(app, paths)

    monkeypatch.setattr(server, "warm_pages", warm)

    def run(self: server.Port, wsgi_app: Any) -> None:
        with wsgi_app.test_request_context("/"):
            data = current()
            end = time.monotonic() + 120
            want = {
                m for m in (_module_of(p) for p in page_paths()) if m is not None
            }  # every page kept (keep=False pages, the SQL console, are never kept)
            while _page_keys(data._memo) < want and time.monotonic() < end:
                time.sleep(0.05)
            seen["warmed"] = _page_keys(data._memo)
            seen["want"] = want
            seen["base"] = data._cache.get("timeline_base")

    monkeypatch.setattr(server.Port, "serve", run)
    server.serve([str(stored)], port=0, log=lambda _: None)
    assert seen["at_port"] == set()  # the port opens without waiting for a page
    assert order[0] == ["/"] and ["/"] not in order[1:]  # the first page first, once
    assert seen["warmed"] == seen["want"] and len(seen["want"]) >= 5
    assert isinstance(seen["base"], tl.Overview)


def _module_of(path: str) -> str | None:
    """The module of the kept page at `path` (None: a page that is not kept)."""
    for page in dash.page_registry.values():
        if page["path"] == path:
            module = str(page["module"])
            return None if module.endswith(".sql") else module
    return None


def test_the_warmer_stops_before_the_run_is_closed(
    stored: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[server.Warmer] = []
    real_init = server.Warmer.__init__

    def init(self: server.Warmer, *a: Any) -> None:
        real_init(self, *a)
        threads.append(self)

    monkeypatch.setattr(server.Warmer, "__init__", init)
    monkeypatch.setattr(server.Port, "serve", lambda self, _app: None)  # Ctrl+C at once
    server.serve([str(stored)], port=0, log=lambda _: None)
    assert len(threads) == 1 and not threads[0]._helper.running


def test_a_page_being_built_is_built_once(stored: Path) -> None:
    """Two requests for one memo key at once (the warming thread and the browser's request):
    one build, both get its value; a failed build lets the next caller build."""
    import threading

    from ranklens.dashboards.data import RunData

    data = RunData(stored)
    try:
        calls: list[int] = []
        started, release = threading.Event(), threading.Event()

        def slow() -> str:
            calls.append(1)
            started.set()
            release.wait(10)
            return "page"

        got: list[str] = []
        first = threading.Thread(target=lambda: got.append(data.memo("k", slow)))
        first.start()
        assert started.wait(10)
        second = threading.Thread(target=lambda: got.append(data.memo("k", slow)))
        second.start()
        time.sleep(0.2)  # the second caller is waiting, not building
        assert len(calls) == 1
        release.set()
        first.join(10)
        second.join(10)
        assert got == ["page", "page"] and len(calls) == 1

        def broken() -> str:
            raise RuntimeError("no")

        with pytest.raises(RuntimeError):
            data.memo("j", broken)
        assert data.memo("j", lambda: "again") == "again"
    finally:
        data.close()


@pytest.mark.parametrize("store", [True, False])
def test_a_start_stores_the_results_a_run_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: bool
) -> None:
    """A run ingested with --results later (the views only): a start stores its results first
    (then serves them, and the next start builds no graph); with --no-store the file is left
    byte for byte as it was."""
    import hashlib

    import duckdb
    from ranklens.analysis.views import store_views

    db = tmp_path / "run.duckdb"
    ingest_traces([str(SAMPLE)], db, finalize=store_views)
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    monkeypatch.setattr(server.Port, "serve", lambda self, _app: None)  # Ctrl+C at once
    said: list[str] = []
    server.serve([str(db)], port=0, log=said.append, store=store)
    con = duckdb.connect(str(db), read_only=True)
    made = results_store.made_here(con)
    con.close()
    if not store:
        assert hashlib.sha256(db.read_bytes()).hexdigest() == before and not made
        assert not any("stor" in s for s in said)
        return
    assert made and any(s.startswith("stored them in") for s in said)

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("computed at start although the first start stored it")

    monkeypatch.setattr(critical_path, "model", refuse)
    for mod in REGISTRY:
        monkeypatch.setattr(mod, "run", refuse)
    said.clear()
    server.serve([str(db)], port=0, log=said.append)
    assert not any("stor" in s for s in said)
