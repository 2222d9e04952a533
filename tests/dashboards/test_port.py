"""`ranklens dashboard`'s port (dashboards.port): held before the run is read, so a port in use
is an `error:` with a `hint:` before any work (it was found after the analysis, after the URL
had been printed as if served, in werkzeug's words); served without werkzeug's and Flask's
banners or a log line per request; Ctrl+C and SIGTERM end it as before."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

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
