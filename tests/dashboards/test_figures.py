"""Figure builders and callbacks, called directly (no server, no browser).

Builders get small hand-made analysis tables and must draw exactly those numbers (in ms);
callbacks and page layouts run on a real sample run inside a request context.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import dash
import plotly
import polars as pl
import pytest
from ranklens.analysis import Finding, Result, Severity
from ranklens.analysis import timeline as tl
from ranklens.dashboards import (
    figures,
    figures_comm,
    figures_contention,
    figures_overview,
    figures_pipeline,
)
from ranklens.dashboards.app import create_app
from ranklens.dashboards.data import RunData
from ranklens.dashboards.pages import findings, overview, pipeline, sql
from ranklens.dashboards.pages import timeline as tpage

from .conftest import run_data

MS = 1e6


def by_step() -> pl.DataFrame:
    rows = [
        (r, s, 100 * MS, (40 if r == 3 else 10) * MS, 5 * MS, 20 * MS)
        for r in range(4)
        for s in (1, 2)
    ]
    return pl.DataFrame(
        rows,
        schema=["rank", "step", "window_ns", "compute_ns", "exposed_comm_ns", "idle_ns"],
        orient="row",
    )


def test_step_time_is_in_ms_per_rank() -> None:
    fig = figures.step_time(by_step())
    assert [t.name for t in fig.data] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert list(fig.data[0].y) == [100.0, 100.0]


def test_step_time_past_max_lines_is_one_line_trace_with_a_gap_per_rank() -> None:
    fig = figures.step_time(by_step(), max_lines=2)
    (trace,) = fig.data
    assert trace.type == "scatter" and trace.mode == "lines"
    x, y = list(trace.x), list(trace.y)
    gaps = [i for i, v in enumerate(y) if v != v]  # NaN: where one rank's line ends
    assert gaps == [2, 5, 8, 11]
    assert [x[i] for i in (0, 1, 3, 4)] == [1.0, 2.0, 1.0, 2.0] and y[:2] == [100.0, 100.0]
    assert list(trace.customdata)[:6] == [0, 0, 0, 1, 1, 1]  # hover names the rank


def test_heatmap_rows_are_ranks_and_the_straggler_is_hot() -> None:
    fig = figures_overview.heatmap(by_step(), "compute_ns", focus_rank=3, named=(1,))
    hm = fig.data[0]
    assert list(hm.y) == ["r0", "r1", "r2", "r3"] and list(hm.x) == ["1", "2"]
    assert [list(r) for r in hm.customdata][3] == [40.0, 40.0]  # ms in the hover
    # the colour is the share of the step (40 of 100 ms), on a fixed 0-100% scale
    z = [list(r) for r in hm.z]
    assert z[3] == [40.0, 40.0] and z[0] == [10.0, 10.0]
    assert (hm.zmin, hm.zmax) == (0, 100) and "% of the step" in fig.layout.title.text
    dashes = sorted(s.line.dash for s in fig.layout.shapes)
    assert dashes == ["dot", "solid"]  # the finding's rank dotted, the focused rank solid


def test_heatmap_of_step_time_is_relative_to_the_median_step() -> None:
    t = by_step().with_columns(
        window_ns=pl.when(pl.col("rank") == 3).then(pl.lit(102 * MS)).otherwise(100 * MS)
    )
    hm = figures_overview.heatmap(t, "window_ns").data[0]
    assert [list(r) for r in hm.z][3] == pytest.approx([2.0, 2.0])  # 2% above the median
    assert hm.zmax == 20.0  # a 2 ms difference on a 100 ms step stays pale


def test_one_step_run_draws_bars_not_a_column_of_dots() -> None:
    fig = figures.step_time(by_step().filter(pl.col("step") == 2))
    (bar,) = fig.data
    assert bar.type == "bar" and list(bar.x) == [0, 1, 2, 3] and list(bar.y) == [100.0] * 4
    assert [list(c) for c in bar.customdata][1] == [1, 2]  # a click opens rank 1, step 2
    assert "one profiled step: step 2" in fig.layout.title.text


def test_findings_bar_says_when_the_bars_overlap() -> None:
    fs = [Finding(c, Severity.WARNING, c, "", 60 * 1_000_000, ranks=(1,)) for c in "AB"]
    fig = figures_overview.findings_bar(fs, step_ns=100 * MS)
    assert "more than the 100 ms step" in fig.layout.title.text
    assert fig.layout.shapes[0].x0 == 100.0  # the mean step drawn
    alone = figures_overview.findings_bar(fs[:1], step_ns=100 * MS)
    assert "more than" not in alone.layout.title.text


def test_time_split_adds_up_to_the_window() -> None:
    by_rank = pl.DataFrame(
        {
            "rank": [0],
            "window_ns": [100],
            "compute_ns": [50],
            "exposed_comm_ns": [20],
            "idle_ns": [25],
        }
    )
    fig = figures.time_split(by_rank)
    vals = {t.name: t.y[0] for t in fig.data}
    assert vals == pytest.approx(
        {"compute": 50, "exposed comm": 20, "memory copies": 5, "idle": 25}
    )


def test_comm_share_puts_overlapping_shares_side_by_side() -> None:
    steps = pl.DataFrame(
        {"rank": [0, 1], "step": [1, 1], "compute_share": [0.5, 0.6], "idle_share": [0.1, 0.2]}
    )
    par = pl.DataFrame(
        {
            "rank": [0, 1, 0],
            "step": [1, 1, 1],
            "parallelism": ["DP", "DP", "TP"],
            "comm_share": [0.3, 0.2, 0.1],
        }
    )
    fig = figures_overview.comm_share(steps, par, 1)
    assert [t.name for t in fig.data] == ["compute", "DP comm", "TP comm", "idle"]
    assert list(fig.data[2].y) == pytest.approx([10.0, 0.0])
    # overlapping shares are not stacked into a sum past 100%
    assert fig.layout.barmode == "group" and list(fig.layout.yaxis.range) == [0, 100]
    union = figures_overview.comm_share(steps.with_columns(comm_share=pl.lit(0.35)), par, 1)
    assert union.data[1].name == "all comm (union)" and list(union.data[1].y) == [35.0, 35.0]


def test_findings_keep_the_report_order() -> None:
    fs = [
        Finding("A", Severity.WARNING, "a", "fix a", 3_000_000, ranks=(3,)),
        Finding("B", Severity.INFO, "b", "fix b", 1_000_000),
    ]
    rows = figures_overview.finding_rows(fs)
    assert [r["code"] for r in rows] == ["A", "B"] and rows[0]["at stake (ms/step)"] == 3.0
    bar = figures_overview.findings_bar(fs).data[0]
    assert list(bar.x) == [1.0, 3.0] and bar.y[-1] == "A (rank 3)"


def test_gantt_draws_windows_under_blocks() -> None:
    blocks = pl.DataFrame(
        {
            "stage": [0, 1],
            "phase": ["F", "B"],
            "mb": [0, 0],
            "start_ns": [1 * MS, 3 * MS],
            "dur_ns": [1 * MS, 2 * MS],
        }
    )
    wins = pl.DataFrame(
        {"rank": [0, 1], "stage": [0, 1], "start_ns": [0, 0], "end_ns": [10 * MS, 10 * MS]}
    )
    fig = figures_pipeline.gantt(blocks, wins, 0, "t")
    assert fig.data[0].name.startswith("bubble") and list(fig.data[0].x) == [10.0, 10.0]
    assert [t.name for t in fig.data[1:]] == ["B", "F"] and list(fig.data[2].text) == ["F0"]


def test_bubble_by_stage_shows_measured_and_closed_form() -> None:
    st = pl.DataFrame({"stage": [0, 1], "bubble_fraction": [0.8, 0.5], "closed_form": [0.6, 0.6]})
    fig = figures_pipeline.bubble_by_stage(st)
    assert list(fig.data[0].y) == [0.8, 0.5] and list(fig.data[1].y) == [0.6, 0.6]


def test_busbw_against_the_peak() -> None:
    t = pl.DataFrame(
        {
            "parallelism": ["DP", "DP"],
            "op": ["all_reduce"] * 2,
            "bytes": [1e6, 1e8],
            "busbw_gbps": [20.0, 150.0],
            "instances": [5, 5],
            "link": ["nvlink"] * 2,
            "peak_gbps": [450.0, 450.0],
        }
    )
    fig = figures_comm.busbw(t)
    assert list(fig.data[0].y) == [20.0, 150.0] and fig.layout.xaxis.type == "log"
    assert any("peak 450" in a.text for a in fig.layout.annotations)
    assert "peak unknown" not in fig.layout.title.text
    unknown = figures_comm.busbw(t.with_columns(pl.lit(None, pl.Float64).alias("peak_gbps")))
    assert "peak unknown" in unknown.layout.title.text and not unknown.layout.annotations
    empty = figures_comm.busbw(t.with_columns(pl.lit(None, pl.Float64).alias("bytes")))
    msg = empty.layout.annotations[0].text
    assert "no message size" in msg and "gloo" not in msg
    timed = figures_comm.busbw(t.with_columns(pl.lit(None, pl.Float64).alias("busbw_gbps")))
    assert "no collective has both a size and a device time" in timed.layout.annotations[0].text


def test_contention_slowdown_ranks_by_time_lost() -> None:
    table = pl.DataFrame(
        {
            "name": ["gemm", "attn"],
            "shape": ["g", "a"],
            "slowdown": [0.2, 0.5],
            "time_lost_ns": [1 * MS, 3 * MS],
            "n_matched": [4, 2],
            "t_alone_ns": [1e5, 1e5],
            "t_overlapped_ns": [1.2e5, 1.5e5],
        }
    )
    fig = figures_contention.slowdown(Result("contention", table))
    assert list(fig.data[0].x) == [1.0, 3.0] and list(fig.data[0].text) == ["+20%", "+50%"]


# --- on a real sample run -------------------------------------------------------------------


@pytest.fixture(scope="module")
def app(sample_db: Callable[[str], Path]) -> Iterator[dash.Dash]:
    data = RunData(sample_db("megatron_tp2_pp2_dp2"))
    data.warm()
    yield create_app(data.db_path, data=data)
    data.close()


def test_pages_and_figures_are_built_once_per_run(app: dash.Dash) -> None:
    data = run_data(app)
    built: list[int] = []
    assert data.memo(("test", 1), lambda: built.append(1) or "x") == "x"
    assert data.memo(("test", 1), lambda: built.append(2) or "y") == "x" and built == [1]
    with app.server.test_request_context("/"):
        page = next(p for p in dash.page_registry.values() if p["path"] == "/")
        assert page["layout"](rank="3") is page["layout"](rank="3")
        assert page["layout"](rank="3") is not page["layout"](rank="2")


def test_every_page_registers_and_renders(app: dash.Dash) -> None:
    paths = {p["path"] for p in dash.page_registry.values()}
    assert {
        "/",
        "/timeline",
        "/pipeline",
        "/communication",
        "/contention",
        "/findings",
        "/sql",
    } <= paths
    for page in dash.page_registry.values():
        with app.server.test_request_context(page["path"]):
            text = json.dumps(page["layout"](), cls=plotly.utils.PlotlyJSONEncoder)
        assert "not available for this run" not in text, page["path"]


def test_timeline_callback_zoom_and_click(app: dash.Dash) -> None:
    data = run_data(app)
    t0 = data.extent().t0_ns
    with app.server.test_request_context("/timeline"):
        s, e = tpage.resolve(data, None, None, None, None)
        win = {"start_ns": s, "end_ns": e}
        out = tpage.update(
            data,
            "timeline-relayout.data",
            {"xaxis.range[0]": 10.0, "xaxis.range[1]": 12.5},
            None,
            None,
            None,
            win,
        )
        _fig, new, label, href = out[:4]
        assert new == {
            "start_ns": t0 + 10_000_000,
            "end_ns": t0 + 12_500_000,
            "hl": None,
            "cp": False,  # the critical path is not drawn unless asked (cp=1)
            "q": "",  # no search
            "sel": None,  # no event selected
        }
        assert "window 10.000 – 12.500 ms" in label and "start=10.000&end=12.500" in href
        # A relayout that does not move the window (e.g. autosize) changes nothing.
        assert (
            tpage.update(data, "timeline-relayout.data", {"autosize": True}, None, None, None, new)
            == (dash.no_update,) * 9  # figure ... details, search position
        )
        cur = data.cursor()
        ev = cur.execute(
            "SELECT rank, stream, ts_ns FROM collectives WHERE status = 'matched' "
            "AND op = 'all_reduce' LIMIT 1"
        ).fetchone()
        cur.close()
        assert ev is not None
        click = {"points": [{"customdata": [ev[0], ev[1], ev[2] - t0, "gloo:all_reduce"]}]}
        out = tpage.update(data, "timeline-graph.clickData", None, click, None, None, new)
        assert len(out[0]["layout"]["shapes"]) >= 2  # the instance outlined on its ranks
        hl, info = tpage.instance_view(data, click)
        assert hl is not None and hl.height >= 2 and ev[0] in hl["rank"].to_list()
        text = json.dumps(info.to_plotly_json(), cls=plotly.utils.PlotlyJSONEncoder)
        assert "collective instance" in text
        # the panel names the rank that arrived last (from the instance's own arrivals)
        arr = hl.filter(pl.col("arrive_ns").is_not_null()).sort("arrive_ns", "rank")
        if arr["arrive_ns"][-1] > arr["arrive_ns"][0]:
            assert f"rank {arr['rank'][-1]} arrived last" in text


def test_overview_heatmap_callback_uses_the_analysis(app: dash.Dash) -> None:
    data = run_data(app)
    res = data.result("breakdown")
    assert res is not None
    fig = overview.heatmap_figure(data, "idle_ns", None)
    worst = res.table.sort("idle_ns", descending=True).row(0, named=True)
    hm = fig.data[0]
    row = list(hm.y).index(f"r{worst['rank']}")
    col = list(hm.x).index(str(worst["step"]))
    assert hm.customdata[row][col] == pytest.approx(worst["idle_ns"] / MS)
    assert hm.z[row][col] == pytest.approx(100 * worst["idle_ns"] / worst["window_ns"], abs=0.01)


def test_pipeline_summary_and_findings_links(app: dash.Dash) -> None:
    data = run_data(app)
    res = data.result("pipeline")
    assert res is not None
    row = res.tables["schedule"].row(0, named=True)
    text = json.dumps(
        pipeline.summary(res, row["pp_group"], row["step"]).to_plotly_json(),
        cls=plotly.utils.PlotlyJSONEncoder,
    )
    assert f"{row['p']} stages" in text and f"{row['closed_form']:.3f}" in text
    windowed = next(f for f in data.report().findings if f.window_ns is not None)
    href = findings.timeline_link(data, windowed)
    start = (windowed.window_ns[0] - data.extent().t0_ns) / MS  # type: ignore[index]
    assert href.startswith("/timeline?") and f"start={start:.3f}" in href


def test_sql_page_runs_a_query(app: dash.Dash) -> None:
    data = run_data(app)
    out, err = sql.execute(data, "SELECT 41 + 1 AS answer")
    assert err == "" and out.children[1].columnDefs[0]["headerName"] == "answer"
    rows = sql.rows_response(data, out.children[1].id["key"], {"startRow": 0, "endRow": 10})
    assert rows == {"rowData": [{"c0": 42}], "rowCount": 1}


def test_window_switches_to_buckets_past_the_cap(app: dash.Dash) -> None:
    data = run_data(app)
    cur = data.cursor()
    ext = data.extent()
    try:
        small = tl.window(cur, ext, ext.t0_ns, ext.t0_ns + 2_000_000)
        big = tl.window(cur, ext, ext.t0_ns, ext.t1_ns, max_events=100)
    finally:
        cur.close()
    assert small.mode == "events" and 0 < small.events.height <= 4000
    assert big.mode == "buckets" and big.buckets.height > 0
    assert big.buckets["bucket"].max() < -(-(ext.t1_ns - ext.t0_ns) // big.bucket_ns)
    assert set(small.segments["label"].unique().to_list()) <= {"exposed", "idle"}
