"""Compare: the current run against a baseline, per rank (and PP stage), as check judges them.

Why: "did my change make it slower, where?" is answered rank by rank: step time in ms and %,
bubble, exposed comm and comm share per parallelism, with the differences `ranklens check
--baseline` would call regressions highlighted in their metric's colour and the ranks that
regressed most on top. The header says what check would print with the same thresholds.
Opened with `ranklens dashboard RUN --baseline BASE [--config FILE] [--max-regression X]`.
"""

from __future__ import annotations

import os
from typing import Any

import dash
from dash import dcc, html
from ranklens.analysis.baseline import Change
from ranklens.analysis.check import Verdict
from ranklens.dashboards import components as ui
from ranklens.dashboards import data_compare as dc
from ranklens.dashboards import figures_compare as figs
from ranklens.dashboards import tables
from ranklens.dashboards.data import current
from ranklens.dashboards.figures import SEVERITY_COLORS
from ranklens.ingest.errors import RanklensError

PATH = "/compare"
NAME = "Compare"  # its link in the page bar
TITLE = "ranklens · compare"  # in the browser tab
HOW = "ranklens dashboard RUN --baseline BASE"


def register(app: dash.Dash) -> None:
    """Add the page to `app`."""
    ui.register_page(__name__, path=PATH, name=NAME, title=TITLE, layout=layout)


def layout(**_: Any) -> html.Div:
    """The comparison, or how to open a baseline when the dashboard has none."""
    data, base = current(), dc.baseline()
    if base is None:
        return html.Div(
            [
                ui.title("Compare runs"),
                html.Div(
                    [
                        html.Strong("No baseline run to compare with. "),
                        "Open the dashboard with one: ",
                        html.Code(HOW),
                        " (BASE: a ranklens database or trace directory, opened read-only "
                        "like RUN). The page then shows per rank what ",
                        html.Code("ranklens check RUN --baseline BASE"),
                        " judges.",
                    ],
                    id="compare-none",
                    style={**ui.CARD, "background": "#fff8e6"},
                ),
            ]
        )
    head = ui.title(
        "Compare runs",
        f"current {os.path.basename(data.db_path)} against baseline {base.name}; "
        "medians per step, as check --baseline compares them",
    )
    try:
        cmp = dc.comparison(data, base)
    except RanklensError as exc:  # malformed [tool.ranklens.check]
        return html.Div([head, html.Div(str(exc), id="compare-error", style=ui.CARD)])
    rows = dc.rank_rows(cmp)
    return html.Div(
        [
            head,
            verdict_card(cmp.verdicts, cmp.regressions, cmp.exit_code),
            legend(cmp.limit),
            html.Div(rank_table(rows, dc.columns(cmp), dc.base_stage_of_heavy(cmp))),
            dcc.Graph(id="compare-steps", figure=figs.step_times(rows), config=ui.GRAPH),
        ]
    )


def verdict_card(verdicts: tuple[Verdict, ...], regressions: tuple[str, ...], code: int) -> Any:
    """What `ranklens check RUN --baseline BASE` prints: each verdict and what regressed."""
    failed = code != 0
    status = html.Div(
        [
            html.B(f"check --baseline would {'FAIL' if failed else 'pass'} (exit {code})"),
        ],
        id="compare-status",
        style={"color": SEVERITY_COLORS["critical"] if failed else "#2b6e2b"},
    )
    lines = [
        html.Li(f"{v.status.upper()}  {v.message}", className=f"compare-verdict-{v.status}")
        for v in verdicts
    ]
    regs = [html.Li(r) for r in regressions]
    return html.Div(
        [status, html.Ul(lines, id="compare-verdicts", style={"margin": "4px 0"})]
        + ([html.Div("Regressed:"), html.Ul(regs, id="compare-regressions")] if regs else []),
        id="compare-verdict",
        style=ui.CARD,
    )


def legend(limit: float) -> html.Div:
    """What a highlighted cell means: check's rule, for every column, bubble included."""
    swatches = [
        html.Span(
            dc.LABELS[m],
            style={"background": figs.tint(c), "padding": "1px 6px", "marginRight": "6px"},
        )
        for m, c in figs.METRIC_COLORS.items()
    ]
    return html.Div(
        [
            f"Highlighted: worse by more than {100 * limit:.1f}% (step time: relative; shares: "
            "points of the step) and the runs' step-to-step noise, check's rule. ",
            *swatches,
            html.Br(),
            "Bubble: each PP stage's share of the step (median per step of the pipeline "
            "analysis), judged and counted by check --baseline like the others. "
            "Hover a cell for its noise.",
        ],
        id="compare-legend",
        style={"color": "#555", "fontSize": "13px", "margin": "6px 0"},
    )


def rank_table(rows: list[dc.RankRow], cols: list[dc.Column], was: list[int]) -> Any:
    """One row per rank, the biggest regression first."""
    if not rows:
        return html.Div("the runs have no rank and metric in common", id="compare-empty")
    has_pp = any(r.stage is not None for r in rows)
    heads = ["rank"] + (["stage"] if has_pp else [])
    heads += ["step base ms", "step current ms", "Δ ms", "Δ %"]
    heads += [c.label for c in cols if c.metric != "step_time"]
    body = []
    for r in rows:
        cells: list[Any] = [_td("rank", str(r.rank))]
        if has_pp:
            cells.append(_stage(r, was))
        cells += _step_cells(r.cells.get("step_time"), r.step_delta_ms())
        cells += [_share(c.id, r.cells.get(c.id)) for c in cols if c.metric != "step_time"]
        body.append(html.Tr(cells, className="compare-row", **_col(str(r.rank), "data-rank")))
    return html.Table(
        [html.Thead(html.Tr([html.Th(h) for h in heads])), html.Tbody(body)],
        id="compare-table",
        className="ranklens-table",
    )


def _td(column: str, text: str, change: Change | None = None, color: str | None = None) -> Any:
    """A cell addressable by `data-column`, tinted when its change is a regression."""
    flagged = change is not None and change.regression
    style = {"background": figs.tint(color), "fontWeight": "bold"} if flagged and color else {}
    attrs: Any = {"data-column": column}  # Any: dash types no data-* keyword
    if change is not None:
        unit = "%" if change.metric == "step_time" else " points"
        noise = "not measurable" if change.noise is None else f"±{tables.num(100 * change.noise)}"
        attrs["title"] = f"noise {noise}{unit if change.noise is not None else ''}"
        if change.time_delta is not None:  # why a share that rose may not be a regression
            attrs["title"] += (
                f"; its time per step {100 * change.time_delta:+.3g}% of the base step"
            )
        if change.offset:
            attrs["title"] += "; offset by other ranks' falls (who waits changed)"
    return html.Td(text, className="compare-regression" if flagged else None, style=style, **attrs)


def _col(value: str, attr: str = "data-column") -> Any:
    """A data-* attribute as a keyword (Any: dash's components declare none)."""
    return {attr: value}


def _stage(r: dc.RankRow, was: list[int]) -> Any:
    """The PP stage, marked when it is its pipeline's heaviest now (highlighted if it was not)."""
    text = "" if r.stage is None else str(r.stage)
    if r.heavy:
        before = "" if r.was_heavy else f" (was stage {', '.join(map(str, was)) or '?'})"
        text += f" · heaviest{before}"
    elif r.was_heavy:
        text += " · was heaviest"
    style = {"background": figs.tint(figs.HEAVY), "fontWeight": "bold"} if r.heavy else {}
    return html.Td(
        text,
        className="compare-heavy" if r.heavy and not r.was_heavy else None,
        style=style if r.heavy and not r.was_heavy else {},
        **_col("stage"),
    )


def _step_cells(c: Change | None, delta_ms: float | None) -> list[Any]:
    color = figs.METRIC_COLORS["step_time"]
    if c is None or delta_ms is None:
        return [_td(n, "") for n in ("step_base_ms", "step_ms", "step_delta_ms", "step_delta")]
    return [
        _td("step_base_ms", tables.num(c.base / dc.MS)),
        _td("step_ms", tables.num(c.cur / dc.MS), c, color),
        _td("step_delta_ms", f"{delta_ms:+,.3g}" if abs(delta_ms) < 100 else f"{delta_ms:+,.0f}"),
        _td("step_delta", f"{100 * c.delta:+.3g}%", c, color),
    ]


def _share(column: str, c: Change | None) -> Any:
    """'32.5% → 51.3% (+18.8 pts)'."""
    if c is None:
        return _td(column, "")
    text = f"{tables.pct(c.base)} → {tables.pct(c.cur)} ({100 * c.delta:+.3g} pts)"
    return _td(column, text, c, figs.METRIC_COLORS.get(c.metric))
