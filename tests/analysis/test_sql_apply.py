"""apply_sql runs a file of views once per connection, a file that builds a table every time,
and forgets with a rolled-back transaction; HeldViews restores each view it held from the
view's own statement (analysis/_sql.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from ranklens.analysis import _sql
from ranklens.analysis.graph_build import drop_inputs
from ranklens.ingest.run import ingest_traces

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "pp4_1f1b_m8" / "raw"
BLOCKS = "SELECT * FROM pipeline_blocks ORDER BY ALL"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("apply") / "run.duckdb"
    ingest_traces([str(SAMPLE)], db)  # no stored views: every view here is a temp one
    return db


@pytest.fixture
def con(run: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    c = duckdb.connect(str(run), read_only=True)
    yield c
    c.close()


def _view_sql(con: duckdb.DuckDBPyConnection, view: str) -> str:
    row = con.execute(
        "SELECT sql FROM duckdb_views() WHERE temporary AND view_name = ?", [view]
    ).fetchone()
    assert row is not None, f"no temp view {view}"
    return str(row[0])


def test_a_file_of_views_runs_once_per_connection(con: duckdb.DuckDBPyConnection) -> None:
    _sql.apply_sql(con, "pipeline_steps")
    blocks = con.execute(BLOCKS).fetchall()
    assert blocks  # the sample has a pipeline: the views read something
    con.execute("CREATE OR REPLACE TEMP VIEW pipeline_stages AS SELECT 42 AS marker")
    _sql.apply_sql(con, "pipeline_steps")  # already run here: not run again
    assert con.execute("SELECT * FROM pipeline_stages").fetchall() == [(42,)]
    _sql.apply_sql(con, "intervals", "pipeline")  # requirements, applied with it: no-ops
    assert con.execute("SELECT * FROM pipeline_stages").fetchall() == [(42,)]
    other = con.cursor()  # another connection: its own temp views, from the file
    try:
        _sql.apply_sql(other, "pipeline_steps")
        assert other.execute("SELECT count(*) FROM pipeline_stages").fetchone() != (42,)
        assert other.execute(BLOCKS).fetchall() == blocks
    finally:
        other.close()


def test_a_file_that_builds_a_table_runs_every_time(con: duckdb.DuckDBPyConnection) -> None:
    assert _sql.builds_table("critical_path")
    assert not _sql.builds_table("pipeline_steps")
    _sql.apply_sql(con, "critical_path")
    n = con.execute("SELECT count(*) FROM _critical_path_ev").fetchone()
    drop_inputs(con)  # as graph_build does when it is done
    _sql.apply_sql(con, "critical_path")  # built again, from the run as it is now
    assert con.execute("SELECT count(*) FROM _critical_path_ev").fetchone() == n


def test_a_rolled_back_apply_is_run_again(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("BEGIN TRANSACTION")
    _sql.apply_sql(con, "pipeline_steps")
    con.execute("ROLLBACK")  # its views and its record of them are gone together
    views = con.execute(
        "SELECT count(*) FROM duckdb_views() WHERE temporary AND view_name = 'pipeline_blocks'"
    ).fetchone()
    assert views == (0,)
    _sql.apply_sql(con, "pipeline_steps")
    assert con.execute(BLOCKS).fetchall()


def test_held_views_are_restored_from_their_statements(
    con: duckdb.DuckDBPyConnection, run: Path
) -> None:
    fresh = duckdb.connect(str(run), read_only=True)
    try:
        _sql.apply_sql(fresh, "pipeline_steps")
        want = {v: _view_sql(fresh, v) for v in ("pipeline_blocks", "pipeline_stages")}
        rows = fresh.execute(BLOCKS).fetchall()
    finally:
        fresh.close()
    with _sql.HeldViews(con, "pipeline_steps", "pipeline_blocks", "pipeline_stages"):
        assert "_ranklens_held_pipeline_blocks" in _view_sql(con, "pipeline_blocks")
        _sql.apply_sql(con, "pipeline_steps", "collectives")  # keeps the held views held
        assert "_ranklens_held_pipeline_blocks" in _view_sql(con, "pipeline_blocks")
        assert con.execute(BLOCKS).fetchall() == rows
    assert {v: _view_sql(con, v) for v in want} == want  # each back to its own statement
    assert _sql.held_views(con) == []
    assert con.execute(BLOCKS).fetchall() == rows


def test_definition_is_the_statement_that_creates_the_view() -> None:
    stmt = _sql.definition("pipeline_steps", "pipeline_blocks")
    assert "TEMP VIEW pipeline_blocks AS" in " ".join(stmt.split())
    assert _sql.definition("pipeline_steps", "_pipeline_comm_ev")  # from a required file
    with pytest.raises(KeyError, match="no view nope"):
        _sql.definition("pipeline_steps", "nope")
