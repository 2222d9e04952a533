"""The dashboard in a real browser (headless chromium): what a user would look for.

Expected values come from the analyses themselves (never hard-coded): the straggler the
stragglers analysis names, the stage count and bubble fractions the pipeline analysis gives,
the rows DuckDB returns for the query. Screenshots land in artifacts/screenshots/.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from ranklens.analysis import pipeline, stragglers
from ranklens.analysis import timeline as tl
from ranklens.dashboards import app as dashboard
from ranklens.dashboards import page_speed

from .conftest import SCREENSHOTS, LiveApp

pytestmark = pytest.mark.browser

# Every graph of the page drawn (or none on the page).
DRAWN = (
    "Array.from(document.querySelectorAll('.dash-graph')).every(g => g.querySelector('.main-svg'))"
)


TIMELINE = "#timeline-graph .js-plotly-plot"  # the timeline page's graph
# The selected event's details panel as {column: shown text}.
CELLS = """return Object.fromEntries(Array.from(
    document.querySelectorAll('#timeline-details-table td'),
    td => [td.dataset.column, td.innerText]));"""


def wait_for(browser: Any, js: str, timeout: float = 60.0, poll: float = 0.1) -> Any:
    """Poll a JS expression every `poll` s until it is truthy; return its value."""
    end = time.monotonic() + timeout
    while True:
        value = browser.execute_script(f"return {js};")
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for: {js}")
        time.sleep(poll)


def open_page(browser: Any, url: str, ready: str, poll: float = 0.1) -> float:
    """Load `url`, wait for the CSS selector `ready` and for Dash to settle; seconds taken."""
    t0 = time.perf_counter()
    browser.get(url)
    wait_for(browser, f"document.querySelector({ready!r})", poll=poll)
    wait_for(browser, "!document.querySelector('[data-dash-is-loading=\"true\"]')", poll=poll)
    return time.perf_counter() - t0


def shoot(browser: Any, name: str) -> Path:
    """A full-page screenshot under artifacts/screenshots/."""
    height = browser.execute_script("return document.body.scrollHeight")
    browser.set_window_size(1400, max(900, min(int(height) + 40, 6000)))
    time.sleep(0.3)
    path = SCREENSHOTS / f"{name}.png"
    browser.save_screenshot(str(path))
    browser.set_window_size(1400, 1000)
    return path


def plot(browser: Any, graph_id: str) -> dict[str, Any]:
    """The data and axes of a rendered plotly graph, as the browser holds them."""
    return browser.execute_script(  # type: ignore[no-any-return]
        """const gd = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');
        const arr = v => (v && typeof v !== 'string' && v.length !== undefined)
            ? Array.from(v, x => (x && typeof x !== 'string' && x.length !== undefined)
                ? Array.from(x) : x) : v;
        return {data: gd.data.map(t => ({name: t.name, type: t.type, x: arr(t.x), y: arr(t.y),
                                           z: arr(t.z), base: arr(t.base)})),
                xrange: gd._fullLayout.xaxis.range,
                yticks: gd._fullLayout.yaxis.ticktext};""",
        graph_id,
    )


def text(browser: Any, css: str) -> str:
    return str(
        browser.execute_script(
            "const e = document.querySelector(arguments[0]); return e ? e.innerText : '';", css
        )
    )


def severe_logs(browser: Any) -> list[str]:
    return [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def click_point(browser: Any, stream: int, rel_ts: int) -> None:
    """Click the timeline's hover point of the drawn event (stream, raw start - t0)."""
    from selenium.webdriver.common.actions.action_builder import ActionBuilder

    x, y = browser.execute_script(
        """const gd = document.querySelector(arguments[0]);
        const t = gd._fullData.find(t => t.name === 'events');
        const j = Array.from(t.customdata).findIndex(c => c[1] == arguments[1]
            && c[2] == arguments[2]);
        const fl = gd._fullLayout, box = gd.getBoundingClientRect();
        return [box.left + fl._size.l + fl.xaxis.l2p(t.x[j]),
                box.top + fl._size.t + fl.yaxis.l2p(t.y[j])];""",
        TIMELINE,
        stream,
        rel_ts,
    )
    mouse = ActionBuilder(browser)
    mouse.pointer_action.move_to_location(round(x), round(y))
    mouse.pointer_action.click()
    mouse.perform()


@pytest.fixture(scope="module")
def straggler(sample_db: Callable[[str], Path], live_app: Callable[[Path], LiveApp]) -> LiveApp:
    return live_app(sample_db("straggler_rank3"))


def test_straggler_in_heatmap_and_findings(browser: Any, straggler: LiveApp) -> None:
    con = straggler.data.cursor()
    res = stragglers.run(con)
    con.close()
    named = [f for f in res.findings if f.code == "STRAGGLER_RANK"]
    assert named, "the stragglers analysis must name the injected straggler"
    rank = named[0].ranks[0]
    took = open_page(browser, straggler.url("/"), "#overview-heatmap .js-plotly-plot")
    heat = plot(browser, "overview-heatmap")["data"][0]
    totals = [sum(v for v in row if v is not None) for row in heat["z"]]
    assert heat["y"][totals.index(max(totals))] == f"r{rank}", (heat["y"], totals)
    listed = text(browser, "#overview-findings")
    assert "STRAGGLER_RANK" in listed and f"rank {rank}" in listed
    assert not severe_logs(browser)
    # page_speed: plotly.js loaded once (by the page's head, not again by dcc.Graph), the
    # bundle page_speed chose (the partial one where the versions agree), and the browser's
    # own trim and parseInt back in place of the polyfill's.
    loaded = browser.execute_script(
        """return [performance.getEntriesByType('resource').map(e => e.name)
                     .filter(n => /plotly[^/]*\\.min\\.js/.test(n)),
                   String(String.prototype.trim), String(parseInt), typeof Plotly.react];"""
    )
    chosen = page_speed.plotly_url(straggler.app).split("?")[0]
    assert len(loaded[0]) == 1 and loaded[0][0].split("?")[0].endswith(chosen), loaded[0]
    assert "[native code]" in loaded[1] and "[native code]" in loaded[2]
    assert loaded[3] == "function"
    shoot(browser, "overview")
    print(f"overview rendered in the browser in {took:.2f} s")

    open_page(browser, straggler.url("/findings"), ".finding")
    cards = browser.execute_script(
        "return Array.from(document.querySelectorAll('.finding'), e => e.innerText);"
    )
    first = next(c for c in cards if "STRAGGLER_RANK" in c)
    assert f"rank {rank}" in first and "Fix:" in first
    assert f"{named[0].time_at_stake_ns / 1e6:.2f} ms per step" in first
    shoot(browser, "findings")


def test_finding_links_to_its_timeline_window(browser: Any, straggler: LiveApp) -> None:
    open_page(browser, straggler.url("/findings"), ".finding-timeline-link")
    href = browser.execute_script(
        "return document.querySelector('.finding .finding-timeline-link').href;"
    )
    assert "/timeline?" in href and "start=" in href
    open_page(browser, href, "#timeline-graph .js-plotly-plot")
    start = float(href.split("start=")[1].split("&")[0])
    assert f"window {start:.3f}" in text(browser, "#timeline-label")


def test_timeline_deep_link_and_zoom(browser: Any, straggler: LiveApp) -> None:
    cur = straggler.data.cursor()
    sw = tl.step_windows(cur)
    cur.close()
    t0 = straggler.data.extent().t0_ns
    step = int(sw["step"].unique().sort()[1])
    w = sw.filter((pl.col("step") == step) & (pl.col("rank") == 3)).row(0, named=True)
    start = round((w["start_ns"] - t0) / 1e6 + 1.0, 3)
    end = round(start + 20.0, 3)
    url = straggler.url(f"/timeline?rank=3&step={step}&start={start}&end={end}")
    open_page(browser, url, "#timeline-graph .js-plotly-plot")
    assert f"window {start:.3f} – {end:.3f} ms" in text(browser, "#timeline-label")
    fig = plot(browser, "timeline-graph")
    assert fig["xrange"][0] == pytest.approx(start, abs=1e-3)
    assert fig["xrange"][1] == pytest.approx(end, abs=1e-3)
    assert fig["yticks"] and all(t.startswith("r3 ") for t in fig["yticks"])
    shoot(browser, "timeline")

    # Zoom: the server answers with the new window (a new query, not a client-side crop).
    lo, hi = start + 5.0, start + 10.0
    t = time.perf_counter()
    browser.execute_script(
        "Plotly.relayout(document.querySelector('#timeline-graph .js-plotly-plot'),"
        " {'xaxis.range[0]': arguments[0], 'xaxis.range[1]': arguments[1]});",
        lo,
        hi,
    )
    wait_for(
        browser,
        f"document.querySelector('#timeline-label').innerText.includes('window {lo:.3f}')",
        timeout=30,
    )
    took = time.perf_counter() - t
    print(f"timeline zoom answered in the browser in {took:.2f} s")
    href = browser.execute_script("return document.querySelector('#timeline-permalink').href;")
    assert f"start={lo:.3f}" in href


def test_clicking_a_collective_outlines_it_on_every_rank(browser: Any, straggler: LiveApp) -> None:
    from selenium.webdriver.common.actions.action_builder import ActionBuilder

    cur = straggler.data.cursor()
    inst = cur.execute(
        "SELECT instance_id, rank, stream, ts_ns, ats_ns, aend_ns FROM collectives_aligned "
        "WHERE op = 'all_reduce' AND status = 'matched' AND rank = 0 ORDER BY instance_id "
        "LIMIT 1 OFFSET 1"
    ).fetchall()[0]
    members = cur.execute(
        "SELECT count(*) FROM collectives WHERE instance_id = ?", [inst[0]]
    ).fetchall()[0][0]
    cur.close()
    t0 = straggler.data.extent().t0_ns
    start, end = (inst[4] - t0) / 1e6 - 2, (inst[5] - t0) / 1e6 + 2
    url = straggler.url(f"/timeline?rank=0,1,2&start={start:.3f}&end={end:.3f}")
    open_page(browser, url, "#timeline-graph .js-plotly-plot")
    # The mouse on rank 0's bar of that collective (where the hover trace has a point for
    # it): the hover label names it, and a click outlines the instance on every rank.
    x, y, name = browser.execute_script(
        """const gd = document.querySelector('#timeline-graph .js-plotly-plot');
        const hit = c => c[0] == arguments[0] && c[1] == arguments[1] && c[2] == arguments[2]
            && c[6].endsWith('comm');
        const i = gd.data.findIndex(t => t.customdata && Array.from(t.customdata).some(hit));
        const j = Array.from(gd.data[i].customdata).findIndex(hit);
        const t = gd._fullData[i], fl = gd._fullLayout, box = gd.getBoundingClientRect();
        return [box.left + fl._size.l + fl.xaxis.l2p(t.x[j]),
                box.top + fl._size.t + fl.yaxis.l2p(t.y[j]), gd.data[i].customdata[j][3]];""",
        inst[1],
        inst[2],
        inst[3] - t0,
    )
    mouse = ActionBuilder(browser)
    mouse.pointer_action.move_to_location(round(x), round(y))
    mouse.perform()
    label = wait_for(
        browser, "document.querySelector('#timeline-graph .hovertext')?.textContent", timeout=10
    )
    assert name in label and "rank 0" in label, label
    mouse.pointer_action.click()
    mouse.perform()
    wait_for(
        browser,
        "document.querySelector('#timeline-instance').innerText.includes('collective instance')",
        timeout=30,
    )
    assert f"on {members} ranks" in text(browser, "#timeline-instance")
    shapes = browser.execute_script(
        "return document.querySelector('#timeline-graph .js-plotly-plot').layout.shapes.length;"
    )
    assert shapes == members
    shoot(browser, "timeline_instance")


def test_pipeline_page_shows_the_analysis_numbers(
    browser: Any, sample_db: Callable[[str], Path], live_app: Callable[[Path], LiveApp]
) -> None:
    app = live_app(sample_db("pp4_gpipe_m2"))
    con = app.data.cursor()
    res = pipeline.run(con)
    con.close()
    sched = res.tables["schedule"].sort("pp_group", "step").row(0, named=True)
    open_page(browser, app.url("/pipeline"), "#pipeline-gantt .js-plotly-plot")
    assert text(browser, "#pipeline-stage-count") == f"{sched['p']} stages"
    assert text(browser, "#pipeline-measured") == f"{sched['bubble_fraction']:.3f}"
    assert text(browser, "#pipeline-closed-form") == f"{sched['closed_form']:.3f}"
    gantt = plot(browser, "pipeline-gantt")
    assert len(set(gantt["data"][0]["y"])) == sched["p"]
    bubbles = plot(browser, "pipeline-bubbles")["data"][0]["y"]
    stages = res.tables["stages"].filter(pl.col("pp_group") == sched["pp_group"]).sort("stage")
    assert bubbles == pytest.approx(stages["bubble_fraction"].to_list())
    shoot(browser, "pipeline")


def test_every_page_opens(
    browser: Any, sample_db: Callable[[str], Path], live_app: Callable[[Path], LiveApp]
) -> None:
    app = live_app(sample_db("megatron_tp2_pp2_dp2"))
    for path in (page.PATH for page in dashboard.PAGES):  # every registered page
        open_page(browser, app.url(path), "#_pages_content > div")
        body = text(browser, "#_pages_content")
        assert "not available for this run" not in body, (path, body[:400])
        assert not severe_logs(browser), path
        # every trace the page draws is a type the loaded plotly.js bundle has
        wait_for(browser, DRAWN)
        unknown = browser.execute_script(
            """const known = Object.keys(Plotly.PlotSchema.get().traces);
               return Array.from(document.querySelectorAll('.js-plotly-plot'))
                 .flatMap(g => (g.data || []).map(t => t.type || 'scatter'))
                 .filter(t => !known.includes(t));"""
        )
        assert unknown == [], (path, unknown)
        shoot(browser, "megatron" + (path.replace("/", "_") if path != "/" else "_overview"))
