"""Pure figure builder for the aligned multi-rank timeline (one window from analysis.timeline).

Why it looks the way it does, all for the browser's time on every pan and zoom:

* filled paths, not bars: plotly draws a bar trace as one SVG element per bar and styles each
  (about half a millisecond a bar, seconds for a window of a few thousand events). Here each
  colour is one scatter trace filling one polygon that holds all its rectangles;
* hover and click come from one invisible trace per kind of rectangle, with a point in the
  middle of each (more along long ones, so the pointer is never far from one) whose
  customdata says which event it is;
* plotly JSON built directly, not a plotly figure object: those validate and deep-copy every
  array, a few hundred ms per window on the server;
* margins that fit the title, legend and labels: plotly grows a margin that is too small by
  drawing the whole figure again.

Times are ms since the run's origin; y is rows (a lane has as many as slices ever overlap on
it). Layers (the window's events) come from timeline_layers.py, marks drawn over them (steps,
outlines, flows, the critical path) from timeline_marks.py.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
from ranklens.analysis.timeline import Window
from ranklens.dashboards.figures import MS, empty, template
from ranklens.dashboards.timeline_layers import Floats, LaneMap, Layer, layers, placed, window_lanes
from ranklens.dashboards.timeline_marks import (
    Marks,
    flow_arrows,
    name_matches,
    outline,
    path_lines,
    place,
    step_lines,
)

HOVER: dict[str, str] = {
    "events": "%{customdata[3]}<br>rank %{customdata[0]} · step %{customdata[8]}"
    " · start %{customdata[4]:.3f} ms · %{customdata[5]:.3f} ms<extra>%{customdata[6]}</extra>",
    "buckets": "%{customdata[1]:.3f} ms busy in this bucket, %{customdata[0]} events"
    "<extra>%{customdata[2]}</extra>",
}
HOVER_POINTS = 40  # hover points across the window's width (one every ~30 px)
HOVER_EXTRA = 3000  # at most this many more hover points than rectangles
MAX_LANE_LABELS = 128  # past this many lanes (or rows squeezed), one y label per rank
ROW_PX, MAX_HEIGHT = 16, 2000  # pixels per row, and the figure's height at most
SEARCH_COLOR, SELECT_COLOR = "#D6007E", "#00A0E0"


def typed(values: Floats) -> dict[str, str]:
    """A float array as plotly.js's typed-array JSON (base64 little-endian doubles): a
    fraction of the text of a list, decoded without parsing."""
    raw = np.ascontiguousarray(values, dtype="<f8").tobytes()
    return {"dtype": "f8", "bdata": base64.b64encode(raw).decode("ascii")}


def rectangles(x0: Floats, x1: Floats, y0: Floats, y1: Floats) -> tuple[Floats, Floats]:
    """Vertices of one polygon that fills every rectangle and nothing else.

    Why one polygon: plotly makes an SVG element for every piece of a trace split by gaps,
    which doubles the time a redraw takes. The rectangles, in lane order, are walked one
    after the other, each from its first corner round back to it, the next reached by a
    bridge, and the bridges are walked back in reverse at the end, so they enclose no area.
    Every bridge is horizontal or vertical (via a corner at the next lane's height): a
    rasteriser cancels such a there-and-back edge exactly, a slanted one leaves a hairline.
    """
    if len(x0) == 0:
        return np.empty(0), np.empty(0)
    order = np.lexsort((x0, y0))
    x0, x1, y0, y1 = x0[order], x1[order], y0[order], y1[order]
    # Each rectangle's loop, then the corner below (or level with) its first corner at the
    # next rectangle's height; the last one's corner is dropped.
    loops_x = np.column_stack([x0, x1, x1, x0, x0, x0])
    loops_y = np.column_stack([y0, y0, y1, y1, y0, np.append(y0[1:], 0.0)])
    forward_x, forward_y = loops_x.ravel()[:-1], loops_y.ravel()[:-1]
    # Back: each bridge's corner and start, last bridge first.
    back_x = np.column_stack([x0[:-1], x0[:-1]])[::-1].ravel()
    back_y = np.column_stack([y0[1:], y0[:-1]])[::-1].ravel()
    return np.concatenate([forward_x, back_x]), np.concatenate([forward_y, back_y])


def hover_spacing(layer_list: list[Layer], view: tuple[float, float]) -> float:
    """How far apart hover points lie along a rectangle: 1/HOVER_POINTS of the view, wider
    when that would give more than HOVER_EXTRA points beyond one per rectangle (the hover
    text of each point travels to the browser)."""
    spacing = (view[1] - view[0]) / HOVER_POINTS
    if spacing <= 0:
        return 1.0
    visible = sum(float((np.clip(ly.x1, *view) - np.clip(ly.x0, *view)).sum()) for ly in layer_list)
    return max(spacing, visible / HOVER_EXTRA)


def hover_points(
    x0: Floats, x1: Floats, y: Floats, view: tuple[float, float], spacing: float
) -> tuple[Floats, Floats, npt.NDArray[np.intp]]:
    """Points along the middle of each rectangle's visible part, at most `spacing` apart (at
    least one per rectangle), and for each point the index of its rectangle."""
    x0, x1 = np.clip(x0, *view), np.clip(x1, *view)
    n = np.maximum(1, np.ceil((x1 - x0) / spacing)).astype(np.intp)
    idx = np.repeat(np.arange(len(x0)), n)
    k = np.arange(len(idx)) - np.repeat(np.cumsum(n) - n, n)
    return x0[idx] + (k + 0.5) * ((x1 - x0) / n)[idx], y[idx], idx


def lane_ticks(lm: LaneMap) -> dict[str, list[Any]]:
    """Y tick labels at each lane's top row ("r3 · python 7393", "r3 · stream 7") while rows
    keep their full height, else one per rank at its first lane (hundreds of labels a few
    pixels apart are unreadable, and plotly measures each one)."""
    if len(lm.keys) <= MAX_LANE_LABELS and ROW_PX * lm.n_rows <= MAX_HEIGHT - 140:
        return {"tickvals": list(lm.top), "ticktext": list(lm.labels)}
    first: dict[int, int] = {}
    for i, (r, _) in enumerate(lm.keys):
        first.setdefault(r, lm.top[i])
    return {"tickvals": list(first.values()), "ticktext": [f"r{r}" for r in first]}


def timeline(
    win: Window,
    t0_ns: int,
    highlight: pl.DataFrame | None = None,
    path: pl.DataFrame | None = None,
    lanes: LaneMap | None = None,
    marks: Marks | None = None,
) -> dict[str, Any]:
    """The window as lanes (rank, stream) x time, as plotly JSON (what dcc.Graph takes).

    `lanes`: the run's lanes on the shown ranks (timeline_layers.lane_map), the same at every
    zoom; None: the window's own. `highlight` rows (rank, stream, start_ns, end_ns on the job
    clock) are outlined, e.g. one collective instance on every rank or a finding's evidence;
    `path` (critical_path rows) is drawn over the lanes; `marks`: step boundaries, search
    matches, the selected event and its launch/kernel flows."""
    lm = lanes if lanes is not None else window_lanes(win)
    marks = marks or Marks()
    if not lm.keys:
        out = empty("no activity in this window").to_plotly_json()
        assert isinstance(out, dict)
        return out
    view = ((win.start_ns - t0_ns) / MS, (win.end_ns - t0_ns) / MS)
    ev = placed(win, lm)
    layer_list = layers(win, lm, t0_ns, ev)
    spacing = hover_spacing([ly for ly in layer_list if ly.group], view)
    data = [_fill(ly) for ly in layer_list]
    annotations: list[dict[str, Any]] = []
    if marks.steps is not None:
        lines, annotations = step_lines(marks.steps, lm, t0_ns, view)
        data += lines
    for group in HOVER:
        members = [ly for ly in layer_list if ly.group == group]
        if members:
            data.append(_hover(group, members, view, spacing))
    data += _marks(marks, win, ev, lm, t0_ns)
    annotations += flow_arrows(marks.flows, ev, lm, t0_ns, view) if marks.flows is not None else []
    if path is not None:
        data += _path(path, lm, t0_ns)
    mode = (
        f"{win.events.height} events"
        if win.mode == "events"
        else f"aggregated: {win.bucket_ns / MS:.3g} ms buckets, zoom in for single events"
    )
    layout = {
        "template": template(),
        "height": min(MAX_HEIGHT, 140 + ROW_PX * lm.n_rows),
        "margin": {"l": 160, "r": 20, "t": 95, "b": 55},  # title + two rows of legend
        "title": {
            "text": f"Aligned timeline ({mode})",
            "x": 0.01,
            "y": 1,
            "yref": "container",
            "yanchor": "top",
            "pad": {"t": 10},
            "font": {"size": 14},
        },
        "legend": {"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom"},
        "uirevision": "timeline",
        "dragmode": "zoom",
        "hovermode": "closest",
        "xaxis": {
            "title": {"text": "time since run start (ms, job clock)"},
            "range": list(view),
            "showgrid": True,
            # plotly's default ("hide past div") measures every tick label against the
            # page, each a fresh layout of the whole plot: seconds with hundreds of lanes.
            "ticklabeloverflow": "allow",
        },
        "yaxis": {
            "tickmode": "array",
            **lane_ticks(lm),
            "fixedrange": True,
            "range": [lm.n_rows - 0.5, -0.5],
            "showgrid": False,
            "zeroline": False,
            "ticklabeloverflow": "allow",
        },
        "shapes": _outlines(highlight, ev, lm, t0_ns),
        "annotations": annotations,
    }
    return {"data": data, "layout": layout}


def _marks(
    marks: Marks, win: Window, ev: pl.DataFrame, lm: LaneMap, t0: int
) -> list[dict[str, Any]]:
    """Search matches and the selected event, outlined."""
    out = []
    if marks.search:
        found = (
            name_matches(ev, marks.search).select(
                "rank", "stream", pl.col("s").alias("start_ns"), pl.col("e").alias("end_ns")
            )
            if win.mode == "events"
            else marks.found
        )
        if found is not None and not found.is_empty():
            at = place(found, ev, lm, t0)
            out.append(outline(f"matches '{marks.search}'", SEARCH_COLOR, 2, at))
    if marks.selected is not None and not marks.selected.is_empty():
        out.append(outline("selected", SELECT_COLOR, 3, place(marks.selected, ev, lm, t0)))
    return out


def _outlines(
    highlight: pl.DataFrame | None, ev: pl.DataFrame, lm: LaneMap, t0: int
) -> list[dict[str, Any]]:
    if highlight is None or highlight.is_empty():
        return []
    at = place(highlight.select("rank", "stream", "start_ns", "end_ns"), ev, lm, t0)
    return [
        {
            "type": "rect",
            "x0": x0,
            "x1": x1,
            "y0": y0,
            "y1": y1,
            "line": {"color": "black", "width": 3},
        }
        for x0, x1, y0, y1 in at.select("x0", "x1", "y0", "y1").iter_rows()
    ]


def _fill(layer: Layer) -> dict[str, Any]:
    """One colour's rectangles as one filled polygon."""
    x, y = rectangles(layer.x0, layer.x1, layer.y0, layer.y1)
    # A region (an overlay) is named where the pointer is inside it, unless a hover point is
    # near: plotly ranks hovering a fill after every point.
    hover = {"hoveron": "fills", "hoverinfo": "name"} if not layer.group else {"hoverinfo": "skip"}
    return {
        "type": "scatter",
        "x": typed(x),
        "y": typed(y),
        "mode": "none",  # fill only: no outline, no point markers (one SVG element each)
        "fill": "toself",
        "fillcolor": layer.color,
        "name": layer.name,
        **hover,
    }


def _hover(
    group: str, members: list[Layer], view: tuple[float, float], spacing: float
) -> dict[str, Any]:
    """The invisible trace that answers hover and click for `members`."""
    x0 = np.concatenate([ly.x0 for ly in members])
    x1 = np.concatenate([ly.x1 for ly in members])
    y = np.concatenate([(ly.y0 + ly.y1) / 2 for ly in members])
    custom = [row for ly in members for row in ly.custom]
    hx, hy, idx = hover_points(x0, x1, y, view, spacing)
    return {
        "type": "scatter",
        "x": typed(hx),
        "y": typed(hy),
        "mode": "none",  # nothing drawn: it is there to answer hover and click
        "name": group,
        "showlegend": False,
        # A plain list, not a typed array: dcc.Graph reads a clicked point's customdata from
        # the figure as sent.
        "customdata": [custom[i] for i in idx.tolist()],
        "hovertemplate": HOVER[group],
    }


def _path(path: pl.DataFrame, lm: LaneMap, t0: int) -> list[dict[str, Any]]:
    """The critical path: a dark chain through its segments (the order the step's time
    passes between ranks), each segment a line in its category's colour on top."""
    lines, cx, cy = path_lines(path, lm, t0)
    chain = {
        "type": "scatter",
        "x": cx,
        "y": cy,
        "mode": "lines",
        "line": {"color": "rgba(20,20,20,0.85)", "width": 7},
        "name": "critical path",
        "hoverinfo": "skip",
    }
    return [chain] + [
        {
            "type": "scatter",
            "x": ln.x,
            "y": ln.y,
            "mode": "lines",
            "line": {"color": ln.color, "width": 3},
            "name": ln.name,
            "customdata": ln.custom,
            "hovertemplate": "critical path · r%{customdata[0]} · %{customdata[1]}<br>"
            "%{customdata[2]}: %{customdata[3]}<br>%{customdata[6]:.3f} ms"
            "<extra>%{fullData.name}</extra>",
        }
        for ln in lines
    ]
