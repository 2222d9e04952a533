"""Stored results made at first use: a face that finds a run's results missing or stale
stores them in the run before it reads them.

Why: results are stored at ingest, but a run ingested with `--results later` (a 5 M-kernel
capture is queryable in seconds; its results take half a minute), or by an older ranklens, had
none a face could use, and every `report` and dashboard start computed them all again. The
first of them now stores them, the way `realign` rewrites a run (ingest/realign.rewrite_run: a
copy beside the file, one rename, under the run's lock), so an interrupted face leaves the run
as it was and a reader holding it open keeps reading it. A run the user cannot write (or has
made read-only), or one another writer holds, is left as it is: the face computes what it
needs, as before, and says why nothing was kept.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb
from ranklens.analysis.results_store import finalize_run, made_here
from ranklens.analysis.views import store_views
from ranklens.ingest.database import connect
from ranklens.ingest.errors import RanklensError
from ranklens.ingest.realign import rewrite_run
from ranklens.ingest.run import Run
from ranklens.ingest.shards import CATALOG, is_sharded_run

NO_STORE = "--no-store leaves the run as it is"
WHEN = ("now", "later")  # ingest --results
LATER_NOTE = (
    "analysis results not stored (--results later): the first `ranklens report` or "
    "`ranklens dashboard` on the run stores them"
)


def finalizer(when: str) -> Callable[[duckdb.DuckDBPyConnection], None]:
    """Ingest's last step for `--results WHEN`: the views and every stored result (now), or
    the views only (later: the run is queryable sooner, a face stores the rest: keep)."""
    if when not in WHEN:
        raise ValueError(f"unknown --results {when!r}; use one of {WHEN}")
    return finalize_run if when == "now" else store_views


@dataclass(frozen=True)
class Kept:
    """What keep did: nothing needed, stored (in `seconds`), or not stored and why."""

    run: str
    needed: bool
    stored: bool = False
    seconds: float = 0.0
    why_not: str = ""

    @property
    def message(self) -> str:
        """The line a face prints ('' when the run's results were fresh)."""
        if not self.needed:
            return ""
        if self.stored:
            return f"stored them in {self.seconds:.1f} s: the next faces read them"
        return (
            f"{self.run} has no fresh stored results and they were not stored ({self.why_not}): "
            "computed now, not kept"
        )


def keep_run(run: Run, log: Callable[[str], None]) -> None:
    """What a face calls on the run it opened: a database gets its results stored (keep); a
    temporary ingest of traces is left alone (it is removed when the face ends)."""
    if run.report is None:
        keep(run.db_path, log)


def keep(db_path: str | os.PathLike[str], log: Callable[[str], None] | None = None) -> Kept:
    """Store the analysis results of the run database `db_path` if this tool has not stored
    them for this state of the run (results_store.made_here), saying to `log` that it starts
    and how it ended; never raises for a run it cannot rewrite, it says why (Kept.why_not)."""
    kept = _keep(str(db_path), log or (lambda _: None))
    if log is not None and kept.message:
        log(kept.message)
    return kept


def _keep(run: str, log: Callable[[str], None]) -> Kept:
    con = connect(run)
    try:
        if made_here(con):
            return Kept(run, needed=False)
    finally:
        con.close()
    if (why := _unwritable(Path(run))) is not None:
        return Kept(run, needed=True, why_not=why)
    log(f"storing the analysis results in {run} (first use; {NO_STORE}) ...")
    t0 = time.perf_counter()
    try:
        rewrite_run(run, finalize_run)
    except (RanklensError, OSError, duckdb.Error) as exc:
        msg = exc.message if isinstance(exc, RanklensError) else str(exc).splitlines()[0]
        return Kept(run, needed=True, why_not=msg)
    return Kept(run, needed=True, stored=True, seconds=time.perf_counter() - t0)


def _unwritable(given: Path) -> str | None:
    """Why the run's database must not be rewritten: the user cannot write it, or made it
    read-only (no write bit: respected even where the user could replace it, e.g. as root)."""
    path = given / CATALOG if is_sharded_run(given) else given
    path = Path(os.path.realpath(path))
    mode = path.stat().st_mode
    if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) or not os.access(path, os.W_OK):
        return f"{path} is read-only"
    if not os.access(path.parent, os.W_OK | os.X_OK):
        return f"cannot write in {path.parent}"
    return None
