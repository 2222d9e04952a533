"""Pure figure builders for the overview and findings: analysis tables in, plotly figures out.

Why pure functions: they are unit-tested without a server or a browser, and they keep the
rule visible that the dashboard draws analysis results and computes nothing of its own (only
unit conversions, reshaping and layout arithmetic happen here).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import polars as pl

MS = 1e6

# One colour, one meaning, on every page: red is exposed communication (and only that: time
# a rank sat in communication with no compute beside it), orange is communication that runs,
# blue is compute, greys are idle and bubble. Parallelisms avoid red (PP was red once and
# read as exposed time). tests/dashboards/test_colors.py checks every figure keeps to it.
EXPOSED = "#E45756"
KIND_COLORS: dict[str, str] = {
    "compute": "#4C78A8",
    "memcpy": "#9D755D",
    "memset": "#BAB0AC",
    "comm": "#F58518",
}
PAR_COLORS: dict[str, str] = {
    "DP": "#F58518",
    "DP_SHARD": "#FFBF79",
    "TP": "#B279A2",
    "PP": "#E377C2",
    "CP": "#72B7B2",
    "EP": "#54A24B",
    "WORLD": "#EECA3B",
    "OTHER": "#79706E",
    "UNKNOWN": "#A0A0A0",
}
SPLIT_COLORS: dict[str, str] = {
    "compute": KIND_COLORS["compute"],
    "exposed comm": EXPOSED,
    "memory copies": KIND_COLORS["memcpy"],
    "idle": "#D3D3D3",
}
# The critical path's categories (analysis.graph_replay.CATEGORIES) in the colours the
# other pages give the same time: compute, communication, exposed waiting, copies, idle.
PATH_COLORS: dict[str, str] = {
    "compute": KIND_COLORS["compute"],
    "comm_transfer": KIND_COLORS["comm"],
    "comm_wait": SPLIT_COLORS["exposed comm"],
    "memory": KIND_COLORS["memcpy"],
    "host_launch": "#72B7B2",
    "idle": "#9A9A9A",
}

BUBBLE_COLORS: dict[str, str] = {  # greys: a bubble is a stage's idle time
    "measured": "#7F7F7F",
    "closed form": "#C7C7C7",
    "warm-up": "#BDBDBD",
    "steady state": "#8C8C8C",
    "cool-down": "#525252",
}
# More or less than the peers (compute imbalance, kernel slowdown): not communication.
ABOVE, BELOW = "#2F4B7C", "#A0CBE8"
SEVERITY_COLORS: dict[str, str] = {"critical": "#6A1B4D", "warning": "#B05A7A", "info": "#8C8C8C"}

TRACE_TYPES = ("bar", "heatmap", "scatter")  # all the dashboard draws


@cache
def template() -> dict[str, Any]:
    """plotly's white template with the trace defaults of TRACE_TYPES only. Why: the browser
    works through the defaults of every trace type a template lists (some thirty) for each
    figure it draws, about a third of drawing a small one."""
    white = pio.templates["plotly_white"].to_plotly_json()
    data = {k: v for k, v in white["data"].items() if k in TRACE_TYPES}
    return {"layout": white["layout"], "data": data}


def empty(message: str) -> go.Figure:
    """A blank figure that says why it is blank."""
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_layout(height=220, margin={"l": 20, "r": 20, "t": 20, "b": 20})
    fig.layout.template = template()  # assigned: update_layout would merge it into plotly's
    return fig


MARGIN = {"l": 60, "r": 20, "t": 80, "b": 60}


def styled(fig: go.Figure, title: str, height: int = 360, **margin: int) -> go.Figure:
    """Title, height and the (slim) white template, the legend in a row above the plot.

    Why fixed margins big enough for the usual title, legend and tick labels (`margin`
    overrides one side): when one is too small, plotly grows it by drawing the whole figure
    a second time, the larger part of what a page's first paint costs (automargin stays on
    for what does not fit)."""
    fig.update_layout(
        title={"text": title, "x": 0.01, "y": 1, "yref": "container", "yanchor": "top"},
        title_pad={"t": 12},
        height=height,
        margin={**MARGIN, **margin},
        legend={"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom"},
    )
    fig.layout.template = template()  # assigned: update_layout would merge it into plotly's
    # plotly's default ("hide past div") measures every tick label against the page, each
    # measurement a fresh layout of the page.
    fig.update_xaxes(ticklabeloverflow="allow")
    fig.update_yaxes(ticklabeloverflow="allow")
    return fig


def step_time(table: pl.DataFrame, max_lines: int = 16, max_markers: int = 300) -> go.Figure:
    """Step time (window W) per rank and step (breakdown.table): one line per rank, or, past
    `max_lines` ranks, every rank's line in one trace (hover names the rank). Why: the
    browser draws a line trace as one SVG path but every marker as an element of its own
    (64 ranks x 150 steps of markers took seconds), and WebGL, the other way out, is slow
    to start and absent in browsers without a GPU. Markers only up to `max_markers`."""
    if table.is_empty():
        return empty("no steps in this run")
    if table["step"].n_unique() == 1:
        return _one_step(table)
    fig = go.Figure()
    ranks = table["rank"].unique().sort().to_list()
    mode = "lines+markers" if table.height <= max_markers else "lines"
    if len(ranks) > max_lines:
        rows = table.sort("rank", "step")
        # One line per rank, separated by a gap (NaN) where the rank changes.
        gap = rows["rank"].ne_missing(rows["rank"].shift(-1)).to_numpy()
        reps = np.where(gap, 2, 1)
        x = np.repeat(rows["step"].to_numpy().astype(float), reps)
        y = np.repeat((rows["window_ns"] / MS).to_numpy().astype(float), reps)
        last = np.cumsum(reps)[gap] - 1
        x[last], y[last] = np.nan, np.nan
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                mode="lines",
                name="ranks",
                line={"width": 1, "color": "rgba(76,120,168,0.45)"},
                customdata=np.repeat(rows["rank"].to_numpy(), reps).tolist(),
                hovertemplate="rank %{customdata}<br>step %{x}<br>%{y:.2f} ms<extra></extra>",
            )
        )
    for r in ranks if len(ranks) <= max_lines else []:
        part = table.filter(pl.col("rank") == r).sort("step")
        fig.add_trace(
            go.Scatter(
                x=part["step"].to_list(),
                y=(part["window_ns"] / MS).to_list(),
                mode=mode,
                name=f"rank {r}",
                customdata=[r] * part.height,  # a click opens the timeline on this rank
                hovertemplate=f"rank {r}<br>step %{{x}}<br>%{{y:.2f}} ms<extra></extra>",
            )
        )
    fig.update_layout(showlegend=len(ranks) <= max_lines)
    fig.update_xaxes(title="step", dtick=1 if table["step"].n_unique() <= 30 else None)
    fig.update_yaxes(title="step time (ms)", rangemode="tozero")
    return styled(fig, "Step time per rank")


def _one_step(table: pl.DataFrame) -> go.Figure:
    """A run with one profiled step: its time per rank as labelled bars (a line over one x
    is a column of dots). customdata is [rank, step], what a click opens."""
    rows = table.sort("rank")
    step = int(rows["step"][0])
    ms = (rows["window_ns"] / MS).to_list()
    fig = go.Figure(
        go.Bar(
            x=rows["rank"].to_list(),
            y=ms,
            name=f"step {step}",
            text=[f"{v:.3g}" for v in ms],
            textposition="outside",
            marker={"color": KIND_COLORS["compute"], "line": {"width": 0}},
            customdata=[[r, step] for r in rows["rank"].to_list()],
            hovertemplate=f"rank %{{x}}<br>step {step}: %{{y:.2f}} ms<extra></extra>",
        )
    )
    rank_axis(fig, rows.height)
    fig.update_yaxes(title="step time (ms)", rangemode="tozero")
    return styled(fig, f"Step time per rank (one profiled step: step {step})")


def time_split(by_rank: pl.DataFrame) -> go.Figure:
    """Where each rank's time went over the run: an exclusive split of W (breakdown.by_rank).

    compute + exposed comm + exposed memory copies + idle = W; the memory part is what remains.
    """
    if by_rank.is_empty():
        return empty("no steps in this run")
    w = by_rank["window_ns"].cast(pl.Float64)
    parts = {
        "compute": by_rank["compute_ns"] / w,
        "exposed comm": by_rank["exposed_comm_ns"] / w,
        "idle": by_rank["idle_ns"] / w,
    }
    parts["memory copies"] = (1 - parts["compute"] - parts["exposed comm"] - parts["idle"]).clip(
        lower_bound=0
    )
    x = by_rank["rank"].to_list()
    fig = go.Figure()
    for name in ("compute", "exposed comm", "memory copies", "idle"):
        fig.add_trace(
            go.Bar(
                x=x,
                y=(parts[name] * 100).to_list(),
                name=name,
                # No outline: one style fewer for the browser to set on each of many bars.
                marker={"color": SPLIT_COLORS[name], "line": {"width": 0}},
                hovertemplate=f"rank %{{x}} {name}: %{{y:.1f}}% of the step<extra></extra>",
            )
        )
    fig.update_layout(barmode="stack", hovermode="x")
    rank_axis(fig, len(x))
    fig.update_yaxes(title="% of step time", range=[0, 100])
    return styled(fig, "Where the step went (all steps)")


def rank_axis(fig: go.Figure, n: int) -> None:
    """Ranks on a numeric x axis: horizontal labels at any rank count (64 category labels
    would be turned on their side, and the figure drawn twice to make room for them)."""
    fig.update_xaxes(title="rank", dtick=1 if n <= 24 else None, tickformat="d")
