"""The timeline's selection and search in a real browser, on a GPU-shaped run.

Clicking a kernel launch lists every column of that event as the database holds it and draws
an arrow to its kernel; a name searched outlines as many events as DuckDB finds, and the
address keeps it. Expected values come from SQL on the run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ranklens.sample_traces.gpu_job import GpuJob

from .conftest import LiveApp, job_db
from .test_browser import CELLS, click_point, open_page, severe_logs, shoot, text, wait_for
from .test_browser import TIMELINE as GRAPH

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory, live_app: Callable[[Path], LiveApp]) -> LiveApp:
    job = GpuJob(tp=2, dp=1, pp=2, m=2, steps=2)
    return live_app(job_db(tmp_path_factory.mktemp("timeline-job"), job))


def test_click_lists_the_event_and_search_outlines_matches(browser: Any, app: LiveApp) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    cur = app.data.cursor()
    try:
        # A launch whose kernel starts within 2 ms, and the window around both.
        launch = cur.execute(
            """SELECT h.stream, h.ts_ns, h.ats_ns, d.ats_ns, h.name, h.correlation, h.step
               FROM events_aligned h JOIN events_aligned d USING (rank, correlation)
               WHERE h.rank = 0 AND h.kind = 'runtime' AND d.device >= 0
                 AND d.ats_ns - h.ats_ns < 2000000 ORDER BY h.ts_ns LIMIT 1 OFFSET 3"""
        ).fetchall()[0]
        t0 = app.data.extent().t0_ns
        start, end = (launch[2] - t0) / 1e6 - 0.5, (launch[3] - t0) / 1e6 + 0.5
        n_gemm = cur.execute(
            "SELECT count(*) FROM events_aligned WHERE rank = 0 AND ats_ns < ? AND aend_ns > ? "
            "AND name ILIKE '%gemm%'",
            [t0 + int(end * 1e6), t0 + int(start * 1e6)],
        ).fetchall()[0][0]
    finally:
        cur.close()
    open_page(browser, app.url(f"/timeline?rank=0&start={start:.3f}&end={end:.3f}"), GRAPH)
    click_point(browser, launch[0], launch[1] - t0)
    wait_for(browser, "document.querySelector('#timeline-details-table')", timeout=30)
    cells = browser.execute_script(CELLS)
    assert cells["name"] == launch[4] and cells["stream"] == str(launch[0])
    assert cells["ts_ns"] == str(launch[1]) and cells["correlation"] == str(launch[5])
    assert cells["step"] == str(launch[6]) and cells["shapes"] == "—"  # NULL, said so
    assert "1 launch → kernel flow" in text(browser, "#timeline-details-flows")
    arrows = browser.execute_script(
        "return document.querySelector(arguments[0]).layout.annotations.filter(a => a.showarrow);",
        GRAPH,
    )
    assert len(arrows) == 1
    assert arrows[0]["x"] == pytest.approx((launch[3] - t0) / 1e6, abs=1e-6)

    # The click's callbacks settle first (it also sets the step and rank menus, which run the
    # view's callback once more), as a user sees the view finish before typing.
    wait_for(browser, "!document.querySelector('[data-dash-is-loading=\"true\"]')", timeout=30)
    box = browser.find_element("id", "timeline-search")
    ActionChains(browser).click(box).send_keys("gemm", Keys.ENTER).perform()
    wait_for(browser, "window.location.search.includes('q=gemm')", timeout=30)
    assert f"'gemm': {n_gemm} matches in view" in text(browser, "#timeline-label")
    loops = browser.execute_script(
        "return document.querySelector(arguments[0]).data"
        ".find(t => t.name === \"matches 'gemm'\").x.filter(v => v === null).length;",
        GRAPH,
    )
    assert n_gemm > 0 and loops == n_gemm
    shoot(browser, "timeline_selection_search")
    assert not severe_logs(browser)
