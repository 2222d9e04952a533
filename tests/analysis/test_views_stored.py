"""A run's stored analysis views are used as they are when this code stored them, and shadowed
by temp views when they are another code's (views.apply_all_views, through safe_connect)."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest
from ranklens.analysis import _sql, overlap, pipeline, views
from ranklens.analysis.results_store import finalize_run
from ranklens.analysis.sql_console import safe_connect
from ranklens.ingest.run import ingest_traces

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "megatron_tp2_pp2_dp2" / "raw"
QUERY = "SELECT * FROM overlap_by_step ORDER BY ALL"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("views") / "run.duckdb"
    ingest_traces([str(SAMPLE)], db, finalize=finalize_run)
    return db


def _temp_views(con: duckdb.DuckDBPyConnection) -> int:
    row = con.execute(
        "SELECT count(*) FROM duckdb_views() WHERE temporary AND NOT internal"
    ).fetchone()
    return int(row[0]) if row else 0


def _with_digest(run: Path, dest: Path, digest: str | None) -> Path:
    shutil.copyfile(run, dest)
    con = duckdb.connect(str(dest))
    con.execute("DELETE FROM meta WHERE key = ?", [views.VIEWS_DIGEST])
    if digest is not None:
        con.execute("INSERT INTO meta VALUES (?, ?)", [views.VIEWS_DIGEST, digest])
    con.close()
    return dest


def test_current_stored_views_are_used_as_stored(run: Path, tmp_path: Path) -> None:
    con = safe_connect(run)
    try:
        assert _temp_views(con) == 0  # nothing created: the stored views are this code's
        got = con.execute(QUERY).fetchall()
    finally:
        con.close()
    fresh = duckdb.connect(str(_with_digest(run, tmp_path / "none.duckdb", None)), read_only=True)
    views.apply_all_views(fresh)  # this code's views, created now
    assert _temp_views(fresh) > 0
    assert got and got == fresh.execute(QUERY).fetchall()
    fresh.close()


def test_analyses_read_the_stored_views_without_creating_them(run: Path, tmp_path: Path) -> None:
    """apply_sql counts a file whose views the run stores as this code wrote them as applied:
    the analyses read the stored views, and get what temp views of the same SQL give."""
    con = duckdb.connect(str(run), read_only=True)
    other = duckdb.connect(str(_with_digest(run, tmp_path / "none.duckdb", None)), read_only=True)
    try:
        _sql.apply_sql(con, *views.view_files())
        assert _temp_views(con) == 0
        _sql.apply_sql(other, *views.view_files())
        assert _temp_views(other) > 0
        for mod in (overlap, pipeline):
            got, want = mod.run(con), mod.run(other)
            assert got.table.equals(want.table) and got.findings == want.findings
            assert not got.table.is_empty()
        asof = con.execute("SELECT current_setting('asof_loop_join_threshold')").fetchone()
        assert asof == (0,)  # set on every connection apply_sql meets
    finally:
        con.close()
        other.close()


@pytest.mark.parametrize("digest", ["0123456789abcdef", None])  # another code's; none stored
def test_other_or_unknown_views_are_shadowed(run: Path, tmp_path: Path, digest: str | None) -> None:
    db = _with_digest(run, tmp_path / "other.duckdb", digest)
    con = safe_connect(db)
    try:
        assert _temp_views(con) > 0
        assert con.execute(QUERY).fetchall()
    finally:
        con.close()


def _stored_views(con: duckdb.DuckDBPyConnection) -> list[tuple[str, object]]:
    return con.execute(
        "SELECT view_name, column_count FROM duckdb_views() "
        "WHERE NOT temporary AND NOT internal ORDER BY 1"
    ).fetchall()


def _installed(run: Path, dest: Path) -> tuple[list[tuple[str, object]], dict[str, list[tuple]]]:
    """install_views on a copy of `run`: each stored view's column count as DuckDB keeps it
    (NULL: unbound), then each view's columns and types as a query binds them."""
    views.install_views(_with_digest(run, dest, None))
    con = duckdb.connect(str(dest), read_only=True)
    try:
        stored = _stored_views(con)
        described = {str(n): con.execute(f'DESCRIBE "{n}"').fetchall() for n, _ in stored}
    finally:
        con.close()
    return stored, described


def test_views_are_stored_unbound_and_bind_as_bound_ones(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """store_views leaves its views unbound (DuckDB binds one when a query reads it, where it
    can), and each then has the same columns, of the same types, as the view created bound."""
    stored, described = _installed(run, tmp_path / "unbound.duckdb")
    assert {"pipeline_by_step", "overlap_by_step", "stragglers_by_rank"} <= set(described)
    unbound = {str(n) for n, cols in stored if cols is None}
    if _sql._defers_binding():  # but the views a table macro reads: creating it binds them
        assert {"pipeline_by_step", "pipeline_schedule", "overlap_by_step"} <= unbound
        assert len(unbound) >= 0.75 * len(stored) and "events" not in unbound
    else:
        assert not unbound
    monkeypatch.setattr(_sql, "unbound", lambda sql: sql)  # created bound, as before
    stored, again = _installed(run, tmp_path / "bound.duckdb")
    assert all(cols is not None for _, cols in stored)
    assert described == again


def test_an_unbound_view_that_cannot_bind_says_so_when_read() -> None:
    con = duckdb.connect()
    try:
        sql = _sql.unbound("CREATE OR REPLACE TEMP VIEW v AS SELECT missing FROM range(3)")
        if not _sql._defers_binding():  # an older DuckDB: refused at creation, as before
            with pytest.raises(duckdb.BinderException, match="missing"):
                con.execute(sql)
            return
        con.execute(sql)
        with pytest.raises(duckdb.BinderException, match="missing"):
            con.execute("SELECT * FROM v")
    finally:
        con.close()
