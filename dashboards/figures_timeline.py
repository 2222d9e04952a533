"""Pure figure builder for the aligned multi-rank timeline (one window from analysis.timeline).

Why bars: one horizontal bar trace per colour holds all the rectangles of that colour, so a
window of a few thousand events is a handful of traces; when the analysis returns buckets
instead of events, each bucket's busy time per kind is drawn as a bar of that length, so the
browser never gets more than the analysis' cell cap. Times are ms since the run's origin.
"""

from __future__ import annotations

import plotly.graph_objects as go
import polars as pl
from ranklens.analysis.timeline import Window
from ranklens.dashboards.figures import KIND_COLORS, MS, PAR_COLORS, empty

OVERLAYS: dict[str, tuple[str, str]] = {
    "exposed": ("exposed communication", "rgba(228,26,28,0.22)"),
    "idle": ("idle / bubble", "rgba(90,90,90,0.18)"),
}


def lanes(win: Window) -> list[tuple[int, int]]:
    """(rank, stream) lanes of the window, top to bottom."""
    df = win.events if win.mode == "events" else win.buckets
    if df.is_empty():
        return []
    rows = df.select("rank", "stream").unique().sort("rank", "stream").rows()
    return [(int(r), int(s)) for r, s in rows]


def _color_key_expr() -> pl.Expr:
    """Comm is coloured by its parallelism, everything else by its kind."""
    par = pl.col("parallelism").fill_null("UNKNOWN") + pl.lit(" comm")
    return pl.when(pl.col("kind") == "comm").then(par).otherwise(pl.col("kind")).alias("ck")


def _color(key: str) -> str:
    if key.endswith(" comm"):
        return PAR_COLORS.get(key[:-5], PAR_COLORS["OTHER"])
    return KIND_COLORS.get(key, "#888888")


def timeline(
    win: Window,
    t0_ns: int,
    highlight: pl.DataFrame | None = None,
) -> go.Figure:
    """The window as lanes (rank, stream) x time; `highlight` rows (rank, stream, start_ns,
    end_ns on the job clock) are outlined, e.g. one collective instance on every rank."""
    lane_list = lanes(win)
    if not lane_list:
        return empty("no device activity in this window")
    index = {lane: i for i, lane in enumerate(lane_list)}
    fig = go.Figure()
    if win.mode == "events":
        _events(fig, win.events, index, t0_ns)
        _segments(fig, win.segments, lane_list, t0_ns)
    else:
        _buckets(fig, win, index, t0_ns)
    if highlight is not None:
        for row in highlight.iter_rows(named=True):
            lane = index.get((int(row["rank"]), int(row["stream"])))
            if lane is None:
                continue
            fig.add_shape(
                type="rect",
                x0=(row["start_ns"] - t0_ns) / MS,
                x1=(row["end_ns"] - t0_ns) / MS,
                y0=lane - 0.5,
                y1=lane + 0.5,
                line={"color": "black", "width": 3},
            )
    mode = (
        f"{win.events.height} events"
        if win.mode == "events"
        else f"aggregated: {win.bucket_ns / MS:.3g} ms buckets, zoom in for single events"
    )
    fig.update_layout(
        barmode="overlay",
        bargap=0.15,
        height=min(1400, 140 + 22 * len(lane_list)),
        margin={"l": 110, "r": 20, "t": 40, "b": 45},
        template="plotly_white",
        title={"text": f"Aligned timeline ({mode})", "x": 0.01, "font": {"size": 14}},
        legend={"orientation": "h", "y": 1.02, "x": 0.35, "yanchor": "bottom"},
        uirevision="timeline",
        dragmode="zoom",
        hovermode="closest",
    )
    fig.update_xaxes(
        title="time since run start (ms, job clock)",
        range=[(win.start_ns - t0_ns) / MS, (win.end_ns - t0_ns) / MS],
    )
    fig.update_yaxes(
        tickmode="array",
        tickvals=list(range(len(lane_list))),
        ticktext=[f"r{r} · {s}" for r, s in lane_list],
        autorange="reversed",
        fixedrange=True,
        range=[len(lane_list) - 0.5, -0.5],
    )
    return fig


def _events(fig: go.Figure, ev: pl.DataFrame, index: dict[tuple[int, int], int], t0: int) -> None:
    keyed = ev.with_columns(_color_key_expr())
    for key in sorted(keyed["ck"].unique().to_list()):
        part = keyed.filter(pl.col("ck") == key)
        y = [index[(int(r), int(s))] for r, s in part.select("rank", "stream").rows()]
        names = part["name"].fill_null("").to_list()
        fig.add_trace(
            go.Bar(
                orientation="h",
                base=((part["s"] - t0) / MS).to_list(),
                x=(part["dur_ns"] / MS).to_list(),
                y=y,
                width=0.8,
                name=key,
                marker={"color": _color(key), "line": {"width": 0}},
                customdata=list(
                    zip(
                        part["rank"].to_list(),
                        part["stream"].to_list(),
                        # Raw start relative to t0: epoch ns do not fit a JS number exactly.
                        (part["ts_ns"] - t0).to_list(),
                        names,
                        strict=True,
                    )
                ),
                hovertemplate="%{customdata[3]}<br>rank %{customdata[0]}"
                " · start %{base:.3f} ms · %{x:.3f} ms<extra>" + key + "</extra>",
            )
        )


def _segments(fig: go.Figure, seg: pl.DataFrame, lane_list: list[tuple[int, int]], t0: int) -> None:
    if seg.is_empty():
        return
    span: dict[int, tuple[int, int]] = {}
    for i, (r, _) in enumerate(lane_list):
        lo, hi = span.get(r, (i, i))
        span[r] = (min(lo, i), max(hi, i))
    for label, (name, color) in OVERLAYS.items():
        part = seg.filter((pl.col("label") == label) & pl.col("rank").is_in(list(span)))
        if part.is_empty():
            continue
        ranks = part["rank"].to_list()
        fig.add_trace(
            go.Bar(
                orientation="h",
                base=((part["s"] - t0) / MS).to_list(),
                x=((part["e"] - part["s"]) / MS).to_list(),
                y=[(span[r][0] + span[r][1]) / 2 for r in ranks],
                width=[span[r][1] - span[r][0] + 0.95 for r in ranks],
                name=name,
                marker={"color": color, "line": {"width": 0}},
                hovertemplate=name + " %{x:.3f} ms<extra></extra>",
            )
        )


def _buckets(fig: go.Figure, win: Window, index: dict[tuple[int, int], int], t0: int) -> None:
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
    for key in sorted(b["ck"].unique().to_list()):
        part = b.filter(pl.col("ck") == key)
        y = [index[(int(r), int(s))] for r, s in part.select("rank", "stream").rows()]
        fig.add_trace(
            go.Bar(
                orientation="h",
                base=((part["s"] + part["off"] - t0) / MS).to_list(),
                x=(part["len"] / MS).to_list(),
                y=y,
                width=0.8,
                name=key,
                marker={"color": _color(key), "line": {"width": 0}},
                customdata=list(
                    zip(part["n_events"].to_list(), (part["busy_ns"] / MS).to_list(), strict=True)
                ),
                hovertemplate="%{customdata[1]:.3f} ms busy in this bucket, %{customdata[0]} "
                "events<extra>" + key + "</extra>",
            )
        )
