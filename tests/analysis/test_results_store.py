"""Persisted analysis results: stored with what made them, reused when fresh, refused when stale."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import polars as pl
import pytest
from ranklens.analysis import REGISTRY, results_store
from ranklens.ingest.run import ingest_traces

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "megatron_tp2_pp2_dp2" / "raw"


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A run whose results were stored at ingest (the finalize hook), and what was stored."""
    db = tmp_path_factory.mktemp("rs") / "run.duckdb"
    names: list[str] = []
    ingest_traces(
        [str(SAMPLE)], db, finalize=lambda con: names.extend(results_store.store_all(con, REGISTRY))
    )
    return db, names


def test_fresh_results_equal_computed(stored: tuple[Path, list[str]]) -> None:
    db, names = stored
    # every analysis round-trips on this sample (pipeline's evidence included); critical_path
    # is stored with the report (test_report_store), not by store_all
    assert set(names) == {m.NAME for m in REGISTRY} - {"critical_path"}
    con = duckdb.connect(str(db), read_only=True)
    for mod in REGISTRY:
        got = results_store.load(con, mod)
        if mod.NAME not in names:
            assert got is None, mod.NAME
            continue
        assert got is not None, mod.NAME
        want = mod.run(con)
        assert got.table.equals(want.table), mod.NAME
        assert set(got.tables) == set(want.tables), mod.NAME
        assert all(got.tables[k].equals(want.tables[k]) for k in want.tables), mod.NAME
        assert got.findings == want.findings, mod.NAME
        assert results_store.compute_or_load(con, mod).table.equals(want.table)
    con.close()


def test_stale_when_version_options_or_run_change(
    stored: tuple[Path, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "copy.duckdb"
    shutil.copy(stored[0], db)
    breakdown = next(m for m in REGISTRY if m.NAME == "breakdown")
    con = duckdb.connect(str(db), read_only=True)
    assert results_store.load(con, breakdown) is not None
    monkeypatch.setattr(results_store, "__version__", "0.0.0-other")
    assert results_store.load(con, breakdown) is None
    monkeypatch.undo()
    # the analysis code changed but not the release number (an editable install): stale too
    monkeypatch.setattr(results_store, "_code_digest", lambda: "0123456789ab")
    assert results_store.load(con, breakdown) is None
    monkeypatch.undo()
    monkeypatch.setattr(results_store, "options_of", lambda mod: "{other options}")
    assert results_store.load(con, breakdown) is None
    monkeypatch.undo()
    con.close()
    rw = duckdb.connect(str(db))
    rw.execute("UPDATE meta SET value = 'later' WHERE key = 'ingested_at'")
    assert results_store.load(rw, breakdown) is None  # another ingest of the run
    rw.close()
    assert "breakdown" in results_store.refresh(db, REGISTRY)  # recomputed and stored again
    con = duckdb.connect(str(db), read_only=True)
    assert results_store.load(con, breakdown) is not None
    con.close()


def test_no_results_in_a_plain_run(tmp_path: Path) -> None:
    db = tmp_path / "plain.duckdb"
    ingest_traces([str(SAMPLE)], db)
    con = duckdb.connect(str(db), read_only=True)
    assert all(results_store.load(con, m) is None for m in REGISTRY)
    con.close()


def test_a_stored_frame_is_checked_a_batch_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """put keeps a frame only if it reads back identical; the check reads it back a batch of
    rows at a time (memory), and still sees a difference in any batch, the last included, and
    a frame without rows whose columns differ."""
    monkeypatch.setattr(results_store, "_CHECK_ROWS", 5)
    con = duckdb.connect()
    df = pl.DataFrame({"seq": list(range(23)), "name": [f"k{i % 4}" for i in range(23)]})
    con.register("f", df)
    con.execute("CREATE TABLE t AS SELECT * FROM f")
    assert results_store._reads_back(con, "t", df)
    con.execute("UPDATE t SET name = 'changed' WHERE seq = 22")  # in the last batch only
    assert not results_store._reads_back(con, "t", df)
    con.execute("CREATE TABLE shorter AS SELECT * FROM f WHERE seq < 20")
    assert not results_store._reads_back(con, "shorter", df)
    con.execute("CREATE TABLE empty AS SELECT * FROM f LIMIT 0")
    assert results_store._reads_back(con, "empty", df.clear())
    assert not results_store._reads_back(con, "empty", df.clear().rename({"name": "other"}))
