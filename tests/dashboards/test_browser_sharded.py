"""The dashboard on a sharded run (a directory: catalog + per-rank Parquet), in real chromium:
the same heatmap and timeline as the one-file run of the same traces, and the SQL page counting
the same events. What is expected comes from the one-file run, never from constants."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ranklens.ingest import load_traces

from .conftest import REPO, LiveApp
from .test_browser import open_page, plot, severe_logs, text, wait_for

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def pair(
    tmp_path_factory: pytest.TempPathFactory,
    sample_db: Callable[[str], Path],
    live_app: Callable[[Path], LiveApp],
) -> tuple[LiveApp, LiveApp]:
    run = tmp_path_factory.mktemp("sharded") / "run"
    raw = REPO / "sample_traces" / "straggler_rank3" / "raw"
    load_traces([str(raw)], run, workers=2, storage="shards")
    return live_app(sample_db("straggler_rank3")), live_app(run)


def test_same_pages_as_the_one_file_run(browser: Any, pair: tuple[LiveApp, LiveApp]) -> None:
    one, sharded = pair
    seen = []
    for app in (one, sharded):
        open_page(browser, app.url("/"), "#overview-heatmap .js-plotly-plot")
        heat = plot(browser, "overview-heatmap")["data"][0]
        open_page(browser, app.url("/timeline?rank=3"), "#timeline-graph .js-plotly-plot")
        lanes = plot(browser, "timeline-graph")["yticks"]
        label = text(browser, "#timeline-label")
        q = "/sql?q=SELECT%20count(*)%20AS%20n%20FROM%20events%20WHERE%20rank%20%3D%203"
        open_page(browser, app.url(q), "#sql-query")
        # AG Grid puts the cell in the page before its text: wait for the text itself
        cell = "document.querySelector('.sql-grid .ag-row .ag-cell')"
        n = str(wait_for(browser, f"{cell} && {cell}.innerText.trim()"))
        assert not severe_logs(browser)
        seen.append((heat["y"], heat["z"], lanes, label, n))
    assert seen[0] == seen[1]
    assert int(seen[1][4].replace(",", "")) > 0
