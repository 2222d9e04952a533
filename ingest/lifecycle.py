"""How a ranklens process ends: SIGTERM like Ctrl+C, and decoding workers that die with it.

Why: `timeout`, CI cancellation and `kill` send SIGTERM, which by default ends Python without
running any `finally`, leaving the half-built database and unpacked .gz copies behind; raising
an exception instead runs every cleanup on the way out. Worker processes must not outlive a
parent killed with SIGKILL (no cleanup can run then): each asks the kernel for SIGKILL when
its parent (the forkserver, which exits with the main process) goes, and watches the main
process as well where that is not available.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from multiprocessing import forkserver, get_context
from multiprocessing.context import BaseContext
from pathlib import Path
from types import FrameType
from typing import Any

from ranklens.ingest.errors import RanklensError
from ranklens.ingest.inputs import scan_inputs
from ranklens.ingest.threads import through_stops

EXIT_TERMINATED = 128 + signal.SIGTERM  # 143, what shells report for a SIGTERM'd process


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: unwinds like Ctrl+C (every `finally` runs), exits 143."""


_received: list[int] = []


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    raise Terminated()


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    signal.default_int_handler(signum, frame)


def was_terminated() -> bool:
    """Whether SIGTERM arrived (Typer turns the exception into exit 130 on its way out)."""
    return signal.SIGTERM in _received


def was_stopped() -> bool:
    """Whether SIGTERM or Ctrl+C arrived. Why: the exception they raise in Python code that
    DuckDB was calling (an Arrow stream it scans) comes out of the query as DuckDB's own
    InvalidInputException; what fails after a stop is the stop's doing, never a file's."""
    return bool(_received)


def handle_sigterm() -> None:
    """Make SIGTERM raise Terminated in the main thread, and note Ctrl+C, whose
    KeyboardInterrupt is Python's as before (call once, from the entry point)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _on_sigint)


_PR_SET_PDEATHSIG = 1


def die_with_parent(main_pid: int) -> None:
    """Worker initializer: end this process when its parent or the main process is gone."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    # Ctrl+C and a group-wide SIGTERM reach the workers too: the parent decides and stops the
    # pool (a worker dying first would turn a clean "terminated" into a broken-pool error).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watcher = threading.Thread(target=_watch, args=(main_pid,), daemon=True)
    watcher.start()


def _watch(main_pid: int) -> None:
    while True:
        time.sleep(0.5)
        if _dead(main_pid):
            os._exit(1)


def _dead(pid: int) -> bool:
    """Gone, or a zombie not yet reaped (the forkserver waits for every worker to let go of
    the main process' pipe, so a worker must not wait for the reaping)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except (OSError, IndexError):
        pass  # no /proc: ask the kernel
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, another user's (pid reuse)
    return False


class _Refuse:
    """A meta path finder that refuses one top-level package and its submodules."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == self.name or name.startswith(self.name + "."):
            raise ImportError(f"{self.name} is not used by ranklens here")


@contextmanager
def refusing_import(name: str) -> Iterator[None]:
    """`import name` fails (ImportError) inside the block, unless it is imported already: for a
    library that looks for an optional package once, at import or first use (pyarrow for
    pandas, dash for IPython), in a process that never uses it. It stays importable after."""
    finder = _Refuse(name)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


_probe_settled: list[bool] = []  # skip_pandas_probe ran in this process: its workers do too


def skip_pandas_probe() -> None:
    """Have pyarrow settle, now, that it works without pandas, unless pandas is imported.

    Why: pyarrow's first array() looks for pandas (to accept its objects) and, where pandas is
    installed, as in nearly every ML environment, imports it: 0.2 s and tens of MB in every
    process, for objects ranklens never hands it (the 402 MB trace's ingest: 1.34x -> 1.6x the
    file in memory). pyarrow looks once and remembers, so the import is refused for that one
    look; pandas stays importable for anything else. For ranklens' own processes only: the
    console script and, after it, its decoding workers (worker_pool). Never a library user's
    process or its workers, which re-run the user's main module, where pyarrow may be handed
    pandas objects."""
    if "pandas" in sys.modules:
        return
    import pyarrow as pa

    with refusing_import("pandas"):
        pa.array([0])
    _probe_settled.append(True)


# What ranklens' own processes ask of their allocators, unless the environment already says.
ALLOCATOR_DEFAULTS = {
    "NUMPY_MADVISE_HUGEPAGE": "0",  # numpy: no transparent huge pages for large arrays
    "MIMALLOC_ALLOW_THP": "0",  # pyarrow's mimalloc: likewise for its arenas
    "OPENBLAS_NUM_THREADS": "1",  # numpy's BLAS: no threads spinning beside the work
}


def settle_allocators() -> None:
    """Ask numpy and pyarrow's allocator for ordinary pages, and numpy's BLAS for one thread,
    where the environment does not say otherwise. Before numpy or pyarrow is imported: they
    read it once. For the console script's process, and so its workers, only.

    Why: an ingest's large buffers are written once and read in order, which gains nothing from
    huge pages, while each huge page's first touch zeroes 2 MB. On a virtual machine whose
    memory the host backs on demand (a cloud VM, this one) that zeroing was 12% of the 5 M-kernel
    Nsight ingest's CPU (perf: clear_page_erms under do_huge_pmd_anonymous_page, reached from
    numpy's and mimalloc's fresh buffers): 9.2-10.1 -> 8.9-9.5 CPU-s, 5.5-6.0 -> 5.2-5.7 s.
    OpenBLAS' threads spun after numpy's few small dot products (1% of the CPU); ranklens runs
    no BLAS work worth a thread."""
    for name, value in ALLOCATOR_DEFAULTS.items():
        os.environ.setdefault(name, value)


# Inputs smaller than this are decoded in-process: a pool's start costs more than it saves.
SERIAL_BELOW_BYTES = 24 * 1024 * 1024


def _set_preload(preload: str) -> BaseContext:
    """The forkserver context, its server (when it starts) to import `preload` once (after
    worker_boot where this process settled pyarrow's pandas probe)."""
    ctx = get_context("forkserver")
    boot = ["ranklens.ingest.forkserver_quiet"]
    boot += ["ranklens.ingest.worker_boot"] if _probe_settled else []
    ctx.set_forkserver_preload([*boot, preload])
    return ctx


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
        initializer=die_with_parent,
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
