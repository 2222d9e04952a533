"""The whole report and the timeline overview kept in the run at ingest: the same as computed,
read back without building the dependency graph, and recomputed when stale."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest
from ranklens.analysis import REGISTRY, critical_path, report, results_store, timeline_store
from ranklens.analysis import timeline as tl
from ranklens.analysis.whatif_run import default_scenarios
from ranklens.ingest.run import ingest_traces

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "megatron_tp2_pp2_dp2" / "raw"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Megatron sample (tp2 pp2 dp2) ingested as `ranklens ingest` does (finalize_run)."""
    db = tmp_path_factory.mktemp("report_store") / "run.duckdb"
    ingest_traces([str(SAMPLE)], db, finalize=results_store.finalize_run)
    return db


def test_everything_a_face_needs_is_stored(run: Path) -> None:
    con = duckdb.connect(str(run), read_only=True)
    names = {r[0] for r in con.execute("SELECT analysis FROM analysis_results").fetchall()}
    con.close()
    # every analysis (pipeline included: its evidence reads back identical), the report, the
    # timeline overview: nothing silently left to be recomputed at each start
    want = {m.NAME for m in REGISTRY} | {report.STORED, timeline_store.NAME}
    assert names == want


def test_stored_report_equals_the_computed_one(run: Path) -> None:
    con = duckdb.connect(str(run), read_only=True)
    kept = report.stored_report(con)
    assert kept is not None
    stored, scenarios = kept
    fresh, model = report._assemble(con, None)  # computed now, stored results not used for cp
    assert model is not None
    assert stored.findings == fresh.findings
    assert stored.facts == fresh.facts
    assert list(stored.results) == list(fresh.results)
    for name, res in fresh.results.items():
        got = stored.results[name]
        assert got.table.equals(res.table), name
        assert set(got.tables) == set(res.tables), name
        assert all(got.tables[k].equals(res.tables[k]) for k in res.tables), name
        assert got.findings == res.findings, name
    assert scenarios == default_scenarios(model)
    assert "stage-balance" in scenarios  # an independent fact: the sample has pp=2
    assert any(f.saving_ns is not None for f in stored.findings)  # savings came with it
    ov, want = timeline_store.stored_overview(con), tl.overview(con, tl.extent(con))
    assert ov is not None
    assert (ov.start_ns, ov.end_ns, ov.bucket_ns) == (want.start_ns, want.end_ns, want.bucket_ns)
    assert ov.buckets.equals(want.buckets) and ov.segments.equals(want.segments)
    con.close()


def test_report_from_the_run_builds_no_graph(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_graph(*_: object, **__: object) -> None:
        raise AssertionError("the dependency graph was built")

    con = duckdb.connect(str(run), read_only=True)
    want = report.stored_report(con)
    assert want is not None
    monkeypatch.setattr(critical_path, "model", no_graph)
    assert report.build_report(con).findings == want[0].findings
    monkeypatch.undo()
    con.close()


def test_stale_report_is_recomputed(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "copy.duckdb"
    shutil.copy(run, db)
    con = duckdb.connect(str(db), read_only=True)
    assert report.stored_report(con) is not None
    monkeypatch.setattr(results_store, "__version__", "0.0.0-other")  # another tool version
    assert report.stored_report(con) is None
    assert timeline_store.stored_overview(con) is None
    assert report.stored_scenarios(con) is None
    monkeypatch.undo()
    # an analysis' options changed: the report (which ranks their findings) is stale too
    real = results_store.options_of
    monkeypatch.setattr(
        results_store,
        "options_of",
        lambda mod: "{other}" if mod.NAME == "overlap" else real(mod),
    )
    assert report.stored_report(con) is None
    monkeypatch.undo()
    con.close()
    rw = duckdb.connect(str(db))
    rw.execute("UPDATE meta SET value = 'later' WHERE key = 'ingested_at'")  # re-ingested
    assert report.stored_report(rw) is None
    rebuilt = report.build_report(rw)  # computed again, the same findings
    rw.close()
    con = duckdb.connect(str(run), read_only=True)
    kept = report.stored_report(con)
    con.close()
    assert kept is not None and rebuilt.findings == kept[0].findings


def test_a_step_over_the_memory_budget_is_left_out_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Storing is a saving, never a reason to fail an ingest: a step that runs out of memory
    is rolled back (no half-stored table) and the ingest goes on; a run with too many lanes
    does not store the timeline overview at all (the dashboard computes it when asked)."""

    def half_then_oom(con: duckdb.DuckDBPyConnection) -> bool:
        con.execute("CREATE TABLE result_timeline_overview__span AS SELECT 1 AS x")
        raise duckdb.OutOfMemoryException("Out of Memory Error: failed to pin block")

    monkeypatch.setattr(timeline_store, "store_overview", half_then_oom)
    db = tmp_path / "oom.duckdb"
    ingest_traces([str(SAMPLE)], db, finalize=results_store.finalize_run)
    con = duckdb.connect(str(db), read_only=True)
    tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    assert "result_timeline_overview__span" not in tables
    assert report.stored_report(con) is not None  # the steps before it were kept
    assert timeline_store.stored_overview(con) is None
    con.close()
    monkeypatch.undo()
    monkeypatch.setattr(timeline_store, "MAX_LANES", 1)
    db = tmp_path / "wide.duckdb"
    ingest_traces([str(SAMPLE)], db, finalize=results_store.finalize_run)
    con = duckdb.connect(str(db), read_only=True)
    assert timeline_store.stored_overview(con) is None
    assert timeline_store.overview(con).buckets.height > 0  # computed when asked
    con.close()
