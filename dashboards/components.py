"""Small layout pieces shared by the pages: URL parameters, tables, messages, links.

Why here: every page parses the same deep-link parameters (rank, step, window) the same way,
and says "not available" the same way when its analysis is missing for a run.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from types import ModuleType
from typing import Any
from urllib.parse import urlencode

import dash
import plotly.graph_objects as go
import polars as pl
from dash import dcc, html
from ranklens.dashboards import tables
from ranklens.dashboards.data import RunData, current

CARD = {
    "border": "1px solid #ddd",
    "borderRadius": "6px",
    "padding": "10px 14px",
    "margin": "8px 0",
    "background": "white",
}

# A flex item that may shrink below its graph's initial width, so two graphs share a row.
CELL = {"flex": "1 1 480px", "minWidth": "0"}
GRAPH: Any = {"displaylogo": False}  # every graph's config: no plotly logo
CONTROLS = {"display": "flex", "gap": "10px", "alignItems": "center"}  # a page's menus, a row


def register_page(
    module: str, *, layout: Callable[..., Any], keep: bool = True, **kwargs: Any
) -> None:
    """dash.register_page, typed (pages call it from their `register(app)`), the page kept
    per run and URL query: a page draws analysis results, which never change while the run
    is served, so the same query is the same page (tables and figures take a while).
    `keep=False` for a page that shows what a user asked for (the SQL console's results)."""

    def kept(**query: Any) -> Any:
        key = ("page", module, tuple(sorted((k, str(v)) for k, v in query.items())))
        return current().memo(key, lambda: layout(**query))

    dash.register_page(module, layout=kept if keep else layout, **kwargs)  # type: ignore[no-untyped-call]


def figure(data: RunData, key: Hashable, build: Callable[[], go.Figure]) -> dict[str, Any]:
    """`build()` as the plain dict dcc.Graph takes, made once per run and `key` (numbers as
    typed arrays), so a page's second visit neither validates nor converts it again."""
    out = data.memo(key, lambda: build().to_plotly_json())
    assert isinstance(out, dict)
    return out


def nav(pages: Iterable[ModuleType]) -> html.Nav:
    """The page links, always on top: each page's NAME linking to its PATH, in order."""
    return html.Nav(
        [dcc.Link(p.NAME, href=p.PATH, style={"marginRight": "18px"}) for p in pages],
        style={"padding": "8px 0", "borderBottom": "1px solid #ddd", "marginBottom": "8px"},
    )


def cells(*items: Any) -> html.Div:
    """Items (graphs) side by side, each a CELL, wrapping onto more rows when narrow."""
    return html.Div(
        [html.Div(item, style=CELL) for item in items],
        style={"display": "flex", "flexWrap": "wrap", "gap": "8px"},
    )


def graph(id_: str, data: RunData, key: Hashable, build: Callable[[], go.Figure]) -> dcc.Graph:
    """A graph of `figure(data, key, build)`, made once per run and key."""
    return dcc.Graph(id=id_, config=GRAPH, figure=figure(data, key, build))


def menu(
    label: str, id_: str, options: list[dict[str, Any]], value: Any, width: str, clearable: bool
) -> list[Any]:
    """A label and its dropdown of one choice."""
    return [
        html.Label(label),
        dcc.Dropdown(
            id=id_, options=options, value=value, clearable=clearable, style={"width": width}
        ),
    ]


def step_menu(
    id_: str,
    steps: list[int],
    value: int | None,
    *,
    clearable: bool = False,
    label: str = " Step ",
    width: str = "120px",
) -> list[Any]:
    """The step picker of a page: `steps` (the run's), `value` chosen."""
    options = [{"label": str(s), "value": s} for s in steps]
    return menu(label, id_, options, value, width, clearable)


def rank_menu(id_: str, value: list[int] | None, every: list[int]) -> list[Any]:
    """The ranks picker of a page (several; none chosen: all ranks)."""
    return [
        html.Label("Ranks "),
        dcc.Dropdown(
            id=id_,
            multi=True,
            value=value,
            placeholder="all ranks",
            style={"minWidth": "300px"},
            options=[{"label": f"rank {r}", "value": r} for r in every],
        ),
    ]


def pick_step(step: Any, steps: list[int]) -> int | None:
    """The step a URL parameter asks for when the run has it, else the first (None: no steps)."""
    asked = parse_int(step)
    return asked if asked in steps else (steps[0] if steps else None)


def parse_int(value: Any) -> int | None:
    """An int from a URL parameter, or None when absent or malformed."""
    if value is None or value == "":
        return None
    try:
        return int(str(value).split(",")[0])
    except ValueError:
        return None


def parse_ints(value: Any) -> list[int] | None:
    """A comma-separated list of ints (`rank=1,3`), or None."""
    if value is None or value == "":
        return None
    items = [str(v) for v in value] if isinstance(value, list) else str(value).split(",")
    out = []
    for item in items:
        try:
            out.append(int(item))
        except ValueError:
            continue
    return out or None


def parse_float(value: Any) -> float | None:
    """A float from a URL parameter, or None."""
    if value is None or value == "":
        return None
    try:
        return float(value)
    except ValueError:
        return None


def unavailable(name: str, why: str | None) -> html.Div:
    """What a page shows when its analysis has no result for this run."""
    return html.Div(
        [
            html.Strong(f"The {name} analysis is not available for this run."),
            html.Div(why or "", style={"color": "#666"}),
        ],
        className="ranklens-unavailable",
        style={**CARD, "background": "#fff8e6"},
    )


def title(text: str, subtitle: str = "") -> html.Div:
    return html.Div(
        [html.H2(text, style={"margin": "4px 0"}), html.Div(subtitle, style={"color": "#555"})]
    )


def table(
    df: pl.DataFrame,
    id_: str,
    max_rows: int = 200,
    *,
    t0_ns: int | None = None,
    groups: Mapping[str, str] | None = None,
    sort_by: str | None = "auto",
) -> html.Div:
    """A polars frame as a plain HTML table (scrolling), as tables.readable shapes it: the
    costliest rows first (`sort_by`), empty columns left out, durations in ms and instants in
    ms since `t0_ns`, groups by `groups`' labels, 3 significant digits."""
    shown = tables.readable(df, t0_ns=t0_ns, groups=groups, sort_by=sort_by)
    # Cells are styled by the page's stylesheet (page_speed.py), not each by its own style:
    # a few hundred rows of inline styles were most of a page's JSON.
    head = html.Thead(html.Tr([html.Th(c) for c in shown.columns]))
    body = html.Tbody(
        [
            html.Tr([html.Td(tables.cell(c, v), **_data_column(c)) for c, v in row.items()])
            for row in shown.head(max_rows).iter_rows(named=True)
        ]
    )
    note = (
        f"{max_rows} of {shown.height} rows shown"
        if shown.height > max_rows
        else f"{shown.height} rows"
    )
    return html.Div(
        [
            html.Table([head, body], id=id_, className="ranklens-table"),
            html.Div(note, style={"color": "#777", "fontSize": "12px"}),
        ],
        style={"overflow": "auto", "maxHeight": "480px", "background": "white"},
    )


def _data_column(name: str) -> Any:
    """`data-column` on a cell, so tests and users' scripts can address columns by name."""
    return {"data-column": name}


def run_table(data: RunData, df: pl.DataFrame, id_: str, **kwargs: Any) -> html.Div:
    """`table` with the run's origin and group labels (what every analysis table needs)."""
    return table(
        df, id_, t0_ns=data.extent().t0_ns, groups=data.report().facts.get("groups"), **kwargs
    )


def evidence(ev: Mapping[str, Any], id_: str, groups: Mapping[str, str] | None = None) -> html.Div:
    """A finding's evidence as labelled values and small tables (tables.evidence_items)."""
    parts: list[Any] = []
    for i, (label, value) in enumerate(tables.evidence_items(ev, groups)):
        if isinstance(value, pl.DataFrame):
            parts += [html.Div(html.B(label)), table(value, f"{id_}-{i}", max_rows=20)]
        else:
            parts.append(html.Div([html.B(f"{label}: "), value]))
    return html.Div(parts, className="finding-evidence")


def timeline_href(
    ranks: list[int] | tuple[int, ...] | None = None,
    step: int | None = None,
    start_ms: float | None = None,
    end_ms: float | None = None,
    hl: str | None = None,
    cp: bool = False,
) -> str:
    """A deep link into the timeline: ranks, step, window in ms since the run's origin, the
    finding code whose evidence is outlined (`hl`), the critical path drawn (`cp`)."""
    q: dict[str, str] = {}
    if ranks:
        q["rank"] = ",".join(str(r) for r in ranks)
    if step is not None:
        q["step"] = str(step)
    if start_ms is not None and end_ms is not None:
        q["start"] = f"{start_ms:.3f}"
        q["end"] = f"{end_ms:.3f}"
    if hl:
        q["hl"] = hl
    if cp:
        q["cp"] = "1"
    return "/timeline" + ("?" + urlencode(q, safe=",") if q else "")
