"""`ranklens ingest --results later` and the first face that stores the results: the run is
queryable without them, the first `report` stores exactly what an ingest with its results
stores (atomically, the run's tables untouched), later faces read them; a run that is
read-only, busy or given with --no-store is left byte for byte as it was."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import duckdb
import pytest
from ranklens.analysis import (
    REGISTRY,
    by_name,
    critical_path,
    report,
    results_keep,
    results_store,
    timeline_store,
)
from ranklens.analysis.results_store import finalize_run
from ranklens.cli.main import app
from ranklens.ingest import loader, output
from ranklens.ingest.realign import realign_run
from typer.testing import CliRunner

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "megatron_tp2_pp2_dp2" / "raw"
runner = CliRunner()
TABLES = ("events", "ranks", "steps", "collectives", "process_groups", "meta")


def invoke(*args: str) -> tuple[str, str]:
    res = runner.invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return str(res.stdout), str(res.stderr)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stored_names(db: Path) -> set[str]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        has = con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'analysis_results'"
        ).fetchall()[0][0]
        if not has:
            return set()
        return {r[0] for r in con.execute("SELECT analysis FROM analysis_results").fetchall()}
    finally:
        con.close()


def made_here(db: Path) -> bool:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return results_store.made_here(con)
    finally:
        con.close()


def tables_of(db: Path) -> dict[str, list[tuple[object, ...]]]:
    """The run's own tables, sorted rows (meta without the results' mark)."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        out = {}
        for t in TABLES:
            where = f" WHERE key <> '{results_store.MADE}'" if t == "meta" else ""
            out[t] = sorted(con.execute(f"SELECT * FROM {t}{where}").fetchall(), key=repr)
        return out
    finally:
        con.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The Megatron sample (tp2 pp2 dp2) ingested with its results and with --results later."""
    d = tmp_path_factory.mktemp("first_use")
    invoke("ingest", str(SAMPLE), "-o", str(d / "now.duckdb"))
    _, said = invoke("ingest", str(SAMPLE), "-o", str(d / "later.duckdb"), "--results", "later")
    assert "--results later" in said
    return {"now": d / "now.duckdb", "later": d / "later.duckdb"}


def copy_of(src: Path, dst: Path) -> Path:
    dst.write_bytes(src.read_bytes())
    return dst


def test_later_is_queryable_and_stores_nothing(runs: dict[str, Path]) -> None:
    assert stored_names(runs["later"]) == set() and not made_here(runs["later"])
    want = {m.NAME for m in REGISTRY} | {report.STORED, timeline_store.NAME}
    assert stored_names(runs["now"]) == want and made_here(runs["now"])
    # the views are there: SQL over the run works without the results
    query = "SELECT count(*) AS n FROM breakdown_by_rank"
    out, _ = invoke("sql", str(runs["later"]), query, "-f", "csv")
    assert int(out.splitlines()[1]) > 0


def test_first_report_stores_what_ingest_would(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = copy_of(runs["later"], tmp_path / "run.duckdb")
    before = tables_of(db)
    first, said = invoke("report", str(db), "-f", "json")
    assert "storing the analysis results" in said and "stored them in" in said
    assert stored_names(db) == stored_names(runs["now"]) and made_here(db)
    assert tables_of(db) == before  # the run's own tables are untouched
    want, _ = invoke("report", str(runs["now"]), "-f", "json")
    assert json.loads(first) == json.loads(want)  # as an ingest with its results reports it
    assert json.loads(first)["findings"]  # an independent fact: the sample has findings
    # the next report reads them: no graph built, nothing stored again, the same report
    monkeypatch.setattr(critical_path, "model", _refuse)
    again, said = invoke("report", str(db), "-f", "json")
    assert "stor" not in said and again == first
    assert not list(tmp_path.glob(".run.duckdb*"))  # no copy, lock or .wal left beside it


def test_stale_results_are_stored_again(runs: dict[str, Path], tmp_path: Path) -> None:
    db = copy_of(runs["now"], tmp_path / "run.duckdb")
    con = duckdb.connect(str(db))
    con.execute("UPDATE analysis_results SET tool_version = 'older'")
    con.execute("UPDATE meta SET value = 'older' WHERE key = ?", [results_store.MADE])
    con.close()
    _, said = invoke("report", str(db))
    assert "stored them in" in said and made_here(db)
    con = duckdb.connect(str(db), read_only=True)
    versions = {r[0] for r in con.execute("SELECT tool_version FROM analysis_results").fetchall()}
    con.close()
    assert versions == {results_store.tool_version()}


def test_no_store_leaves_the_run_as_it_is(runs: dict[str, Path], tmp_path: Path) -> None:
    db = copy_of(runs["later"], tmp_path / "run.duckdb")
    before = digest(db)
    out, said = invoke("report", str(db), "--no-store", "-f", "json")
    assert digest(db) == before and "stor" not in said
    want, _ = invoke("report", str(runs["now"]), "-f", "json")
    assert json.loads(out) == json.loads(want)  # computed, the same report


def test_a_read_only_run_is_left_as_it_is(runs: dict[str, Path], tmp_path: Path) -> None:
    db = copy_of(runs["later"], tmp_path / "run.duckdb")
    os.chmod(db, stat.S_IRUSR | stat.S_IRGRP)
    before = digest(db)
    try:
        out, said = invoke("report", str(db), "-f", "json")
    finally:
        os.chmod(db, stat.S_IRUSR | stat.S_IWUSR)
    assert digest(db) == before
    assert "is read-only" in said and "computed now, not kept" in said
    assert json.loads(out)["findings"]


def test_a_busy_run_is_left_as_it_is(runs: dict[str, Path], tmp_path: Path) -> None:
    db = copy_of(runs["later"], tmp_path / "run.duckdb")
    before = digest(db)
    with output.output_lock(db, "realign"):  # another writer holds the run
        out, said = invoke("report", str(db), "-f", "json")
    assert digest(db) == before and "not stored" in said and "computed now" in said
    assert json.loads(out)["findings"]


def test_an_interrupted_store_keeps_the_run(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = copy_of(runs["later"], tmp_path / "run.duckdb")
    before = digest(db)

    def stopped(con: duckdb.DuckDBPyConnection) -> None:
        results_store.store_all(con, REGISTRY[:2])  # part of the results written, then Ctrl+C
        raise KeyboardInterrupt

    monkeypatch.setattr(results_keep, "finalize_run", stopped)
    with pytest.raises(KeyboardInterrupt):
        results_keep.keep(db)
    assert digest(db) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.duckdb"]


def test_results_stored_outside_an_ingest_are_on_its_budget(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At first use (and in realign) the stored results get the ingest's DuckDB budget per
    event (bounded by half the memory), not DuckDB's default of 80% of the machine's memory."""
    monkeypatch.setattr(loader, "RESULTS_BYTES_PER_EVENT", 2**20)  # a budget the events size
    db = copy_of(runs["later"], tmp_path / "run.duckdb")
    with duckdb.connect(str(db), read_only=True) as con:
        events = int(con.execute("SELECT count(*) FROM events").fetchall()[0][0])
    scratch = duckdb.connect()
    default = scratch.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
    scratch.execute(f"SET memory_limit = '{loader.results_budget_mb(events)}MB'")
    want = scratch.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
    assert events > 256 and want != default  # the check below could fail
    seen: list[str] = []

    def noted(con: duckdb.DuckDBPyConnection) -> None:
        seen.append(con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0])
        finalize_run(con)

    monkeypatch.setattr(results_keep, "finalize_run", noted)
    assert results_keep.keep(db).stored
    realign_run(db, finalize=noted)
    assert seen == [want, want]
    assert made_here(db)


def test_a_sharded_run_gets_its_results_in_the_catalog(tmp_path: Path) -> None:
    out = tmp_path / "run"
    invoke("ingest", str(SAMPLE), "-o", str(out), "--storage", "shards", "--results", "later")
    shards = {p: digest(p) for p in sorted(out.rglob("*.parquet"))}
    assert shards and not made_here(out / "catalog.duckdb")
    _, said = invoke("report", str(out))
    assert "stored them in" in said and made_here(out / "catalog.duckdb")
    assert {p: digest(p) for p in sorted(out.rglob("*.parquet"))} == shards  # events untouched


def test_unknown_results_value_is_a_usage_error(tmp_path: Path) -> None:
    res = runner.invoke(app, ["ingest", str(SAMPLE), "-o", str(tmp_path / "r.duckdb"),
                              "--results", "soon"])  # fmt: skip
    assert res.exit_code == 2 and "unknown --results 'soon'" in res.output
    assert not (tmp_path / "r.duckdb").exists()


def _refuse(*_: object, **__: object) -> None:
    raise AssertionError("the dependency graph was built")


@pytest.mark.parametrize(("name", "table"), [("overlap", None), ("pipeline", "blocks")])
def test_analyze_reads_a_fresh_stored_result(
    runs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, name: str, table: str | None
) -> None:
    """`analyze` prints the stored result, identical to what it computes on the run without
    one; with the analysis made unable to run, only the stored one can answer."""
    extra = [] if table is None else ["--table", table]
    computed, _ = invoke("analyze", name, str(runs["later"]), "-f", "csv", *extra)
    mod = by_name()[name]

    def cannot(*_a: object, **_k: object) -> None:
        raise AssertionError(f"{name} computed again")

    monkeypatch.setattr(mod, "run", cannot)
    stored, _ = invoke("analyze", name, str(runs["now"]), "-f", "csv", *extra)
    assert stored == computed and len(computed.splitlines()) > 1
    res = runner.invoke(app, ["analyze", name, str(runs["later"]), "-f", "csv", *extra])
    assert res.exit_code != 0 and "computed again" in repr(res.exception)
