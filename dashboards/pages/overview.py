"""Overview: step time per rank, where the time went, the ranks x steps heatmap, top findings.

Why first: it answers "is something wrong, where, and how much is at stake" at a glance; the
heatmap makes a straggler or a slow stage a hot row. Every chart is a way in: a click on a
heatmap cell, a rank's bar or point, or a finding's bar opens the timeline there (rank, step,
evidence). Deep link: `/?rank=3&step=4&metric=...`.
"""

from __future__ import annotations

from typing import Any

import dash
import plotly.graph_objects as go
import polars as pl
from dash import Input, Output, State, ctx, dcc, html
from ranklens.dashboards import components as ui
from ranklens.dashboards import figures
from ranklens.dashboards import figures_overview as ofigs
from ranklens.dashboards.data import RunData, current
from ranklens.dashboards.pages.findings import timeline_link

PATH = "/"
NAME = "Overview"  # its link in the page bar
TITLE = "ranklens · overview"  # in the browser tab
GRAPHS = (
    "overview-heatmap",
    "overview-step-time",
    "overview-split",
    "overview-share",
    "overview-findings-bar",
)


def click_href(data: RunData, graph: str, click: Any, step: int | None) -> str | None:
    """The timeline link a click on one of the overview's charts opens: the clicked rank at
    the clicked step (the chart's step, or the first), or the clicked finding's evidence."""
    try:
        point = click["points"][0]
    except (KeyError, IndexError, TypeError):
        return None
    if graph == "overview-findings-bar":
        i = ui.parse_int(point.get("customdata"))
        found = data.report().findings
        return timeline_link(data, found[i]) if i is not None and 0 <= i < len(found) else None
    if graph == "overview-heatmap":
        rank, step = ui.parse_int(str(point.get("y", "")).lstrip("r")), ui.parse_int(point.get("x"))
    elif graph == "overview-step-time":  # lines: customdata rank, x step; bars: [rank, step]
        cd = point.get("customdata")
        if isinstance(cd, list) and len(cd) == 2:
            rank, step = ui.parse_int(cd[0]), ui.parse_int(cd[1])
        else:
            rank, step = ui.parse_int(cd), ui.parse_int(point.get("x"))
    else:  # per-rank bars: x is the rank; the share chart's step is its menu's
        rank = ui.parse_int(point.get("x"))
        step = step if graph == "overview-share" else None
    if rank is None:
        return None
    return ui.timeline_href([rank], step)


def register(app: dash.Dash) -> None:
    """Add the page and its callbacks to `app`."""
    ui.register_page(__name__, path=PATH, name=NAME, title=TITLE, layout=layout)

    @app.callback(
        Output("overview-heatmap", "figure"),
        Input("overview-metric", "value"),
        State("overview-focus", "data"),
        prevent_initial_call=True,
    )
    def _heatmap(metric: str, focus: int | None) -> dict[str, Any]:
        data = current()
        return ui.figure(
            data, ("heatmap", metric, focus), lambda: heatmap_figure(data, metric, focus)
        )

    @app.callback(
        Output("overview-go", "href"),
        Input("overview-heatmap", "clickData"),
        Input("overview-step-time", "clickData"),
        Input("overview-split", "clickData"),
        Input("overview-share", "clickData"),
        Input("overview-findings-bar", "clickData"),
        State("overview-step", "value"),
        prevent_initial_call=True,
    )
    def _go(*args: Any) -> Any:
        graph = str(ctx.triggered_id or "")
        clicks = dict(zip(GRAPHS, args[:-1], strict=True))
        href = click_href(current(), graph, clicks.get(graph), ui.parse_int(args[-1]))
        return href if href is not None else dash.no_update

    @app.callback(
        Output("overview-share", "figure"),
        Input("overview-step", "value"),
        prevent_initial_call=True,
    )
    def _share(step: Any) -> dict[str, Any]:
        data, chosen = current(), ui.parse_int(step)
        return ui.figure(data, ("share", chosen), lambda: share_figure(data, chosen))


def heatmap_table(data: RunData, metric: str) -> pl.DataFrame | None:
    """The analysis table a heatmap metric comes from (None: analysis unavailable)."""
    _, source, _ = ofigs.HEATMAP_METRICS[metric]
    res = data.result(source)
    if res is None:
        return None
    return res.table if source == "breakdown" else res.tables.get("by_step")


def heatmap_figure(data: RunData, metric: str, focus: int | None) -> go.Figure:
    if metric not in ofigs.HEATMAP_METRICS:
        metric = "compute_ns"
    table = heatmap_table(data, metric)
    if table is None:
        return figures.empty(f"the {ofigs.HEATMAP_METRICS[metric][1]} analysis is not available")
    report = data.report()
    named = ofigs.named_ranks(report.findings, len(report.facts.get("ranks") or []))
    return ofigs.heatmap(table, metric, focus, named)


def share_figure(data: RunData, step: int | None) -> go.Figure:
    res = data.result("breakdown")
    if res is None:
        return figures.empty("the breakdown analysis is not available")
    steps = res.table["step"].unique().sort().to_list()
    if not steps:
        return figures.empty("no steps in this run")
    chosen: int = step if step is not None and step in steps else steps[0]
    return ofigs.comm_share(res.table, res.tables["by_parallelism"], chosen)


def layout(rank: Any = None, step: Any = None, metric: Any = None, **_: Any) -> html.Div:
    """The overview; `rank` outlines a heatmap row, `step` picks the step of the share chart."""
    data = current()
    res = data.result("breakdown")
    if res is None:
        return html.Div(
            [ui.title("Overview"), ui.unavailable("breakdown", data.error("breakdown"))]
        )
    focus = ui.parse_int(rank)
    steps = res.table["step"].unique().sort().to_list()
    chosen = ui.pick_step(step, steps)
    metrics = {k: v for k, v in ofigs.HEATMAP_METRICS.items() if data.result(v[1]) is not None}
    metric = metric if metric in metrics else "compute_ns"
    report = data.report()
    return html.Div(
        [
            ui.title(
                "Overview",
                "Every rank, every step: where the time went and what it costs. "
                "Click a cell, bar or point to open the timeline there.",
            ),
            dcc.Store(id="overview-focus", data=focus),
            dcc.Location(id="overview-go", refresh="callback-nav"),
            ui.cells(
                ui.graph(
                    "overview-step-time", data, ("step_time",), lambda: figures.step_time(res.table)
                ),
                ui.graph(
                    "overview-split",
                    data,
                    ("split",),
                    lambda: figures.time_split(res.tables["by_rank"]),
                ),
            ),
            ui.cells(
                [
                    *ui.menu(
                        "Heatmap metric ",
                        "overview-metric",
                        [{"label": v[0], "value": k} for k, v in metrics.items()],
                        metric,
                        "320px",
                        clearable=False,
                    ),
                    ui.graph(
                        "overview-heatmap",
                        data,
                        ("heatmap", metric, focus),
                        lambda: heatmap_figure(data, metric, focus),
                    ),
                ],
                [
                    *ui.step_menu("overview-step", steps, chosen, label="Step ", width="160px"),
                    ui.graph(
                        "overview-share",
                        data,
                        ("share", chosen),
                        lambda: share_figure(data, chosen),
                    ),
                ],
            ),
            html.Div(
                [
                    ui.graph(
                        "overview-findings-bar",
                        data,
                        ("findings_bar",),
                        lambda: ofigs.findings_bar(
                            report.findings, step_ns=ofigs.mean_step_ns(res.table)
                        ),
                    ),
                    html.Ul(
                        [
                            html.Li(
                                [
                                    html.B(f"{f.code} "),
                                    html.Span(f"({f.time_at_stake_ns / figures.MS:.1f} ms/step) "),
                                    f.message,
                                ],
                                className="overview-finding",
                            )
                            for f in report.findings[:5]
                        ],
                        id="overview-findings",
                    ),
                    dcc.Link("All findings with their fixes →", href="/findings"),
                ],
                style=ui.CARD,
            ),
        ]
    )
