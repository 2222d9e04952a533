"""Imported first by the decoding workers' forkserver (workpool.worker_pool).

Why: when an ingest stops while its pool is asking the forkserver for a worker (a worker died,
Ctrl+C), that request ends half-sent; Python's forkserver loop then dies of an EOFError and
prints its traceback on the user's terminal, under ranklens' own `error:`. The forkserver is
ending anyway (its client is gone); this keeps a lost client quiet and leaves every other
error as Python prints it.
"""

from __future__ import annotations

import sys
from types import TracebackType


def _hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if issubclass(kind, (EOFError, ConnectionError)):
        return
    sys.__excepthook__(kind, exc, tb)


sys.excepthook = _hook
