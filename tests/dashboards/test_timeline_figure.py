"""The timeline figure, built from hand-made analysis windows (no server, no browser).

It is plotly JSON with rectangles drawn as one filled polygon per colour and hover points in
a separate trace, so these tests read the rectangles back from the polygon and check that
every event can be hovered and clicked, with the numbers the window holds (in ms).
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ranklens.analysis import timeline as tl
from ranklens.dashboards.figures_timeline import lane_ticks, rectangles, timeline
from ranklens.dashboards.timeline_layers import lane_map


def arr(v: Any) -> list[float]:
    """A figure array, typed (base64) or plain."""
    if isinstance(v, dict):
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).tolist()
    return list(v)


def rects(trace: dict[str, Any]) -> list[tuple[float, float, float, float]]:
    """(x0, x1, y0, y1) of each rectangle of a filled trace: the closed 4-corner loops of its
    polygon (the bridges between them are straight there-and-back lines, never a loop)."""
    x, y = arr(trace["x"]), arr(trace["y"])
    out, i = [], 0
    while i + 4 < len(x):
        xs, ys = x[i : i + 5], y[i : i + 5]
        if xs[0] == xs[3] == xs[4] != xs[1] == xs[2] and ys[0] == ys[1] == ys[4] != ys[2] == ys[3]:
            out.append((xs[0], xs[1], ys[0], ys[2]))
            i += 5
        else:
            i += 1
    return out


def window(mode: str) -> tl.Window:
    ev = pl.DataFrame(
        {
            "rank": [0, 0, 1],
            "stream": [7, 9, 7],
            "kind": ["compute", "comm", "comm"],
            "name": ["gemm", "nccl AllReduce", "nccl AllReduce"],
            "step": [1, 1, 1],
            "ts_ns": [1000, 2000, 2100],
            "s": [1000, 2000, 2100],
            "e": [3000, 4000, 4000],
            "dur_ns": [2000, 2000, 1900],
            "pg_name": [None, "1", "1"],
            "coll_op": [None, "ar", "ar"],
            "parallelism": [None, "DP", "DP"],
        }
    )
    seg = pl.DataFrame({"rank": [0], "label": ["exposed"], "s": [3000], "e": [4000]})
    bk = pl.DataFrame(
        {
            "rank": [0, 0],
            "stream": [7, 7],
            "kind": ["compute", "comm"],
            "parallelism": [None, "TP"],
            "bucket": [0, 0],
            "s": [0, 0],
            "busy_ns": [1500, 1500],
            "n_events": [3, 1],
        }
    )
    if mode == "events":
        return tl.Window(0, 5000, "events", ev, pl.DataFrame(), 0, seg, 3)
    return tl.Window(0, 1000, "buckets", ev.clear(), bk, 1000, pl.DataFrame(), 1)


def test_events_one_polygon_per_colour_with_overlays() -> None:
    hl = pl.DataFrame(
        {"rank": [0, 1], "stream": [9, 7], "start_ns": [2000, 2100], "end_ns": [4000, 4000]}
    )
    fig = timeline(window("events"), t0_ns=0, highlight=hl)
    fills = [t for t in fig["data"] if t.get("fill") == "toself"]
    assert [t["name"] for t in fills] == ["DP comm", "compute", "exposed communication"]
    # DP comm: rank 0 stream 9 (lane 1) and rank 1 stream 7 (lane 2), 0.8 lane high.
    assert np.allclose(rects(fills[0]), [(0.002, 0.004, 0.6, 1.4), (0.0021, 0.004, 1.6, 2.4)])
    # Exposed comm of rank 0 spans both of its lanes, named by hovering it (not by points,
    # which would compete with the events' own).
    assert np.allclose(rects(fills[2]), [(0.003, 0.004, -0.475, 1.475)])
    assert fills[2]["hoveron"] == "fills" and fills[0]["hoverinfo"] == "skip"
    assert {t["name"] for t in fig["data"] if "customdata" in t} == {"events"}
    layout = fig["layout"]
    assert layout["yaxis"]["ticktext"] == ["r0 · 7", "r0 · 9", "r1 · 7"]  # no names known
    assert len(layout["shapes"]) == 2  # the instance, outlined on both ranks
    assert tuple(layout["xaxis"]["range"]) == (0.0, 0.005)


def test_every_event_answers_hover_and_click_inside_its_rectangle() -> None:
    fig = timeline(window("events"), t0_ns=0)
    hover = next(t for t in fig["data"] if t["name"] == "events")
    rows = hover["customdata"]
    # What a click sends back: rank, stream and raw start identify the event.
    assert {tuple(r[:3]) for r in rows} == {(0, 7, 1000), (0, 9, 2000), (1, 7, 2100)}
    assert {r[6] for r in rows} == {"compute", "DP comm"}  # the colour it belongs to
    lanes = {(0, 7): 0, (0, 9): 1, (1, 7): 2}
    for x, y, r in zip(arr(hover["x"]), arr(hover["y"]), rows, strict=True):
        assert r[4] <= x <= r[4] + r[5] and y == lanes[(r[0], r[1])]
    # A 2 us event in a 5 us window gets hover points along it, not just one.
    assert sum(1 for r in rows if r[3] == "gemm") > 10


def test_buckets_never_overflow_their_bucket() -> None:
    fig = timeline(window("buckets"), t0_ns=0)
    fills = [t for t in fig["data"] if t.get("fill") == "toself"]
    total = sum(x1 - x0 for t in fills for x0, x1, _, _ in rects(t))
    assert total == pytest.approx(0.001)  # 1500 + 1500 ns of busy time scaled into 1000 ns
    assert "aggregated" in fig["layout"]["title"]["text"]


@settings(deadline=None)  # no timing assertion: a loaded CI host is slow at random
@given(
    st.lists(
        st.tuples(
            st.floats(-1e3, 1e3), st.floats(0.001, 100), st.integers(0, 50), st.floats(0.1, 0.9)
        ),
        min_size=1,
        max_size=40,
    )
)
def test_one_polygon_covers_exactly_its_rectangles(boxes: list[tuple[float, ...]]) -> None:
    """The bridges between rectangles enclose no area (the polygon's signed area is the sum
    of the rectangles'), all of them run straight across or down, and every rectangle is in
    the polygon as a loop of its own."""
    x0 = np.array([b[0] for b in boxes])
    x1 = x0 + np.array([b[1] for b in boxes])
    y0 = np.array([float(b[2]) for b in boxes])
    y1 = y0 + np.array([b[3] for b in boxes])
    x, y = rectangles(x0, x1, y0, y1)
    area = 0.5 * float(np.sum(x * np.roll(y, -1) - np.roll(x, -1) * y))
    assert area == pytest.approx(float(np.sum((x1 - x0) * (y1 - y0))), rel=1e-9, abs=1e-6)
    assert np.all((np.diff(x) == 0) | (np.diff(y) == 0))  # no slanted edge
    found = sorted(rects({"x": x.tolist(), "y": y.tolist()}))
    assert found == sorted(zip(x0.tolist(), x1.tolist(), y0.tolist(), y1.tolist(), strict=True))


def test_many_lanes_get_one_label_per_rank() -> None:
    few = lane_map(
        pl.DataFrame(
            {
                "rank": [0, 0, 1],
                "stream": [7, 9, 7],
                "host": [True, False, False],
                "activity": [False, True, True],
                "rows": [3, 1, 1],
                "name": ["thread 7 (python)", None, None],
            }
        )
    )
    assert lane_ticks(few) == {
        "tickvals": [0, 3, 4],  # each lane's top row: the host thread has 3 rows
        "ticktext": ["r0 · python 7", "r0 · stream 9", "r1 · stream 7"],
    }
    many = lane_map(
        pl.DataFrame(
            {
                "rank": [r for r in range(40) for _ in (7, 9)],
                "stream": [s for _ in range(40) for s in (7, 9)],
                "host": [False] * 80,
                "activity": [True] * 80,
                "rows": [2] * 80,  # 160 rows: more than fit at full height
                "name": [None] * 80,
            }
        )
    )
    ticks = lane_ticks(many)
    assert ticks["ticktext"] == [f"r{r}" for r in range(40)]
    assert ticks["tickvals"] == list(range(0, 160, 4))
