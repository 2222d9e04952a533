"""Pipeline: the stage x time Gantt of micro-batch blocks, bubbles, measured vs closed form.

Why: a pipeline's bubble is the one loss the schedule predicts; putting the measured bubble
next to the closed form per stage says whether to add micro-batches (the closed form is
already large) or to fix the stages (the excess is large). Deep link: `/pipeline?step=3&group=10`.
"""

from __future__ import annotations

from typing import Any

import dash
import plotly.graph_objects as go
import polars as pl
from dash import Input, Output, dcc, html
from ranklens.analysis import Result
from ranklens.analysis import timeline as tl
from ranklens.dashboards import components as ui
from ranklens.dashboards import figures_pipeline as figs
from ranklens.dashboards.data import RunData, current

PATH = "/pipeline"
NAME = "Pipeline"  # its link in the page bar
TITLE = "ranklens · pipeline"  # in the browser tab


def register(app: dash.Dash) -> None:
    """Add the page and its callbacks to `app`."""
    ui.register_page(__name__, path=PATH, name=NAME, title=TITLE, layout=layout)

    @app.callback(
        Output("pipeline-gantt", "figure"),
        Output("pipeline-summary", "children"),
        Input("pipeline-group", "value"),
        Input("pipeline-step", "value"),
        prevent_initial_call=True,
    )
    def _update(group: Any, step: Any) -> tuple[go.Figure, Any]:
        data = current()
        res = data.result("pipeline")
        if res is None:
            return dash.no_update, dash.no_update
        return gantt(data, res, str(group), ui.parse_int(step)), summary(
            res, str(group), ui.parse_int(step)
        )


def gantt(data: RunData, res: Result, group: str, step: int | None) -> go.Figure:
    blocks = res.tables["blocks"].filter((pl.col("pp_group") == group) & (pl.col("step") == step))
    stages = res.table.filter((pl.col("pp_group") == group) & (pl.col("step") == step))
    windows = data.cached("step_windows", tl.step_windows).filter(pl.col("step") == step)
    windows = stages.select("rank", "stage").join(windows, on="rank", how="inner")
    return figs.gantt(
        blocks,
        windows,
        data.extent().t0_ns,
        f"Micro-batch Gantt, {label(data, group)}, step {step}",
    )


def label(data: RunData, group: str) -> str:
    """A PP group by its ranks ("PP [0, 4, 8, 12]"), as the report's facts name it."""
    return str((data.report().facts.get("groups") or {}).get(str(group), f"PP group {group}"))


def summary(res: Result, group: str, step: int | None) -> html.Div:
    """The schedule and the bubble numbers of one pipeline and step, as the analysis gives them."""
    sched = res.tables["schedule"].filter((pl.col("pp_group") == group) & (pl.col("step") == step))
    if sched.is_empty():
        return html.Div(f"no schedule for PP group {group}, step {step}")
    s = sched.row(0, named=True)

    def num(v: Any, fmt: str = ".3f") -> str:
        return "n/a" if v is None else format(v, fmt)

    items: list[Any] = [
        html.Span(f"{s['p']} stages", id="pipeline-stage-count"),
        f" · m = {s['m']} micro-batches · v = {s['v']} · schedule {s['schedule']} "
        f"({s['schedule_source']})",
        html.Br(),
        "bubble fraction: measured ",
        html.B(num(s["bubble_fraction"]), id="pipeline-measured"),
        " vs closed form ",
        html.B(num(s["closed_form"]), id="pipeline-closed-form"),
        f" ({s['convention']})",
    ]
    heavy = figs.heavy_stage_line(s)
    if heavy is not None:
        items += [html.Br(), html.Span(heavy, id="pipeline-heavy-stage")]
    if s.get("excess_ns") is not None:
        terms, notes = figs.decomposition_lines(s)
        items += [
            html.Br(),
            f"excess bubble {s['excess_ns'] / 1e6:.2f} ms per stage = {terms} "
            f"({s['decomposition']})",
        ]
        if notes:
            items.append(
                html.Ul(
                    [html.Li(n) for n in notes],
                    id="pipeline-negative-terms",
                    style={"color": "#555", "margin": "4px 0"},
                )
            )
    return html.Div(items, style=ui.CARD)


def layout(step: Any = None, group: Any = None, **_: Any) -> html.Div:
    """The pipeline of `group` (default: the first) at `step` (default: the first)."""
    data = current()
    res = data.result("pipeline")
    head = ui.title(
        "Pipeline", "Stage x time; grey is bubble. Measured bubble vs the schedule's closed form."
    )
    if res is None:
        return html.Div([head, ui.unavailable("pipeline", data.error("pipeline"))])
    groups = sorted(res.table["pp_group"].drop_nulls().unique().to_list())
    if not groups:
        return html.Div(
            [
                head,
                ui.unavailable(
                    "pipeline",
                    "this run has no pipeline parallelism (no PP group and no p2p pattern of one)",
                ),
            ]
        )
    chosen = str(group) if group in groups else groups[0]
    steps = sorted(res.table.filter(pl.col("pp_group") == chosen)["step"].unique().to_list())
    step_i = ui.pick_step(step, steps)
    stages = res.tables["stages"].filter(pl.col("pp_group") == chosen)
    sched = res.tables["schedule"].filter(pl.col("pp_group") == chosen)
    return html.Div(
        [
            head,
            html.Div(
                [
                    *ui.menu(
                        "Pipeline ",
                        "pipeline-group",
                        [{"label": label(data, g), "value": g} for g in groups],
                        chosen,
                        "260px",
                        clearable=False,
                    ),
                    *ui.step_menu("pipeline-step", steps, step_i),
                ],
                style=ui.CONTROLS,
            ),
            html.Div(summary(res, chosen, step_i), id="pipeline-summary"),
            dcc.Graph(
                id="pipeline-gantt", figure=gantt(data, res, chosen, step_i), config=ui.GRAPH
            ),
            ui.cells(
                dcc.Graph(
                    id="pipeline-bubbles", config=ui.GRAPH, figure=figs.bubble_by_stage(stages)
                ),
                dcc.Graph(id="pipeline-phases", config=ui.GRAPH, figure=figs.bubble_phases(stages)),
            ),
            html.H4("Per stage (all steps)"),
            ui.run_table(data, stages, "pipeline-stages-table", sort_by=None),
            html.H4("Schedule and excess-bubble decomposition per step"),
            ui.run_table(data, sched, "pipeline-schedule-table", sort_by=None),
        ]
    )
