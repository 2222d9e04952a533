"""Drill-downs in a real browser: a finding's link lands on its ranks, step and window with
its evidence outlined; overview charts open the timeline where they are clicked; the
timeline's address follows the view (reload = same picture); a missing step is said so.

Expected values come from the analyses and DuckDB (the findings' ranks, the step windows),
never hard-coded.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import polars as pl
import pytest
from ranklens.analysis import timeline as tl
from ranklens.dashboards.data import EVIDENCE
from ranklens.dashboards.figures import MS

from .conftest import LiveApp
from .test_browser import open_page, plot, severe_logs, shoot, text, wait_for

pytestmark = pytest.mark.browser
GRAPH = "#timeline-graph .js-plotly-plot"


@pytest.fixture(scope="module")
def app(sample_db: Callable[[str], Path], live_app: Callable[[Path], LiveApp]) -> LiveApp:
    return live_app(sample_db("straggler_rank3"))


def query_of(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlparse(url).query).items()}


def step_windows(app: LiveApp) -> pl.DataFrame:
    cur = app.data.cursor()
    try:
        return tl.step_windows(cur)
    finally:
        cur.close()


# The label of the lane holding row y: a lane's label sits on its top row, and its nested
# slices on the rows below, down to the next lane's.
LANE_OF = """const gd = document.querySelector(arguments[0]);
    const ticks = gd._fullLayout.yaxis.ticktext, vals = gd._fullLayout.yaxis.tickvals;
    const laneOf = y => ticks[vals.reduce((k, v, i) => (v <= y + 1e-9 ? i : k), 0)];"""


def outlines(browser: Any) -> list[dict[str, Any]]:
    """The outlined rectangles, each with the lane label it sits on."""
    return browser.execute_script(  # type: ignore[no-any-return]
        LANE_OF
        + """return (gd.layout.shapes || []).map(s => ({x0: s.x0, x1: s.x1,
            lane: laneOf(Math.round((s.y0 + s.y1) / 2))}));""",
        GRAPH,
    )


def event_starts(browser: Any) -> list[list[Any]]:
    """(lane label, start ms) of every event the figure can name on hover."""
    return browser.execute_script(  # type: ignore[no-any-return]
        LANE_OF
        + """const t = gd._fullData.find(t => t.name === 'events' && t.customdata);
        return t ? Array.from(t.customdata, (c, i) => [laneOf(t.y[i]), c[4]]) : [];""",
        GRAPH,
    )


def test_every_finding_lands_on_its_evidence(browser: Any, app: LiveApp) -> None:
    every_finding_lands(browser, app)


def test_every_demo_finding_lands_on_its_evidence(
    browser: Any, sample_db: Callable[[str], Path], live_app: Callable[[Path], LiveApp]
) -> None:
    """The demo run: pipeline findings with windows, and COLLECTIVE_SLOW, whose link is a window
    around its worst instance outside the finding's first step (a link with no step)."""
    demo = live_app(sample_db("megatron_tp2_pp2_dp2"))
    codes = {f.code for f in demo.data.report().findings}
    assert {"COLLECTIVE_SLOW", "PIPELINE_BUBBLE_SCHEDULE"} <= codes
    every_finding_lands(browser, demo)


def every_finding_lands(browser: Any, app: LiveApp) -> None:
    """Each finding's link opens its ranks, step and window, with its evidence outlined."""
    findings = app.data.report().findings
    assert findings
    open_page(browser, app.url("/findings"), ".finding-timeline-link")
    hrefs = browser.execute_script(
        "return Array.from(document.querySelectorAll('.finding .finding-timeline-link'),"
        " a => a.href);"
    )
    assert len(hrefs) == len(findings)
    t0 = app.data.extent().t0_ns
    sw = step_windows(app)
    outlined_any = False
    for f, href in zip(findings, hrefs, strict=True):
        q = query_of(href)
        assert q["hl"] == f.code
        if f.ranks:
            assert q["rank"] == ",".join(map(str, f.ranks)), (f.code, href)
        if "step" in q:
            step = int(q["step"])
            assert step in (f.steps or sw["step"].to_list())
            # the window is that step's on the finding's ranks, inside the finding's own
            # window (COLLECTIVE_SLOW's: around its worst instance)
            w = sw.filter(pl.col("step") == step)
            if f.ranks:
                w = w.filter(pl.col("rank").is_in(list(f.ranks)))
            lo, hi = int(w["start_ns"].min()), int(w["end_ns"].max())  # type: ignore[arg-type]
            if f.window_ns is not None:
                lo, hi = max(lo, f.window_ns[0]), min(hi, f.window_ns[1])
        else:  # the finding's window lies outside its first step: the window alone
            assert f.window_ns is not None, f.code
            lo, hi = f.window_ns
        start, end = float(q["start"]), float(q["end"])
        assert start == pytest.approx((lo - t0) / MS, abs=1e-3)
        assert end == pytest.approx((hi - t0) / MS, abs=1e-3)

        open_page(browser, href, GRAPH)
        assert f"window {start:.3f}" in text(browser, "#timeline-label")
        fig = plot(browser, "timeline-graph")
        assert fig["xrange"] == pytest.approx([start, end], abs=1e-3)
        if "step" in q:
            assert text(browser, "#timeline-step").strip() == q["step"]  # the menu names it
        if f.ranks:
            assert {t.split(" ")[0] for t in fig["yticks"]} == {f"r{r}" for r in f.ranks}
        assert query_of(browser.current_url)["hl"] == f.code  # the address keeps it
        shapes = outlines(browser)
        if not any(f.code.startswith(e[0]) for e in EVIDENCE):
            assert shapes == [] and "none drawn as events" in text(browser, "#timeline-label")
            continue
        assert shapes, (f.code, text(browser, "#timeline-label"))
        assert f"{len(shapes)} events outlined" in text(browser, "#timeline-label")
        lanes = {t for t in fig["yticks"]}
        for s in shapes:
            assert s["lane"] in lanes and s["x1"] > start and s["x0"] < end
            if f.ranks:
                assert s["lane"].split(" ")[0] in {f"r{r}" for r in f.ranks}
        if "aggregated" not in text(browser, "#timeline-label"):
            # every outline is an event the figure draws (same lane, same start)
            drawn = {(lane, round(x, 3)) for lane, x in event_starts(browser)}
            assert all((s["lane"], round(s["x0"], 3)) in drawn for s in shapes), f.code
        outlined_any = True
        shoot(browser, f"finding_{f.code.lower()}")
    assert outlined_any
    assert not severe_logs(browser)


def test_timeline_address_follows_the_view(browser: Any, app: LiveApp) -> None:
    steps = sorted(step_windows(app)["step"].unique().to_list())
    open_page(browser, app.url(f"/timeline?rank=0,1&step={steps[1]}"), GRAPH)
    q = query_of(browser.current_url)
    assert q["rank"] == "0,1" and q["step"] == str(steps[1]) and "start" in q
    lo, hi = float(q["start"]) + 2.0, float(q["start"]) + 6.0
    browser.execute_script(
        "Plotly.relayout(document.querySelector(arguments[0]),"
        " {'xaxis.range[0]': arguments[1], 'xaxis.range[1]': arguments[2]});",
        GRAPH,
        lo,
        hi,
    )
    wait_for(browser, f"window.location.search.includes('start={lo:.3f}')", timeout=30)
    label = text(browser, "#timeline-label")
    assert f"window {lo:.3f} – {hi:.3f} ms" in label
    # the Step menu follows the view: still inside that step
    assert text(browser, "#timeline-step").strip() == str(steps[1])
    browser.refresh()
    wait_for(browser, f"document.querySelector({GRAPH!r})")
    assert text(browser, "#timeline-label") == label
    assert plot(browser, "timeline-graph")["xrange"] == pytest.approx([lo, hi], abs=1e-3)
    # Whole run: the Step menu empties (the view is no step)
    browser.find_element("id", "timeline-reset").click()
    wait_for(browser, "!window.location.search.includes('step=')", timeout=30)
    assert text(browser, "#timeline-step").strip() in ("", "Select...")


def test_a_missing_step_is_said_so(browser: Any, app: LiveApp) -> None:
    sw = step_windows(app)
    steps = sorted(sw["step"].unique().to_list())
    missing = max(steps) + 100
    open_page(browser, app.url(f"/timeline?step={missing}"), GRAPH)
    warning = text(browser, "#timeline-warning")
    assert f"step {missing} is not in this run" in warning and f"showing step {steps[0]}" in warning
    first = sw.filter(pl.col("step") == steps[0])
    start = (first["start_ns"].min() - app.data.extent().t0_ns) / MS
    assert f"window {start:.3f}" in text(browser, "#timeline-label")  # not the whole run


def test_heatmap_cell_opens_the_timeline_there(browser: Any, app: LiveApp) -> None:
    from selenium.webdriver.common.actions.action_builder import ActionBuilder

    open_page(browser, app.url("/"), "#overview-heatmap .js-plotly-plot")
    heat = plot(browser, "overview-heatmap")["data"][0]
    i, j = len(heat["y"]) - 1, len(heat["x"]) - 1  # the last rank, the last step
    rank, step = int(heat["y"][i].lstrip("r")), int(heat["x"][j])
    x, y = browser.execute_script(
        """const gd = document.querySelector('#overview-heatmap .js-plotly-plot');
        const fl = gd._fullLayout, box = gd.getBoundingClientRect();
        return [box.left + fl._size.l + fl.xaxis.l2p(arguments[0]),
                box.top + fl._size.t + fl.yaxis.l2p(arguments[1])];""",
        j,
        i,
    )
    mouse = ActionBuilder(browser)
    mouse.pointer_action.move_to_location(round(x), round(y))
    mouse.pointer_action.click()
    mouse.perform()
    wait_for(browser, "window.location.pathname === '/timeline'", timeout=30)
    wait_for(browser, f"document.querySelector({GRAPH!r})")
    q = query_of(browser.current_url)
    assert q["rank"] == str(rank) and q["step"] == str(step)
    w = step_windows(app).filter((pl.col("step") == step) & (pl.col("rank") == rank))
    start = (w["start_ns"].min() - app.data.extent().t0_ns) / MS
    assert f"window {start:.3f}" in text(browser, "#timeline-label")
    assert all(t.startswith(f"r{rank} ") for t in plot(browser, "timeline-graph")["yticks"])
