"""The last start's page, kept and answered early: what is kept is what the app serves, a page
carries the asking request's URL (escaped), the port answers it before the app exists and
holds every other request until the app is there (or refuses it when the server stops)."""

from __future__ import annotations

import os
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import flask
import pytest
from ranklens.analysis import results_store
from ranklens.dashboards import early_page, page_record
from ranklens.dashboards.app import create_app, page_paths
from ranklens.dashboards.port import Port
from ranklens.ingest.run import ingest_traces

from .conftest import REPO

SAMPLE = REPO / "sample_traces" / "megatron_tp2_pp2_dp2" / "raw"
INDEX = b'<meta property="twitter:url" content="' + early_page.BASE.encode() + b'/">'


def _kept(tmp_path: Path) -> early_page.Page:
    responses = {
        "/": ("200 OK", [("Content-Type", "text/html; charset=utf-8")], INDEX, True),
        "/a.js": ("200 OK", [("Content-Type", "text/javascript")], b"var a = 1;", False),
        "/_favicon.ico?v=1": ("200 OK", [("Content-Type", "image/x-icon")], b"ico", False),
    }
    early_page.store(responses, "k", tmp_path)
    page = early_page.load("k", tmp_path)
    assert page is not None and early_page.same(page, responses)
    return page


def _environ(path: str, query: str = "", host: str = "127.0.0.1:8050", method: str = "GET") -> Any:
    return {
        "REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query,
        "HTTP_HOST": host, "wsgi.url_scheme": "http",
    }  # fmt: skip


def test_a_kept_page_carries_the_requests_url_escaped(tmp_path: Path) -> None:
    page = _kept(tmp_path)
    got = page.answer(_environ("/"))
    assert got is not None
    status, headers, body = got
    assert status == "200 OK" and b'content="http://127.0.0.1:8050/"' in body
    assert dict(headers)["Content-Length"] == str(len(body))
    evil = page.answer(_environ("/", host='x"><script>alert(1)</script>'))
    assert evil is not None and b"<script>" not in evil[2] and b"&quot;&gt;&lt;script" in evil[2]
    assert page.answer(_environ("/_favicon.ico", "v=1")) is not None  # path and query
    assert page.answer(_environ("/_favicon.ico", "v=2")) is None  # another version's
    assert page.answer(_environ("/a.js", method="POST")) is None  # only GETs
    assert page.answer(_environ("/_dash-layout")) is None  # the app's to answer


def test_a_copy_is_replaced_whole_and_old_keys_are_pruned(tmp_path: Path) -> None:
    _kept(tmp_path)
    for i in range(early_page.KEEP + 2):
        early_page.store({"/": ("200 OK", [], b"x", True)}, f"other{i}", tmp_path)
        os.utime(tmp_path / f"other{i}", (1000 + i, 1000 + i))  # in age order
    early_page.store({"/": ("200 OK", [], b"new", True)}, "k", tmp_path)
    page = early_page.load("k", tmp_path)
    assert page is not None and list(page.kept) == ["/"]  # no script of the old copy left
    kept = sorted(p.name for p in tmp_path.iterdir())
    newest = [f"other{i}" for i in range(2, early_page.KEEP + 2)]
    assert kept == sorted(["k", *newest])  # the KEEP newest others, no work folder
    assert early_page.load("missing", tmp_path) is None
    (tmp_path / "k").chmod(0o777)
    assert early_page.load("k", tmp_path) is None  # anyone could have written it
    (tmp_path / "k").chmod(0o700)
    manifest = tmp_path / "k" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"0.body"', '"../k/0.body"'))
    assert early_page.load("k", tmp_path) is None  # a body outside its folder
    manifest.write_text("{not json")
    assert early_page.load("k", tmp_path) is None  # a damaged copy is none


def test_the_key_follows_the_dashboards_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "app.py").write_text("a = 1\n")
    monkeypatch.setattr(early_page, "_HERE", tmp_path)
    before = early_page.page_key()
    assert early_page.page_key() == before  # stable
    (tmp_path / "app.py").write_text("a = 22\n")  # an edit (size and time)
    assert early_page.page_key() != before


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Any:
    db = tmp_path_factory.mktemp("early") / "run.duckdb"
    ingest_traces([str(SAMPLE)], db, finalize=results_store.finalize_run)
    return create_app(db)


def test_what_is_kept_is_what_the_app_serves(
    app: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(early_page.CACHE_ENV, str(tmp_path))
    assert page_record.record(app)
    assert not page_record.record(app)  # kept already: nothing written
    page = early_page.load()
    assert page is not None
    assert {p for p, k in page.kept.items() if k.index} == set(page_paths())
    scripts = [p for p, k in page.kept.items() if not k.index]
    assert any("dash_renderer" in p for p in scripts) and any("plotly" in p for p in scripts)
    client = app.server.test_client()
    for path in scripts:  # byte for byte, with the app's type and caching
        got = page.answer(_environ(*path.split("?", 1)))
        assert got is not None, path
        with client.get(path) as real:
            assert got[2] == real.get_data(), path
            assert dict(got[1])["Content-Type"] == real.headers["Content-Type"]
    early = page.answer(_environ("/pipeline", host="localhost"))
    assert early is not None
    with client.get("/pipeline") as real:  # the test client's URL is http://localhost/...
        assert early[2] == page_record._END_ID.sub(b'"end_id":null', real.get_data())
    assert b'"end_id":null' in early[2]  # (Dash's signed id of another process: dropped)


def test_an_unwritable_cache_is_no_error(
    app: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(early_page.CACHE_ENV, str(blocker))
    assert not page_record.record(app)


def _get(url: str, out: dict[str, Any], name: str) -> None:
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            out[name] = (r.status, r.read(), time.monotonic())
    except urllib.error.HTTPError as exc:
        out[name] = (exc.code, exc.read(), time.monotonic())


def test_the_port_answers_the_kept_page_and_holds_the_rest_for_the_app(tmp_path: Path) -> None:
    page = _kept(tmp_path)
    held = Port("127.0.0.1", 0)
    held.serve_early(page)
    got: dict[str, Any] = {}
    try:
        _get(held.url, got, "index")  # no app yet
        assert got["index"][0] == 200 and f'content="{held.url}"'.encode() in got["index"][1]
        asker = threading.Thread(target=_get, args=(held.url + "_dash-layout", got, "layout"))
        asker.start()
        time.sleep(0.5)
        assert "layout" not in got  # waits for the app
        app = flask.Flask("early_test")
        app.add_url_rule("/_dash-layout", "layout", lambda: "from the app")
        given = time.monotonic()
        serving = threading.Thread(target=held.serve, args=(app,), daemon=True)
        serving.start()
        asker.join(60)
        assert got["layout"][:2] == (200, b"from the app") and got["layout"][2] >= given
    finally:
        held.stop(within=5)
        held.close()
    serving.join(5)
    assert not serving.is_alive()  # serve returns once the port is closed


def test_requests_waiting_for_an_app_that_never_comes_are_refused(tmp_path: Path) -> None:
    """The run could not be opened (a bad input): the server closes its port; the browser's
    waiting requests end with 503 instead of hanging."""
    held = Port("127.0.0.1", 0)
    held.serve_early(_kept(tmp_path))
    got: dict[str, Any] = {}
    asker = threading.Thread(target=_get, args=(held.url + "_dash-layout", got, "layout"))
    asker.start()
    time.sleep(0.3)
    held.close()
    asker.join(30)
    assert got["layout"][0] == 503


def test_the_server_takes_the_early_port_only_for_the_same_address() -> None:
    from ranklens.dashboards import port as port_mod

    port_mod.hold_early("127.0.0.1", 0)
    early = port_mod._EARLY[0]
    assert Port.take("127.0.0.1", 0) is early and not port_mod._EARLY
    early.close()
    port_mod.hold_early("127.0.0.1", 0)
    other = port_mod._EARLY[0]
    fresh = Port.take("127.0.0.1", _free_port())
    try:
        assert fresh is not other and other._stopping  # let go
    finally:
        fresh.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
