"""A worker or the workers' server that loses its pool or its client ends without a traceback
(ingest/forkserver_quiet.py): a traceback printed above ranklens' `error:` (seen in CI, and 2 in
40 kills under load) told the user of a crash that was not one. Any other error still prints."""

from __future__ import annotations

import subprocess
import sys


def test_a_worker_whose_pool_is_gone_ends_quietly() -> None:
    """A worker waiting for a task when its pool's task queue ends (the pool broke: another
    worker was killed) printed an EOFError traceback above ranklens' `error:` (2 in 40 kills
    under load). The forkserver's preload runs the workers' loop through quiet_worker: exit 1,
    no traceback; any other error escaping the loop is still printed."""
    script = (
        "import multiprocessing as mp, sys\n"
        "import concurrent.futures.process as cfp\n"
        "import ranklens.ingest.forkserver_quiet\n"
        "ctx = mp.get_context('fork')\n"
        "q = ctx.Queue()\n"
        "q._writer.close()  # its only writer gone: the next get() reads end-of-file\n"
        "args = (q if sys.argv[1] == 'eof' else None, None, None, ())\n"
        "worker = ctx.Process(target=cfp._process_worker, args=args)  # as a pool starts one\n"
        "worker.start()\n"
        "worker.join()\n"
        "sys.exit(worker.exitcode)\n"
    )
    for case, shown in (("eof", False), ("other", True)):
        run = subprocess.run(
            [sys.executable, "-c", script, case], capture_output=True, text=True, timeout=60
        )
        assert run.returncode == 1 and ("Traceback" in run.stderr) == shown, (case, run.stderr)


def test_the_pools_workers_run_the_quiet_loop() -> None:
    """The loop a pool's worker runs is quiet_worker: the forkserver imported it before it
    forked the worker (the main process names the loop by reference)."""
    from ranklens.ingest import workpool

    ask = "__import__('concurrent.futures.process').futures.process._process_worker.__qualname__"
    pool = workpool.worker_pool(1, "json")
    try:
        assert pool.submit(eval, ask).result(timeout=60) == "quiet_worker"
    finally:
        pool.shutdown()


def test_the_forkserver_keeps_a_lost_client_quiet() -> None:
    """The forkserver's preload (workpool.worker_pool) silences the EOFError its loop dies of
    when an ingest stops mid-request (it printed a traceback under ranklens' `error:`, seen
    in CI), and no other error."""
    quiet = "import ranklens.ingest.forkserver_quiet; raise "
    for exc, shown in (("EOFError", False), ("ConnectionResetError", False), ("ValueError", True)):
        run = subprocess.run(
            [sys.executable, "-c", quiet + exc], capture_output=True, text=True, timeout=60
        )
        assert run.returncode == 1 and ("Traceback" in run.stderr) == shown, (exc, run.stderr)
