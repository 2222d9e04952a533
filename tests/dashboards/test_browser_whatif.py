"""The what-if panel and the critical path overlay in a real browser, on a generated job with
a slow rank (13 computes 30% longer).

Expected values come from the analyses run here on their own connection (whatif_run.answer,
critical_path.run), never from the dashboard's data layer and never hard-coded.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from ranklens.analysis import critical_path, whatif_run
from ranklens.sample_traces.gpu_job import GpuJob

from .conftest import LiveApp, job_db
from .test_browser import open_page, severe_logs, shoot, text, wait_for
from .test_browser_drill import query_of

pytestmark = pytest.mark.browser
GRAPH = "#timeline-graph .js-plotly-plot"
SLOW = 13


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory, live_app: Callable[[Path], LiveApp]) -> LiveApp:
    job = GpuJob(tp=2, dp=2, pp=4, m=8, steps=2, rank_factor={SLOW: 1.3})
    return live_app(job_db(tmp_path_factory.mktemp("whatif-job"), job))


def answer(app: LiveApp, names: list[str]) -> dict[str, Any]:
    cur = app.data.cursor()
    try:
        return whatif_run.answer(cur, whatif_run.parse_all(names))
    finally:
        cur.close()


def replay(
    browser: Any, chosen: list[str], rank: str = "", comm: str = "", kernels: str = ""
) -> None:
    """Fill the form and press Replay (the fields cleared first); wait for its answer."""
    from selenium.webdriver.common.keys import Keys

    for value in chosen:
        browser.find_element("css selector", f"#whatif-scenarios input[value='{value}']").click()
    for field, value in (
        ("whatif-straggler-rank", rank),
        ("whatif-scale-comm", comm),
        ("whatif-scale-kernels", kernels),
    ):
        box = browser.find_element("id", field)
        box.send_keys(Keys.CONTROL, "a")  # clear(): React would not see the field emptied
        box.send_keys(Keys.BACKSPACE)
        if value:
            box.send_keys(value)
    done = "document.getElementById('whatif-done').textContent"
    pressed = int(browser.execute_script(f"return {done};")) + 1
    browser.find_element("id", "whatif-run").click()
    wait_for(browser, f"{done} === '{pressed}'", timeout=60)


def rows(browser: Any) -> dict[str, tuple[int, int]]:
    got = browser.execute_script(
        "return Array.from(document.querySelectorAll('.whatif-row'), r => [r.dataset.scenario,"
        " r.dataset.predictedNs, r.dataset.savingNs]);"
    )
    return {name: (int(p), int(s)) for name, p, s in got}


def test_findings_show_the_replayed_savings(browser: Any, app: LiveApp) -> None:
    findings = app.data.report().findings
    open_page(browser, app.url("/findings"), "#whatif-panel")
    shown = browser.execute_script(
        """return Array.from(document.querySelectorAll('#findings-list .finding'), f => {
            const s = f.querySelector('.finding-saving');
            return [f.querySelector('.finding-code').innerText.trim(),
                    s ? s.dataset.savingNs : null, s ? s.dataset.method : null,
                    f.querySelector('.finding-stake') ? f.querySelector('.finding-stake').innerText
                                                      : null];});"""
    )
    assert [c for c, *_ in shown] == [f.code for f in findings]
    for (code, ns, method, stake), f in zip(shown, findings, strict=True):
        if f.saving_ns is None and not f.time_at_stake_ns:  # a share, not a time cost
            assert ns is None and stake.strip(" ·") == "no time at stake measured", code
        elif f.saving_ns is None:
            assert ns is None and "estimate" in stake and f"{f.time_at_stake_ns / 1e6:.2f}" in stake
        else:
            assert int(ns) == f.saving_ns and method == f.saving_method, code
    # the slow rank's finding: its saving is the replay of that rank at its peers' pace
    slow = [f for f in findings if f.code == "STRAGGLER_RANK"]
    assert slow and slow[0].ranks == (SLOW,)
    truth = answer(app, [f"straggler:{SLOW}"])["scenarios"][0]
    assert truth["saving_ns"] > 0
    saved = {c: int(ns) for c, ns, *_ in shown if ns is not None}
    assert saved["STRAGGLER_RANK"] == truth["saving_ns"]
    assert f"{truth['saving_ns'] / 1e6:.3f} ms" in text(browser, "#findings-list .finding-saving")
    assert not severe_logs(browser)


def test_a_scenario_from_the_form_is_what_whatif_answers(browser: Any, app: LiveApp) -> None:
    open_page(browser, app.url("/findings"), "#whatif-run")
    offered = browser.execute_script(
        "return Array.from(document.querySelectorAll('#whatif-scenarios input'), i => i.value);"
    )
    assert "stage-balance" in offered and "straggler" in offered  # PP and a straggler here
    replay(browser, ["stage-balance"], rank=str(SLOW), comm="dp=2", kernels="gemm=0.8")
    names = ["stage-balance", f"straggler:{SLOW}", "scale-comm:dp=2", "scale-kernels:gemm=0.8"]
    truth = answer(app, names)
    got = rows(browser)
    assert set(got) == set(names)
    for s in truth["scenarios"]:
        assert got[s["name"]] == (s["predicted_step_ns"], s["saving_ns"]), s["name"]
    assert got[f"straggler:{SLOW}"][1] > 0 and got["scale-kernels:gemm=0.8"][1] > 0
    summary = browser.find_element("id", "whatif-summary").get_attribute("data-replayed-ns")
    assert int(summary) == truth["replayed_step_ns"]
    shoot(browser, "whatif_panel")
    assert not severe_logs(browser)


def test_bad_input_says_what_is_wrong(browser: Any, app: LiveApp) -> None:
    open_page(browser, app.url("/findings"), "#whatif-run")
    replay(browser, [], kernels="gemm(=0.8")
    msg = text(browser, "#whatif-error")
    assert "bad regular expression" in msg and "gemm(" in msg and "Traceback" not in msg
    assert not browser.find_elements("css selector", ".whatif-row")
    replay(browser, [], kernels="(?=gemm)x=0.8")  # Python reads it, DuckDB's RE2 does not
    assert "RE2" in text(browser, "#whatif-error")
    replay(browser, [], rank="thirteen")
    assert "bad rank list" in text(browser, "#whatif-error")
    replay(browser, [], rank=str(SLOW))  # a good one after bad ones: the message goes
    assert rows(browser) and not text(browser, "#whatif-error").strip()
    assert not severe_logs(browser)


def path_drawn(browser: Any) -> list[dict[str, Any]]:
    """Every critical path segment the figure draws, with the lane label it sits on."""
    return browser.execute_script(  # type: ignore[no-any-return]
        """const gd = document.querySelector(arguments[0]);
        const ticks = gd._fullLayout.yaxis.ticktext, vals = gd._fullLayout.yaxis.tickvals;
        const out = [];
        for (const t of gd.data.filter(t => (t.name || '').startsWith('path: '))) {
            for (let i = 0; i < t.x.length; i += 3) {
                const c = t.customdata[i];
                out.push({rank: c[0], category: c[2], start: c[4], end: c[5], step: c[7],
                          x0: t.x[i], x1: t.x[i + 1], lane: ticks[vals.indexOf(t.y[i])]});
            }
        }
        return out;""",
        GRAPH,
    )


def test_critical_path_over_the_timeline(browser: Any, app: LiveApp) -> None:
    cur = app.data.cursor()
    try:
        table = critical_path.run(cur).tables["critical_path"]
    finally:
        cur.close()
    t0 = app.data.extent().t0_ns
    step = int(table["step"].max())  # type: ignore[arg-type]
    open_page(browser, app.url(f"/timeline?step={step}&cp=1"), GRAPH)
    assert query_of(browser.current_url)["cp"] == "1"
    drawn = path_drawn(browser)
    want = table.filter((pl.col("step") == step) & (pl.col("rank") >= 0))
    expected = sorted(
        (r["rank"], r["category"], r["start_ns"] - t0, r["end_ns"] - t0)
        for r in want.iter_rows(named=True)
    )
    assert expected and len({r for r, *_ in expected}) > 1  # the path crosses ranks
    got = sorted(
        (d["rank"], d["category"], d["start"], d["end"]) for d in drawn if d["step"] == step
    )
    assert got == expected
    for d in drawn:
        assert d["lane"].startswith(f"r{d['rank']} ")  # on its own rank's lane
        assert d["x0"] == pytest.approx(d["start"] / 1e6) and d["x1"] == pytest.approx(
            d["end"] / 1e6
        )
    assert f"critical path: {len(drawn)} segments" in text(browser, "#timeline-label")
    shoot(browser, "timeline_critical_path")
    # off: no path, and the address forgets it; on again from the toggle: the same segments
    browser.find_element("css selector", "#timeline-cp input").click()
    wait_for(browser, "!window.location.search.includes('cp=1')", timeout=30)
    assert path_drawn(browser) == []
    browser.find_element("css selector", "#timeline-cp input").click()
    wait_for(browser, "window.location.search.includes('cp=1')", timeout=30)
    again = sorted((d["rank"], d["category"], d["start"], d["end"]) for d in path_drawn(browser))
    assert again == sorted((d["rank"], d["category"], d["start"], d["end"]) for d in drawn)
    assert not severe_logs(browser)


def test_unmatched_waits_say_why_no_saving_is_shown(
    browser: Any, live_app: Callable[[Path], LiveApp], tmp_path: Path
) -> None:
    """An interleaved batched job whose trace names no peer: the findings show their time at
    stake, the page says why nothing is replayed, and each replayed scenario carries the note."""
    job = GpuJob(
        tp=2, pp=4, m=8, v=2, schedule="interleaved", batched=True, peers=False,
        rank_factor={3: 1.3},
    )  # fmt: skip
    blind = live_app(job_db(tmp_path, job))
    rep = blind.data.report()
    assert rep.facts["replay"]["used"] is False
    open_page(browser, blind.url("/findings"), "#whatif-run")
    why = text(browser, "#findings-not-replayed")
    assert f"not replayed: {rep.facts['replay']['unlinked_ops']:,} comm ops" in why
    assert not browser.find_elements("css selector", "#findings-list .finding-saving")
    assert len(browser.find_elements("css selector", "#findings-list .finding-stake")) == len(
        rep.findings
    )
    replay(browser, [], rank="3")
    note = browser.execute_script(
        "return document.querySelector('.whatif-row td:last-child').innerText;"
    )
    assert note == "unmatched comm keeps its measured waits"
    assert not severe_logs(browser)
