"""The console script starts an ingest's decoding workers' server before its own imports, so
the two boot side by side (workpool.prestart_workers), only for an ingest that will likely use
workers, and holds a dashboard's port before dash, numpy or the CLI is imported (port.hold_early);
its early reading of the command line agrees with the CLI's options."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from ranklens.cli.entry import INGEST_VALUED, dashboard_port, pooled_ingest
from ranklens.cli.main import app
from ranklens.dashboards.port import DEFAULT_HOST, DEFAULT_PORT

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "megatron_tp2_pp2_dp2" / "raw"


def test_the_valued_options_are_the_clis() -> None:
    cmd = typer.main.get_command(app).commands["ingest"]  # type: ignore[attr-defined]
    valued = {o for p in cmd.params if not getattr(p, "is_flag", False) for o in p.opts}
    assert valued - {p.name for p in cmd.params if p.param_type_name == "argument"} == set(
        INGEST_VALUED
    )


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["ingest", "runs/a", "-o", "a.duckdb"], (["runs/a"], None)),
        (
            ["ingest", "-o", "a.duckdb", "x.json", "y.json", "--workers", "4"],
            (["x.json", "y.json"], 4),
        ),
        (["ingest", "--workers=1", "--skip-bad", "d"], (["d"], 1)),
        (["ingest", "--layout", "tp=2,pp=2", "--no-align", "d", "-o", "o"], (["d"], None)),
        (["ingest", "--", "-odd-name", "-o"], (["-odd-name", "-o"], None)),
        (["ingest", "d", "-o", "o", "--engine", "ray"], None),
        (["ingest", "d", "--engine=local"], (["d"], None)),
        (["ingest", "d", "--workers", "many"], None),
        (["ingest", "--help"], None),
        (["report", "d"], None),
        ([], None),
    ],
)
def test_reading_an_ingests_command_line(args: list[str], want: object) -> None:
    assert pooled_ingest(args) == want


# The console script's main as the `ranklens` command runs it, after lowering the bytes from
# which an ingest uses workers (the sample is small) and recording, at the server's start, what
# the process had imported; then whether the workers decoded (a pool started) and the server ran.
_CODE = """
import json, sys
from multiprocessing import forkserver
import ranklens.ingest.workpool as workpool
workpool.SERIAL_BELOW_BYTES = 0
seen = {"started_with": None, "pools": 0}
_start = forkserver.ensure_running
def ensure_running():
    if seen["started_with"] is None:
        seen["started_with"] = sorted(
            m for m in ("ranklens.cli.main", "ranklens.analysis") if m in sys.modules)
    _start()
forkserver.ensure_running = ensure_running
_pool = workpool.worker_pool
def worker_pool(*a):
    seen["pools"] += 1
    return _pool(*a)
workpool.worker_pool = worker_pool
from ranklens.cli.entry import main
sys.argv = ["ranklens", "ingest", SAMPLE, "-o", OUT, *EXTRA]
try:
    main()
except SystemExit as stop:
    assert not stop.code, stop.code
seen["server"] = forkserver._forkserver._forkserver_pid is not None
print(json.dumps(seen))
"""


def _console_script(tmp: Path, extra: list[str]) -> dict[str, object]:
    code = (
        _CODE.replace("SAMPLE", repr(str(SAMPLE)))
        .replace("OUT", repr(str(tmp / "r.duckdb")))
        .replace("EXTRA", repr(extra))
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=os.environ
    )
    assert res.returncode == 0, res.stderr
    assert "ingested 8 rank(s)" in res.stdout
    got: dict[str, object] = json.loads(res.stdout.strip().splitlines()[-1])
    return got


def test_an_ingest_starts_its_workers_server_before_the_clis_imports(tmp_path: Path) -> None:
    got = _console_script(tmp_path, ["--workers", "2"])
    assert got["started_with"] == []  # neither the CLI nor the analyses imported yet
    assert got["pools"] == 1 and got["server"] is True  # and the workers it served decoded


def test_one_worker_starts_no_server(tmp_path: Path) -> None:
    got = _console_script(tmp_path, ["--workers", "1"])
    assert got == {"started_with": None, "pools": 0, "server": False}


def test_the_inputs_size_guess(tmp_path: Path) -> None:
    """Directories walked, globs expanded, missing paths worth nothing; the guess stops once
    the bytes are reached."""
    from ranklens.ingest.workpool import _holds_bytes

    (tmp_path / "run" / "sub").mkdir(parents=True)
    (tmp_path / "run" / "a.json").write_bytes(b"x" * 600)
    (tmp_path / "run" / "sub" / "b.json").write_bytes(b"x" * 500)
    (tmp_path / "c.sqlite").write_bytes(b"x" * 100)
    run, c = str(tmp_path / "run"), str(tmp_path / "c.sqlite")
    assert _holds_bytes([run], 1100) and not _holds_bytes([run], 1101)
    assert _holds_bytes([run, c, str(tmp_path / "missing")], 1200)
    assert not _holds_bytes([str(tmp_path / "run" / "*.json")], 601)
    assert _holds_bytes([str(tmp_path / "run" / "**" / "*.json")], 1100)
    assert not _holds_bytes([], 1)


def test_a_ctrl_c_while_the_command_loads_is_no_traceback() -> None:
    """The stop lands in the CLI's own import (as one 0.5 s into `ranklens ingest` did)."""
    code = (
        "import signal, sys\n"
        "import ranklens.cli.entry as entry\n"
        "class Stop:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'ranklens.cli.main':\n"
        "            signal.raise_signal(signal.SIGINT)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Stop())\n"
        "sys.argv = ['ranklens', 'report', 'nowhere']\n"
        "entry.main()\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 130, res.stderr
    assert res.stderr.strip() == "interrupted" and "Traceback" not in res.stderr


def test_a_server_that_cannot_start_early_is_left_to_the_ingest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A machine out of sockets or processes at that moment: no error before the CLI runs (the
    ingest's own pool starts it, or reports why it cannot)."""
    from multiprocessing import forkserver

    from ranklens.ingest import workpool

    def refuse() -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(forkserver, "ensure_running", refuse)
    (tmp_path / "big.json").write_bytes(b"x" * 64)
    monkeypatch.setattr(workpool, "SERIAL_BELOW_BYTES", 10)
    assert workpool.prestart_workers([str(tmp_path / "big.json")], 2) is False


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["dashboard", "run.duckdb"], ("127.0.0.1", 8050)),
        (["dashboard", "run.duckdb", "--port", "0"], ("127.0.0.1", 0)),
        (["dashboard", "--host=0.0.0.0", "d", "--port=9000"], ("0.0.0.0", 9000)),
        (["dashboard", "d", "--port", "many"], None),  # the CLI's error to give
        (["dashboard", "d", "--port", "-1"], None),
        (["dashboard", "--help"], None),
        (["report", "d", "--port", "1"], None),
        ([], None),
    ],
)
def test_reading_a_dashboards_command_line(args: list[str], want: object) -> None:
    assert dashboard_port(args) == want


def test_the_dashboards_early_defaults_are_the_clis() -> None:
    cmd = typer.main.get_command(app).commands["dashboard"]  # type: ignore[attr-defined]
    defaults = {p.name: p.default for p in cmd.params}
    assert (defaults["host"], defaults["port"]) == (DEFAULT_HOST, DEFAULT_PORT)


# `ranklens dashboard` as the console script runs it, up to its port: what was imported then.
_DASH_CODE = """
import json, sys
import ranklens.dashboards.port as port
HEAVY = ("dash", "flask", "numpy", "pyarrow", "polars", "duckdb", "ranklens.cli.main")
def hold(host, number):
    loaded = sorted(m for m in HEAVY if m in sys.modules)
    print(json.dumps({"at": [host, number], "loaded": loaded}))
    sys.exit(0)
port.hold_early = hold
sys.argv = ["ranklens", "dashboard", "run.duckdb", "--port", "0"]
from ranklens.cli.entry import main
main()
"""


def test_a_dashboard_holds_its_port_before_the_heavy_imports(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-c", _DASH_CODE], cwd=tmp_path, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout) == {"at": ["127.0.0.1", 0], "loaded": []}
