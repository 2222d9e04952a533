"""`ranklens realign`: the cross-rank stage again on a stored run, with another layout or offsets.

Why: the layout labels the groups and user offsets (or none) set the clocks, and both were fixed
when the traces were ingested; re-ingesting to change them means having the traces at hand and
decoding every byte again. Everything that stage needs is in the database: the events after the
option-free half of the stage (crossrank.attribute_communication: groups for communication the
traces left unlabelled) and the process groups. So realign resets what the second half writes
(the clock columns of `ranks`; `collectives` and the group labels are rebuilt whole), runs
crossrank.match_align_label with the new options, and replaces its facts in `meta`: the tables
are those a fresh ingest with the same options gives.

Atomic like ingest (output.py): the work is done on a copy beside the file, under the same lock,
and put in place by one rename, so an interrupted realign leaves the previous database, and
readers holding it open keep reading it. `realigned_at` in `meta` changes the run's stamp, so
analysis results stored with the old tables are stale (analysis/results_store.py); the caller's
`finalize` stores fresh ones before the rename.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import duckdb
from ranklens.ingest import output, shards
from ranklens.ingest.config import RunOptions
from ranklens.ingest.crossrank import check_layout, match_align_label
from ranklens.ingest.database import connect, is_database
from ranklens.ingest.errors import DatabaseError
from ranklens.ingest.loader import results_budget_mb
from ranklens.ingest.p2p_batches import build_batches

# The `meta` facts match_align_label writes (besides `option_*` of the options it was given).
_FACTS_SQL = r"""key IN ('p2p_peers_inferred', 'layout', 'realigned_at', 'option_align',
  'option_offsets', 'option_layout') OR key LIKE 'collectives\_%' ESCAPE '\'
  OR key LIKE 'align\_%' ESCAPE '\'"""
_HINT = "give the database file `ranklens ingest TRACES -o run.duckdb` wrote"


@dataclass(frozen=True)
class RealignReport:
    """What the realign did, for the command's summary line."""

    db_path: str
    comm_ops: int
    matched: int
    align_method: str
    max_residual_ns: int | None
    layout: str | None


def realign_tables(con: duckdb.DuckDBPyConnection, options: RunOptions) -> dict[str, str]:
    """Re-run matching, alignment and labels on the writable run `con`; returns the new facts.

    Raises:
        ConfigError: a layout that does not fit the run.
    """
    check_layout(con, options)
    # As the sink left them before the first alignment (p2p inference reads the offsets).
    con.execute(
        "UPDATE ranks SET clock_offset_ns = 0, clock_method = 'none', align_residual_ns = NULL"
    )
    build_batches(con)
    facts = match_align_label(con, options)
    facts["realigned_at"] = datetime.now(timezone.utc).isoformat()
    con.execute(f"DELETE FROM meta WHERE {_FACTS_SQL} OR list_contains(?, key)", [sorted(facts)])
    con.executemany("INSERT INTO meta VALUES (?, ?)", sorted(facts.items()))
    return facts


def realign_run(
    db_path: str | os.PathLike[str],
    options: RunOptions | None = None,
    *,
    finalize: Callable[[duckdb.DuckDBPyConnection], None] | None = None,
) -> RealignReport:
    """Realign the run database `db_path` in place, atomically (see the module docstring).

    Args:
        db_path: a database written by `ranklens ingest` (a link: the file it points to).
        options: the layout, offsets and alignment to use (the run's previous ones are not
            kept: as a fresh ingest with these options).
        finalize: called on the realigned copy before the rename (the CLI stores the analysis
            results with it).

    Raises:
        DatabaseError: no such file, not a ranklens database, or held by a writer.
        OutputError: the file or its directory cannot be written, or an ingest writes it.
        ConfigError: a layout that does not fit the run.
    """
    facts: dict[str, str] = {}

    def work(con: duckdb.DuckDBPyConnection) -> None:
        facts.update(realign_tables(con, options or RunOptions()))
        if finalize is not None:
            finalize(con)

    rewrite_run(db_path, work)
    return _report(str(db_path), facts)


def rewrite_run(
    db_path: str | os.PathLike[str], work: Callable[[duckdb.DuckDBPyConnection], None]
) -> None:
    """Run `work` on a writable copy of the run database `db_path` (a sharded run: its catalog,
    the shards attached) and put the copy in place by one rename, under the run's lock: an
    interrupted rewrite leaves the previous database, and readers holding it keep reading it.
    DuckDB gets the budget an ingest's stored results get (loader.results_budget_mb).

    Raises:
        DatabaseError: no such file, not a ranklens database, or held by a writer.
        OutputError: the file or its directory cannot be written, or another writer holds it.
    """
    out = _database_path(db_path)
    output.check_output(out, [])
    run_dir = (
        out.parent if shards.is_sharded_run(out.parent) and out.name == shards.CATALOG else None
    )
    with ExitStack() as stack:
        if run_dir is not None:  # no ingest replaces the run while its catalog is rewritten
            stack.enter_context(output.output_lock(run_dir))
        tmp = stack.enter_context(output.replacing(out))
        _copy(out, tmp, run_dir)
        con = duckdb.connect(str(tmp))
        try:
            con.execute("SET enable_progress_bar = false")
            if run_dir is not None:
                shards.attach(con, run_dir)
            events = int(con.execute("SELECT count(*) FROM events").fetchall()[0][0])
            con.execute(f"SET memory_limit = '{results_budget_mb(events)}MB'")
            work(con)
            con.execute("CHECKPOINT")
        finally:
            con.close()


def _database_path(db_path: str | os.PathLike[str]) -> Path:
    """The file to replace, refused unless it is a database (checked before any work)."""
    given = Path(db_path)
    if shards.is_sharded_run(given):
        given = given / shards.CATALOG
    if given.is_dir():
        raise DatabaseError(
            f"{given}: is a directory; realign works on a run's database",
            "give the database file ingest wrote, or ingest the traces with the options "
            "(ranklens ingest DIR -o run.duckdb --layout ...)",
        )
    if not given.exists():
        raise DatabaseError(f"{given}: no such file", _HINT)
    out = Path(os.path.realpath(given))
    if not is_database(out):
        raise DatabaseError(f"{given}: not a DuckDB database", _HINT)
    return out


def _copy(out: Path, tmp: Path, run_dir: Path | None) -> None:
    """Copy the database (and a `.wal` it may have) while holding it open read-only: that
    checks it is a ranklens database of this schema, and keeps a writer from changing it
    during the copy (DuckDB refuses a writer while a reader holds the file). A sharded run's
    catalog only: realign never changes events."""
    src = connect(run_dir or out)
    try:
        shutil.copyfile(out, tmp)
        wal = Path(str(out) + ".wal")
        if wal.exists():
            shutil.copyfile(wal, str(tmp) + ".wal")
    finally:
        src.close()
    shutil.copymode(out, tmp)


def _report(db_path: str, facts: dict[str, str]) -> RealignReport:
    counts = {
        k.removeprefix("collectives_"): int(v)
        for k, v in facts.items()
        if k.startswith("collectives_")
    }
    residual = facts.get("align_max_residual_ns", "")
    return RealignReport(
        db_path=db_path,
        comm_ops=sum(counts.values()),
        matched=counts.get("matched", 0),
        align_method=facts.get("align_method", ""),
        max_residual_ns=int(residual) if residual else None,
        layout=facts.get("layout"),
    )
