"""A stop (SIGTERM, Ctrl+C) while `ranklens ingest` stores the analyses' results: the last and
longest stage of a big ingest, where the dependency graph is built in a thread on a DuckDB
connection of its own (analysis/_background.py) while the analyses run.

The run must end as the stop (143 or 130, one line, no traceback) within seconds, the graph's
queries interrupted (a thread left inside DuckDB at exit aborts the interpreter: 134), with
the previous output and the inputs unchanged and nothing left behind.

Where the stop lands is not left to timing: the command runs with a `sitecustomize` (found
first on PYTHONPATH) that marks, in a file, the moment the graph's thread starts, and keeps
that thread building the graph until it is stopped; the stop is sent after that mark, while
the analyses run beside it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from ranklens.sample_traces.gpu_job import GpuJob, write_job

from reliability.conftest import write_run
from reliability.harness import RANKLENS, ok, run, snapshot, unchanged

_HOOK = """
import os, pathlib, sys
_mark = os.environ.get("RANKLENS_TEST_RESULTS_MARK")
if _mark and sys.argv and sys.argv[0].endswith("ranklens"):
    from ranklens.analysis import critical_path as _cp
    _real = _cp.model
    def _model(con, *args, **kw):
        # the graph is still being built whenever the stop comes (a 1,024-rank job's takes
        # seconds): build it again and again until the stop interrupts its queries
        pathlib.Path(_mark).touch()
        while True:
            _real(con, *args, **kw)
    _cp.model = _model
"""


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 16-rank pipeline job whose stored results take a few seconds (graph and analyses)."""
    root = tmp_path_factory.mktemp("job") / "run"
    write_job(GpuJob(tp=2, dp=2, pp=4, m=8, steps=3), root)
    return root


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "rc", "said"), [(signal.SIGTERM, 143, "terminated"),
                                                 (signal.SIGINT, 130, "interrupted")])  # fmt: skip
def test_a_stop_while_results_are_stored(
    job: Path, tmp_path: Path, sig: int, rc: int, said: str
) -> None:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_HOOK)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    ok(run(["ingest", write_run(tmp_path, name="small"), "-o", work / "o.duckdb"], work))
    before, inputs = snapshot(work), snapshot(job)
    mark = tmp_path / "storing"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]),
        "RANKLENS_TEST_RESULTS_MARK": str(mark),
        "TMPDIR": str(tmpdir),
    }
    proc = subprocess.Popen(
        [RANKLENS, "ingest", str(job), "-o", "o.duckdb", "--workers", "2"],
        cwd=work, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if not mark.exists():
        proc.kill()
        pytest.fail(f"the stored results never started: {proc.communicate()}")
    time.sleep(0.3)  # the analyses' queries under way, the graph's thread busy beside them
    stopped = time.monotonic()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == rc, (out, err)
    assert time.monotonic() - stopped < 30
    assert said in err and "Traceback" not in err + out, err
    unchanged(before, snapshot(work))  # the previous output as it was, no temporary file left
    assert sorted(p.name for p in tmpdir.iterdir()) == []
    unchanged(inputs, snapshot(job))
