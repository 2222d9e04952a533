"""A stop (SIGTERM, Ctrl+C) while `ranklens ingest` stores the analyses' results: the last and
longest stage of a big ingest, where the dependency graph is built in a thread on a DuckDB
connection of its own (analysis/_background.py) while the analyses run.

The run must end as the stop (143 or 130, one line, no traceback) within seconds, the graph's
queries interrupted (a thread left inside DuckDB at exit aborts the interpreter: 134), with
the previous output and the inputs unchanged and nothing left behind.

Where the stop lands is not left to timing: the command runs with a `sitecustomize` (found
first on PYTHONPATH) that marks, in a file, the moment the graph's thread starts, and keeps
that thread building the graph until it is stopped; the stop is sent after that mark, while
the analyses run beside it, or after a second mark, once they are done and the main thread
waits for the graph. There, on Python <= 3.12, a stop inside `Thread.join()` made the thread
look finished while it still ran its query: the ingest exited under it, and aborted whenever
that query returned during finalization (ingest/threads.py). The sitecustomize's exit hook
makes that visible every time: exit 99 when the graph's thread has not left at exit.
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
    _left = []
    def _model(con, *args, **kw):
        # the graph is still being built whenever the stop comes (a 1,024-rank job's takes
        # seconds): build it again and again until the stop interrupts its queries
        pathlib.Path(_mark).touch()
        try:
            while True:
                _real(con, *args, **kw)
        finally:
            _left.append(True)
    _cp.model = _model
    import atexit
    def _check():
        # what the process promises: no thread of its own still inside DuckDB at exit (one
        # whose query returns during finalization aborts it; the rest only by luck do not)
        if not _left:
            sys.stderr.write("the graph's thread was still running at exit\\n")
            sys.stderr.flush()
            os._exit(99)
    atexit.register(_check)
    from ranklens.analysis import _background as _bg
    _result = _bg._Work.result
    def _waiting(self):
        pathlib.Path(_mark + ".waiting").touch()  # the analyses are done: only the graph is left
        return _result(self)
    _bg._Work.result = _waiting
"""


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 16-rank pipeline job whose stored results take a few seconds (graph and analyses)."""
    root = tmp_path_factory.mktemp("job") / "run"
    write_job(GpuJob(tp=2, dp=2, pp=4, m=8, steps=3), root)
    return root


@pytest.mark.slow
@pytest.mark.parametrize("waiting", [False, True], ids=["analyses-running", "graph-awaited"])
@pytest.mark.parametrize(("sig", "rc", "said"), [(signal.SIGTERM, 143, "terminated"),
                                                 (signal.SIGINT, 130, "interrupted")])  # fmt: skip
def test_a_stop_while_results_are_stored(
    job: Path, tmp_path: Path, sig: int, rc: int, said: str, waiting: bool
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
    at = mark.with_name(mark.name + ".waiting") if waiting else mark
    while not at.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if not at.exists():
        proc.kill()
        pytest.fail(f"the stored results never reached {at.name}: {proc.communicate()}")
    # the analyses' queries under way, or the main thread waiting; the graph's thread busy
    time.sleep(0.3)
    stopped = time.monotonic()
    proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"still running 60 s after the stop: {proc.communicate()}")
    assert proc.returncode == rc, (out, err)
    assert time.monotonic() - stopped < 30
    assert said in err and "Traceback" not in err + out, err
    unchanged(before, snapshot(work))  # the previous output as it was, no temporary file left
    assert sorted(p.name for p in tmpdir.iterdir()) == []
    unchanged(inputs, snapshot(job))
