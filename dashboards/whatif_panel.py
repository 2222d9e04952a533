"""The Findings page's what-if panel: what a finding's fix saves, and a form to replay fixes.

Why apart from the page: the form has its own callback and the findings list stays readable;
every number comes from data_whatif (the replay of the run's kept graph), this only lays out.
Exact nanoseconds ride on `data-*` attributes, so scripts and tests read what was computed.
"""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, State, dcc, html
from ranklens.analysis import Finding, savings
from ranklens.dashboards import components as ui
from ranklens.dashboards import data_whatif as dw
from ranklens.dashboards.data import current
from ranklens.dashboards.figures import MS

_ERROR = {"color": "#B00020", "fontWeight": "bold", "margin": "6px 0"}
_INPUT = {"width": "140px"}


def saving(f: Finding) -> html.Span:
    """A finding's cost: the replayed saving of its fix, else its time at stake (an estimate)."""
    if f.saving_ns is not None:
        why = savings.not_shorter(f)
        gain = f"saves {f.saving_ns / MS:.3f} ms per step" if why is None else f"no saving ({why})"
        return html.Span(
            f" · {gain} ({f.saving_method}; "
            f"{f.time_at_stake_ns / MS:.2f} ms per step at stake by estimate)",
            className="finding-saving",
            **_data({"data-saving-ns": str(f.saving_ns), "data-method": f.saving_method or ""}),
        )
    stake = f"~{f.time_at_stake_ns / MS:.2f} ms per step at stake (estimate: no replay of this fix)"
    return html.Span(
        f" · {stake if f.time_at_stake_ns else savings.NO_STAKE}",
        className="finding-stake",
    )


def register(app: dash.Dash) -> None:
    """The form's callback: replay what it names, show the answer or what is wrong."""

    @app.callback(
        Output("whatif-result", "children"),
        Output("whatif-error", "children"),
        Output("whatif-error", "style"),
        Output("whatif-done", "children"),
        Input("whatif-run", "n_clicks"),
        State("whatif-scenarios", "value"),
        State("whatif-straggler-rank", "value"),
        State("whatif-scale-comm", "value"),
        State("whatif-scale-kernels", "value"),
        prevent_initial_call=True,
    )
    def _run(n: Any, chosen: Any, rank: Any, comm: Any, kernels: Any) -> tuple[Any, ...]:
        names = dw.scenario_names(chosen, _text(rank), _text(comm), _text(kernels))
        return (*result(dw.run(current(), names)), str(n))  # whatif-done: which press answered


def _data(attrs: dict[str, str]) -> Any:
    """`data-*` attributes as keyword arguments (Dash takes them; its stubs do not say so)."""
    return attrs


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def result(ans: dw.Answer) -> tuple[Any, str, dict[str, str]]:
    """The answer as a table (children of whatif-result) or its message (whatif-error)."""
    if ans.error is not None:
        return None, ans.error, _ERROR
    head = html.Tr(
        [html.Th(c) for c in ("scenario", "predicted step (ms)", "saving (ms)", "saving", "note")]
    )
    rows = [
        html.Tr(
            [
                html.Td(str(r["name"])),
                html.Td(f"{int(str(r['predicted_step_ns'])) / MS:.3f}"),
                html.Td(f"{int(str(r['saving_ns'])) / MS:.3f}"),
                html.Td(f"{float(str(r['saving_share'])):.1%}"),
                html.Td(str(r["note"] or "")),
            ],
            className="whatif-row",
            **_data(
                {
                    "data-scenario": str(r["name"]),
                    "data-predicted-ns": str(r["predicted_step_ns"]),
                    "data-saving-ns": str(r["saving_ns"]),
                }
            ),
        )
        for r in ans.rows
    ]
    summary = html.Div(
        f"measured step {ans.measured_step_ns / MS:.3f} ms, replayed unchanged "
        f"{ans.replayed_step_ns / MS:.3f} ms (means over steps)",
        id="whatif-summary",
        **_data({"data-replayed-ns": str(ans.replayed_step_ns)}),
    )
    table = html.Table([html.Thead(head), html.Tbody(rows)], className="ranklens-table")
    return html.Div([summary, table]), "", {"display": "none"}


def panel() -> html.Div:
    """The form: the fixes that apply to this run, and fields for the parametrised ones."""
    data = current()
    why = dw.unavailable(data)
    if why:
        return html.Div(why, id="whatif-panel", style={**ui.CARD, "color": "#a60"})
    options = dw.scenario_options(data)
    return html.Div(
        [
            html.B("What if: replay the run's dependency graph with a fix"),
            html.Div(
                "Same order and dependencies, changed durations; the saving is the step time "
                "the replay gains over the unchanged graph.",
                style={"color": "#555", "fontSize": "13px"},
            ),
            dcc.Checklist(
                id="whatif-scenarios",
                options=[{"label": f" {o}", "value": o} for o in options],
                value=[],
                inline=True,
                inputStyle={"marginLeft": "10px"},
            ),
            html.Div(
                [
                    html.Label("straggler rank "),
                    dcc.Input(
                        id="whatif-straggler-rank",
                        type="text",
                        placeholder="e.g. 3",
                        style={"width": "70px"},
                    ),
                    html.Label(" scale-comm "),
                    dcc.Input(
                        id="whatif-scale-comm", type="text", placeholder="dp=2", style=_INPUT
                    ),
                    html.Label(" scale-kernels "),
                    dcc.Input(
                        id="whatif-scale-kernels", type="text", placeholder="gemm=0.8", style=_INPUT
                    ),
                    html.Button("Replay", id="whatif-run"),
                ],
                style={"display": "flex", "gap": "6px", "alignItems": "center", "margin": "6px 0"},
            ),
            html.Div(id="whatif-error", style={"display": "none"}),
            html.Div("0", id="whatif-done", style={"display": "none"}),
            dcc.Loading(html.Div(id="whatif-result")),
        ],
        id="whatif-panel",
        style=ui.CARD,
    )
