"""`ranklens dashboard`'s port (dashboards.port): held before the run is read, so a port in use
is an `error:` with a `hint:` before any work (it was found after the analysis, after the URL
had been printed as if served, in werkzeug's words); served without werkzeug's and Flask's
banners or a log line per request; Ctrl+C and SIGTERM end it as before, once the requests
being answered have ended (the run was closed under them: a traceback, or DuckDB's abort)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import flask
import pytest
from ranklens.dashboards import server
from ranklens.dashboards.port import Port
from ranklens.ingest.errors import RanklensError

from .conftest import REPO

RANKLENS = str(Path(sys.executable).with_name("ranklens"))
SAMPLE = REPO / "sample_traces" / "megatron_tp2_pp2_dp2" / "raw"


@pytest.fixture
def taken() -> Iterator[int]:
    """A port another program listens on."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        yield int(s.getsockname()[1])


def test_a_port_in_use_says_so_and_what_to_do(taken: int) -> None:
    with pytest.raises(RanklensError) as err:
        Port("127.0.0.1", taken)
    assert f"port {taken} on 127.0.0.1 is in use" in err.value.message
    assert err.value.hint is not None and f"--port {taken + 1}" in err.value.hint


@pytest.mark.parametrize(
    ("host", "port", "said"),
    [
        ("127.0.0.1", 70000, "--port 70000 is not a port number"),
        ("127.0.0.1", -1, "--port -1 is not a port number"),
        ("nosuchhost.invalid", 0, "cannot serve on nosuchhost.invalid port 0"),
        ("192.0.2.1", 0, "cannot serve on 192.0.2.1 port 0"),  # TEST-NET: not this machine's
    ],
)
def test_a_port_that_cannot_be_had_is_a_clear_error(host: str, port: int, said: str) -> None:
    with pytest.raises(RanklensError) as err:
        Port(host, port)
    assert said in err.value.message and err.value.hint, (err.value.message, err.value.hint)


def test_port_0_takes_a_free_port_and_says_which() -> None:
    held = Port("127.0.0.1", 0)
    try:
        assert held.number > 0 and held.url == f"http://127.0.0.1:{held.number}/"
        with socket.create_connection(("127.0.0.1", held.number), timeout=5):
            pass  # listening (queued) before it serves
    finally:
        held.close()


def test_a_stop_waits_for_the_requests_being_answered(caplog: pytest.LogCaptureFixture) -> None:
    """A request being answered when the server stops (its query reading the run, which is
    closed next) ends first; a new one is refused (503); what the first raises as the run
    closes is not logged, while an error before the stop is."""
    entered, release = threading.Event(), threading.Event()
    app = flask.Flask("port_stop_test")

    @app.route("/boom")
    def boom() -> str:
        raise RuntimeError("an error before the stop")

    @app.route("/slow")
    def slow() -> str:
        entered.set()
        release.wait(60)
        raise RuntimeError("the run was closed under this query")

    held = Port("127.0.0.1", 0)
    threading.Thread(target=held.serve, args=(app,), daemon=True).start()
    codes: dict[str, int] = {}

    def ask(path: str) -> None:
        try:
            urllib.request.urlopen(held.url + path, timeout=60)
        except urllib.error.HTTPError as exc:
            codes[path] = exc.code

    try:
        ask("boom")
        assert codes["boom"] == 500 and "Exception on /boom" in caplog.text
        asker = threading.Thread(target=ask, args=("slow",))
        asker.start()
        assert entered.wait(60)
        stopped: list[bool] = []
        stopping = threading.Thread(target=lambda: stopped.append(held.stop(within=60)))
        stopping.start()
        while not held._stopping:
            time.sleep(0.01)
        ask("late")
        assert codes["late"] == 503
        assert stopping.is_alive() and not stopped  # still waiting for /slow
        release.set()
        stopping.join(60)
        asker.join(60)
        assert stopped == [True] and codes["slow"] == 500
        assert "Exception on /slow" not in caplog.text
    finally:
        release.set()
        held._server.shutdown()
        held.close()


def test_the_port_is_held_before_the_run_is_read(taken: int, tmp_path: Path) -> None:
    """A run that does not exist: the taken port is what the user hears of, at once."""
    said: list[str] = []
    with pytest.raises(RanklensError, match="is in use"):
        server.serve([str(tmp_path / "missing.duckdb")], port=taken, log=said.append)
    assert said == []  # not "analyzing the run ..."


def _start(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [RANKLENS, "dashboard", *args], cwd=cwd, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _url_of(proc: subprocess.Popen[str]) -> tuple[str, list[str]]:
    """The URL the dashboard printed (its stderr lines up to it)."""
    assert proc.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("ranklens dashboard on "):
            return line.split()[3], lines
    proc.kill()
    pytest.fail(f"no URL printed: {lines} {proc.communicate()}")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stop", "code", "word"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")],
)
def test_the_dashboard_says_its_url_and_nothing_per_request(
    tmp_path: Path, stop: signal.Signals, code: int, word: str
) -> None:
    proc = _start([str(SAMPLE), "--port", "0"], tmp_path)
    try:
        url, before = _url_of(proc)
        port = int(url.rsplit(":", 1)[1].strip("/"))
        assert url == f"http://127.0.0.1:{port}/" and port != 8050
        for path in ("", "_dash-layout", "_dash-dependencies"):
            with urllib.request.urlopen(url + path, timeout=60) as r:
                assert r.status == 200
        proc.send_signal(stop)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    said = "".join(before) + err
    assert proc.returncode == code and said.rstrip().endswith(word), (proc.returncode, said)
    assert "Traceback" not in said
    # ranklens' own lines only: no banner (Dash's, Flask's, werkzeug's), no request lines
    assert out == "", out
    assert [line for line in said.splitlines() if line.strip()] == [
        "analyzing the run ...",
        f"ranklens dashboard on {url}  (Ctrl+C to stop)",
        word,
    ], said


@pytest.mark.slow
def test_a_second_dashboard_on_the_same_port_fails_before_reading(
    taken: int, tmp_path: Path
) -> None:
    proc = subprocess.run(
        [RANKLENS, "dashboard", str(SAMPLE), "--port", str(taken)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc
    assert proc.stderr.startswith(f"error: port {taken} on 127.0.0.1 is in use"), proc.stderr
    assert "hint: " in proc.stderr and "analyzing" not in proc.stderr, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
