"""Analysis results kept in the run's database, so a face reuses them instead of recomputing.

Why: the dashboard and `report` recompute every analysis at each start (30 s on 10 M events),
though a run's tables never change after ingest (but by `realign`, which stamps the run).
Results are stored where the run is (one file to copy), each with what made it: tool version
(the release and a digest of the analysis code), schema version, the analysis' options and the
run's ingest (and realign) stamp. A stored result is used only when all of those still match
(else it is stale and the caller computes it), and only if it reads back identical to what was
computed: a table or a finding that would not round-trip is simply not stored.

Writing needs a writable connection (ingest's `finalize` hook, or `refresh` on a file nobody
holds open); reading works on the read-only connections every face uses.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, is_dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import duckdb
import polars as pl
from ranklens.analysis import _activity
from ranklens.analysis._base import Finding, Result, Severity
from ranklens.analysis._sql import query_pl
from ranklens.analysis.results_split import Done, Shared, helping, own_and_shared
from ranklens.ingest.database import connect_writable, registered
from ranklens.ingest.schema import SCHEMA_VERSION

from ranklens import __version__

META = "analysis_results"
# critical_path replays the others' findings inside build_report; it is not stored on its own.
SKIP = frozenset({"critical_path"})
_DDL = f"""CREATE TABLE IF NOT EXISTS {META} (
  analysis VARCHAR PRIMARY KEY, tool_version VARCHAR, schema_version VARCHAR, options VARCHAR,
  run_stamp VARCHAR, computed_at VARCHAR, findings VARCHAR, tables VARCHAR)"""


def tool_version() -> str:
    """The version that made a result: the release and a digest of the analysis code (its
    Python and SQL), so a changed analysis never serves what older code stored, even where
    the release number did not move (an editable install, a patched copy)."""
    return f"{__version__}+{_code_digest()}"


@functools.cache
def _code_digest() -> str:
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for f in sorted([*root.glob("*.py"), *root.glob("sql/*.sql")]):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def options_of(mod: ModuleType) -> str:
    """The options an analysis runs with by default, as stable text."""
    params = mod.Params() if hasattr(mod, "Params") else None
    if is_dataclass(params) and not isinstance(params, type):
        return json.dumps(asdict(params), sort_keys=True, default=repr)
    return repr(params)


def _stamp(con: duckdb.DuckDBPyConnection) -> str:
    """What identifies this state of the run: its ingest, and its last `realign` (the only
    change made to a run's tables after ingest: ingest/realign.py)."""
    rows = con.execute(
        "SELECT key, value FROM meta WHERE key IN ('ingested_at', 'n_files', 'realigned_at') "
        "ORDER BY key"
    ).fetchall()
    return ";".join(f"{k}={v}" for k, v in rows)


def store(con: duckdb.DuckDBPyConnection, res: Result, mod: ModuleType) -> bool:
    """Store `res` (computed by `mod` with its default options) in `con`; False when it would
    not read back identical (then nothing of it is stored)."""
    findings = json.dumps([f.as_dict() for f in res.findings])
    if [finding_of(d) for d in json.loads(findings)] != list(res.findings):
        return False
    return put(con, res.name, options_of(mod), {"": res.table, **res.tables}, findings)


def put(
    con: duckdb.DuckDBPyConnection,
    name: str,
    options: str,
    frames: dict[str, pl.DataFrame],
    findings: str = "[]",
) -> bool:
    """Store frames (and findings as JSON) under `name`, made with `options`, replacing what
    was there; False when a frame would not read back identical (then nothing is stored)."""
    con.execute(_DDL)
    drop(con, name)
    names = {key: _table_name(name, key) for key in frames}
    for key, df in frames.items():
        with registered(con, "_rs_frame", df):
            con.execute(f'CREATE TABLE "{names[key]}" AS SELECT * FROM _rs_frame')
        if not _reads_back(con, names[key], df):
            drop(con, name, list(names.values()))
            return False
    con.execute(
        f"INSERT INTO {META} VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [
            name,
            tool_version(),
            str(SCHEMA_VERSION),
            options,
            _stamp(con),
            datetime.now(timezone.utc).isoformat(),
            findings,
            json.dumps(names),
        ],
    )
    return True


_CHECK_ROWS = 1 << 18


def _reads_back(con: duckdb.DuckDBPyConnection, table: str, df: pl.DataFrame) -> bool:
    """Whether the stored `table` reads back as `df` (values and types), compared a batch of
    rows at a time: read back whole, the critical path of a one-step capture of 5 M kernels
    (millions of segments, with names) held a second copy of itself, the ingest's peak
    (6.2 GB)."""
    reader = con.sql(f'SELECT * FROM "{table}"').to_arrow_reader(_CHECK_ROWS)
    at = 0
    for batch in reader:
        back = pl.from_arrow(batch)
        assert isinstance(back, pl.DataFrame)
        if not back.equals(df.slice(at, batch.num_rows)):
            return False
        at += batch.num_rows
    if at == 0:  # no rows: the columns and their types
        empty = pl.from_arrow(reader.schema.empty_table())
        assert isinstance(empty, pl.DataFrame)
        return empty.equals(df)
    return at == df.height


def load(con: duckdb.DuckDBPyConnection, mod: ModuleType) -> Result | None:
    """The stored result of `mod` if it is fresh, else None (the caller computes it)."""
    got = get(con, mod.NAME, options_of(mod))
    if got is None:
        return None
    frames, findings = got
    params = mod.Params() if hasattr(mod, "Params") else None
    return Result(
        name=mod.NAME,
        table=frames.pop(""),
        findings=tuple(finding_of(d) for d in json.loads(findings)),
        params=params,
        tables=frames,
    )


def get(
    con: duckdb.DuckDBPyConnection, name: str, options: str
) -> tuple[dict[str, pl.DataFrame], str] | None:
    """The frames and findings JSON stored under `name` if fresh (this tool and schema
    version, these options, this state of the run), else None."""
    if not _has_meta(con):
        return None
    rows = con.execute(
        f"SELECT tool_version, schema_version, options, run_stamp, findings, tables FROM {META} "
        "WHERE analysis = ?",
        [name],
    ).fetchall()
    if not rows:
        return None
    tool, schema, stored_options, stamp, findings, tables = rows[0]
    want = (tool_version(), str(SCHEMA_VERSION), options, _stamp(con))
    if (tool, schema, stored_options, stamp) != want:
        return None
    names: dict[str, str] = json.loads(tables)
    return {key: query_pl(con, f'SELECT * FROM "{t}"') for key, t in names.items()}, findings


def compute_or_load(con: duckdb.DuckDBPyConnection, mod: ModuleType) -> Result:
    """The hook for build_report: a fresh stored result, else a computed one."""
    return load(con, mod) or mod.run(con)


def store_all(con: duckdb.DuckDBPyConnection, mods: tuple[ModuleType, ...]) -> list[str]:
    """Compute and store every analysis of `mods` (but SKIP); returns the names stored."""
    done = []
    with ExitStack() as stack:
        if _activity.users(mods):  # the shared islands, computed once
            stack.enter_context(_activity.held(con))
        for mod in mods:
            if mod.NAME not in SKIP and store(con, mod.run(con), mod):
                done.append(str(mod.NAME))
    return done


def finalize_run(con: duckdb.DuckDBPyConnection) -> None:
    """Ingest's last step before its atomic rename: the analysis views, every registered
    analysis' results, the assembled report and the timeline's whole-run overview, stored for
    the faces to reuse (a dashboard then serves its first page without computing)."""
    from ranklens.analysis import REGISTRY, critical_path
    from ranklens.analysis._background import background
    from ranklens.analysis.report import store_report
    from ranklens.analysis.timeline_store import store_overview
    from ranklens.analysis.views import store_views

    store_views(con)
    # The dependency graph is built on a connection of its own while the analyses run, and
    # then takes analyses from the same queue (results_split): it reads only the run's tables
    # and views, committed before this point. Both share DuckDB's memory budget: what did not
    # fit side by side is done again alone, as it was before.
    mods = tuple(m for m in REGISTRY if m.NAME not in SKIP)
    own, shared = own_and_shared(mods)
    model: critical_path.Model | None = None
    theirs: Done = {}
    done: set[str] = set()
    work = helping(shared, critical_path.model, _out_of_memory)
    with background(con, work) as built:
        _if_it_fits(con, lambda: done.update(_run_own(con, own, shared)))  # none if rolled back
        try:
            model, theirs = built()
        except duckdb.Error as exc:
            if not _out_of_memory(exc):
                raise
    if theirs and _if_it_fits(con, lambda: _store_each(con, theirs)):
        done.update(theirs)
    missing = tuple(m for m in mods if m.NAME not in done)
    if missing:
        _if_it_fits(con, lambda: store_all(con, missing))
    kept = model
    _if_it_fits(con, lambda: store_report(con, None if kept is None else lambda: kept))
    _if_it_fits(con, lambda: store_overview(con))
    mark_made(con)


def _store_each(con: duckdb.DuckDBPyConnection, results: Done) -> None:
    """Store results computed elsewhere (the graph's thread), each under its analysis."""
    for mod, res in results.values():
        store(con, res, mod)


def _run_own(
    con: duckdb.DuckDBPyConnection, own: tuple[ModuleType, ...], shared: Shared
) -> list[str]:
    """Compute and store `own` (with the activity views held), then what `shared` still holds;
    the names computed (stored, or not storable: either way not to be computed again)."""
    names = []
    if own:
        with _activity.held(con):
            for mod in own:
                store(con, mod.run(con), mod)
                names.append(str(mod.NAME))
    while (next_mod := shared.take()) is not None:
        store(con, next_mod.run(con), next_mod)
        names.append(str(next_mod.NAME))
    return names


MADE = "results_made_by"  # meta: the tool and run state the stored results were made for


def mark_made(con: duckdb.DuckDBPyConnection) -> None:
    """Say in `meta` that this tool stored what it could of this state of the run's results
    (a part that did not fit or would not read back is computed by the faces), so a face
    that finds the mark does not try to store them again."""
    con.execute("DELETE FROM meta WHERE key = ?", [MADE])
    con.execute("INSERT INTO meta VALUES (?, ?)", [MADE, _made_by(con)])


def made_here(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether this tool already stored the results of this state of the run (mark_made);
    False after `ingest --results later`, an upgrade, or a run from before the mark."""
    row = con.execute("SELECT value FROM meta WHERE key = ?", [MADE]).fetchone()
    return row is not None and row[0] == _made_by(con)


def _made_by(con: duckdb.DuckDBPyConnection) -> str:
    return f"{tool_version()};schema={SCHEMA_VERSION};{_stamp(con)}"


def _if_it_fits(con: duckdb.DuckDBPyConnection, step: Callable[[], object]) -> bool:
    """Run one storing step in a transaction; when it does not fit in the ingest's memory
    budget (loader: two thirds of the input), nothing of it is kept, the ingest goes on and this
    returns False: stored results only save the faces time, and they compute what is missing
    (on a 1,024-rank job the whole-run timeline overview needs ~1 GB, over that budget)."""
    con.execute("BEGIN TRANSACTION")
    try:
        step()
    except duckdb.Error as exc:
        con.execute("ROLLBACK")
        if _out_of_memory(exc):
            return False
        raise
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
    return True


def _out_of_memory(exc: BaseException | None) -> bool:
    """Whether `exc` is DuckDB's out-of-memory error, or one a cleanup raised while that error
    unwound (a `finally` that queries an aborted transaction: "Current transaction is aborted",
    with the memory error as its context)."""
    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, duckdb.OutOfMemoryException):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def refresh(db_path: str | os.PathLike[str], mods: tuple[ModuleType, ...]) -> list[str]:
    """Recompute what is stale in a database file nobody else holds open; returns the names."""
    con = connect_writable(db_path)
    try:
        stale = tuple(m for m in mods if m.NAME not in SKIP and load(con, m) is None)
        return store_all(con, stale)
    finally:
        con.close()


def drop(con: duckdb.DuckDBPyConnection, name: str, tables: list[str] | None = None) -> None:
    """Remove the stored result of `name` (its tables and its row)."""
    if tables is None and _has_meta(con):
        rows = con.execute(f"SELECT tables FROM {META} WHERE analysis = ?", [name]).fetchall()
        tables = list(json.loads(rows[0][0]).values()) if rows else []
    for t in tables or []:
        con.execute(f'DROP TABLE IF EXISTS "{t}"')
    if _has_meta(con):
        con.execute(f"DELETE FROM {META} WHERE analysis = ?", [name])


def _has_meta(con: duckdb.DuckDBPyConnection) -> bool:
    return bool(
        con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE table_name = ? "
            "AND database_name = current_database() AND schema_name = 'main'",
            [META],
        ).fetchall()[0][0]
    )


def _table_name(analysis: str, key: str) -> str:
    return f"result_{analysis}__{key or 'main'}"


def finding_of(d: dict[str, Any]) -> Finding:
    """A finding from its as_dict() read back from JSON."""
    return Finding(
        code=d["code"],
        severity=Severity(d["severity"]),
        message=d["message"],
        fix=d["fix"],
        time_at_stake_ns=d["time_at_stake_ns"],
        ranks=tuple(d["ranks"]),
        steps=tuple(d["steps"]),
        window_ns=None if d["window_ns"] is None else (d["window_ns"][0], d["window_ns"][1]),
        value=d["value"],
        threshold=d["threshold"],
        evidence=d["evidence"],
        saving_ns=d["saving_ns"],
        saving_method=d["saving_method"],
    )
