"""Timeline: all ranks on the aligned clock, one window at a time.

Why windowed: a large run has millions of events; every pan or zoom asks analysis.timeline
for the visible window only (events, or busy-time buckets when zoomed out), so the browser
never receives more than a few thousand rectangles. Clicking a collective, or reaching it
with a search's next/previous, outlines the same instance on every rank and lists it.
Deep link: `/timeline?rank=0,3&step=4&start=120.5&end=180&hl=CODE&cp=1`
(ms since the run's origin on the job clock; `hl`: the finding whose evidence is outlined;
`cp=1`: the critical path of the steps in view drawn over the lanes of its ranks; `q`: a
name searched, its matches outlined, stepped through in time order with next/previous;
`sel=RANK:STREAM:TS_NS:DUR_NS`: the selected event, by its raw start, its details shown, or
said to be missing); the address bar follows every pan, zoom and pick, so reload and share
show the same picture. Lanes are the run's (rank, host thread or device
stream), the same at every zoom; clicking an event lists every column of it and draws its
launch -> kernel flows. The logic is in dashboards/timeline_view.py.
"""

from __future__ import annotations

import re
from typing import Any

import dash
from dash import Input, Output, State, ctx, dcc, html
from ranklens.dashboards import components as ui
from ranklens.dashboards import timeline_details as td
from ranklens.dashboards.data import current
from ranklens.dashboards.timeline_view import (  # noqa: F401 (step_window: the findings page's)
    all_ranks,
    all_steps,
    instance_view,
    linked_selection,
    render,
    resolve,
    search_text,
    selection_instance,
    step_of,
    step_window,
    update,
)

PATH = "/timeline"
NAME = "Timeline"  # its link in the page bar
TITLE = "ranklens · timeline"  # in the browser tab
_DEFAULT_RANKS = 16  # ranks shown when none are asked for (more: pick them)


def register(app: dash.Dash) -> None:
    """Add the page and its callbacks to `app`."""
    ui.register_page(__name__, path=PATH, name=NAME, title=TITLE, layout=layout)

    # In the browser: pass on only relayouts that move the x axis. Plotly also reports resizes
    # ({"autosize": true}); sent to the server, such a request would supersede (and so discard)
    # the answer to a click or zoom still in flight.
    app.clientside_callback(  # type: ignore[no-untyped-call]
        """function(r) {
            if (r && ('xaxis.range[0]' in r || 'xaxis.range' in r || 'xaxis.autorange' in r)) {
                return r;
            }
            return window.dash_clientside.no_update;
        }""",
        Output("timeline-relayout", "data"),
        Input("timeline-graph", "relayoutData"),
        prevent_initial_call=True,
    )

    # The address bar follows the view (replaced, not pushed: a zoom is not a page).
    app.clientside_callback(  # type: ignore[no-untyped-call]
        """function(href) {
            if (href && href !== window.location.pathname + window.location.search) {
                window.history.replaceState(null, "", href);
            }
            return window.dash_clientside.no_update;
        }""",
        Output("timeline-url", "data"),
        Input("timeline-permalink", "href"),
    )

    @app.callback(
        Output("timeline-graph", "figure"),
        Output("timeline-window", "data"),
        Output("timeline-label", "children"),
        Output("timeline-permalink", "href"),
        Output("timeline-instance", "children"),
        Output("timeline-step", "value"),
        Output("timeline-ranks", "value"),
        Output("timeline-details", "children"),
        Output("timeline-search-pos", "children"),
        Input("timeline-relayout", "data"),
        Input("timeline-graph", "clickData"),
        Input("timeline-ranks", "value"),
        Input("timeline-step", "value"),
        Input("timeline-reset", "n_clicks"),
        Input("timeline-cp", "value"),
        Input("timeline-search", "n_submit"),
        Input("timeline-search-next", "n_clicks"),
        Input("timeline-search-prev", "n_clicks"),
        State("timeline-window", "data"),
        State("timeline-search", "value"),
        prevent_initial_call=True,
    )
    def _update(*args: Any) -> tuple[Any, ...]:
        relayout, click, ranks, step, _reset, cp, _enter, _next, _prev, win, q = args
        prop = ctx.triggered[0]["prop_id"] if ctx.triggered else ""
        return update(current(), prop, relayout, click, ranks, step, win, cp, q)


def _span(values: list[int]) -> str:
    """`0–7` for a run of consecutive numbers, else the list (or "none")."""
    if not values:
        return "none"
    if values == list(range(values[0], values[-1] + 1)) and len(values) > 2:
        return f"{values[0]}–{values[-1]}"
    return ", ".join(map(str, values))


def layout(
    rank: Any = None,
    step: Any = None,
    start: Any = None,
    end: Any = None,
    hl: Any = None,
    cp: Any = None,
    q: Any = None,
    sel: Any = None,
    **_: Any,
) -> html.Div:
    """The timeline at the window the URL names (ranks, step, start/end in ms, the finding
    whose evidence is outlined, the critical path drawn, a name searched, the selected
    event); ranks, a step or an event the run does not have are said so."""
    data = current()
    every = all_ranks(data)
    asked = ui.parse_ints(rank) or []
    ranks = [r for r in asked if r in every] or None
    notes = []
    if set(asked) - set(every):
        gone = ", ".join(str(r) for r in sorted(set(asked) - set(every)))
        notes.append(f"rank {gone} is not in this run (its ranks: {_span(every)})")
    if ranks is None and len(every) > _DEFAULT_RANKS:
        ranks = every[:_DEFAULT_RANKS]
    steps = all_steps(data)
    step_i = ui.parse_int(step)
    if step_i is not None and step_i not in steps:
        notes.append(
            f"step {step_i} is not in this run (its steps: {_span(steps)}); "
            + (f"showing step {steps[0]}" if steps else "showing the whole run")
        )
        step_i = None
    if step_i is None and ui.parse_float(start) is None and steps:
        step_i = steps[0]  # resolve() opens the first step: say so in the step picker
    code = str(hl) if hl and re.fullmatch(r"[A-Z][A-Z0-9_]{0,63}", str(hl)) else None
    picked, missing = linked_selection(data, sel)
    notes += [missing] if missing else []
    s, e = resolve(data, ranks, step_i, ui.parse_float(start), ui.parse_float(end), picked)
    path_on = str(cp) == "1"
    text = search_text(q)
    # A selected collective: its instance on every rank outlined and listed, as a click does.
    inst, info = selection_instance(data, picked) if picked else (None, None)
    fig, label, href = render(data, ranks, s, e, inst, code, path_on, text, picked)
    step_i = step_of(data, ranks, s, e)
    return html.Div(
        [
            ui.title(
                "Timeline",
                "Aligned clock; per rank its host threads, then its device streams, nested "
                "slices stacked. Drag to zoom, double-click to see the whole run, click an "
                "event to see every column of it and its launch → kernel flows (a collective: "
                "on every rank). Red: exposed communication; grey: idle / pipeline bubble; "
                "dotted: step boundaries.",
            ),
            html.Div(
                [
                    *ui.rank_menu("timeline-ranks", ranks, every),
                    *ui.step_menu("timeline-step", steps, step_i, clearable=True),
                    html.Button("Whole run", id="timeline-reset"),
                    dcc.Checklist(
                        id="timeline-cp",
                        options=[{"label": " critical path", "value": "on"}],
                        value=["on"] if path_on else [],
                    ),
                    dcc.Input(
                        id="timeline-search",
                        type="search",
                        value=text,  # searched on Enter (n_submit), see timeline_view.SEARCH
                        placeholder="search names, Enter",
                        style={"width": "180px"},
                    ),
                    html.Button("◀", id="timeline-search-prev", title="previous match"),
                    html.Button("▶", id="timeline-search-next", title="next match"),
                    html.Span(id="timeline-search-pos", style={"color": "#444"}),
                    html.A("link to this view", id="timeline-permalink", href=href),
                ],
                style=ui.CONTROLS,
            ),
            html.Div(
                "; ".join(notes),
                id="timeline-warning",
                style={"color": "#a60", "fontWeight": "bold"} if notes else {"display": "none"},
            ),
            html.Div(label, id="timeline-label", style={"color": "#444", "margin": "6px 0"}),
            dcc.Store(
                id="timeline-window",
                data={
                    "start_ns": s,
                    "end_ns": e,
                    "hl": code,
                    "cp": path_on,
                    "q": text,
                    "sel": picked,
                },
            ),
            dcc.Store(id="timeline-relayout"),
            dcc.Store(id="timeline-url"),
            dcc.Graph(
                id="timeline-graph",
                figure=fig,
                config={"displaylogo": False, "scrollZoom": True},
            ),
            html.Div(
                td.panel(data, picked) if picked else None,
                id="timeline-details",
                style={"margin": "8px 0"},
            ),
            html.Div(info, id="timeline-instance", style={"margin": "8px 0"}),
        ]
    )
