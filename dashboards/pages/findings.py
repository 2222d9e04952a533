"""Findings: every finding of every analysis, ranked by what its fix saves, with evidence and fix.

Why a page of its own: this is the "what do I change" answer; each finding links to the
timeline window that shows it so the user can see the evidence. Deep link: `/findings?code=X`.
"""

from __future__ import annotations

from typing import Any

import dash
from dash import dcc, html
from ranklens.analysis import Finding, savings
from ranklens.dashboards import components as ui
from ranklens.dashboards import tables, whatif_panel
from ranklens.dashboards.data import RunData, current
from ranklens.dashboards.figures import MS, SEVERITY_COLORS
from ranklens.dashboards.timeline_view import all_steps, step_window

PATH = "/findings"
NAME = "Findings"  # its link in the page bar
TITLE = "ranklens · findings"  # in the browser tab


def register(app: dash.Dash) -> None:
    """Add the page to `app`."""
    ui.register_page(__name__, path=PATH, name=NAME, title=TITLE, layout=layout)
    whatif_panel.register(app)


def timeline_link(data: RunData, f: Finding) -> str:
    """The timeline on a finding's ranks, at its first step (its window when it names no
    step), with its evidence outlined (`hl`): where the user sees what the finding says."""
    t0 = data.extent().t0_ns
    ranks = list(f.ranks) or None
    steps = [s for s in f.steps if s in all_steps(data)] or all_steps(data)[:1]
    w = step_window(data, steps[0], ranks) if steps and (f.steps or f.window_ns is None) else None
    if w is not None and f.window_ns is not None:  # the step, inside the finding's window
        w = (max(w[0], f.window_ns[0]), min(w[1], f.window_ns[1]))
        w = w if w[1] > w[0] else None
    if w is None and f.window_ns is not None:
        return ui.timeline_href(
            ranks, None, (f.window_ns[0] - t0) / MS, (f.window_ns[1] - t0) / MS, f.code
        )
    if w is None:
        return ui.timeline_href(ranks, steps[0] if steps else None, hl=f.code)
    return ui.timeline_href(ranks, steps[0], (w[0] - t0) / MS, (w[1] - t0) / MS, f.code)


def card(data: RunData, i: int, f: Finding) -> html.Div:
    """One finding: rank in the list, cost, message, fix, evidence, link to the timeline."""
    sev = f.severity.value
    facts = []
    if f.ranks:
        facts.append(
            f"ranks {', '.join(map(str, f.ranks[:32]))}{' ...' if len(f.ranks) > 32 else ''}"
        )
    if f.steps:
        facts.append(f"steps {', '.join(map(str, f.steps))}")
    if f.value is not None:
        facts.append(
            f"value {tables.num(f.value)}"
            + (f" (threshold {tables.num(f.threshold)})" if f.threshold is not None else "")
        )
    return html.Div(
        [
            html.Div(
                [
                    html.Span(f"#{i} ", style={"fontWeight": "bold"}),
                    html.Span(
                        sev,
                        style={
                            "color": "white",
                            "background": SEVERITY_COLORS[sev],
                            "padding": "1px 6px",
                            "borderRadius": "4px",
                        },
                    ),
                    html.B(f" {f.code}", className="finding-code"),
                    whatif_panel.saving(f),
                ]
            ),
            html.Div(f.message, className="finding-message", style={"margin": "4px 0"}),
            html.Div([html.B("Fix: "), f.fix], className="finding-fix"),
            html.Div(" · ".join(facts), style={"color": "#555", "fontSize": "13px"}),
            html.Details(
                [
                    html.Summary("evidence"),
                    ui.evidence(
                        f.evidence, f"finding-{i}-evidence", data.report().facts.get("groups")
                    ),
                ]
            )
            if f.evidence
            else None,
            dcc.Link(
                "show in the timeline →",
                href=timeline_link(data, f),
                className="finding-timeline-link",
            ),
        ],
        className="finding",
        style=ui.CARD,
    )


def layout(code: Any = None, **_: Any) -> html.Div:
    """All findings, most costly first; `code` keeps only findings with that code."""
    data = current()
    findings = list(data.report().findings)
    if code:
        findings = [f for f in findings if f.code == code]
    missing = [
        n
        for n in ("breakdown", "overlap", "stragglers", "collectives", "pipeline", "contention")
        if data.error(n)
    ]
    return html.Div(
        [
            ui.title(
                "Findings",
                "Ranked by the step time their fix saves (a replay of the run's dependency "
                "graph where one exists, else the time at stake); each says what to change.",
            ),
            html.Div(why, id="findings-not-replayed", style={"color": "#a60"})
            if (why := savings.not_replayed(data.report().facts))
            else None,
            whatif_panel.panel(),
            html.Div(f"not run: {', '.join(missing)}", style={"color": "#a60"})
            if missing
            else None,
            html.Div(
                [card(data, i, f) for i, f in enumerate(findings, 1)]
                or [html.Div("no findings: nothing crossed a threshold", style=ui.CARD)],
                id="findings-list",
            ),
        ]
    )
