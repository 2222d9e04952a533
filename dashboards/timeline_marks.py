"""What the timeline draws over its lanes: step boundaries, outlines (evidence, search matches,
the selected event), launch -> kernel flows and the critical path, each placed on the row of
the slice it marks.

Why apart from timeline_layers: layers are the window's own events; marks come from elsewhere
(the steps table, a finding, a search, a click, the critical_path analysis) and are matched
to the drawn slices by (rank, stream, start, end), falling back to the whole lane where the
window does not hold the slice (aggregated views).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
from ranklens.dashboards.figures import MS, PATH_COLORS
from ranklens.dashboards.timeline_layers import HALF, Floats, LaneMap, lane_frame

MAX_STEP_LABELS = 40  # past this many steps in view, one line per step across all ranks
PAD = 0.06  # an outline sits this much outside its rectangle, in rows
EPS = 1e-6  # ms (1 ns): polars and Python may round the same ns-to-ms division apart


@dataclass(frozen=True)
class Marks:
    """What to draw over the window besides its events. Frames hold rank, stream, start_ns,
    end_ns on the job clock (steps: rank, step, start_ns, end_ns)."""

    steps: pl.DataFrame | None = None
    search: str = ""
    found: pl.DataFrame | None = None  # matches from the database, for aggregated windows
    selected: pl.DataFrame | None = None
    flows: pl.DataFrame | None = None  # analysis.timeline_lanes.flows rows


def name_matches(ev: pl.DataFrame, text: str) -> pl.DataFrame:
    """Events whose name holds `text` (any case, literally), as the search finds them."""
    if not text or ev.is_empty():
        return ev.clear()
    return ev.filter(
        pl.col("name").fill_null("").str.to_lowercase().str.contains(text.lower(), literal=True)
    )


def place(rows: pl.DataFrame, ev: pl.DataFrame, lm: LaneMap, t0: int) -> pl.DataFrame:
    """`rows` (rank, stream, start_ns, end_ns, ...) on lanes that are shown, with their box:
    x0, x1 (ms since t0), y0, y1, on the row of the drawn slice with that lane, start and end
    (`ev`: timeline_layers.placed), else over the whole lane."""
    key = ["rank", "stream", "start_ns", "end_ns"]
    rows = rows.with_columns(pl.col(key).cast(pl.Int64)).join(
        lane_frame(lm), on=["rank", "stream"], maintain_order="left"
    )
    if not ev.is_empty():
        on = ev.select(
            pl.col("rank", "stream").cast(pl.Int64),
            pl.col("s").cast(pl.Int64).alias("start_ns"),
            pl.col("e").cast(pl.Int64).alias("end_ns"),
            pl.col("y").alias("row"),
        ).unique(subset=key, keep="first")
        rows = rows.join(on, on=key, how="left", maintain_order="left")
    else:
        rows = rows.with_columns(row=pl.lit(None, pl.Float64))
    lane = rows["lane"].to_numpy()
    top, depth = np.array(lm.top, dtype=float)[lane], np.array(lm.rows, dtype=float)[lane]
    y = rows["row"].fill_null(np.nan).to_numpy().astype(float)
    hit = ~np.isnan(y)
    return rows.with_columns(
        x0=(pl.col("start_ns") - t0) / MS,
        x1=(pl.col("end_ns") - t0) / MS,
        y0=pl.Series(np.where(hit, y - HALF, top - HALF) - PAD, dtype=pl.Float64),
        y1=pl.Series(np.where(hit, y + HALF, top + depth - 1 + HALF) + PAD, dtype=pl.Float64),
    ).drop("row")


def box(df: pl.DataFrame) -> tuple[Floats, Floats, Floats, Floats]:
    """The x0, x1, y0, y1 columns of placed rows."""
    return tuple(df[c].to_numpy().astype(float) for c in ("x0", "x1", "y0", "y1"))  # type: ignore[return-value]


def outline(name: str, color: str, width: float, placed_rows: pl.DataFrame) -> dict[str, Any]:
    """Placed rows' boxes as one line trace (a closed loop each, None between): one SVG
    path, where a layout shape per rectangle would be an element each."""
    x0, x1, y0, y1 = box(placed_rows)
    nan = np.full(len(x0), None)
    xs = np.column_stack([x0, x1, x1, x0, x0, nan]).ravel().tolist()
    ys = np.column_stack([y0, y0, y1, y1, y0, nan]).ravel().tolist()
    return {
        "type": "scatter",
        "x": xs,
        "y": ys,
        "mode": "lines",
        "line": {"color": color, "width": width},
        "name": name,
        "hoverinfo": "skip",
    }


def step_lines(
    steps: pl.DataFrame, lm: LaneMap, t0: int, view: tuple[float, float]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Step boundaries in view: a dotted line across each shown rank's lanes at its step's
    start and end (one line across all ranks per step when there are many), and a label per
    step at its earliest start. Returns (traces, annotations)."""
    span: dict[int, tuple[float, float]] = {}
    for i, (r, _) in enumerate(lm.keys):
        lo, hi = lm.band(i)
        span[r] = (min(span.get(r, (lo, hi))[0], lo), hi)
    sw = steps.filter(pl.col("rank").is_in(list(span)))
    if sw.is_empty():
        return [], []
    sw = sw.with_columns(
        ((pl.col("start_ns") - t0) / MS).alias("x0"), ((pl.col("end_ns") - t0) / MS).alias("x1")
    ).filter((pl.col("x1") >= view[0] - EPS) & (pl.col("x0") <= view[1] + EPS))
    per_step = sw.group_by("step").agg(pl.col("x0").min(), pl.col("x1").max()).sort("step")
    xs: list[float | None] = []
    ys: list[float | None] = []
    if per_step.height > MAX_STEP_LABELS:
        top, bottom = -0.5, lm.n_rows - 0.5
        for x in sorted(set(per_step["x0"].to_list()) | set(per_step["x1"].to_list())):
            xs += [x, x, None]
            ys += [top, bottom, None]
    else:
        for r, x0, x1 in sw.select("rank", "x0", "x1").iter_rows():
            lo, hi = span[r]
            for x in {x0, x1}:
                if view[0] - EPS <= x <= view[1] + EPS:
                    xs += [x, x, None]
                    ys += [lo, hi, None]
    trace = {
        "type": "scatter",
        "x": xs,
        "y": ys,
        "mode": "lines",
        "line": {"color": "rgba(40,40,40,0.55)", "width": 1, "dash": "dot"},
        "name": "step boundaries",
        "hoverinfo": "skip",
    }
    labels = [
        {
            "x": x,
            "y": 1,
            "xref": "x",
            "yref": "paper",
            "yanchor": "top",
            "xanchor": "left",
            "bgcolor": "rgba(255,255,255,0.7)",
            "text": f"step {s}",
            "showarrow": False,
            "font": {"size": 10, "color": "#444"},
        }
        for s, x in per_step.select("step", "x0").iter_rows()
        if view[0] - EPS <= x <= view[1] + EPS and per_step.height <= MAX_STEP_LABELS
    ]
    return ([trace] if xs else []), labels


def flow_arrows(
    flows: pl.DataFrame, ev: pl.DataFrame, lm: LaneMap, t0: int, view: tuple[float, float]
) -> list[dict[str, Any]]:
    """An arrow from each launch (host) to its kernel or copy (device), start to start, for
    the pairs whose both ends are drawn in view."""
    if flows.is_empty():
        return []
    at = place(flows, ev, lm, t0).with_columns(y=(pl.col("y0") + pl.col("y1")) / 2)
    where = {
        (int(c), bool(h)): (float(x), float(y))
        for c, h, x, y in at.select("correlation", "host", "x0", "y").iter_rows()
    }
    out = []
    for (corr, host), (hx, hy) in where.items():
        if not host or (corr, False) not in where:
            continue
        kx, ky = where[(corr, False)]
        if view[0] - EPS <= min(hx, kx) and max(hx, kx) <= view[1] + EPS:
            out.append(
                {
                    "x": kx,
                    "y": ky,
                    "ax": hx,
                    "ay": hy,
                    "xref": "x",
                    "yref": "y",
                    "axref": "x",
                    "ayref": "y",
                    "showarrow": True,
                    "arrowhead": 2,
                    "arrowsize": 1.2,
                    "arrowwidth": 1.5,
                    "arrowcolor": "#D62728",
                    "text": "",
                }
            )
    return out


@dataclass(frozen=True)
class PathLine:
    """One category's critical path segments as a line per segment on its lane (None breaks
    the line between segments), with per point (rank, stream, category, name, start and end
    in ns since t0, duration ms, step) for the hover."""

    name: str
    color: str
    x: list[float | None]
    y: list[float | None]
    custom: list[list[Any] | None]


def path_lines(
    path: pl.DataFrame, lm: LaneMap, t0: int
) -> tuple[list[PathLine], list[float | None], list[float | None]]:
    """The path's segments per category on the top row of their lanes (the segment's own
    stream, a host thread for host segments; else its rank's first lane; ranks not shown are
    left out), and the chain that joins consecutive segments of a step (x, y with None
    between steps)."""
    index = lm.index()
    first: dict[int, int] = {}
    for i, (r, _) in enumerate(lm.keys):
        first.setdefault(r, i)
    by_cat: dict[str, PathLine] = {}
    cx: list[float | None] = []
    cy: list[float | None] = []
    last_step = None
    for row in path.iter_rows(named=True):
        rank, stream = int(row["rank"]), row["stream"]
        lane = index.get((rank, int(stream))) if stream is not None else None
        lane = lane if lane is not None else first.get(rank)
        if lane is None:
            continue
        y = float(lm.top[lane])
        cat = str(row["category"])
        line = by_cat.setdefault(
            cat, PathLine(f"path: {cat}", PATH_COLORS.get(cat, "#000000"), [], [], [])
        )
        s, e = int(row["start_ns"]) - t0, int(row["end_ns"]) - t0
        info = [rank, stream, cat, row["name"] or "", s, e, round((e - s) / MS, 6), row["step"]]
        line.x.extend([s / MS, e / MS, None])
        line.y.extend([y, y, None])
        line.custom.extend([info, info, None])
        if last_step is not None and row["step"] != last_step:
            cx.append(None)
            cy.append(None)
        cx.extend([s / MS, e / MS])
        cy.extend([y, y])
        last_step = row["step"]
    return [by_cat[c] for c in sorted(by_cat)], cx, cy
