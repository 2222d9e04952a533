"""A second Ctrl+C while ranklens waits for its threads or worker processes to stop.

Python's own waits for them (`Thread.join()`, which a thread pool's and a process pool's
`shutdown(wait=True)` use) give up on a second stop and, up to Python 3.12, mark the thread
ended while it runs on (ingest/threads.py). Measured before the change, double Ctrl+C on
`ranklens ingest`: a SIGSEGV in 8 of 12 during the read of a 5 M-kernel Nsight export (its
reader's threads stepping SQLite on connections being closed), a hang at exit in 2 of 12 on
4 x 60 MB Kineto ranks (the workers never told to stop). Here the second stop is a real
SIGINT sent to the main thread during the wait, as a terminal sends it."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pytest
from ranklens.ingest import tempfiles, threads, workpool

LONG_S = 3.0  # how long the calls still running take; the second stop comes at STOP_S
STOP_S = 0.3


@contextmanager
def second_stop_after(seconds: float) -> Iterator[None]:
    """A real SIGINT to the main thread `seconds` from now, raising KeyboardInterrupt only
    inside this block: one that a loaded machine delays past it is ignored, so it can never
    stop the test session (then the test proves less, but cannot fail for it)."""
    armed = threading.Event()
    armed.set()

    def handler(signum: int, frame: object) -> None:
        if armed.is_set():
            raise KeyboardInterrupt

    old = signal.signal(signal.SIGINT, handler)
    main = threading.main_thread().ident
    assert main is not None
    timer = threading.Timer(seconds, signal.pthread_kill, (main, signal.SIGINT))
    timer.start()
    try:
        yield
    finally:
        armed.clear()
        timer.cancel()
        while timer.is_alive():  # sent or cancelled before the handler goes
            time.sleep(0.01)
        signal.signal(signal.SIGINT, old)


def test_nsys_reads_are_never_left_running() -> None:
    lock = threading.Lock()
    running = [0]

    def read(start: int) -> list[pa.Array]:
        with lock:
            running[0] += 1
        try:
            if start > 0:
                time.sleep(LONG_S)  # SQLite stepping: the GIL released
            return [pa.array([start], pa.int64())]
        finally:
            with lock:
                running[0] -= 1

    chunks = threads.ordered_parallel(read, list(range(12)), 3)
    assert next(chunks)[0].to_pylist() == [0]  # the next reads are running
    started = time.monotonic()
    with second_stop_after(STOP_S), pytest.raises(KeyboardInterrupt):
        try:
            raise KeyboardInterrupt  # the first Ctrl+C, where the chunks are consumed
        finally:
            chunks.close()  # what unwinding does to the reader's generator
        # (the second stop lands while close() waits for the reads)
    assert running[0] == 0, "a read still ran when the stop reached the caller"
    assert time.monotonic() - started < 3 * LONG_S  # the queued reads were cancelled


def test_workers_end_before_the_pool_shutdown_returns() -> None:
    pool = workpool.worker_pool(2, "json")
    futures = [pool.submit(time.sleep, LONG_S) for _ in range(2)]
    deadline = time.monotonic() + 60
    while not all(f.running() for f in futures) and time.monotonic() < deadline:
        time.sleep(0.01)
    procs = list(pool._processes.values())  # type: ignore[attr-defined]
    thread = pool._executor_manager_thread  # type: ignore[attr-defined]
    assert len(procs) == 2 and thread is not None
    with second_stop_after(STOP_S), pytest.raises(KeyboardInterrupt):
        pool.shutdown(wait=True, cancel_futures=True)
    # not is_alive(): after a stop in join() it says False of a running thread
    assert thread not in threading.enumerate(), "the pool's thread ran on after shutdown"
    assert all(p.exitcode is not None for p in procs), "a worker outlived the shutdown"


def test_a_temporary_tree_is_removed_whole(tmp_path: Path) -> None:
    """A sharded run's temporary directory (thousands of shards) is gone when the stop reaches
    the caller, though a second stop landed while it was being removed."""
    tree = tmp_path / ".run.tmp-1"
    for r in range(400):
        d = tree / "events" / f"rank={r}"
        d.mkdir(parents=True)
        for t in range(50):
            (d / f"t{t}-0.parquet").write_bytes(b"x")
    with second_stop_after(0.02), pytest.raises(KeyboardInterrupt):
        try:
            raise KeyboardInterrupt  # the first Ctrl+C, during the ingest
        finally:
            tempfiles.remove_tree(tree)  # replacing_dir's cleanup
    assert not tree.exists()


def test_a_stop_inside_rmtrees_own_cleanup_still_removes_the_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop landing between rmtree's close of a directory's descriptor and the flag that says
    so: its `finally` closes it again, and the EBADF OSError leaves rmtree in the stop's place
    (a CI run, 1 in ~1,200 tests). The tree is still removed whole and the stop raised."""
    tree = tmp_path / ".run.tmp-1"
    (tree / "events" / "rank=0").mkdir(parents=True)
    (tree / "events" / "rank=0" / "t0-0.parquet").write_bytes(b"x")
    real = tempfiles.shutil.rmtree
    calls = []

    def rmtree(path: object, ignore_errors: bool = False) -> None:
        calls.append(path)
        if len(calls) == 1:  # as CPython's rmtree does when the stop lands there
            try:
                raise KeyboardInterrupt
            finally:
                raise OSError(9, "Bad file descriptor")
        real(path, ignore_errors=ignore_errors)  # type: ignore[arg-type]

    monkeypatch.setattr(tempfiles.shutil, "rmtree", rmtree)
    with pytest.raises(KeyboardInterrupt):
        tempfiles.remove_tree(tree)
    assert len(calls) == 2 and not tree.exists()

    def denied(path: object, ignore_errors: bool = False) -> None:
        raise OSError(13, "denied")

    monkeypatch.setattr(tempfiles.shutil, "rmtree", denied)
    with pytest.raises(OSError, match="denied"):  # an OSError of its own is not a stop
        tempfiles.remove_tree(tree)


class _SlowRay:
    """A local Ray instance that is still shutting down when the stop lands, and for a while
    after it (ray.shutdown waits 1.1-1.3 s for Ray's processes here)."""

    def __init__(self, stopped: threading.Event) -> None:
        self.stopped = stopped
        self.down = False

    def shutdown(self) -> None:
        self.stopped.wait(60)
        time.sleep(0.3)
        self.down = True


def test_a_stop_while_local_ray_shuts_down_waits_for_it() -> None:
    # The stop is a real SIGINT to the main thread while settle waits; the fake Ray stays up
    # until it has landed, so a loaded machine that delays the signal delays the test only.
    from ranklens.ingest import ray_engine

    stopped = threading.Event()

    def handler(signum: int, frame: object) -> None:
        stopped.set()
        raise KeyboardInterrupt

    ray = _SlowRay(stopped)
    ray_engine._closing.append(ray_engine._Closing(ray))
    old = signal.signal(signal.SIGINT, handler)
    main = threading.main_thread().ident
    assert main is not None
    timer = threading.Timer(0.1, signal.pthread_kill, (main, signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            ray_engine.settle()
        # the code before forgot the instance, then waited: the stop came out at once, Ray
        # still shutting down (the interpreter's exit then waited for it, where a second
        # Ctrl+C printed a traceback)
        assert ray.down, "the stop reached the caller while Ray was still shutting down"
        assert not ray_engine._closing
    finally:
        timer.cancel()
        stopped.set()  # a fake that never got its stop ends too
        signal.signal(signal.SIGINT, old)
        ray_engine._closing.clear()


def test_a_stop_held_across_a_call_is_raised_after_it() -> None:
    # ray_engine starts a local Ray instance inside stops_held: a stop inside ray.init left
    # processes ray.shutdown could not reach (its node object not yet made). A real SIGINT
    # lands in the block, which runs on; the stop comes out once it is left, and the handlers
    # are the ones before it again.
    from ranklens.ingest.lifecycle import stops_held

    def raising(signum: int, frame: object) -> None:  # what the CLI's handler does
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGINT, raising)  # not the test runner's, whatever it is
    try:
        before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
        main = threading.main_thread().ident
        assert main is not None
        ran_on = False
        with pytest.raises(KeyboardInterrupt), stops_held():
            signal.pthread_kill(main, signal.SIGINT)
            time.sleep(0.2)  # the handler runs within this: noted, not raised
            ran_on = True
        assert ran_on
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
        with stops_held():  # no stop: nothing raised after the block
            pass
    finally:
        signal.signal(signal.SIGINT, old)
