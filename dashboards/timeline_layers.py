"""What the timeline draws, before it is a figure: one layer of rectangles per colour.

Why apart from the figure: this is the reading of an analysis window (lanes, colours, the
numbers a hover shows); figures_timeline.py only turns layers into plotly JSON. Rectangles
are in ms since the run's origin (x) and lanes (y, lane i centred on i).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
from ranklens.analysis.timeline import Window
from ranklens.dashboards.figures import KIND_COLORS, MS, PAR_COLORS, PATH_COLORS

Floats = npt.NDArray[np.float64]

OVERLAYS: dict[str, tuple[str, str]] = {
    "exposed": ("exposed communication", "rgba(228,26,28,0.22)"),
    "idle": ("idle / bubble", "rgba(90,90,90,0.18)"),
}
HALF = 0.4  # half the height of an event's rectangle, in lanes


@dataclass(frozen=True)
class Layer:
    """One colour's rectangles and, per rectangle, the values its hover text shows."""

    name: str
    color: str
    x0: Floats
    x1: Floats
    y0: Floats
    y1: Floats
    custom: list[list[Any]]  # one row per rectangle; the last value names the colour
    # Which hover text its rectangles take ("events", "buckets"); "" for a region that the
    # pointer names only where no rectangle of another layer is near (the overlays).
    group: str


def lanes(win: Window) -> list[tuple[int, int]]:
    """(rank, stream) lanes of the window, top to bottom."""
    df = win.events if win.mode == "events" else win.buckets
    if df.is_empty():
        return []
    rows = df.select("rank", "stream").unique().sort("rank", "stream").rows()
    return [(int(r), int(s)) for r, s in rows]


def layers(win: Window, lane_list: list[tuple[int, int]], t0: int) -> list[Layer]:
    """The window's layers: events and the exposed/idle overlays, or busy-time buckets."""
    index = {lane: i for i, lane in enumerate(lane_list)}
    if win.mode == "events":
        return _events(win.events, index, t0) + _segments(win.segments, lane_list, t0)
    return _buckets(win, index, t0)


def _color_key_expr() -> pl.Expr:
    """Comm is coloured by its parallelism, everything else by its kind."""
    par = pl.col("parallelism").fill_null("UNKNOWN") + pl.lit(" comm")
    return pl.when(pl.col("kind") == "comm").then(par).otherwise(pl.col("kind")).alias("ck")


def _color(key: str) -> str:
    if key.endswith(" comm"):
        return PAR_COLORS.get(key[:-5], PAR_COLORS["OTHER"])
    return KIND_COLORS.get(key, "#888888")


def _lanes_of(part: pl.DataFrame, index: dict[tuple[int, int], int]) -> Floats:
    return np.array(
        [index[(int(r), int(s))] for r, s in part.select("rank", "stream").rows()], dtype=float
    )


def _ms(values: pl.Series | Floats) -> Floats:
    return np.asarray(values, dtype=float) / MS


def _rows(*cols: list[Any]) -> list[list[Any]]:
    return [list(row) for row in zip(*cols, strict=True)]


def _events(ev: pl.DataFrame, index: dict[tuple[int, int], int], t0: int) -> list[Layer]:
    keyed = ev.with_columns(_color_key_expr())
    out = []
    for key in sorted(keyed["ck"].unique().to_list()):
        part = keyed.filter(pl.col("ck") == key)
        lane = _lanes_of(part, index)
        start, dur = _ms(part["s"] - t0), _ms(part["dur_ns"])
        custom = _rows(
            part["rank"].to_list(),
            part["stream"].to_list(),
            # Raw start relative to t0: epoch ns do not fit a JS number exactly.
            (part["ts_ns"] - t0).to_list(),
            part["name"].fill_null("").to_list(),
            np.round(start, 6).tolist(),
            np.round(dur, 6).tolist(),
            [key] * part.height,
        )
        box = (start, start + dur, lane - HALF, lane + HALF)
        out.append(Layer(key, _color(key), *box, custom, "events"))
    return out


def _segments(seg: pl.DataFrame, lane_list: list[tuple[int, int]], t0: int) -> list[Layer]:
    """Exposed communication and idle time across all lanes of their rank."""
    if seg.is_empty():
        return []
    span: dict[int, tuple[int, int]] = {}
    for i, (r, _) in enumerate(lane_list):
        lo, hi = span.get(r, (i, i))
        span[r] = (min(lo, i), max(hi, i))
    out = []
    for label, (name, color) in OVERLAYS.items():
        part = seg.filter((pl.col("label") == label) & pl.col("rank").is_in(list(span)))
        if part.is_empty():
            continue
        ranks = part["rank"].to_list()
        start, end = _ms(part["s"] - t0), _ms(part["e"] - t0)
        top = np.array([span[r][0] - 0.475 for r in ranks], dtype=float)
        bottom = np.array([span[r][1] + 0.475 for r in ranks], dtype=float)
        out.append(Layer(name, color, start, end, top, bottom, [], ""))
    return out


def _buckets(win: Window, index: dict[tuple[int, int], int], t0: int) -> list[Layer]:
    b = win.buckets.with_columns(_color_key_expr()).sort("rank", "stream", "bucket", "ck")
    # Lay the kinds of one bucket side by side inside it, each as long as its busy time,
    # scaled down together when they sum past the bucket (nested host spans, or kinds that
    # ran at the same time on one stream).
    width = float(win.bucket_ns)
    total = pl.col("busy_ns").sum().over("rank", "stream", "bucket").cast(pl.Float64)
    scale = pl.min_horizontal(pl.lit(1.0), pl.lit(width) / total)
    b = b.with_columns((pl.col("busy_ns").cast(pl.Float64) * scale).alias("len")).with_columns(
        (pl.col("len").cum_sum().over("rank", "stream", "bucket") - pl.col("len")).alias("off")
    )
    out = []
    for key in sorted(b["ck"].unique().to_list()):
        part = b.filter(pl.col("ck") == key)
        lane = _lanes_of(part, index)
        start, length = _ms(part["s"] + part["off"] - t0), _ms(part["len"])
        custom = _rows(
            part["n_events"].to_list(),
            np.round(_ms(part["busy_ns"]), 6).tolist(),
            [key] * part.height,
        )
        box = (start, start + length, lane - HALF, lane + HALF)
        out.append(Layer(key, _color(key), *box, custom, "buckets"))
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
    path: pl.DataFrame, lane_list: list[tuple[int, int]], t0: int
) -> tuple[list[PathLine], list[float | None], list[float | None]]:
    """The path's segments per category on their lanes (the segment's own stream when it is
    a lane, else its rank's first lane; ranks not shown are left out), and the chain that
    joins consecutive segments of a step (x, y with None between steps)."""
    index = {lane: i for i, lane in enumerate(lane_list)}
    first: dict[int, int] = {}
    for i, (r, _) in enumerate(lane_list):
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
        cat = str(row["category"])
        line = by_cat.setdefault(
            cat, PathLine(f"path: {cat}", PATH_COLORS.get(cat, "#000000"), [], [], [])
        )
        s, e = int(row["start_ns"]) - t0, int(row["end_ns"]) - t0
        info = [rank, stream, cat, row["name"] or "", s, e, round((e - s) / MS, 6), row["step"]]
        line.x.extend([s / MS, e / MS, None])
        line.y.extend([float(lane), float(lane), None])
        line.custom.extend([info, info, None])
        if last_step is not None and row["step"] != last_step:
            cx.append(None)
            cy.append(None)
        cx.extend([s / MS, e / MS])
        cy.extend([float(lane), float(lane)])
        last_step = row["step"]
    return [by_cat[c] for c in sorted(by_cat)], cx, cy
