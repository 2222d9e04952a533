"""The compare page's numbers: what `ranklens check --baseline` prints, and what each run's own
analysis tables hold (medians per step), for two bundled samples: the balanced 1F1B pipeline
as the baseline, the run with a slow stage 2 (truth.json's slow_rank) as the current one."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest
from ranklens.analysis import breakdown, overlap, pipeline
from ranklens.cli.main import app as cli
from ranklens.dashboards import data_compare as dc
from ranklens.dashboards.app import create_app
from ranklens.dashboards.data import RunData
from ranklens.dashboards.pages import compare
from typer.testing import CliRunner

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
BASE, CURRENT = "pp4_1f1b_m8", "pp4_slow_stage2"


def _path(con: duckdb.DuckDBPyConnection) -> str:
    row = con.execute(
        "SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
    )
    return str(row.fetchone()[0])  # type: ignore[index]


def _medians(df: pl.DataFrame, value: str, by: tuple[str, ...] = ("rank",)) -> dict[Any, float]:
    """The median per step of `value`, per `by` (what check compares)."""
    out = df.filter(pl.col(value).is_not_null()).group_by(*by).agg(pl.col(value).median())
    return {r[0] if len(by) == 1 else r[:-1]: r[-1] for r in out.iter_rows()}


def _own_tables(con: duckdb.DuckDBPyConnection) -> dict[str, dict[Any, float]]:
    """Each compared metric from the run's own analysis results."""
    b, o, p = breakdown.run(con), overlap.run(con), pipeline.run(con)
    exposed = o.tables["by_parallelism"].join(
        o.table.select("rank", "step", pl.col("window_ns").alias("w")), on=["rank", "step"]
    )
    return {
        "step_time": _medians(b.table, "window_ns"),
        "comm_share": _medians(b.tables["by_parallelism"], "comm_share", ("rank", "parallelism")),
        "exposed_comm": _medians(
            exposed.with_columns((pl.col("exposed_ns") / pl.col("w")).alias("x")),
            "x",
            ("rank", "parallelism"),
        ),
        "bubble": _medians(p.table.filter(pl.col("work_ns").is_not_null()), "bubble_fraction"),
    }


@pytest.fixture
def runs(ingest: Callable[..., duckdb.DuckDBPyConnection]) -> tuple[str, str]:
    """(current, baseline) database paths; the fixture's own connections closed, as the
    dashboard opens the files sandboxed (DuckDB refuses a second configuration)."""
    paths = []
    for name in (CURRENT, BASE):
        con = ingest([SAMPLES / name / "raw"])
        paths.append(_path(con))
        con.close()
    return paths[0], paths[1]


def test_compare_numbers_are_checks_and_the_analyses(runs: tuple[str, str]) -> None:
    cur_db, base_db = runs
    data, base = RunData(cur_db), dc.Baseline(RunData(base_db), "base")
    try:
        cmp = dc.comparison(data, base)
        rows = dc.rank_rows(cmp)
        app = create_app(cur_db, data=data, baseline=base)
        with app.server.test_request_context(compare.PATH):
            page = str(compare.layout())
    finally:
        data.close()
        base.data.close()

    # what `ranklens check CUR --baseline BASE` prints: the same verdicts and exit code
    said = CliRunner().invoke(cli, ["check", cur_db, "--baseline", base_db, "-f", "json"])
    doc = json.loads(said.stdout)
    assert said.exit_code == cmp.exit_code
    assert [(c["name"], c["status"], c["message"]) for c in doc["checks"]] == [
        (v.name, v.status, v.message) for v in cmp.verdicts
    ]
    assert doc["regressions"] == list(cmp.regressions)
    assert f"check --baseline would {'FAIL' if cmp.exit_code else 'pass'}" in page
    assert all(v.message in page for v in cmp.verdicts)

    # each cell: the medians per step of each run's own analysis tables
    own = {}
    for name, db in (("cur", cur_db), ("base", base_db)):
        con = duckdb.connect(db, read_only=True)
        own[name] = _own_tables(con)
        con.close()
    assert {r.rank for r in rows} == set(own["cur"]["step_time"]) == {0, 1, 2, 3}
    for r in rows:
        for c in r.cells.values():
            key: Any = r.rank if c.metric in dc.ONE_KEY else (r.rank, c.key)
            assert c.cur == pytest.approx(own["cur"][c.metric][key]), (r.rank, c)
            assert c.base == pytest.approx(own["base"][c.metric][key]), (r.rank, c)
        step = r.cells["step_time"]
        assert r.step_delta_ms() == pytest.approx((step.cur - step.base) / 1e6)
        assert step.delta == pytest.approx(step.cur / step.base - 1)
    assert {c.id for c in dc.columns(cmp)} == {
        "step_time",
        "bubble",
        "exposed_comm_pp",
        "comm_share_pp",
    }

    # the slow stage: the current run's heaviest, not the baseline's, marked on its row
    slow = json.loads((SAMPLES / CURRENT / "truth.json").read_text())["config"]["slow_rank"]
    heavy = [r for r in rows if r.heavy]
    assert [(r.rank, r.stage, r.was_heavy) for r in heavy] == [(slow, slow, False)]
    assert "compare-heavy" in page and "heaviest (was stage" in page

    # the biggest regression first; highlighted cells are exactly the judged regressions
    keys = [(not r.regressed, -r.worst) for r in rows]
    assert keys == sorted(keys)
    flagged = sum(c.regression for r in rows for c in r.cells.values())
    cells_flagged = page.count("className='compare-regression'")
    # step time has two highlighted cells (current and Δ %) per regression
    steps_flagged = sum(r.cells["step_time"].regression for r in rows)
    assert cells_flagged == flagged + steps_flagged


def test_without_a_baseline_the_page_says_how(runs: tuple[str, str]) -> None:
    data = RunData(runs[0])
    try:
        app = create_app(runs[0], data=data)
        with app.server.test_request_context(compare.PATH):
            page = str(compare.layout())
    finally:
        data.close()
    assert "compare-none" in page and compare.HOW in page
