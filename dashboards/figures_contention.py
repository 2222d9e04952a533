"""Pure figure builders for the contention analysis (slowdown of overlapped kernels).

Why separate: the contention tables are their own shape; keeping them here keeps each figure
module small.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import polars as pl
from ranklens.analysis import Result
from ranklens.dashboards.figures import ABOVE, BELOW, KIND_COLORS, MS, empty, styled


def _slowest(df: pl.DataFrame, top: int) -> pl.DataFrame:
    """The `top` classes that lost most time to a slowdown (compared ones only)."""
    return (
        df.filter(pl.col("slowdown").is_not_null())
        .sort("time_lost_ns", descending=True, nulls_last=True)
        .head(top)
    )


def _lost_bars(rows: pl.DataFrame, labels: list[str], **kw: Any) -> go.Bar:
    """Time lost per class, the costliest on top, each labelled with its slowdown (%)."""
    slow = (rows["slowdown"] * 100).to_list()
    return go.Bar(
        x=(rows["time_lost_ns"].fill_null(0) / MS).to_list()[::-1],
        y=labels[::-1],
        orientation="h",
        text=[f"{v:+.0f}%" for v in slow][::-1],
        textposition="outside",
        **kw,
    )


def slowdown(res: Result, top: int = 15) -> go.Figure:
    """Kernel classes that ran slower beside communication: time lost, with the slowdown
    T_overlapped / T_alone - 1 (contention.table)."""
    rows = _slowest(res.table, top)
    if rows.is_empty():
        return empty("no kernel class ran both alone and beside communication: nothing to compare")
    labels = [
        f"{n[:48]} {s[:24]}"
        for n, s in zip(rows["name"].to_list(), rows["shape"].fill_null("").to_list(), strict=True)
    ]
    fig = go.Figure(
        _lost_bars(
            rows,
            labels,
            marker_color=[ABOVE if v > 0 else BELOW for v in rows["slowdown"].to_list()][::-1],
            customdata=list(
                zip(
                    rows["n_matched"].fill_null(0).to_list(),
                    (rows["t_alone_ns"] / MS).to_list(),
                    (rows["t_overlapped_ns"] / MS).to_list(),
                    strict=True,
                )
            )[::-1],
            hovertemplate="%{y}<br>lost %{x:.2f} ms; slowdown %{text} over %{customdata[0]} "
            "runs<br>alone %{customdata[1]:.3f} ms, overlapped %{customdata[2]:.3f} ms"
            "<extra></extra>",
        )
    )
    fig.update_xaxes(title="time lost to contention (ms, all steps); label: slowdown")
    return styled(fig, "Compute slowed by concurrent communication", height=120 + 28 * rows.height)


def comm_slowdown(comm: pl.DataFrame, top: int = 15) -> go.Figure:
    """Communication slowed by communication on other streams (contention.tables["comm"])."""
    rows = _slowest(comm, top)
    if rows.is_empty():
        return empty("no communication ran both alone and beside other communication")
    labels = [
        f"{p} {o} {n[:40]}"
        for p, o, n in zip(
            rows["parallelism"].fill_null("?").to_list(),
            rows["coll_op"].fill_null("?").to_list(),
            rows["name"].to_list(),
            strict=True,
        )
    ]
    fig = go.Figure(_lost_bars(rows, labels, marker_color=KIND_COLORS["comm"]))
    fig.update_xaxes(title="time lost (ms, all steps); label: slowdown")
    return styled(
        fig, "Communication slowed by concurrent communication", height=120 + 28 * rows.height
    )
