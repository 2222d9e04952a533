"""A thread whose end its starter can wait for through Ctrl+C and SIGTERM.

Why: up to Python 3.12, a KeyboardInterrupt (or Terminated, lifecycle.py) raised while
`Thread.join()` waits runs threading's bpo-45274 handler, which releases the state lock the
*running* thread holds and marks it stopped: `is_alive()` then says False while the thread
goes on. A stop that landed there let `ranklens ingest` close a cursor whose query another
thread was still running, and exit under it: an abort inside DuckDB (exit 134, not 130 or
143) when that query returned during the interpreter's finalization: 10 stops in 60 sent
0-4 s into a 16-rank job's stored results (docs/scale.md, session 28). Here `join()` is
never called: the thread sets its own flag when its target has returned, and that flag is the
only truth. To wake at once, the starter also waits on a lock of its own that the thread holds
until then, in acquires of at most 0.1 s: a signal that lands in one leaves the flag as it was.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

T = TypeVar("T")

_POLL_S = 0.1  # the longest a wait goes without looking at the flag


class Helper:
    """`target` on a thread of its own."""

    def __init__(self, target: Callable[[], object], name: str, daemon: bool = False) -> None:
        self.started = self.done = False
        self._target = target
        self._end = threading.Lock()  # held from start() until the target has returned
        self.thread = threading.Thread(target=self._body, name=name, daemon=daemon)

    def start(self) -> Helper:
        self._end.acquire()
        self.started = True
        self.thread.start()
        return self

    @property
    def running(self) -> bool:
        """Started, and its target not yet returned (what `is_alive()` should have said)."""
        return self.started and not self.done

    def _body(self) -> None:
        try:
            self._target()
        finally:
            self.done = True  # after the target left every C call (DuckDB's included)
            self._end.release()

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until the target has returned or raised, or `timeout` passed; whether it
        has. A stop raised here leaves the thread and its state as they were."""
        end = None if timeout is None else time.monotonic() + timeout
        while self.running:
            left = _POLL_S if end is None else min(_POLL_S, end - time.monotonic())
            if left <= 0:
                return False
            if self._end.acquire(timeout=left):
                self._end.release()
        return True

    def outlast(self, stop: Callable[[], None]) -> None:
        """Call `stop` (what ends the target soon: a cursor's interrupt) and wait, again until
        the target has returned, through further Ctrl+C too: never leave it running."""
        while self.running:
            with contextlib.suppress(KeyboardInterrupt):
                stop()
                self.wait(0.05)


def through_stops(step: Callable[[], bool], on_stop: Callable[[], object] = lambda: None) -> None:
    """Call `step` until it returns True; a Ctrl+C (or lifecycle.Terminated) raised meanwhile
    calls `on_stop` and is held, then raised once `step` has said done. Why: a cleanup that a
    second stop cuts short leaves threads, workers or files behind (docs/scale.md, session
    29): the pools' waits and the temporary trees' removal go through here."""
    stop: KeyboardInterrupt | None = None
    while True:
        try:
            if step():
                break
        except KeyboardInterrupt as exc:
            stop = stop or exc
            on_stop()
    if stop is not None:
        raise stop


def outlast_futures(futures: Iterable[Future[Any]]) -> None:
    """Cancel what has not started and wait, through Ctrl+C too, until every future is done;
    a stop that landed meanwhile is raised then. Why: what a thread pool runs must not outlive
    what it reads from, and the pool's own `shutdown(wait=True)` joins its threads: a second
    Ctrl+C in that join left the Nsight reader's threads stepping SQLite while their
    connections were closed (SIGSEGV in 8 of 12 double Ctrl+C during the read of a 5 M-kernel
    export). Futures' waits are conditions, not joins: a stop that lands in one changes
    nothing."""
    left = [f for f in futures if not f.cancel()]
    through_stops(lambda: not wait(left, timeout=_POLL_S).not_done)


def ordered_parallel(fn: Callable[[int], T], starts: list[int], workers: int) -> Iterator[T]:
    """fn over starts on a small thread pool, its results in order, with a bounded window in
    flight. However it ends (Ctrl+C, twice, included), no call of fn is left running: the
    caller may then close what fn read from."""
    if len(starts) == 1:
        yield fn(starts[0])
        return
    pool = ThreadPoolExecutor(workers)
    window: deque[Future[T]] = deque()
    try:
        it = iter(starts)
        for s in it:
            window.append(pool.submit(fn, s))
            if len(window) >= 2 * workers:
                break
        while window:
            t = window[0].result()
            window.popleft()
            nxt = next(it, None)
            if nxt is not None:
                window.append(pool.submit(fn, nxt))
            yield t
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # no join: the running calls are waited
        outlast_futures(window)  # for here, through Ctrl+C
