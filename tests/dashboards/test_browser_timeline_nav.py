"""The timeline in a real browser: overlays of aggregated views, the selected event in the URL,
and stepping through a search's matches.

Expected values come from the run's construction (the overlays) or from SQL on the run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ranklens.dashboards.timeline_layers import OVERLAYS
from ranklens.ingest import load_traces
from ranklens.sample_traces.gpu_job import GpuJob, write_job

from .conftest import LiveApp
from .test_browser import CELLS, click_point, open_page, severe_logs, shoot, text, wait_for
from .test_browser import TIMELINE as GRAPH
from .test_timeline_overlays import EXPOSED_0, IDLE_0, write_overlay_run

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def gpu_app(
    tmp_path_factory: pytest.TempPathFactory, live_app: Callable[[Path], LiveApp]
) -> LiveApp:
    root = tmp_path_factory.mktemp("timeline-nav-job")
    write_job(GpuJob(tp=2, dp=1, pp=2, m=2, steps=2), root / "raw")
    load_traces([str(root / "raw")], root / "run.duckdb", workers=1)
    return live_app(root / "run.duckdb")


def test_an_aggregated_view_draws_the_overlays(
    browser: Any, tmp_path_factory: pytest.TempPathFactory, live_app: Callable[[Path], LiveApp]
) -> None:
    app = live_app(write_overlay_run(tmp_path_factory.mktemp("overlay-browser")))
    t0 = app.data.extent().t0_ns
    open_page(browser, app.url("/timeline?rank=0"), GRAPH)
    assert "aggregated" in text(browser, "#timeline-label")
    for key, (s, e) in (("exposed", EXPOSED_0), ("idle", IDLE_0)):
        name = OVERLAYS[key][0]
        got = browser.execute_script(
            """const gd = document.querySelector(arguments[0]);
            const i = gd._fullData.findIndex(t => t.name === arguments[1]);
            if (i < 0) return null;
            const x = Array.from(gd._fullData[i].x);
            const fill = document.querySelectorAll(arguments[0] + ' .scatterlayer .trace')[i]
                .querySelector('.js-fill');
            return [Math.min(...x), Math.max(...x), fill ? fill.getAttribute('d').length : 0];""",
            GRAPH,
            name,
        )
        assert got is not None, name
        assert got[0] == pytest.approx((s - t0) / 1e6) and got[1] == pytest.approx((e - t0) / 1e6)
        assert got[2] > 0  # drawn as a filled path
    shoot(browser, "timeline_aggregated_overlays")
    assert not severe_logs(browser)


def test_a_reloaded_link_shows_the_clicked_event(browser: Any, gpu_app: LiveApp) -> None:
    app = gpu_app
    t0 = app.data.extent().t0_ns
    cur = app.data.cursor()
    try:
        stream, ts, dur, s, name = cur.execute(
            "SELECT stream, ts_ns, dur_ns, ats_ns, name FROM events_aligned "
            "WHERE rank = 0 AND kind = 'compute' ORDER BY ts_ns LIMIT 1 OFFSET 5"
        ).fetchall()[0]
    finally:
        cur.close()
    start = (s - t0) / 1e6 - 0.2
    open_page(browser, app.url(f"/timeline?rank=0&start={start:.3f}&end={start + 1:.3f}"), GRAPH)
    click_point(browser, stream, ts - t0)
    wait_for(browser, "document.querySelector('#timeline-details-table')", timeout=30)
    wait_for(browser, "window.location.search.includes('sel=')", timeout=30)
    assert f"sel=0:{stream}:{ts}:{dur}" in browser.current_url
    before = browser.execute_script(CELLS)
    assert before["name"] == name and before["ts_ns"] == str(ts)
    link = browser.current_url
    open_page(browser, link, GRAPH)  # a reload, or the link shared
    wait_for(browser, "document.querySelector('#timeline-details-table')", timeout=30)
    assert browser.execute_script(CELLS) == before
    assert browser.current_url == link
    assert browser.execute_script(
        "return document.querySelector(arguments[0]).data.some(t => t.name === 'selected');",
        GRAPH,
    )
    # A link to an event the run lacks says so.
    open_page(browser, app.url(f"/timeline?rank=0&sel=0:{stream}:{ts + 1}:{dur}"), GRAPH)
    assert "is not in this run: no event is selected" in text(browser, "#timeline-warning")
    assert not browser.execute_script("return document.querySelector('#timeline-details-table')")
    assert not severe_logs(browser)


def test_next_and_previous_match_step_through_the_search(browser: Any, gpu_app: LiveApp) -> None:
    """Each match selected as a click selects it: details, and (an all-reduce of ranks 0 and
    1) its instance listed and outlined on both ranks."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    app = gpu_app
    t0 = app.data.extent().t0_ns
    cur = app.data.cursor()
    try:
        want = cur.execute(
            "SELECT e.rank, e.stream, e.ts_ns, e.ats_ns, c.instance_id, "
            "  (SELECT count(*) FROM collectives k WHERE k.instance_id = c.instance_id) "
            "FROM events_aligned e LEFT JOIN collectives c USING (rank, stream, ts_ns) "
            "WHERE e.rank IN (0, 1) AND e.name ILIKE '%allreduce%' "
            "ORDER BY e.ats_ns, e.rank, e.stream, e.ts_ns, e.dur_ns"
        ).fetchall()
    finally:
        cur.close()
    n = len(want)
    start = (want[2][3] - t0) // 1000 / 1000  # the µs the third match starts in
    url = f"/timeline?rank=0,1&start={start:.3f}&end={start + 2:.3f}"
    open_page(browser, app.url(url), GRAPH)
    box = browser.find_element("id", "timeline-search")
    ActionChains(browser).click(box).send_keys("allreduce", Keys.ENTER).perform()
    wait_for(browser, "window.location.search.includes('q=allreduce')", timeout=30)
    for button, k in (("next", 3), ("next", 4), ("prev", 3)):
        browser.find_element("id", f"timeline-search-{button}").click()
        wait_for(
            browser,
            f"document.querySelector('#timeline-search-pos').innerText === '{k} of {n}'",
            timeout=30,
        )
        rank, stream, ts, ats, iid, members = want[k - 1]
        wait_for(
            browser,
            "document.querySelector('#timeline-details-table td[data-column=ts_ns]')"
            f"?.innerText === '{ts}'",
            timeout=30,
        )
        assert f"sel={rank}:{stream}:{ts}:" in browser.current_url
        assert iid is not None and members == 2
        wait_for(
            browser,
            "document.querySelector('#timeline-instance')?.innerText"
            f".includes('collective instance {iid}:')",
            timeout=30,
        )
        assert "arrived" in text(browser, "#timeline-instance-late")
        wait_for(
            browser,
            f"(document.querySelector('{GRAPH}').layout.shapes || []).length === {members}",
            timeout=30,
        )
        x0, x1 = browser.execute_script(
            "return document.querySelector(arguments[0])._fullLayout.xaxis.range;", GRAPH
        )
        assert x0 < (ats - t0) / 1e6 < x1  # the view moved to it
    shoot(browser, "timeline_search_next")
    assert not severe_logs(browser)
