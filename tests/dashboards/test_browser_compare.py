"""The compare page in a real browser: both runs' numbers per rank, check's verdict on top,
and the slow stage of the current run (truth.json's slow_rank) highlighted."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ranklens.dashboards import data_compare as dc
from ranklens.dashboards import figures_compare as figs
from ranklens.dashboards import tables

from .conftest import REPO, LiveApp
from .test_browser import open_page, plot, severe_logs, shoot, text

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def compared(sample_db: Callable[[str], Path]) -> Iterator[LiveApp]:
    app = LiveApp(sample_db("pp4_slow_stage2"), baseline=sample_db("pp4_1f1b_m8"))
    yield app
    app.stop()


def _rgba(color: str, alpha: float) -> str:
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r}, {g}, {b}, {alpha})"


def test_compare_page_shows_both_runs_and_the_slow_stage(browser: Any, compared: LiveApp) -> None:
    assert compared.base is not None
    cmp = dc.comparison(compared.data, compared.base)
    took = open_page(browser, compared.url("/compare"), "#compare-table")
    verdict = text(browser, "#compare-verdict")
    assert f"check --baseline would {'FAIL' if cmp.exit_code else 'pass'}" in verdict
    assert "pp4_1f1b_m8" in text(browser, "#_pages_content")
    assert all(line in verdict for line in cmp.regressions)  # bubble lines included
    assert "--max-bubble" not in text(browser, "#compare-legend")  # bubble counts in check
    cells = browser.execute_script(
        """return Array.from(document.querySelectorAll('#compare-table tr.compare-row'), tr =>
             Object.fromEntries(Array.from(tr.cells, td => [td.dataset.column,
               [td.innerText, getComputedStyle(td).backgroundColor, td.className]])));"""
    )
    rows = dc.rank_rows(cmp)
    assert [int(c["rank"][0]) for c in cells] == [r.rank for r in rows]  # worst first
    for shown, row in zip(cells, rows, strict=True):
        step = row.cells["step_time"]
        assert shown["step_base_ms"][0] == tables.num(step.base / 1e6)  # the baseline
        assert shown["step_ms"][0] == tables.num(step.cur / 1e6)  # the current run
        for col, change in row.cells.items():
            if change.regression and col != "step_time":
                tint = _rgba(figs.METRIC_COLORS[change.metric], 0.2)
                assert shown[col][1] == tint and "compare-regression" in shown[col][2]
    slow = json.loads((REPO / "sample_traces/pp4_slow_stage2/truth.json").read_text())
    slow_rank = slow["config"]["slow_rank"]
    stage = next(c["stage"] for c in cells if int(c["rank"][0]) == slow_rank)
    assert "heaviest (was stage" in stage[0] and "compare-heavy" in stage[2]
    assert stage[1] == _rgba(figs.HEAVY, 0.2)
    bars = plot(browser, "compare-steps")["data"]
    assert [t["name"] for t in bars] == ["baseline", "current"]
    assert not severe_logs(browser)
    shoot(browser, "compare")
    print(f"compare page rendered in the browser in {took:.2f} s")
