"""SQL: a read-only console over the run's tables and analysis views, results as a table + CSV.

Why it is safe to expose: each query runs in a process of its own (analysis.sql_isolated) on
the sandboxed connection of analysis.sql_console (read-only, one query statement, no files, no
ATTACH, no extensions, locked configuration) with a row, time, memory and result-size limit;
errors come back as messages. Deep link: `/sql?q=SELECT...` (run on every visit, never cached:
a page shows what its user asked, now).
"""

from __future__ import annotations

from typing import Any

import dash
import polars as pl
from dash import Input, Output, State, dcc, html
from ranklens.analysis.sql_console import MEMORY_LIMIT, MIB, SqlError, view_names
from ranklens.analysis.sql_isolated import run_sql_isolated
from ranklens.dashboards import components as ui
from ranklens.dashboards.data import RunData, current
from ranklens.ingest.schema import TABLES

PATH = "/sql"
MAX_ROWS = 1000
CSV_ROWS = 100_000
TIMEOUT_S = 20.0
MAX_BYTES = 32 * MIB  # result of one query (table or CSV), as Arrow columns
EXAMPLE = (
    "SELECT rank, kind, count(*) AS events, sum(dur_ns) AS dur_ns\nFROM events\n"
    "GROUP BY ALL ORDER BY rank, kind"
)


def register(app: dash.Dash) -> None:
    """Add the page and its callbacks to `app`."""
    ui.register_page(
        __name__, path=PATH, name="SQL", title="ranklens · SQL", layout=layout, keep=False
    )

    @app.callback(
        Output("sql-result", "children"),
        Output("sql-error", "children"),
        Input("sql-run", "n_clicks"),
        State("sql-query", "value"),
        prevent_initial_call=True,
    )
    def _run(_n: Any, query: str | None) -> tuple[Any, str]:
        return execute(current(), query or "")

    @app.callback(
        Output("sql-download", "data"),
        Output("sql-error", "children", allow_duplicate=True),
        Input("sql-csv", "n_clicks"),
        State("sql-query", "value"),
        prevent_initial_call=True,
    )
    def _csv(_n: Any, query: str | None) -> tuple[Any, str]:
        df, err = query_frame(current(), query or "", CSV_ROWS)
        if df is None:
            return dash.no_update, err
        return {"content": df.write_csv(), "filename": "ranklens-query.csv"}, ""


def query_frame(data: RunData, query: str, max_rows: int) -> tuple[pl.DataFrame | None, str]:
    """Run `query` in the sandbox: (rows, "") or (None, the error message)."""
    if not query.strip():
        return None, "type a query"
    try:
        df = run_sql_isolated(
            data.db_path, query, max_rows=max_rows, timeout_s=TIMEOUT_S, max_bytes=MAX_BYTES
        )
    except SqlError as exc:
        return None, f"error: {exc}" + (f" (hint: {exc.hint})" if exc.hint else "")
    return df, ""


def execute(data: RunData, query: str) -> tuple[Any, str]:
    """The result table (at most MAX_ROWS rows) or an error message."""
    df, err = query_frame(data, query, MAX_ROWS + 1)
    if df is None:
        return None, err
    note = (
        f"first {MAX_ROWS} rows shown (download the CSV for up to {CSV_ROWS:,})"
        if df.height > MAX_ROWS
        else ""
    )
    return html.Div(
        [
            html.Div(note, id="sql-rowcount"),
            ui.table(df.head(MAX_ROWS), "sql-table", max_rows=MAX_ROWS),
        ]
    ), ""


def _catalog(data: RunData) -> html.Div:
    """The documented tables and the analysis views one can query."""
    names: list[str] = data.cached("sql_views", view_names)
    return html.Div(
        [
            html.H4("Tables"),
            html.Ul(
                [
                    html.Li(
                        [html.Code(t.name), f" {t.doc}"], title=", ".join(c.name for c in t.columns)
                    )
                    for t in TABLES
                ]
            ),
            html.H4("Views"),
            html.Div(", ".join(names), style={"fontFamily": "monospace", "fontSize": "12px"}),
        ],
        style={**ui.CARD, "flex": "0 1 420px", "fontSize": "13px"},
    )


def layout(q: Any = None, **_: Any) -> html.Div:
    """The console, pre-filled with `q` (and run, so a link shows its result)."""
    data = current()
    query = str(q) if q else EXAMPLE
    result, err = execute(data, query) if q else (None, "")
    return html.Div(
        [
            ui.title(
                "SQL",
                f"Read-only, one query at a time; at most {MAX_ROWS} rows shown, "
                f"{TIMEOUT_S:.0f} s, {MEMORY_LIMIT // MIB:,} MiB of memory and "
                f"{MAX_BYTES // MIB} MiB of result per query; no files, no ATTACH, no extensions.",
            ),
            html.Div(
                [
                    html.Div(
                        [
                            dcc.Textarea(
                                id="sql-query",
                                value=query,
                                style={
                                    "width": "100%",
                                    "height": "140px",
                                    "fontFamily": "monospace",
                                },
                            ),
                            html.Div(
                                [
                                    html.Button("Run", id="sql-run"),
                                    html.Button(
                                        "Download CSV", id="sql-csv", style={"marginLeft": "8px"}
                                    ),
                                ]
                            ),
                            html.Div(
                                err, id="sql-error", style={"color": "#B00020", "margin": "6px 0"}
                            ),
                            dcc.Loading(html.Div(result, id="sql-result")),
                            dcc.Download(id="sql-download"),
                        ],
                        style={"flex": "1 1 600px", "minWidth": "0"},
                    ),
                    _catalog(data),
                ],
                style={"display": "flex", "gap": "12px", "alignItems": "flex-start"},
            ),
        ]
    )
