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
from ranklens.analysis import Finding

MS = 1e6

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
    "PP": "#E45756",
    "CP": "#72B7B2",
    "EP": "#54A24B",
    "WORLD": "#EECA3B",
    "OTHER": "#79706E",
    "UNKNOWN": "#A0A0A0",
}
SPLIT_COLORS: dict[str, str] = {
    "compute": KIND_COLORS["compute"],
    "exposed comm": "#E45756",
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

# Heatmap metrics: (label, source, column). Source "breakdown" is breakdown.table,
# "stragglers" is stragglers.tables["by_step"].
HEATMAP_METRICS: dict[str, tuple[str, str, str]] = {
    "compute_ns": ("compute time (union of compute)", "breakdown", "compute_ns"),
    "window_ns": ("step time (window W)", "breakdown", "window_ns"),
    "exposed_comm_ns": ("exposed communication", "breakdown", "exposed_comm_ns"),
    "idle_ns": ("idle time", "breakdown", "idle_ns"),
    "exposed_wait_ns": ("waiting for late ranks", "stragglers", "exposed_wait_ns"),
}


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


def comm_share(by_step: pl.DataFrame, by_par: pl.DataFrame, step: int) -> go.Figure:
    """One step per rank: compute share, communication share per parallelism, idle share.

    Communication of different parallelisms can run at once and under compute, so the bars
    stand side by side: each is |M_x| / |W| (breakdown.by_parallelism), not an exclusive split.
    """
    steps = by_step.filter(pl.col("step") == step).sort("rank")
    if steps.is_empty():
        return empty(f"no step {step} in this run")
    x = steps["rank"].to_list()
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            x=x,
            y=(steps["compute_share"] * 100).to_list(),
            name="compute",
            marker={"color": SPLIT_COLORS["compute"], "line": {"width": 0}},
        )
    )
    par = by_par.filter(pl.col("step") == step)
    for p in sorted(par["parallelism"].unique().to_list()):
        part = steps.select("rank").join(
            par.filter(pl.col("parallelism") == p), on="rank", how="left"
        )
        fig.add_trace(
            go.Bar(
                x=x,
                y=(part["comm_share"].fill_null(0) * 100).to_list(),
                name=f"{p} comm",
                marker={"color": PAR_COLORS.get(p, PAR_COLORS["OTHER"]), "line": {"width": 0}},
            )
        )
    fig.add_trace(
        go.Bar(
            x=x,
            y=(steps["idle_share"] * 100).to_list(),
            name="idle",
            marker={"color": SPLIT_COLORS["idle"], "line": {"width": 0}},
        )
    )
    # Side by side, not stacked: the shares overlap (comm under compute, DP beside PP), so a
    # stack would pass 100% and read as an exclusive split (time_split is that one).
    fig.update_layout(barmode="group", hovermode="x")
    rank_axis(fig, len(x))
    fig.update_yaxes(title="% of step time (shares overlap)", range=[0, 100])
    return styled(fig, f"Communication share by parallelism, step {step}")


def heatmap(table: pl.DataFrame, metric: str, focus_rank: int | None = None) -> go.Figure:
    """Ranks x steps of one per-step metric: a straggler or a slow stage is a hot row."""
    label, _, col = HEATMAP_METRICS[metric]
    if table.is_empty() or col not in table.columns:
        return empty(f"no {label} for this run")
    wide = table.select("rank", "step", col).pivot(on="step", index="rank", values=col).sort("rank")
    steps = [c for c in wide.columns if c != "rank"]
    ranks = wide["rank"].to_list()
    # Rounded to the ns the values are counted in: float noise only lengthens the JSON.
    z = [
        [None if v is None else round(v / MS, 6) for v in row] for row in wide.select(steps).rows()
    ]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=[str(s) for s in steps],
            y=[f"r{r}" for r in ranks],
            colorscale="YlOrRd",
            colorbar={"title": "ms"},
            hovertemplate="%{y} step %{x}: %{z:.2f} ms<extra></extra>",
        )
    )
    if focus_rank is not None and focus_rank in ranks:
        i = ranks.index(focus_rank)
        fig.add_shape(
            type="rect",
            xref="paper",
            x0=0,
            x1=1,
            y0=i - 0.5,
            y1=i + 0.5,
            line={"color": "black", "width": 2},
        )
    fig.update_xaxes(title="step", type="category")
    fig.update_yaxes(title="rank", autorange="reversed", type="category")
    return styled(
        fig, f"Ranks x steps: {label}", height=max(300, 150 + 18 * len(ranks)), r=110, t=60, b=70
    )


def finding_rows(findings: tuple[Finding, ...] | list[Finding]) -> list[dict[str, Any]]:
    """Findings as table rows, most costly first (the order build_report gave them)."""
    rows = []
    for i, f in enumerate(findings, 1):
        rows.append(
            {
                "#": i,
                "severity": f.severity.value,
                "code": f.code,
                "at stake (ms/step)": round(f.time_at_stake_ns / MS, 2),
                "ranks": ", ".join(str(r) for r in f.ranks[:16])
                + (" ..." if len(f.ranks) > 16 else ""),
                "message": f.message,
                "fix": f.fix,
            }
        )
    return rows


def findings_bar(findings: tuple[Finding, ...] | list[Finding], top: int = 8) -> go.Figure:
    """The top findings by time at stake per step."""
    index = [i for i, f in enumerate(findings) if f.time_at_stake_ns > 0][:top]
    top_f = [findings[i] for i in index]
    if not top_f:
        return empty("no finding with time at stake")
    fig = go.Figure(
        go.Bar(
            x=[f.time_at_stake_ns / MS for f in top_f][::-1],
            y=[f"{f.code} {_ranks_label(f)}" for f in top_f][::-1],
            orientation="h",
            marker_color=["#E45756" if f.severity.value != "info" else "#F58518" for f in top_f][
                ::-1
            ],
            hovertext=[f.message for f in top_f][::-1],
            customdata=index[::-1],  # the finding's place in `findings`: a click opens it
            hovertemplate="%{hovertext}<br>%{x:.2f} ms/step<extra></extra>",
        )
    )
    fig.update_xaxes(title="time at stake (ms per step)")
    width = 20 + 7 * max(len(label) for label in fig.data[0].y)  # ~7 px a character
    return styled(
        fig, "Top findings by time at stake", height=140 + 40 * len(top_f), l=min(width, 360)
    )


def _ranks_label(f: Finding) -> str:
    if not f.ranks:
        return ""
    if len(f.ranks) == 1:
        return f"(rank {f.ranks[0]})"
    return f"({len(f.ranks)} ranks)"
