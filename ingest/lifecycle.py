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
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

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


@contextmanager
def stops_held() -> Iterator[None]:
    """Ctrl+C and SIGTERM noted inside the block, not raised there; the first is delivered
    again once the block is left, to the handlers that were in place before it. For a call
    that a stop must not cut in two: a local Ray instance's start (ray_engine.py), where a stop
    inside ray.init left its agents running on after the ingest, and the exit segfaulted in 2
    of 8 double Ctrl+C. Only the main thread's handlers can be set: elsewhere, nothing held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        got.append(signum)

    old = {s: signal.signal(s, note) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():  # None: one not set from Python, which cannot be put back
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        if got:
            signal.raise_signal(got[0])


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
        if process_gone(main_pid):
            os._exit(1)


def process_gone(pid: int) -> bool:
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


def probe_settled() -> bool:
    """Whether skip_pandas_probe ran in this process (its workers' server then runs it too)."""
    return bool(_probe_settled)


# What ranklens' own processes ask of their allocators, unless the environment already says.
_MMAP_THRESHOLD = "MALLOC_MMAP_THRESHOLD_"
_M_MMAP_THRESHOLD = -3  # mallopt's parameter for it (malloc.h)
ALLOCATOR_DEFAULTS = {
    "NUMPY_MADVISE_HUGEPAGE": "0",  # numpy: no transparent huge pages for large arrays
    "MIMALLOC_ALLOW_THP": "0",  # pyarrow's mimalloc: likewise for its arenas
    "OPENBLAS_NUM_THREADS": "1",  # numpy's BLAS: no threads spinning beside the work
    # glibc: arrays up to 1 GB from the heap, whose freed pages are reused, not from fresh
    # mappings that each fault and zero every page again (set for this process by mallopt)
    _MMAP_THRESHOLD: str(1 << 30),
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
    no BLAS work worth a thread. glibc's malloc maps every array over 32 MB afresh, and frees
    it to the system: on such a VM each numpy step over millions of events then paid its page
    faults again (the 5 M-kernel export's dependency graph: 23.1-26.2 -> 15.9-18.9 s from the
    heap, peak 3.65 -> 3.8-4.1 GB). glibc reads its variable at the process' start, so this
    process is told by mallopt; its workers, started after, read the variable."""
    mine = _MMAP_THRESHOLD not in os.environ
    for name, value in ALLOCATOR_DEFAULTS.items():
        os.environ.setdefault(name, value)
    if mine:  # not glibc (musl, macOS): no mallopt, and an allocator of its own
        with contextlib.suppress(AttributeError, OSError):
            ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, int(ALLOCATOR_DEFAULTS[_MMAP_THRESHOLD]))
