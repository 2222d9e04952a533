"""Imported first by the decoding workers' forkserver (workpool.worker_pool), so the workers it
forks inherit it too.

Why: when an ingest stops while its pool is asking the forkserver for a worker (a worker died,
Ctrl+C), that request ends half-sent; Python's forkserver loop then dies of an EOFError and
prints its traceback on the user's terminal, under ranklens' own `error:`. Likewise a worker
started as its pool breaks (another worker killed: the OOM killer) printed an EOFError traceback
from its task queue (once in a test run, 2 in 40 kills under load): the pool's thread closes the
main process' end of that queue while the main thread is sending the new worker its descriptors,
and the number, reused by then (seen: a socket, most likely the forkserver connection's own,
opened in between), reaches the worker as its task queue, which then ends. The pool is broken
and says so; this keeps a lost client or a worker of a lost pool quiet and leaves every other
error as Python prints it.
"""

from __future__ import annotations

import concurrent.futures.process as _futures_process
import sys
from types import TracebackType
from typing import Any

# What a lost client or a lost pool ends in, in the server's loop and in a worker's.
_LOST = (EOFError, ConnectionError)
# (private to concurrent.futures: where a Python names it otherwise, workers stay as they were)
_process_worker: Any = getattr(_futures_process, "_process_worker", None)


def _hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if issubclass(kind, _LOST):
        return
    sys.__excepthook__(kind, exc, tb)


def quiet_worker(*args: Any, **kwargs: Any) -> None:
    """A pool worker's loop (concurrent.futures' own) that exits with status 1, silently, when
    its pool's queues are closed under it. A task's own errors never get here: the loop sends
    them back to the main process as the task's result."""
    try:
        _process_worker(*args, **kwargs)
    except _LOST:  # the pool is gone or broken: the main process says so
        sys.exit(1)


sys.excepthook = _hook
# The main process names the loop by reference (pickled as concurrent.futures.process.
# _process_worker); a worker forked from this server finds this one under that name.
if _process_worker is not None:
    _futures_process._process_worker = quiet_worker
