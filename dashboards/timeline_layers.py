"""What the timeline draws, before it is a figure: lanes, and one layer of rectangles per colour.

Why apart from the figure: this is the reading of an analysis window (lanes, rows, colours,
the numbers a hover shows); figures_timeline.py only turns layers into plotly JSON.
Rectangles are in ms since the run's origin (x) and rows (y, row i centred on i). A lane
(rank, stream: a device stream or a host thread) has as many rows as slices ever overlap on
it (analysis.timeline_lanes), so nested host operators, the ProfilerStep range around them
and a long send beside compute are stacked, never drawn over each other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
from ranklens.analysis.timeline import Window
from ranklens.analysis.timeline_lanes import depths
from ranklens.dashboards.figures import KIND_COLORS, MS, PAR_COLORS

Floats = npt.NDArray[np.float64]

OVERLAYS: dict[str, tuple[str, str]] = {
    "exposed": ("exposed communication", "rgba(228,26,28,0.22)"),
    "idle": ("idle / bubble", "rgba(90,90,90,0.18)"),
}
HALF = 0.4  # half the height of an event's rectangle, in rows
# Host slices of GPU ranks (device kinds are in figures.KIND_COLORS): runtime calls in the
# critical path's colour for host launches, ranges pale so the work inside them stands out.
HOST_COLORS: dict[str, str] = {
    "cpu_op": "#9FB9D4",
    "runtime": "#72B7B2",
    "sync": "#6F4E9B",
    "annotation": "#D9CFA6",
    "other": "#888888",
}


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


@dataclass(frozen=True)
class LaneMap:
    """Lanes top to bottom: key (rank, stream), first row, rows, label, and whether the lane
    carries device activity (what the exposed/idle overlays describe)."""

    keys: list[tuple[int, int]]
    top: list[int]
    rows: list[int]
    labels: list[str]
    activity: list[bool]

    @property
    def n_rows(self) -> int:
        return self.top[-1] + self.rows[-1] if self.keys else 0

    def index(self) -> dict[tuple[int, int], int]:
        return {k: i for i, k in enumerate(self.keys)}

    def band(self, lane: int) -> tuple[float, float]:
        """The y extent of a lane's rows (an aggregated bucket, an event not placed)."""
        return self.top[lane] - HALF, self.top[lane] + self.rows[lane] - 1 + HALF


def lane_label(rank: int, stream: int, host: bool | None, name: str | None) -> str:
    """ "r0 · python 7393" from the trace's "thread 7393 (python)"; "r0 · stream 7" or
    "r0 · thread 7393" where the trace names none; "r0 · 7" where host/device is unknown."""
    if name:
        m = re.fullmatch(r"thread (\d+) \((.+)\)", name)
        text = f"{m.group(2)} {m.group(1)}" if m else name
        return f"r{rank} · {text[:28]}"
    if host is None:
        return f"r{rank} · {stream}"
    return f"r{rank} · {'thread' if host else 'stream'} {stream}"


def lane_map(table: pl.DataFrame, ranks: list[int] | None = None) -> LaneMap:
    """The run's lanes (analysis.timeline_lanes.lanes rows, in order) on `ranks` (None: all)."""
    if ranks:
        table = table.filter(pl.col("rank").is_in(ranks))
    keys, top, rows, labels, act = [], [], [], [], []
    row = 0
    for r in table.iter_rows(named=True):
        keys.append((int(r["rank"]), int(r["stream"])))
        top.append(row)
        rows.append(max(1, int(r["rows"])))
        labels.append(lane_label(int(r["rank"]), int(r["stream"]), r["host"], r["name"]))
        act.append(bool(r["activity"]))
        row += rows[-1]
    return LaneMap(keys, top, rows, labels, act)


def window_lanes(win: Window) -> LaneMap:
    """Lanes from the window alone (no run at hand: figure tests), rows as deep as it needs."""
    df = win.events if win.mode == "events" else win.buckets
    if df.is_empty():
        return LaneMap([], [], [], [], [])
    if win.mode == "events":
        df = df.with_columns(depth=depths(df))
        per = df.group_by("rank", "stream").agg((pl.col("depth").max() + 1).alias("rows"))
    else:
        per = df.select("rank", "stream").unique().with_columns(rows=pl.lit(1))
    per = per.with_columns(host=pl.lit(None), activity=pl.lit(True), name=pl.lit(None))
    return lane_map(per.sort("rank", "stream"))


def placed(win: Window, lm: LaneMap) -> pl.DataFrame:
    """The window's events on lanes that are shown, each with its lane and row `y` (lane top
    + depth; past the lane's rows, its last one)."""
    ev = win.events
    if win.mode != "events" or ev.is_empty():
        return ev.with_columns(lane=pl.lit(0, pl.Int64), y=pl.lit(0.0)).clear()
    ev = ev.with_columns(pl.col("rank", "stream").cast(pl.Int64), depth=depths(ev))
    ev = ev.join(lane_frame(lm), on=["rank", "stream"], maintain_order="left")
    top, rows = np.array(lm.top, dtype=float), np.array(lm.rows, dtype=float)
    lane = ev["lane"].to_numpy()
    y = top[lane] + np.minimum(ev["depth"].to_numpy(), rows[lane] - 1)
    return ev.with_columns(y=pl.Series(y, dtype=pl.Float64))


def layers(win: Window, lm: LaneMap, t0: int, ev: pl.DataFrame | None = None) -> list[Layer]:
    """The window's layers: events (`ev`: placed(win, lm)) or busy-time buckets, and over
    either the exposed/idle overlays (packed per bucket by the analysis when aggregated)."""
    if win.mode == "events":
        ev = placed(win, lm) if ev is None else ev
        return _events(ev, t0) + _segments(win.segments, lm, t0)
    return _buckets(win, lm, t0) + _segments(win.segments, lm, t0)


def _color_key_expr() -> pl.Expr:
    """Comm is coloured by its parallelism, everything else by its kind."""
    par = pl.col("parallelism").fill_null("UNKNOWN") + pl.lit(" comm")
    return pl.when(pl.col("kind") == "comm").then(par).otherwise(pl.col("kind")).alias("ck")


def _color(key: str) -> str:
    if key.endswith(" comm"):
        return PAR_COLORS.get(key[:-5], PAR_COLORS["OTHER"])
    return KIND_COLORS.get(key) or HOST_COLORS.get(key, "#888888")


def _ms(values: pl.Series | Floats) -> Floats:
    return np.asarray(values, dtype=float) / MS


def _rows(*cols: list[Any]) -> list[list[Any]]:
    return [list(row) for row in zip(*cols, strict=True)]


def _events(ev: pl.DataFrame, t0: int) -> list[Layer]:
    keyed = ev.with_columns(_color_key_expr())
    out = []
    for key in sorted(keyed["ck"].unique().to_list()):
        part = keyed.filter(pl.col("ck") == key)
        row = part["y"].to_numpy().astype(float)
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
            part["dur_ns"].to_list(),  # with the start, which of the slices was clicked
            part["step"].to_list(),
        )
        box = (start, start + dur, row - HALF, row + HALF)
        out.append(Layer(key, _color(key), *box, custom, "events"))
    return out


def activity_span(lm: LaneMap) -> dict[int, tuple[float, float]]:
    """Per rank, the y extent of its lanes that carry device activity (all its lanes when
    none does): where its exposed/idle time is shaded."""
    act: dict[int, tuple[float, float]] = {}
    every: dict[int, tuple[float, float]] = {}
    for i, (r, _) in enumerate(lm.keys):
        lo, hi = lm.top[i] - 0.475, lm.top[i] + lm.rows[i] - 1 + 0.475
        for span, on in ((act, lm.activity[i]), (every, True)):
            if on:
                old = span.get(r)
                span[r] = (min(old[0], lo), max(old[1], hi)) if old else (lo, hi)
    return {r: act.get(r, every[r]) for r in every}


def _segments(seg: pl.DataFrame, lm: LaneMap, t0: int) -> list[Layer]:
    """Exposed communication and idle time across the activity lanes of their rank."""
    if seg.is_empty():
        return []
    span = activity_span(lm)
    out = []
    for label, (name, color) in OVERLAYS.items():
        part = seg.filter((pl.col("label") == label) & pl.col("rank").is_in(list(span)))
        if part.is_empty():
            continue
        ranks = part["rank"].to_list()
        start, end = _ms(part["s"] - t0), _ms(part["e"] - t0)
        top = np.array([span[r][0] for r in ranks], dtype=float)
        bottom = np.array([span[r][1] for r in ranks], dtype=float)
        out.append(Layer(name, color, start, end, top, bottom, [], ""))
    return out


def lane_frame(lm: LaneMap) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "rank": [r for r, _ in lm.keys],
            "stream": [s for _, s in lm.keys],
            "lane": list(range(len(lm.keys))),
        },
        schema={"rank": pl.Int64, "stream": pl.Int64, "lane": pl.Int64},
    )


def _buckets(win: Window, lm: LaneMap, t0: int) -> list[Layer]:
    b = (
        win.buckets.with_columns(_color_key_expr(), pl.col("rank", "stream").cast(pl.Int64))
        .join(lane_frame(lm), on=["rank", "stream"])
        .sort("rank", "stream", "bucket", "ck")
    )
    # Lay the kinds of one bucket side by side inside it, each as long as its busy time,
    # scaled down together when they sum past the bucket (nested host spans, or kinds that
    # ran at the same time on one stream). A bucket fills its lane's rows.
    width = float(win.bucket_ns)
    total = pl.col("busy_ns").sum().over("rank", "stream", "bucket").cast(pl.Float64)
    scale = pl.min_horizontal(pl.lit(1.0), pl.lit(width) / total)
    b = b.with_columns((pl.col("busy_ns").cast(pl.Float64) * scale).alias("len")).with_columns(
        (pl.col("len").cum_sum().over("rank", "stream", "bucket") - pl.col("len")).alias("off")
    )
    top, rows = np.array(lm.top, dtype=float), np.array(lm.rows, dtype=float)
    out = []
    for key in sorted(b["ck"].unique().to_list()):
        part = b.filter(pl.col("ck") == key)
        lane = part["lane"].to_numpy()
        y0, y1 = top[lane] - HALF, top[lane] + rows[lane] - 1 + HALF
        start, length = _ms(part["s"] + part["off"] - t0), _ms(part["len"])
        custom = _rows(
            part["n_events"].to_list(),
            np.round(_ms(part["busy_ns"]), 6).tolist(),
            [key] * part.height,
        )
        out.append(Layer(key, _color(key), start, start + length, y0, y1, custom, "buckets"))
    return out
