"""One computation on a connection of its own, in a thread, while the caller's goes on.

Why: a run's stored results are two independent halves: every analysis (DuckDB queries, which
use every core while they run, between stretches of Python) and the dependency graph's model
(numpy and Python on one core). One after the other, a 1,024-rank job's results left a core
idle for seconds; side by side they took 11.1 s instead of 13.1 (finalize_run, alternating).
DuckDB lets several connections of one database read at once, each with its own temp views
and tables, and numpy and DuckDB release the GIL while they work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

import duckdb
from ranklens.ingest.threads import Helper

T = TypeVar("T")

# Session settings a connection's queries depend on, which a new cursor does not inherit
# (a sharded run's views find their Parquet files through file_search_path).
_SESSION = ("file_search_path",)
# The caller's temporary views that shadow a stored one, which a new cursor does not see
# either: a sharded run's `events` on its shards' absolute path (shards.attach). Without it
# the cursor read the stored view, whose relative path found no shard outside the run
# directory: `ranklens ingest --storage shards` ended in an internal error.
_SHADOWS_SQL = """
SELECT sql FROM duckdb_views() t
WHERE t.temporary AND EXISTS (
  SELECT 1 FROM duckdb_views() s WHERE NOT s.temporary AND s.view_name = t.view_name)
ORDER BY t.view_name"""


class _Work(Generic[T]):
    def __init__(
        self, con: duckdb.DuckDBPyConnection, fn: Callable[[duckdb.DuckDBPyConnection], T]
    ):
        self.cur = con.cursor()
        for name in _SESSION:
            value = con.execute("SELECT current_setting(?)", [name]).fetchall()[0][0]
            if value:
                self.cur.execute(f"SET {name} = ?", [value])
        for (sql,) in con.execute(_SHADOWS_SQL).fetchall():
            self.cur.execute(sql)
        self.fn = fn
        self.value: T | None = None
        self.error: BaseException | None = None
        self.helper = Helper(self._run, name="ranklens-background", daemon=True)

    def _run(self) -> None:
        try:
            self.value = self.fn(self.cur)
        except BaseException as exc:  # handed to the caller by result()
            self.error = exc

    def result(self) -> T:
        """Wait for the computation; its value, or its error raised here."""
        self.helper.wait()
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


@contextmanager
def background(
    con: duckdb.DuckDBPyConnection, fn: Callable[[duckdb.DuckDBPyConnection], T]
) -> Iterator[Callable[[], T]]:
    """Start `fn(cursor)` on a new cursor of `con`'s database; the block gets what waits for
    its result. `fn` must only read what is committed: it sees no change the block makes in
    an open transaction. Leaving the block early (an error, Ctrl+C) interrupts the cursor's
    queries until `fn` gives up (its outcome is dropped): the wait is at most the Python
    stretch `fn` is in. Why wait at all: a thread still inside DuckDB when the interpreter
    exits is torn down under it, and the process aborts (exit 134, not 143 or 130); how it
    waits: ingest/threads.py."""
    work = _Work(con, fn)
    try:
        work.helper.start()
        yield work.result
    finally:
        work.helper.outlast(work.cur.interrupt)
        work.cur.close()
