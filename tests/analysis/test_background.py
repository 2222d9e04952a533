"""analysis/_background.py: the dependency graph's model is built on a connection of its own
while the analyses' results are stored (finalize_run). What it must keep: the value of the
computation, its error, the session settings a sharded run's views need, a prompt exit when
the caller stops early, and stored results identical to those computed one after the other."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import duckdb
import pytest
from duckdb.sqltypes import BIGINT
from ranklens.analysis import critical_path, report, results_split
from ranklens.analysis._background import background
from ranklens.analysis.report import stored_report
from ranklens.ingest.loader import load_traces
from ranklens.sample_traces.gpu_job import GpuJob, write_job


def test_value_on_its_own_connection(tmp_path: Path) -> None:
    con = duckdb.connect(str(tmp_path / "a.duckdb"))
    con.execute("CREATE TABLE t AS SELECT range AS x FROM range(10)")
    seen: list[int] = []

    def fn(c: duckdb.DuckDBPyConnection) -> int:
        seen.append(threading.get_ident())
        c.execute("CREATE TEMP TABLE mine AS SELECT 1")  # a temp table of its own connection
        return int(c.execute("SELECT sum(x) FROM t").fetchall()[0][0])

    with background(con, fn) as result:
        assert result() == 45
    assert seen and seen[0] != threading.get_ident()
    assert (
        con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'mine'").fetchall()[0][
            0
        ]
        == 0
    )


def test_its_error_is_raised_by_result(tmp_path: Path) -> None:
    con = duckdb.connect(str(tmp_path / "a.duckdb"))

    def fn(c: duckdb.DuckDBPyConnection) -> int:
        c.execute("SELECT * FROM missing_table")
        return 0

    with background(con, fn) as result, pytest.raises(duckdb.CatalogException):
        result()


def test_session_settings_follow(tmp_path: Path) -> None:
    """A sharded run's views read Parquet files relative to file_search_path, a session
    setting a new cursor would not have."""
    con = duckdb.connect(str(tmp_path / "a.duckdb"))
    (tmp_path / "it's").mkdir()
    con.execute(
        "COPY (SELECT 7 AS v) TO ? (FORMAT parquet)", [str(tmp_path / "it's" / "v.parquet")]
    )
    con.execute("SET file_search_path = ?", [str(tmp_path / "it's")])
    with background(con, lambda c: c.execute("SELECT v FROM 'v.parquet'").fetchall()) as result:
        assert result() == [(7,)]


def test_views_shadowing_stored_ones_follow(tmp_path: Path) -> None:
    """A sharded run's stored `events` reads its shards by a path relative to the run; the
    caller's connection shadows it by a temporary view on their absolute path (shards.attach),
    which a new cursor would not see: it then read no shard outside the run directory."""
    con = duckdb.connect(str(tmp_path / "a.duckdb"))
    con.execute("CREATE VIEW v AS SELECT 1 AS x")  # the stored one: not what the caller reads
    con.execute("CREATE VIEW other AS SELECT 1 AS x")
    con.execute("CREATE TEMP VIEW v AS SELECT 7 AS x")
    con.execute("CREATE TEMP VIEW mine AS SELECT 2 AS x")  # shadows nothing: not copied
    views = "SELECT count(*) FROM duckdb_views() WHERE temporary AND view_name = 'mine'"
    with background(
        con, lambda c: (c.execute("SELECT x FROM v").fetchall(), c.execute(views).fetchall())
    ) as result:
        assert result() == ([(7,)], [(0,)])


def test_leaving_early_stops_its_query(tmp_path: Path) -> None:
    """Ctrl+C in the caller's block: the running query is stopped and the block left once the
    thread is done, promptly (a thread left inside DuckDB aborts the interpreter at exit)."""
    con = duckdb.connect(str(tmp_path / "a.duckdb"))
    running = threading.Event()
    errors: list[BaseException] = []

    def mark(x: int) -> int:  # called by the query itself: set once it is running
        running.set()
        return 3

    def slow(c: duckdb.DuckDBPyConnection) -> None:
        c.create_function("mark", mark, [BIGINT], BIGINT)
        try:
            c.execute(
                "SELECT count(*) FROM range(100000000000) a WHERE a.range % 7 = mark(a.range)"
            )
        except BaseException as exc:
            errors.append(exc)
            raise

    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt), background(con, slow):
        assert running.wait(60)
        raise KeyboardInterrupt
    assert errors and "interrupt" in str(errors[0]).lower(), errors  # the thread is done
    assert time.monotonic() - t0 < 60  # stopped: the query would run for hours


def test_stored_report_is_what_one_after_the_other_computes(tmp_path: Path) -> None:
    """finalize_run's model (built side by side with the analyses) gives the stored report,
    critical path and savings included, that the sequential assembly computes."""
    job = GpuJob(tp=2, pp=4, dp=2, m=8, steps=3, stage_factor={2: 1.5}, rank_factor={5: 1.3})
    write_job(job, tmp_path / "run")
    db = tmp_path / "run.duckdb"
    from ranklens.analysis.results_store import finalize_run

    load_traces([str(tmp_path / "run")], db, workers=1, finalize=finalize_run)
    con = duckdb.connect(str(db), read_only=True)
    kept = stored_report(con)
    assert kept is not None
    stored = kept[0]
    fresh, _model = report._assemble(con, None)
    assert stored.findings == fresh.findings
    assert stored.facts == fresh.facts
    cp = critical_path.NAME
    for name, table in fresh.results[cp].tables.items():
        assert stored.results[cp].tables[name].equals(table), name
    assert any(f.saving_ns for f in stored.findings)  # the savings' replays ran on that model


def _job_db(tmp_path: Path) -> Path:
    write_job(GpuJob(tp=1, pp=2, dp=2, m=4, steps=2), tmp_path / "run")
    db = tmp_path / "run.duckdb"
    load_traces([str(tmp_path / "run")], db, workers=1)
    return db


def _stored(db: Path) -> list[str]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return [r[0] for r in con.execute("SELECT analysis FROM analysis_results").fetchall()]
    finally:
        con.close()


def test_what_did_not_fit_side_by_side_is_done_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both halves share DuckDB's memory budget (a third of the input): the graph built beside
    the analyses, or the analyses beside the graph, may run out of it. Each is then done
    again alone, as before: nothing is lost (seen on the 5 M-kernel Nsight export)."""
    from ranklens.analysis import results_store

    db = _job_db(tmp_path)
    calls = {"model": 0, "own": 0, "store_all": 0}
    real_model, real_own = critical_path.model, results_store._run_own
    real_store_all = results_store.store_all

    def model(con: duckdb.DuckDBPyConnection) -> critical_path.Model:
        calls["model"] += 1
        if calls["model"] == 1:
            raise duckdb.OutOfMemoryException("Out of Memory Error: side by side")
        return real_model(con)

    def own(con: duckdb.DuckDBPyConnection, mods: tuple[ModuleType, ...], shared: Any) -> None:
        calls["own"] += 1
        real_own(con, mods[:2], results_split.Shared([]))  # some written, then out of memory
        raise duckdb.OutOfMemoryException("Out of Memory Error: side by side")

    def store_all(con: duckdb.DuckDBPyConnection, mods: tuple[ModuleType, ...]) -> list[str]:
        calls["store_all"] += 1
        done: list[str] = real_store_all(con, mods)
        return done

    monkeypatch.setattr(critical_path, "model", model)
    monkeypatch.setattr(results_store, "_run_own", own)
    monkeypatch.setattr(results_store, "store_all", store_all)
    con = duckdb.connect(str(db))
    results_store.finalize_run(con)
    con.close()
    # the graph failed before it took any analysis, the analyses' transaction was rolled back:
    # every analysis is computed once more, alone, and the graph once more for the report
    assert calls == {"model": 2, "own": 1, "store_all": 1}
    got = _stored(db)
    for name in ("report", "critical_path", "pipeline", "contention", "overlap", "stragglers"):
        assert name in got, name


def test_the_graphs_thread_takes_analyses_each_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the graph is built, its thread takes analyses from the queue the ingest's
    connection takes from too (results_split): each analysis runs once, on one side, the
    thread's results are stored by the ingest's connection, and the stored report is the one
    computed alone. One that does not fit on the thread is computed after the join."""
    from ranklens.analysis import REGISTRY, results_store

    db = _job_db(tmp_path)
    ran: dict[str, list[int]] = {}
    helped = threading.Event()
    real_own, real_helping = results_store._run_own, results_store.helping

    def own(con: duckdb.DuckDBPyConnection, mods: tuple[ModuleType, ...], shared: Any) -> list[str]:
        assert helped.wait(60)  # the thread takes the whole queue first (deterministic)
        return real_own(con, mods, shared)

    def helping(*args: Any) -> Any:
        work = real_helping(*args)

        def done_then_say(cur: duckdb.DuckDBPyConnection) -> Any:
            try:
                return work(cur)
            finally:
                helped.set()

        return done_then_say

    def counted(mod: ModuleType, fail: bool) -> Any:
        real = mod.run

        def run(con: duckdb.DuckDBPyConnection) -> Any:
            ran.setdefault(mod.NAME, []).append(threading.get_ident())
            if fail and len(ran[mod.NAME]) == 1:
                raise duckdb.OutOfMemoryException("Out of Memory Error: on the thread")
            return real(con)

        return run

    shared = [m for m in REGISTRY if not getattr(m, "USES_ACTIVITY", False)]
    shared = [m for m in shared if m.NAME not in results_store.SKIP]
    assert len(shared) >= 2
    for i, mod in enumerate(shared):
        monkeypatch.setattr(mod, "run", counted(mod, fail=i == len(shared) - 1))
    monkeypatch.setattr(results_store, "_run_own", own)
    monkeypatch.setattr(results_store, "helping", helping)
    con = duckdb.connect(str(db))
    results_store.finalize_run(con)
    con.close()
    main = threading.get_ident()
    for mod in shared[:-1]:  # taken by the thread, computed there once
        assert len(ran[mod.NAME]) == 1 and ran[mod.NAME][0] != main, mod.NAME
    last = ran[shared[-1].NAME]  # out of memory on the thread: computed again here
    assert len(last) == 2 and last[0] != main and last[1] == main
    got = _stored(db)
    for mod in shared:
        assert mod.NAME in got, mod.NAME
    monkeypatch.undo()
    con = duckdb.connect(str(db), read_only=True)
    kept = stored_report(con)
    assert kept is not None
    fresh, _model = report._assemble(con, None)
    assert kept[0].findings == fresh.findings and kept[0].facts == fresh.facts
    con.close()


def test_a_cleanup_after_running_out_of_memory_is_still_out_of_memory(tmp_path: Path) -> None:
    """A `finally` that queries the transaction DuckDB aborted raises "Current transaction is
    aborted", the memory error only its context: the step still did not fit (nothing kept,
    the ingest goes on), it is not an internal error."""
    from ranklens.analysis.results_store import _if_it_fits

    con = duckdb.connect(str(tmp_path / "a.duckdb"))
    con.execute("SET memory_limit = '2MB'")
    con.execute("SET temp_directory = ''")  # no spilling: the sort below cannot fit

    def step() -> None:
        con.execute("CREATE TABLE kept AS SELECT 1")
        try:
            con.execute(
                "SELECT range::VARCHAR || 'x' AS s FROM range(3000000) ORDER BY s DESC"
            ).fetchall()
        finally:
            con.execute("DROP TABLE IF EXISTS temp.scratch")  # on the aborted transaction

    assert _if_it_fits(con, step) is False
    assert con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'kept'"
    ).fetchall() == [(0,)]
    assert _if_it_fits(con, lambda: con.execute("CREATE TABLE fine AS SELECT 1")) is True
    with pytest.raises(duckdb.CatalogException):  # any other error is raised as it is
        _if_it_fits(con, lambda: con.execute("SELECT * FROM missing"))
