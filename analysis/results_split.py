"""The stored results' analyses shared between the ingest's connection and the graph's thread.

Why: `finalize_run` builds the dependency graph on a thread of its own while the analyses run
on the ingest's connection. On a 1,024-rank job the graph was done ~2 s before the analyses
(~6 s against ~8 s, side by side), a core idle meanwhile; on a one-rank 5 M-kernel capture it
is the other way round. Analyses that do not read the activity views (which are held on the ingest's
connection only) wait in one queue: whichever side is free takes the next, so the two halves
end together on either shape. What the thread computed is stored by the ingest's connection,
in its own transaction (the thread only reads what is committed).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import TypeVar

import duckdb
from ranklens.analysis import _activity
from ranklens.analysis._base import Result

T = TypeVar("T")
Done = dict[str, tuple[ModuleType, Result]]  # by NAME: the analysis and its result


class Shared:
    """Analyses either side may take, each taken once, in order."""

    def __init__(self, mods: Iterable[ModuleType]) -> None:
        self._todo = list(mods)
        self._lock = threading.Lock()

    def take(self) -> ModuleType | None:
        """The next analysis nobody took yet (None when none is left)."""
        with self._lock:
            return self._todo.pop(0) if self._todo else None


def own_and_shared(mods: Iterable[ModuleType]) -> tuple[tuple[ModuleType, ...], Shared]:
    """The analyses only the ingest's connection runs (they read the activity views it holds),
    and the queue of the others."""
    mods = tuple(mods)
    users = set(_activity.users(mods))
    own = tuple(m for m in mods if m.NAME in users)
    return own, Shared(m for m in mods if m.NAME not in users)


def helping(
    shared: Shared,
    first: Callable[[duckdb.DuckDBPyConnection], T],
    out_of_memory: Callable[[BaseException], bool],
) -> Callable[[duckdb.DuckDBPyConnection], tuple[T, Done]]:
    """What the graph's thread runs: `first` (the graph), then analyses from `shared` until
    none is left. An analysis that does not fit beside the other side's work is left undone
    (the caller computes what is missing after the join), so the graph is not lost with it."""

    def work(cur: duckdb.DuckDBPyConnection) -> tuple[T, Done]:
        value = first(cur)
        done: Done = {}
        while (mod := shared.take()) is not None:
            try:
                done[mod.NAME] = (mod, mod.run(cur))
            except duckdb.Error as exc:
                if not out_of_memory(exc):
                    raise
                break
        return value, done

    return work
