"""The timeline on ingested runs: what the figure draws against what the database holds.

Host threads on named lanes at their nesting depth, the same lanes at every zoom, no two
overlapping slices on one row, step boundaries from the steps table, a click's details panel
and launch -> kernel arrow, search matches, host critical path segments on their thread.
Expected values come from SQL on the run, never from the figure code.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from ranklens.analysis import timeline as tl
from ranklens.analysis import timeline_lanes as tlz
from ranklens.dashboards import timeline_view as tv
from ranklens.dashboards.data import RunData
from ranklens.dashboards.timeline_layers import lane_map
from ranklens.dashboards.timeline_marks import path_lines
from ranklens.sample_traces.gpu_job import GpuJob

from .conftest import job_db
from .test_timeline_figure import arr


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunData]:
    """A GPU-shaped run (host threads with ProfilerStep ranges, operators and launches;
    kernels on streams) as the dashboard reads it."""
    data = RunData(
        job_db(tmp_path_factory.mktemp("gpu-timeline"), GpuJob(tp=2, dp=1, pp=2, m=2, steps=2))
    )
    yield data
    data.close()


@pytest.fixture(scope="module")
def cpu_run(sample_db: Callable[[str], Path]) -> Iterator[RunData]:
    """The real gloo sample: nested operators on named threads, sends beside compute."""
    data = RunData(sample_db("megatron_tp2_pp2_dp2"))
    yield data
    data.close()


def sql(data: RunData, query: str, *params: Any) -> list[tuple[Any, ...]]:
    cur = data.cursor()
    try:
        return cur.execute(query, list(params)).fetchall()
    finally:
        cur.close()


def drawn(fig: dict[str, Any]) -> list[dict[str, Any]]:
    """Every event the figure can hover or click: its hover values, row and lane label."""
    hover = next(t for t in fig["data"] if t["name"] == "events")
    vals, text = fig["layout"]["yaxis"]["tickvals"], fig["layout"]["yaxis"]["ticktext"]
    out = {}
    for y, c in zip(arr(hover["y"]), hover["customdata"], strict=True):
        lane = max(i for i, v in enumerate(vals) if v <= y)
        out[(c[0], c[1], c[2], c[7])] = {"c": c, "row": y - vals[lane], "lane": text[lane]}
    return list(out.values())


def step_view(data: RunData, ranks: list[int], ms: float | None = None) -> tuple[int, int]:
    s, e = tv.resolve(data, ranks, None, None, None)
    return (s, e) if ms is None else (s, s + int(ms * 1e6))


def test_host_threads_drawn_on_named_lanes_at_their_depth(gpu_run: RunData) -> None:
    data, t0 = gpu_run, gpu_run.extent().t0_ns
    start, end = step_view(data, [0], 4.0)
    fig, _, _ = tv.render(data, [0], start, end)
    # Every host event of rank 0 in the window, with its nesting depth: how many other
    # slices of its thread enclose it (equal ones: the longer, or the first by name).
    want = sql(
        data,
        """WITH h AS (SELECT stream, ts_ns, dur_ns, ats_ns AS s, aend_ns AS e, name, kind
                      FROM events_aligned WHERE rank = 0 AND device = -1
                        AND ats_ns < ? AND aend_ns > ?)
        SELECT a.stream, a.ts_ns, a.dur_ns, a.kind::VARCHAR,
               count(b.ts_ns) FILTER (WHERE (b.s < a.s AND b.e >= a.e)
                                        OR (b.s = a.s AND b.e > a.e)) AS depth
        FROM h a LEFT JOIN h b ON a.stream = b.stream GROUP BY ALL""",
        end,
        start,
    )
    assert {k for *_, k, _ in want} >= {"annotation", "cpu_op", "runtime"}
    got = {(d["c"][1], d["c"][2] + t0, d["c"][7]): d for d in drawn(fig) if d["c"][0] == 0}
    names = dict(sql(data, "SELECT DISTINCT stream, device FROM events WHERE rank = 0"))
    for stream, ts, dur, _, depth in want:
        d = got[(stream, ts, dur)]
        assert d["row"] == depth and d["lane"] == f"r0 · thread {stream}", (d, depth)
        assert names[stream] == -1
    lanes = sql(data, "SELECT DISTINCT stream, device < 0 FROM events WHERE rank = 0")
    assert len(fig["layout"]["yaxis"]["ticktext"]) == len(lanes)  # kernels' streams too


def test_lanes_are_the_runs_at_every_zoom(cpu_run: RunData) -> None:
    data = cpu_run
    ext = data.extent()
    ranks = [0, 1]
    start, end = step_view(data, ranks)
    axes = []
    for s, e in ((start, start + 50_000), (start, end), (ext.t0_ns, ext.t1_ns)):
        fig, label, _ = tv.render(data, ranks, s, e)
        y = fig["layout"]["yaxis"]
        axes.append((y["tickvals"], y["ticktext"], y["range"]))
    assert "aggregated" in label  # the whole run: buckets, same lanes
    assert axes[0] == axes[1] == axes[2]
    # One lane per thread of those ranks that holds an event, named as the trace names it.
    threads = sql(
        data,
        """SELECT DISTINCT e.rank, e.stream, t.name FROM events e
           LEFT JOIN threads t ON t.rank = e.rank AND t.pid = e.pid AND t.tid = e.tid
           WHERE e.rank IN (0, 1)""",
    )
    labels = axes[0][1]
    assert len(labels) == len({(r, s) for r, s, _ in threads})
    for r, s, name in threads:
        assert name and name.startswith(f"thread {s} (")
        shown = f"r{r} · {name.split('(')[1].rstrip(')')} {s}"
        assert shown in labels or any(  # a thread renamed: either of its names
            f"r{r} · {n.split('(')[1].rstrip(')')} {s}" in labels
            for rr, ss, n in threads
            if (rr, ss) == (r, s)
        )


def test_overlapping_slices_never_share_a_row(cpu_run: RunData) -> None:
    data = cpu_run
    # The longest send of the run, and the window around it.
    rank, ts, dur, s, e = sql(
        data,
        "SELECT rank, ts_ns, dur_ns, ats_ns, aend_ns FROM events_aligned "
        "WHERE name LIKE 'gloo:send%' OR coll_op = 'send' ORDER BY dur_ns DESC LIMIT 1",
    )[0]
    fig, label, _ = tv.render(data, [rank], s, e)
    assert "aggregated" not in label
    events = drawn(fig)
    rows: dict[tuple[str, float], list[tuple[float, float]]] = {}
    for d in events:
        rows.setdefault((d["lane"], d["row"]), []).append((d["c"][4], d["c"][4] + d["c"][5]))
    for spans in rows.values():
        spans.sort()
        for (_, e0), (s1, _) in itertools.pairwise(spans):
            assert s1 >= e0 - 1e-9
    # The send is drawn, and work of its thread during it sits on other rows.
    t0 = data.extent().t0_ns
    send = next(d for d in events if (d["c"][0], d["c"][2] + t0, d["c"][7]) == (rank, ts, dur))
    lo, hi = send["c"][4], send["c"][4] + send["c"][5]
    beside = [
        d
        for d in events
        if d["lane"] == send["lane"]
        and d is not send
        and d["c"][4] < hi
        and d["c"][4] + d["c"][5] > lo
    ]
    assert any(d["c"][6] == "compute" for d in beside)  # the send hid under these before
    assert all(d["row"] != send["row"] for d in beside)


def test_step_boundaries_are_the_steps_table(cpu_run: RunData) -> None:
    data = cpu_run
    t0 = data.extent().t0_ns
    ranks = [0, 3]
    start, end = tv.step_window(data, 3, ranks) or (0, 0)
    start, end = start - 20_000_000, end + 20_000_000
    fig, _, _ = tv.render(data, ranks, start, end)
    lines = next(t for t in fig["data"] if t["name"] == "step boundaries")
    xs = {round(x, 6) for x in lines["x"] if x is not None}
    want = {
        round((x - t0) / 1e6, 6)
        for s, e in sql(
            data,
            "SELECT s.start_ns + r.clock_offset_ns, s.end_ns + r.clock_offset_ns "
            "FROM steps s JOIN ranks r USING (rank) WHERE rank IN (0, 3)",
        )
        for x in (s, e)
        if start <= x <= end
    }
    assert want and xs == want
    labels = {a["text"] for a in fig["layout"]["annotations"]}
    assert "step 3" in labels


def test_a_click_lists_every_column_and_draws_its_flow(gpu_run: RunData) -> None:
    data, t0 = gpu_run, gpu_run.extent().t0_ns
    start, end = step_view(data, [0], 4.0)
    win = {"start_ns": start, "end_ns": end}
    fig, _, _ = tv.render(data, [0], start, end)
    launch = next(d for d in drawn(fig) if d["c"][6] == "runtime")
    click = {"points": [{"customdata": launch["c"]}]}
    out = tv.update(data, "timeline-graph.clickData", None, click, [0], None, win)
    cols = sql(data, "SELECT column_name FROM (DESCRIBE events_aligned)")
    row = sql(
        data,
        "SELECT * FROM events_aligned WHERE rank = 0 AND stream = ? AND ts_ns = ?",
        launch["c"][1],
        launch["c"][2] + t0,
    )[0]
    cells = {
        tr.children[0].children: tr.children[1].children
        for tr in out[7].children[2].children.children  # the panel's table rows
    }
    assert set(cells) >= {c for (c,) in cols} | {"parallelism", "thread_name"}
    for (c,), v in zip(cols, row, strict=True):
        assert cells[c] == "—" if v is None else cells[c].startswith(str(v)), (c, v)
    # The arrow: from the launch's start on its row to the kernel's (same correlation).
    kernel = sql(
        data,
        "SELECT stream, ats_ns FROM events_aligned WHERE rank = 0 AND device >= 0 "
        "AND correlation = ?",
        row[cols.index(("correlation",))],
    )[0]
    fig2 = out[0]
    arrow = next(a for a in fig2["layout"]["annotations"] if a.get("showarrow"))
    assert arrow["ax"] == pytest.approx(launch["c"][4]) and arrow["x"] == pytest.approx(
        (kernel[1] - t0) / 1e6
    )
    at = {(d["c"][1], round(d["c"][4], 6)): d for d in drawn(fig2)}
    vals = fig2["layout"]["yaxis"]["tickvals"]
    texts = fig2["layout"]["yaxis"]["ticktext"]
    assert (
        texts[max(i for i, v in enumerate(vals) if v <= arrow["y"])] == f"r0 · stream {kernel[0]}"
    )
    assert at[(launch["c"][1], round(launch["c"][4], 6))]["lane"] == "r0 · thread " + str(
        launch["c"][1]
    )
    assert out[1]["sel"]["ts"] == launch["c"][2]  # kept for the next pan and zoom


def test_search_outlines_exactly_the_matching_events(
    gpu_run: RunData, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, t0 = gpu_run, gpu_run.extent().t0_ns
    start, end = step_view(data, [0, 1], 3.0)
    fig, label, href = tv.render(data, [0, 1], start, end, q="GEMM")
    want = sql(
        data,
        "SELECT count(*) FROM events_aligned WHERE rank IN (0, 1) AND ats_ns < ? "
        "AND aend_ns > ? AND name ILIKE '%gemm%'",
        end,
        start,
    )[0][0]
    found = next(t for t in fig["data"] if t["name"] == "matches 'GEMM'")
    assert want > 0 and found["x"].count(None) == want
    assert f"'GEMM': {want} matches in view" in label and "q=GEMM" in href
    # Aggregated: the matches come from the database, counted the same way.
    ext = data.extent()
    monkeypatch.setattr(tl, "window", functools.partial(tl.window, max_events=100))
    _, label, _ = tv.render(data, None, ext.t0_ns, ext.t1_ns, q="gemm")
    total = sql(
        data,
        "SELECT count(*) FROM events_aligned WHERE ats_ns < ? AND aend_ns > ? "
        "AND name ILIKE '%gemm%'",
        ext.t1_ns,
        ext.t0_ns,
    )[0][0]
    assert "aggregated" in label and f"'gemm': {total} matches" in label
    assert t0 == ext.t0_ns


def test_host_critical_path_segments_land_on_their_thread(gpu_run: RunData) -> None:
    lanes = gpu_run.timeline_lanes()
    lm = lane_map(lanes, [0])
    host = lanes.filter((pl.col("rank") == 0) & pl.col("host"))["stream"][0]
    path = pl.DataFrame(
        {
            "rank": [0, 0],
            "stream": [host, None],
            "category": ["host_launch", "idle"],
            "name": ["cudaLaunchKernel", None],
            "start_ns": [0, 10],
            "end_ns": [10, 20],
            "step": [1, 1],
        }
    )
    lines, _, _ = path_lines(path, lm, 0)
    by = {ln.name: ln for ln in lines}
    assert by["path: host_launch"].y[0] == lm.top[lm.keys.index((0, host))]
    assert by["path: idle"].y[0] == lm.top[0]


def test_lanes_from_a_sample_grow_to_what_a_window_stacks(cpu_run: RunData) -> None:
    """Past EXACT_MAX events lane rows come from the first steps; a window deeper than that
    grows its lanes (here: a sample of no step at all, every lane one row)."""
    data = cpu_run
    cur = data.cursor()
    try:
        exact = tlz.lanes(cur)
        data._cache["timeline_lanes"] = tlz.lanes(cur, exact_max=0, sample_steps=0)
    finally:
        cur.close()
    try:
        assert data.timeline_lanes()["rows"].max() == 1
        start, end = step_view(data, [0])
        fig, _, _ = tv.render(data, [0], start, end)
        rows: dict[tuple[str, float], list[tuple[float, float]]] = {}
        for d in drawn(fig):
            rows.setdefault((d["lane"], d["row"]), []).append((d["c"][4], d["c"][4] + d["c"][5]))
        for spans in rows.values():
            spans.sort()
            assert all(s1 >= e0 - 1e-9 for (_, e0), (s1, _) in itertools.pairwise(spans))
        grown = data.timeline_lanes().filter(pl.col("rank") == 0)
        assert grown["rows"].to_list() == exact.filter(pl.col("rank") == 0)["rows"].to_list()
    finally:
        data._cache["timeline_lanes"] = exact
