"""Contention & stragglers: kernels slowed by overlap, late ranks and the wait they cause.

Why on one page: both explain time that is lost although nothing looks idle: a kernel that
runs slower because communication shares the GPU with it, and ranks that wait in a collective
for one that arrives late. Deep link: `/contention?rank=3`.
"""

from __future__ import annotations

from typing import Any

import dash
import polars as pl
from dash import dcc, html
from ranklens.dashboards import components as ui
from ranklens.dashboards import figures_comm as figs
from ranklens.dashboards import figures_contention as cfigs
from ranklens.dashboards.data import RunData, current

PATH = "/contention"
NAME = "Contention & stragglers"  # its link in the page bar
TITLE = "ranklens · contention & stragglers"  # in the browser tab


def register(app: dash.Dash) -> None:
    """Add the page to `app` (no callbacks: everything is drawn from the URL)."""
    ui.register_page(
        __name__,
        path=PATH,
        name=NAME,
        title=TITLE,
        layout=layout,
    )


def stragglers_section(data: RunData, rank: int | None) -> list[Any]:
    res = data.result("stragglers")
    if res is None:
        return [ui.unavailable("stragglers", data.error("stragglers"))]
    late = [f for f in res.findings if f.code == "STRAGGLER_RANK"]
    summary = (
        [html.Li(f.message, className="contention-straggler") for f in late]
        if late
        else [html.Li("no rank holds the others back beyond the thresholds")]
    )
    inst = res.tables["by_instance"]
    if rank is not None:
        inst = inst.filter(pl.col("late_rank") == rank)
    return [
        html.Ul(summary, id="contention-stragglers", style=ui.CARD),
        ui.cells(
            dcc.Graph(id="contention-late", figure=figs.late_ranks(res.table), config=ui.GRAPH),
            dcc.Graph(id="contention-imbalance", config=ui.GRAPH, figure=figs.imbalance(res.table)),
        ),
        dcc.Graph(
            id="contention-skew", figure=figs.skew(res.tables["by_instance"]), config=ui.GRAPH
        ),
        html.H4("Per rank"),
        ui.run_table(data, res.table, "contention-stragglers-table"),
        html.H4(
            "Collectives by arrival skew" + (f" (late rank {rank})" if rank is not None else "")
        ),
        ui.run_table(data, inst, "contention-skew-table", sort_by="skew_ns"),
    ]


def contention_section(data: RunData) -> list[Any]:
    res = data.result("contention")
    if res is None:
        return [ui.unavailable("contention", data.error("contention"))]
    out: list[Any] = [
        ui.cells(
            dcc.Graph(id="contention-slowdown", figure=cfigs.slowdown(res), config=ui.GRAPH),
            dcc.Graph(
                id="contention-comm",
                config=ui.GRAPH,
                figure=cfigs.comm_slowdown(res.tables["comm"]),
            ),
        )
    ]
    for f in (f for f in data.report().findings if f.code.startswith("CONTENTION_")):
        out.append(
            html.Div([html.B(f.code + ": "), f.message, html.Br(), "fix: " + f.fix], style=ui.CARD)
        )
    out.append(html.H4("Kernel classes (alone vs overlapped)"))
    out.append(
        ui.run_table(data, res.table, "contention-table", max_rows=50, sort_by="time_lost_ns")
    )
    return out


def layout(rank: Any = None, **_: Any) -> html.Div:
    """Contention, then stragglers; `rank` filters the skew table to that late rank."""
    data = current()
    return html.Div(
        [
            ui.title(
                "Contention & stragglers",
                "Time lost while nothing looks idle: slowed kernels, late ranks.",
            ),
            html.H3("Contention"),
            *contention_section(data),
            html.H3("Stragglers"),
            *stragglers_section(data, ui.parse_int(rank)),
        ]
    )
