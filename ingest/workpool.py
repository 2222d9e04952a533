"""The ingest's decoding workers: a process pool forked from one server that imported the
decoders once, whose workers die with the main process, and whose breakage (a worker killed,
by the OOM killer or as it starts) is an error, never a hang or a silent retry.

Why its own module: how a process ends (lifecycle) and how the pool's workers live and die are
two concerns; the pool is the larger and is what the engines and the Kineto scheduler call.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import forkserver, get_context
from multiprocessing.context import BaseContext
from typing import Any

from ranklens.ingest import lifecycle
from ranklens.ingest.errors import RanklensError
from ranklens.ingest.inputs import scan_inputs
from ranklens.ingest.threads import through_stops

# Inputs smaller than this are decoded in-process: a pool's start costs more than it saves.
SERIAL_BELOW_BYTES = 24 * 1024 * 1024

# The longest path a Unix socket's address holds (Linux: 108 bytes with the NUL; macOS 104).
_SOCKET_PATH_MAX = 103
# What multiprocessing adds under $TMPDIR for the forkserver's socket
_SOCKET_SUFFIX = len("/pymp-12345678/listener-12345678")


def _set_preload(preload: str) -> BaseContext:
    """The forkserver context, its server (when it starts) to import `preload` once (after
    worker_boot where this process settled pyarrow's pandas probe)."""
    _socket_dir_that_fits()
    ctx = get_context("forkserver")
    boot = ["ranklens.ingest.forkserver_quiet"]
    boot += ["ranklens.ingest.worker_boot"] if lifecycle.probe_settled() else []
    ctx.set_forkserver_preload([*boot, preload])
    return ctx


def _socket_dir_that_fits() -> None:
    """Have multiprocessing keep its forkserver's socket in a directory short enough for one.
    Why: it puts the socket under $TMPDIR, and a long $TMPDIR (a scheduler's per-job scratch,
    pytest's) made binding it fail ("AF_UNIX path too long"): every worker then died as it
    started and the ingest said so, blaming memory. With such a $TMPDIR multiprocessing's own
    directory (removed at exit) goes to the first writable short system one instead; ranklens'
    scratch stays in $TMPDIR. Called before the server starts; once chosen, kept."""
    from multiprocessing import util

    if len(os.fsencode(tempfile.gettempdir())) + _SOCKET_SUFFIX <= _SOCKET_PATH_MAX:
        return
    for short in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(short) and os.access(short, os.W_OK | os.X_OK):
            saved = tempfile.tempdir
            tempfile.tempdir = short  # read by util.get_temp_dir, which caches what it makes
            try:
                util.get_temp_dir()
            finally:
                tempfile.tempdir = saved
            return


def prestart_workers(inputs: list[str], workers: int | None) -> bool:
    """Start the decoding workers' server now if an ingest of `inputs` will likely use workers
    (2 or more, and SERIAL_BELOW_BYTES of input); whether it did. For the console script, before
    its own imports.

    Why: the server's start (an interpreter and the decoders' imports, ~0.25 s of one core)
    came in front of the first file, with the other core idle; begun here it runs beside the
    console script's imports (~0.4 s of one core). 8 x 60 MB with 2 workers: traces stage
    2.1-2.2 -> 1.9-2.0 s, the whole command 7.5-7.8 -> 7.0-7.2 s. Its preload, the rank task,
    imports what every pool's workers need (the Kineto scheduler's included). A guess (it does
    not read [tool.ranklens] workers): a server started for nothing costs its boot on a core
    the imports leave idle, and exits with the process."""
    n = workers if workers is not None else min(os.cpu_count() or 1, 8)
    if n < 2 or not _holds_bytes(inputs, SERIAL_BELOW_BYTES):
        return False
    _set_preload("ranklens.ingest.rank_task")
    try:
        forkserver.ensure_running()  # spawns the server and returns: it imports on its own
    except OSError:  # no socket or process to spare: the ingest's own pool says so, or not
        return False
    return True


def _holds_bytes(inputs: list[str], least: int) -> bool:
    """Whether the files `inputs` name (as the loader expands them, any suffix) hold `least`
    bytes: a guess, stopping as soon as it is reached."""
    try:
        files = scan_inputs(inputs, ("",)).files
    except RanklensError:  # nothing there: the CLI says so
        return False
    total = 0
    for path in files:
        with contextlib.suppress(OSError):
            total += os.stat(path).st_size
        if total >= least:
            return True
    return False


def worker_pool(workers: int, preload: str) -> ProcessPoolExecutor:
    """The ingest's worker processes: forked from a server that imported `preload` once (or
    the rank task, if prestart_workers started it), each dying with the main process (no
    orphan outlives a killed ingest)."""
    ctx = _set_preload(preload)
    return _WorkerPool(
        max_workers=workers,
        mp_context=ctx,
        initializer=lifecycle.die_with_parent,
        initargs=(os.getpid(),),
    )


_STUCK_S = 1.0  # a worker dead this long with the pool not broken: its thread is stuck


class _WorkerPool(ProcessPoolExecutor):
    """A pool whose shutdown, once it is broken (a worker died: the OOM killer), SIGKILLs the
    workers left. Why: a broken pool stops them with SIGTERM, which they ignore
    (die_with_parent), then waits for them: the ingest, and its exit, would hang forever.
    `worked` (a task finished) tells a worker that died as it started, as one does when it
    re-runs a script that starts the ingest at import (no `__main__` guard), from one killed."""

    worked = False
    _watch: threading.Thread | None = None
    _closing = False

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        fut = super().submit(fn, *args, **kwargs)
        fut.add_done_callback(self._note)
        if self._watch is None:
            self._watch = threading.Thread(target=self._watchdog, name="ranklens-pool", daemon=True)
            self._watch.start()
        return fut

    def _watchdog(self) -> None:
        """A worker killed while it wrote its result (a decoded piece: megabytes) leaves half
        a message in the result pipe; the pool's thread then waits for the rest forever and
        never looks at the death, and the ingest hangs. When a worker is dead and the pool
        still not broken a moment later, the other workers are killed and this process' end
        of the pipe closed: the pool's thread reads end-of-file and breaks the pool as for any
        death (BrokenProcessPool, then WorkerDied)."""
        dead_since: float | None = None
        while not self._closing and not getattr(self, "_broken", False):
            time.sleep(0.2)
            if not self._dead_worker():
                dead_since = None
            elif dead_since is None:
                dead_since = time.monotonic()
            elif time.monotonic() - dead_since >= _STUCK_S and not self._closing:
                self._unstick()
                return

    def _spawn_process(self) -> None:
        """Start a worker; one that cannot start breaks the pool as a worker's death does.
        Why: a worker killed between its fork and the task the pool then writes it (the OOM
        killer, 1 in 6 kills of a new worker in a test) made Python's submit raise
        BrokenPipeError with the pool unbroken: the task was queued all the same, the next
        submit started another worker, and the ingest either went on or took the pipe's error
        for the file's own (a file error, or one skipped under --skip-bad)."""
        if getattr(self, "_broken", False):  # no worker for a broken pool (forkserver_quiet)
            raise BrokenProcessPool(self._broken)
        try:
            super()._spawn_process()  # type: ignore[misc]
        except (OSError, EOFError) as exc:  # the new worker's pipe, or the server, is gone
            why = f"a worker process died as it started ({exc!r})"
            self._broken = why  # type: ignore[assignment]  # (typeshed: bool; Python: the cause)
            raise BrokenProcessPool(why) from exc

    def _processes_now(self) -> list[Any]:
        with contextlib.suppress(RuntimeError):  # the pool's thread changed the dict
            return list((getattr(self, "_processes", None) or {}).values())
        return []

    def _dead_worker(self) -> bool:
        """Whether a worker has exited (its sentinel is ready: nothing is read or reaped)."""
        from multiprocessing.connection import wait

        sentinels = []
        for p in self._processes_now():
            with contextlib.suppress(ValueError):  # closed
                sentinels.append(p.sentinel)
        try:
            return bool(sentinels) and bool(wait(sentinels, timeout=0))
        except (OSError, ValueError):  # closed as the pool shut down: not a death
            return False

    def _kill_all(self) -> None:
        _kill(self._processes_now())

    def _unstick(self) -> None:
        _unstick(self._processes_now(), getattr(self, "_result_queue", None))

    def _note(self, fut: Future[Any]) -> None:
        if not fut.cancelled() and fut.exception() is None:
            self.worked = True

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """The pool's own shutdown, but its thread is waited for without `join()`: a second
        Ctrl+C in that join (bpo-45274, threads.py) marked the thread ended while it still
        sent the workers their stop; the exit then closed the queue under it, the workers
        never heard, and the ingest hung at exit waiting for them (2 of 12 double Ctrl+C on
        4 x 60 MB ranks). A stop during the wait kills the workers (the user insists; the
        scratch a killed worker leaves is swept by the caller or the next run) and the wait
        goes on until the thread has ended; then the stop is raised."""
        self._closing = True  # workers exit now: not a death for the watchdog
        if getattr(self, "_broken", False):
            self._kill_all()
        # (typeshed calls the thread a _ThreadWakeup)
        thread: threading.Thread | None = getattr(self, "_executor_manager_thread", None)
        results = self._result_queue
        procs = self._processes_now()
        super().shutdown(wait=False, cancel_futures=cancel_futures)
        if not wait:
            return

        def ended() -> bool:  # no join: see the docstring
            if thread is None or not thread.is_alive():
                return True
            time.sleep(0.005)
            return False

        try:
            through_stops(ended, lambda: _unstick(procs, results))
        finally:
            if results is not None:
                results.close()


def _unstick(procs: list[Any], results: Any) -> None:
    """Kill the workers and close this process' end of the result pipe: a worker killed while
    it wrote its result (a decoded piece: megabytes) leaves half a message, and the pool's
    thread, reading the rest, then reads end-of-file instead of waiting forever."""
    _kill(procs)
    writer = getattr(results, "_writer", None)
    with contextlib.suppress(OSError):
        if writer is not None:
            writer.close()


def _kill(procs: list[Any]) -> None:
    for p in procs:
        with contextlib.suppress(OSError, ValueError):  # gone, or closed
            p.kill()


def worked(pool: ProcessPoolExecutor) -> bool:
    """Whether a task finished on `pool` (worker_pool's): WorkerDied's hint depends on it."""
    return bool(getattr(pool, "worked", True))


def start_workers(pool: ProcessPoolExecutor, workers: int) -> None:
    """Have the pool start its `workers` processes now (it starts one per task submitted while
    none is idle): an empty task each, submitted at once, then waited for. A pool that fails
    to start says so at the caller's next submit, as it would have without this."""
    try:
        for fut in [pool.submit(int) for _ in range(workers)]:
            fut.result()
    except Exception:  # the pool raises it again at the next submit
        return
