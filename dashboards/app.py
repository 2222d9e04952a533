"""The Dash app factory: `create_app(db_path)` builds a multi-page dashboard over one run.

Why a factory with explicit page registration (not a scanned pages folder): nothing is read at
import time, each app carries its own run (several can live in one process, as in the tests),
and each page's callbacks are bound to the app that serves them.
"""

from __future__ import annotations

import os
from types import ModuleType

import dash
from dash import html
from ranklens.dashboards import components, data_compare, page_speed
from ranklens.dashboards.data import CONFIG_KEY, RunData, current
from ranklens.dashboards.data_compare import BASELINE_KEY, Baseline
from ranklens.dashboards.pages import (
    communication,
    compare,
    contention,
    findings,
    overview,
    pipeline,
    sql,
    timeline,
)

# The pages in the order of the page bar. Each module declares PATH, NAME (its link), TITLE,
# `register(app)` and `layout(...)`: adding a page is its module and one line here.
PAGES: tuple[ModuleType, ...] = (
    overview,
    timeline,
    pipeline,
    communication,
    contention,
    findings,
    compare,
    sql,
)


def create_app(
    db_path: str | os.PathLike[str],
    *,
    data: RunData | None = None,
    baseline: Baseline | None = None,
) -> dash.Dash:
    """A Dash app over the ranklens database at `db_path` (opened read-only, sandboxed), and
    the run it is compared with on the compare page (`baseline`, also read-only)."""
    run = data if data is not None else RunData(db_path)
    app = dash.Dash(
        __name__,
        use_pages=True,
        pages_folder="",
        title="ranklens",
        # assets/ holds plotly.js's partial bundle, which the page loads itself (page_speed)
        assets_ignore=r".*\.js$",
        suppress_callback_exceptions=True,
        update_title=None,  # type: ignore[arg-type]  # None: keep the tab title
    )
    app.server.config[CONFIG_KEY] = run
    app.server.config[BASELINE_KEY] = baseline
    page_speed.tune_index(app)
    for page in PAGES:
        page.register(app)
    app.layout = _layout
    return app


def warm_pages(app: dash.Dash, paths: list[str] | None = None) -> None:
    """Render every page's default view (or those at `paths`) once, so its figures are kept
    (RunData.memo) and the first visitor is served from memory (dashboards.server: the first
    page before the port opens, the others right after)."""
    for page in dash.page_registry.values():
        if paths is None or page["path"] in paths:
            with app.server.test_request_context(page["path"]):
                page["layout"]()


def page_paths() -> list[str]:
    """The registered pages' paths, in the page bar's order."""
    return [str(page["path"]) for page in dash.page_registry.values()]


def _layout() -> html.Div:
    """The frame around every page: the run it shows and the page links."""
    facts = current().report().facts
    steps = facts.get("steps") or []
    about = (
        f"{os.path.basename(current().db_path)} · {len(facts.get('ranks') or [])} ranks · "
        f"{len(steps)} steps"
        + (f" · missing ranks {facts['missing_ranks']}" if facts.get("missing_ranks") else "")
        + (f" · {', '.join(facts['devices'])}" if facts.get("devices") else "")
        + (f" · baseline {base.name}" if (base := data_compare.baseline()) is not None else "")
    )
    return html.Div(
        [
            html.Div(
                [
                    html.B("ranklens", style={"fontSize": "20px", "marginRight": "14px"}),
                    html.Span(about, id="run-about", style={"color": "#555"}),
                ],
            ),
            components.nav(PAGES),
            dash.page_container,
        ],
        style={"fontFamily": "system-ui, sans-serif", "margin": "0 16px", "background": "#fafafa"},
    )
