"""Pure figure builders for communication, bandwidth, stragglers and contention.

Why together: they all read the tables of the communication-side analyses (overlap,
stragglers, collectives, contention); only unit conversion and summing a table's ns column
over its rows (labelled as totals) happen here.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import polars as pl
from ranklens.dashboards.figures import (
    ABOVE,
    BELOW,
    EXPOSED,
    KIND_COLORS,
    MS,
    PAR_COLORS,
    PATH_COLORS,
    empty,
    styled,
)


def ms_bars(x: list[str], df: pl.DataFrame, bars: dict[str, dict[str, Any]]) -> go.Figure:
    """One bar trace per ns column of `df` over `x`, in ms, with that column's options (name,
    colour, hover)."""
    return go.Figure([go.Bar(x=x, y=(df[col] / MS).to_list(), **kw) for col, kw in bars.items()])


def comm_by_op(by_group: pl.DataFrame) -> go.Figure:
    """Hidden vs exposed communication per parallelism and op, summed over the given rows
    (overlap.tables["by_group"], already filtered to the ranks/steps shown)."""
    if by_group.is_empty():
        return empty("no communication in this run")
    agg = (
        by_group.with_columns(
            (pl.col("parallelism").fill_null("UNKNOWN") + " " + pl.col("coll_op")).alias("key")
        )
        .group_by("key")
        .agg(pl.col("hidden_ns").sum(), pl.col("exposed_ns").sum())
        .sort("key")
    )
    fig = ms_bars(
        agg["key"].to_list(),
        agg,
        {
            "exposed_ns": {"name": "exposed", "marker_color": EXPOSED},
            "hidden_ns": {"name": "hidden under compute", "marker_color": KIND_COLORS["comm"]},
        },
    )
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title="ms (total over the rows shown)")
    return styled(fig, "Communication per parallelism and op: exposed vs hidden")


def exposed_share(by_par: pl.DataFrame, step: int) -> go.Figure:
    """Exposed communication share of the step per rank and parallelism (overlap.by_parallelism)."""
    part = by_par.filter(pl.col("step") == step)
    if part.is_empty():
        return empty(f"no communication in step {step}")
    fig = go.Figure()
    for p in sorted(part["parallelism"].unique().to_list()):
        rows = part.filter(pl.col("parallelism") == p).sort("rank")
        fig.add_trace(
            go.Bar(
                x=[f"r{r}" for r in rows["rank"].to_list()],
                y=(rows["exposed_share"].fill_null(0) * 100).to_list(),
                name=p,
                marker_color=PAR_COLORS.get(p, PAR_COLORS["OTHER"]),
            )
        )
    fig.update_layout(barmode="group")
    fig.update_yaxes(title="% of the step exposed")
    return styled(fig, f"Exposed communication share per parallelism, step {step}")


def wait_transfer(by_rank: pl.DataFrame) -> go.Figure:
    """Exposed communication split into waiting for late ranks vs moving data (stragglers)."""
    if by_rank.is_empty():
        return empty("no matched collectives")
    fig = ms_bars(
        [f"r{r}" for r in by_rank["rank"].to_list()],
        by_rank,
        {
            "exposed_wait_ns": {"name": "exposed: waiting for late ranks", "marker_color": EXPOSED},
            "exposed_transfer_ns": {
                "name": "exposed: transferring",
                "marker_color": PATH_COLORS["comm_transfer"],
            },
        },
    )
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title="exposed communication (ms, all steps)")
    return styled(fig, "Exposed communication: waiting vs transferring")


def busbw(table: pl.DataFrame) -> go.Figure:
    """Bus bandwidth vs message size per op and group, against the link peak where the
    device's link is known (the title says when it is not: no line is promised)."""
    rows = table.filter(pl.col("busbw_gbps").is_not_null() & pl.col("bytes").is_not_null())
    if rows.is_empty():
        sized = "bytes" in table.columns and table["bytes"].is_not_null().any()
        return empty(
            "no bandwidth: "
            + (
                "no collective has both a size and a device time"
                if sized
                else "the trace records no message size for its collectives"
            )
        )
    fig = go.Figure()
    for key, part in rows.group_by("parallelism", "op", maintain_order=True):
        par, op = key
        fig.add_trace(
            go.Scatter(
                x=part["bytes"].to_list(),
                y=part["busbw_gbps"].to_list(),
                mode="markers",
                name=f"{par} {op}",
                marker={
                    "size": 9,
                    "color": PAR_COLORS.get(str(par), PAR_COLORS["OTHER"]),
                    "symbol": _SYMBOLS.get(str(op), "circle"),
                },
                customdata=list(
                    zip(part["instances"].to_list(), part["link"].to_list(), strict=True)
                ),
                hovertemplate="%{x:.3s}B: %{y:.1f} GB/s busbw, %{customdata[0]} instances, "
                "%{customdata[1]}<extra></extra>",
            )
        )
    peaks = rows.filter(pl.col("peak_gbps").is_not_null()).select("link", "peak_gbps").unique()
    for link, peak in peaks.rows():
        fig.add_hline(
            y=peak,
            line_dash="dash",
            line_color="#555",
            annotation_text=f"{link} peak {peak:.0f} GB/s",
        )
    fig.update_xaxes(type="log", title="message size (bytes, full array)")
    fig.update_yaxes(title="bus bandwidth (GB/s)", rangemode="tozero")
    peak_note = "" if peaks.height else " (link peak unknown for this device: none drawn)"
    return styled(fig, "Collective bandwidth: busbw vs size" + peak_note)


_SYMBOLS = {
    "all_reduce": "circle",
    "all_gather": "square",
    "reduce_scatter": "diamond",
    "all_to_all": "x",
    "broadcast": "triangle-up",
    "p2p": "star",
}


def late_ranks(by_rank: pl.DataFrame) -> go.Figure:
    """Per rank: the wait it caused others (late) vs its own wait for others (stragglers)."""
    if by_rank.is_empty():
        return empty("no matched collectives")
    fig = ms_bars(
        [f"r{r}" for r in by_rank["rank"].to_list()],
        by_rank,
        {
            "caused_wait_ns": {
                "name": "others waited for it (their exposed comm)",
                "marker_color": EXPOSED,
                "customdata": by_rank["late_count"].to_list(),
                "hovertemplate": "%{x}: %{y:.2f} ms caused, late in %{customdata} "
                "collectives<extra></extra>",
            },
            "waited_ns": {"name": "it waited for others", "marker_color": "#A0A0A0"},
        },
    )
    fig.update_layout(barmode="group")
    fig.update_yaxes(title="ms, all steps")
    return styled(fig, "Late ranks and the wait they cause")


def skew(by_instance: pl.DataFrame, top: int = 400) -> go.Figure:
    """Arrival skew of each matched collective, coloured by the rank that arrived last."""
    if by_instance.is_empty():
        return empty("no matched collectives")
    rows = by_instance.sort("skew_ns", descending=True).head(top).sort("instance_id")
    fig = go.Figure()
    for (late,), part in rows.group_by("late_rank", maintain_order=True):
        fig.add_trace(
            go.Scatter(
                x=part["instance_id"].to_list(),
                y=(part["skew_ns"] / MS).to_list(),
                mode="markers",
                name="no late rank" if late is None else f"late: rank {late}",
                customdata=list(
                    zip(
                        part["op"].to_list(),
                        part["parallelism"].to_list(),
                        part["step"].to_list(),
                        strict=True,
                    )
                ),
                hovertemplate="instance %{x}: %{customdata[1]} %{customdata[0]} step "
                "%{customdata[2]}, skew %{y:.2f} ms<extra></extra>",
            )
        )
    fig.update_xaxes(title="collective instance")
    fig.update_yaxes(title="arrival skew (ms)", rangemode="tozero")
    return styled(fig, "Arrival skew per collective")


def imbalance(by_rank: pl.DataFrame) -> go.Figure:
    """Compute per step vs the median of its peers, per rank (stragglers.compute_imbalance)."""
    rows = by_rank.filter(pl.col("compute_imbalance").is_not_null())
    if rows.is_empty():
        return empty("no compute imbalance measured")
    vals = (rows["compute_imbalance"] * 100).to_list()
    fig = go.Figure(
        go.Bar(
            x=[f"r{r}" for r in rows["rank"].to_list()],
            y=vals,
            marker_color=[ABOVE if v > 0 else BELOW for v in vals],
        )
    )
    fig.update_yaxes(title="% vs peers' median")
    return styled(fig, "Compute imbalance per rank")
