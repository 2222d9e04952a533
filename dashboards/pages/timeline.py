"""Timeline: all ranks on the aligned clock, one window at a time.

Why windowed: a large run has millions of events; every pan or zoom asks analysis.timeline
for the visible window only (events, or busy-time buckets when zoomed out), so the browser
never receives more than a few thousand rectangles. Clicking a collective outlines the same
instance on every rank. Deep link: `/timeline?rank=0,3&step=4&start=120.5&end=180&hl=CODE&cp=1`
(ms since the run's origin on the job clock; `hl`: the finding whose evidence is outlined;
`cp=1`: the critical path of the steps in view drawn over the lanes of its ranks);
the address bar follows every pan, zoom and pick, so reload and share show the same picture.
"""

from __future__ import annotations

import re
from typing import Any

import dash
import polars as pl
from dash import Input, Output, State, ctx, dcc, html
from ranklens.analysis import timeline as tl
from ranklens.dashboards import components as ui
from ranklens.dashboards import data_whatif as dw
from ranklens.dashboards.data import RunData, current, evidence
from ranklens.dashboards.figures import MS
from ranklens.dashboards.figures_timeline import timeline as timeline_figure

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
        Input("timeline-relayout", "data"),
        Input("timeline-graph", "clickData"),
        Input("timeline-ranks", "value"),
        Input("timeline-step", "value"),
        Input("timeline-reset", "n_clicks"),
        Input("timeline-cp", "value"),
        State("timeline-window", "data"),
        prevent_initial_call=True,
    )
    def _update(*args: Any) -> tuple[Any, ...]:
        relayout, click, ranks, step, _reset, cp, win = args
        prop = ctx.triggered[0]["prop_id"] if ctx.triggered else ""
        return update(current(), prop, relayout, click, ranks, step, win, cp)


def step_of(data: RunData, ranks: list[int] | None, start: int, end: int) -> int | None:
    """The step whose window (over `ranks`) holds the view, so the Step menu never names a
    step the view has left."""
    sw = data.cached("step_windows", tl.step_windows)
    if ranks:
        sw = sw.filter(pl.col("rank").is_in(ranks))
    w = sw.group_by("step").agg(pl.col("start_ns").min(), pl.col("end_ns").max())
    # Ranks' step windows overlap at the edges: the step that began last holds the view.
    # (to the µs a link's window is written in)
    hit = w.filter((pl.col("start_ns") <= start + 1000) & (pl.col("end_ns") >= end - 1000))
    return int(hit.sort("start_ns")["step"][-1]) if hit.height else None


def step_window(data: RunData, step: int, ranks: list[int] | None) -> tuple[int, int] | None:
    """The step's window on the job clock over the chosen ranks (from the steps table)."""
    sw = data.cached("step_windows", tl.step_windows).filter(pl.col("step") == step)
    if ranks:
        sw = sw.filter(pl.col("rank").is_in(ranks))
    if sw.is_empty():
        return None
    return int(sw["start_ns"].min()), int(sw["end_ns"].max())


def resolve(
    data: RunData,
    ranks: list[int] | None,
    step: int | None,
    start_ms: float | None,
    end_ms: float | None,
) -> tuple[int, int]:
    """The window a deep link asks for: start/end, else the step, else the first step."""
    ext = data.extent()
    if start_ms is not None and end_ms is not None and end_ms > start_ms:
        return ext.t0_ns + int(start_ms * MS), ext.t0_ns + int(end_ms * MS)
    steps = all_steps(data)
    if step is None and steps:
        step = steps[0]
    if step is not None:
        w = step_window(data, step, ranks)
        if w is not None:
            return w
    return ext.t0_ns, max(ext.t1_ns, ext.t0_ns + 1)


def _span(values: list[int]) -> str:
    """`0–7` for a run of consecutive numbers, else the list (or "none")."""
    if not values:
        return "none"
    if values == list(range(values[0], values[-1] + 1)) and len(values) > 2:
        return f"{values[0]}–{values[-1]}"
    return ", ".join(map(str, values))


def all_steps(data: RunData) -> list[int]:
    sw = data.cached("step_windows", tl.step_windows)
    return [int(s) for s in sw["step"].unique().sort().to_list()]


def all_ranks(data: RunData) -> list[int]:
    return [int(r) for r in data.report().facts.get("ranks") or []]


def render(
    data: RunData,
    ranks: list[int] | None,
    start_ns: int,
    end_ns: int,
    highlight: pl.DataFrame | None = None,
    hl: str | None = None,
    cp: bool = False,
) -> tuple[dict[str, Any], str, str]:
    """Figure, label and permalink of one window; `hl` outlines that finding's evidence,
    `cp` draws the critical path of the steps in view."""
    ext = data.extent()
    cur = data.cursor()
    try:
        win = tl.window(cur, ext, start_ns, end_ns, ranks, base=data.timeline_base())
        shown = evidence(cur, win, hl, ranks) if hl else None
    finally:
        cur.close()
    outlined = pl.concat(
        [
            h.select("rank", "stream", "start_ns", "end_ns")
            for h in (highlight, shown)
            if h is not None and not h.is_empty()
        ]
        or [pl.DataFrame(schema={"rank": pl.Int64})],
        how="diagonal_relaxed",
    )
    path = dw.path_segments(data, start_ns, end_ns, ranks) if cp else None
    fig = timeline_figure(win, ext.t0_ns, outlined if outlined.height else None, path)
    s_ms, e_ms = (start_ns - ext.t0_ns) / MS, (end_ns - ext.t0_ns) / MS
    label = (
        f"window {s_ms:.3f} – {e_ms:.3f} ms ({e_ms - s_ms:.3f} ms), "
        f"{'all ranks' if not ranks else 'ranks ' + ', '.join(map(str, ranks))}, "
        + (
            f"{win.events.height} events"
            if win.mode == "events"
            else f"aggregated into {win.bucket_ns / MS:.3g} ms buckets"
        )
    )
    if hl:
        label += f"; evidence of {hl}: " + (
            f"{shown.height} events outlined" if shown is not None else "none drawn as events"
        )
    if path is not None:
        steps = ", ".join(str(x) for x in path["step"].unique().sort().to_list()) or "none"
        label += f"; critical path: {path.height} segments (steps {steps})"
    step = step_of(data, ranks, start_ns, end_ns)
    return fig, label, ui.timeline_href(ranks, step, s_ms, e_ms, hl, cp)


def update(
    data: RunData,
    trigger: Any,
    relayout: Any,
    click: Any,
    ranks_v: Any,
    step_v: Any,
    win: dict[str, Any],
    cp_v: Any = None,
) -> tuple[Any, ...]:
    """One callback for every way the window changes (pan/zoom, ranks, step, click, reset,
    path toggle); `trigger`: the Dash prop id that fired, e.g. "timeline-relayout.data"."""
    ranks = ui.parse_ints(ranks_v)
    start, end = int(win["start_ns"]), int(win["end_ns"])
    hl = win.get("hl")
    cp = bool(cp_v) if trigger == "timeline-cp.value" else bool(win.get("cp"))
    highlight = None
    info: Any = dash.no_update
    if trigger == "timeline-graph.clickData":
        highlight, info = instance_view(data, click)
        if highlight is None:
            return (dash.no_update,) * 4 + (info,) + (dash.no_update,) * 2
        # Show the whole instance on every member rank, even where it lies outside the view.
        lo, hi = int(highlight["arrive_ns"].min()), int(highlight["end_ns"].max())  # type: ignore[arg-type]
        pad = max((hi - lo) // 10, 1000)
        start, end = min(start, lo - pad), max(end, hi + pad)
        if ranks:
            ranks = sorted(set(ranks) | set(highlight["rank"].to_list()))
    elif trigger == "timeline-relayout.data":
        new = _relayout_window(data, relayout, start, end)
        if new is None:
            return (dash.no_update,) * 7
        start, end = new
    elif trigger == "timeline-step.value":
        step = ui.parse_int(step_v)
        w = step_window(data, step, ranks) if step is not None else None
        if w is not None:
            start, end = w
    elif trigger == "timeline-reset.n_clicks":
        ext = data.extent()
        start, end = ext.t0_ns, max(ext.t1_ns, ext.t0_ns + 1)
    fig, label, href = render(data, ranks, start, end, highlight, hl, cp)
    step = step_of(data, ranks, start, end)
    store = {"start_ns": start, "end_ns": end, "hl": hl, "cp": cp}
    return fig, store, label, href, info, step, ranks


def _relayout_window(data: RunData, relayout: Any, start: int, end: int) -> tuple[int, int] | None:
    if not isinstance(relayout, dict):
        return None
    t0 = data.extent().t0_ns
    if "xaxis.range[0]" in relayout and "xaxis.range[1]" in relayout:
        lo, hi = float(relayout["xaxis.range[0]"]), float(relayout["xaxis.range[1]"])
    elif isinstance(relayout.get("xaxis.range"), list):
        lo, hi = (float(v) for v in relayout["xaxis.range"][:2])
    elif relayout.get("xaxis.autorange"):
        ext = data.extent()
        return ext.t0_ns, max(ext.t1_ns, ext.t0_ns + 1)
    else:
        return None
    new = (t0 + int(lo * MS), t0 + int(hi * MS))
    if new[1] <= new[0] or (abs(new[0] - start) < 1000 and abs(new[1] - end) < 1000):
        return None
    return new


def instance_view(data: RunData, click: Any) -> tuple[pl.DataFrame | None, Any]:
    """The clicked event's collective instance on every rank, and a table of it."""
    try:
        rank, stream, rel_ns = (int(v) for v in click["points"][0]["customdata"][:3])
    except (KeyError, IndexError, TypeError, ValueError):
        return None, dash.no_update
    ts_ns = data.extent().t0_ns + rel_ns  # the figure carries raw starts relative to t0
    cur = data.cursor()
    try:
        inst = tl.instance(cur, rank, stream, ts_ns)
    finally:
        cur.close()
    if inst.is_empty():
        return None, html.Div(
            "the clicked event is not part of a matched collective", id="timeline-instance-none"
        )
    t0 = data.extent().t0_ns
    shown = inst.select(
        "instance_id",
        "rank",
        "op",
        "pg_name",
        "parallelism",
        "status",
        "bytes",
        *[
            ((pl.col(c) - t0) / MS).round(3).alias(c.replace("_ns", "_ms"))
            for c in ("arrive_ns", "start_ns", "end_ns")
        ],
    )
    head = (
        f"collective instance {inst['instance_id'][0]}: {inst['op'][0]} on "
        f"{inst.height} ranks (outlined in the timeline)"
    )
    return inst, html.Div([html.B(head), ui.table(shown, "timeline-instance-table")], style=ui.CARD)


def layout(
    rank: Any = None,
    step: Any = None,
    start: Any = None,
    end: Any = None,
    hl: Any = None,
    cp: Any = None,
    **_: Any,
) -> html.Div:
    """The timeline at the window the URL names (ranks, step, start/end in ms, the finding
    whose evidence is outlined, the critical path drawn); ranks or a step the run does not
    have are said so."""
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
    s, e = resolve(data, ranks, step_i, ui.parse_float(start), ui.parse_float(end))
    path_on = str(cp) == "1"
    fig, label, href = render(data, ranks, s, e, None, code, path_on)
    step_i = step_of(data, ranks, s, e)
    return html.Div(
        [
            ui.title(
                "Timeline",
                "Aligned clock; drag to zoom, double-click to see the whole run, "
                "click a collective to see it on every rank. Red: exposed communication; "
                "grey: idle / pipeline bubble.",
            ),
            html.Div(
                [
                    html.Label("Ranks "),
                    dcc.Dropdown(
                        id="timeline-ranks",
                        multi=True,
                        value=ranks,
                        options=[{"label": f"rank {r}", "value": r} for r in every],
                        placeholder="all ranks",
                        style={"minWidth": "300px"},
                    ),
                    html.Label(" Step "),
                    dcc.Dropdown(
                        id="timeline-step",
                        value=step_i,
                        clearable=True,
                        options=[{"label": str(x), "value": x} for x in steps],
                        style={"width": "120px"},
                    ),
                    html.Button("Whole run", id="timeline-reset"),
                    dcc.Checklist(
                        id="timeline-cp",
                        options=[{"label": " critical path", "value": "on"}],
                        value=["on"] if path_on else [],
                    ),
                    html.A("link to this view", id="timeline-permalink", href=href),
                ],
                style={"display": "flex", "gap": "10px", "alignItems": "center"},
            ),
            html.Div(
                "; ".join(notes),
                id="timeline-warning",
                style={"color": "#a60", "fontWeight": "bold"} if notes else {"display": "none"},
            ),
            html.Div(label, id="timeline-label", style={"color": "#444", "margin": "6px 0"}),
            dcc.Store(
                id="timeline-window", data={"start_ns": s, "end_ns": e, "hl": code, "cp": path_on}
            ),
            dcc.Store(id="timeline-relayout"),
            dcc.Store(id="timeline-url"),
            dcc.Graph(
                id="timeline-graph",
                figure=fig,
                config={"displaylogo": False, "scrollZoom": True},
            ),
            html.Div(id="timeline-instance", style={"margin": "8px 0"}),
        ]
    )
