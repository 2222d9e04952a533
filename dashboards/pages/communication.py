"""Communication: per parallelism and op, exposed vs hidden, wait vs transfer, bandwidth.

Why: exposed communication is the usual loss of a distributed step; this page says which
parallelism and op carry it, whether it is waiting (a balance problem) or moving data (a
network/overlap problem), and how close each collective gets to its link's peak.
Deep link: `/communication?rank=0,1&step=3`.
"""

from __future__ import annotations

from typing import Any

import dash
import plotly.graph_objects as go
import polars as pl
from dash import Input, Output, dcc, html
from ranklens.dashboards import components as ui
from ranklens.dashboards import figures_comm as figs
from ranklens.dashboards.data import RunData, current
from ranklens.dashboards.figures import empty

PATH = "/communication"
NAME = "Communication"  # its link in the page bar
TITLE = "ranklens · communication"  # in the browser tab


def register(app: dash.Dash) -> None:
    """Add the page and its callbacks to `app`."""
    ui.register_page(__name__, path=PATH, name=NAME, title=TITLE, layout=layout)

    @app.callback(
        Output("communication-by-op", "figure"),
        Output("communication-exposed", "figure"),
        Input("communication-ranks", "value"),
        Input("communication-step", "value"),
        prevent_initial_call=True,
    )
    def _update(ranks: Any, step: Any) -> tuple[go.Figure, go.Figure]:
        return by_op(current(), ui.parse_ints(ranks)), exposed(current(), ui.parse_int(step))


def by_op(data: RunData, ranks: list[int] | None) -> go.Figure:
    res = data.result("overlap")
    if res is None:
        return empty("the overlap analysis is not available")
    rows = res.tables["by_group"]
    if ranks:
        rows = rows.filter(pl.col("rank").is_in(ranks))
    return figs.comm_by_op(rows)


def exposed(data: RunData, step: int | None) -> go.Figure:
    res = data.result("overlap")
    if res is None:
        return empty("the overlap analysis is not available")
    steps = res.table["step"].unique().sort().to_list()
    if not steps:
        return empty("no steps")
    chosen: int = step if step is not None and step in steps else steps[0]
    return figs.exposed_share(res.tables["by_parallelism"], chosen)


def layout(rank: Any = None, step: Any = None, **_: Any) -> html.Div:
    """Communication for `rank` (default: all ranks) and `step` (default: the first)."""
    data = current()
    head = ui.title(
        "Communication",
        "Per parallelism and op: exposed vs hidden, waiting vs "
        "transferring, bandwidth against the link's peak.",
    )
    ov = data.result("overlap")
    if ov is None:
        return html.Div([head, ui.unavailable("overlap", data.error("overlap"))])
    ranks = ui.parse_ints(rank)
    steps = ov.table["step"].unique().sort().to_list()
    step_i = ui.pick_step(step, steps)
    every = data.report().facts.get("ranks") or []
    st = data.result("stragglers")
    co = data.result("collectives")
    wait: Any = (
        dcc.Graph(id="communication-wait", figure=figs.wait_transfer(st.table), config=ui.GRAPH)
        if st is not None
        else ui.unavailable("stragglers", data.error("stragglers"))
    )
    bw: Any = (
        html.Div(
            [
                dcc.Graph(id="communication-busbw", figure=figs.busbw(co.table), config=ui.GRAPH),
                ui.run_table(data, co.table, "communication-collectives-table"),
            ]
        )
        if co is not None
        else ui.unavailable("collectives", data.error("collectives"))
    )
    return html.Div(
        [
            head,
            html.Div(
                [
                    *ui.rank_menu("communication-ranks", ranks, every),
                    *ui.step_menu("communication-step", steps, step_i),
                ],
                style=ui.CONTROLS,
            ),
            ui.cells(
                dcc.Graph(id="communication-by-op", figure=by_op(data, ranks), config=ui.GRAPH),
                dcc.Graph(
                    id="communication-exposed", figure=exposed(data, step_i), config=ui.GRAPH
                ),
            ),
            wait,
            html.H4("Collective bandwidth"),
            bw,
        ]
    )
