"""SQL: a read-only console over the run's tables and analysis views, results in a grid + CSV.

Why it is safe to expose: each query runs in a process of its own (analysis.sql_isolated) on
the sandboxed connection of analysis.sql_console (read-only, one query statement, no files, no
ATTACH, no extensions, locked configuration) with a row, time, memory and result-size limit;
errors come back as messages. Why a grid fed by the server: the result stays on the server
(RunData.results) and the virtualised grid asks for the block of rows it shows, so 100,000
rows cost the browser what 100 do. Deep link: `/sql?q=SELECT...` (run on every visit, never
cached: a page shows what its user asked, now); Run and Ctrl+Enter put the query in the URL.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import dash
import dash_ag_grid as dag
import polars as pl
from dash import MATCH, Input, Output, State, ctx, dcc, html
from ranklens.analysis.sql_console import MEMORY_LIMIT, MIB, SqlError, view_names
from ranklens.analysis.sql_isolated import run_sql_isolated
from ranklens.dashboards import components as ui
from ranklens.dashboards.data import RunData, current, result_rows
from ranklens.ingest.schema import TABLES

PATH = "/sql"
NAME = "SQL"  # its link in the page bar
TITLE = "ranklens · SQL"  # in the browser tab
MAX_ROWS = 100_000  # rows of one result, in the grid and in the CSV
CSV_ROWS = MAX_ROWS
TIMEOUT_S = 20.0
MAX_BYTES = 32 * MIB  # result of one query (grid or CSV), as Arrow columns
BLOCK_ROWS = 200  # rows the grid fetches at a time
EXAMPLES: tuple[tuple[str, str], ...] = (
    (
        "events per rank and kind",
        "SELECT rank, kind, count(*) AS events, sum(dur_ns) / 1e6 AS total_ms\nFROM events\n"
        "GROUP BY ALL ORDER BY rank, kind",
    ),
    (
        "step time per rank",
        "SELECT step, rank, (end_ns - start_ns) / 1e6 AS step_ms\nFROM steps ORDER BY step, rank",
    ),
    (
        "longest kernels",
        "SELECT rank, step, name, dur_ns / 1e6 AS dur_ms\nFROM events WHERE kind = 'compute'\n"
        "ORDER BY dur_ns DESC LIMIT 50",
    ),
    (
        "collectives by group and op",
        "SELECT pg_name, op, count(*) AS n, sum(bytes) AS bytes,\n"
        "  avg(end_ns - ts_ns) / 1e6 AS avg_ms\nFROM collectives GROUP BY ALL ORDER BY n DESC",
    ),
    ("process groups", "SELECT * FROM process_groups"),
    ("every event", "SELECT * FROM events"),
)
EXAMPLE = EXAMPLES[0][1]

# Ctrl+Enter (Cmd+Enter) in the query box presses Run; attached once per box.
_KEYS_JS = """function(id) {
    const box = document.getElementById(id);
    if (box && !box.dataset.ranklensKeys) {
        box.dataset.ranklensKeys = "1";
        box.addEventListener("keydown", function (e) {
            if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
                e.preventDefault();
                document.getElementById("sql-run").click();
            }
        });
    }
    return window.dash_clientside.no_update;
}"""
# The query run goes into the URL (a history entry), so reload and share give the same result.
_URL_JS = """function(n, query) {
    if (n && query !== undefined && query !== null) {
        const url = window.location.pathname + "?q=" + encodeURIComponent(query);
        if (url !== window.location.pathname + window.location.search) {
            window.history.pushState(null, "", url);
        }
    }
    return window.dash_clientside.no_update;
}"""


def register(app: dash.Dash) -> None:
    """Add the page and its callbacks to `app`."""
    ui.register_page(__name__, path=PATH, name=NAME, title=TITLE, layout=layout, keep=False)
    app.clientside_callback(  # type: ignore[no-untyped-call]
        _KEYS_JS, Output("sql-keys", "data"), Input("sql-query", "id")
    )
    app.clientside_callback(  # type: ignore[no-untyped-call]
        _URL_JS,
        Output("sql-url", "data"),
        Input("sql-run", "n_clicks"),
        State("sql-query", "value"),
        prevent_initial_call=True,
    )

    @app.callback(
        Output("sql-result", "children"),
        Output("sql-error", "children"),
        Input("sql-run", "n_clicks"),
        Input("sql-auto", "data"),
        State("sql-query", "value"),
    )
    def _run(n: Any, auto: Any, query: str | None) -> tuple[Any, str]:
        if not n and not auto:
            return None, ""  # a page opened without a query waits for Run
        return execute(current(), query or "")

    @app.callback(
        Output({"type": "sql-grid", "key": MATCH}, "getRowsResponse"),
        Input({"type": "sql-grid", "key": MATCH}, "getRowsRequest"),
        prevent_initial_call=True,
    )
    def _rows(request: dict[str, Any] | None) -> Any:
        key = ctx.triggered_id["key"] if isinstance(ctx.triggered_id, dict) else ""
        return rows_response(current(), str(key), request or {})

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
    """The result grid (at most MAX_ROWS rows, kept on the server) or an error message."""
    df, err = query_frame(data, query, MAX_ROWS + 1)
    if df is None:
        return None, err
    more = df.height > MAX_ROWS
    df = df.head(MAX_ROWS)
    key = data.results.put(df)
    note = f"{df.height:,} rows × {df.width} columns" + (
        f" (the first {MAX_ROWS:,}: the result has more; filter or aggregate to see the rest)"
        if more
        else ""
    )
    return html.Div([html.Div(note, id="sql-rowcount"), grid(df, key)]), ""


def grid(df: pl.DataFrame, key: str) -> dag.AgGrid:
    """A virtualised grid over the result kept under `key`: it fetches BLOCK_ROWS at a time,
    sorted on the server when a header is clicked."""
    cols = [
        {
            "field": f"c{i}",
            "headerName": name,
            "type": "numericColumn" if df.schema[name].is_numeric() else None,
            "headerTooltip": str(df.schema[name]),
        }
        for i, name in enumerate(df.columns)
    ]
    return dag.AgGrid(
        id={"type": "sql-grid", "key": key},
        className="ag-theme-alpine sql-grid",
        columnDefs=[{k: v for k, v in c.items() if v is not None} for c in cols],
        defaultColDef={"sortable": True, "resizable": True, "filter": False, "minWidth": 90},
        rowModelType="infinite",
        dashGridOptions={
            "cacheBlockSize": BLOCK_ROWS,
            "infiniteInitialRowCount": min(df.height, BLOCK_ROWS),
            "maxBlocksInCache": 50,
            "rowBuffer": 10,
            "rowHeight": 28,
            "headerHeight": 32,
            "enableCellTextSelection": True,
            "tooltipShowDelay": 300,
        },
        style={"height": "480px", "width": "100%"},
    )


def rows_response(data: RunData, key: str, request: dict[str, Any]) -> dict[str, Any]:
    """The block of rows the grid asked for, and the result's row count."""
    df = data.results.get(key)
    if df is None:  # dropped (more recent results, or a restarted server): run it again
        return {"rowData": [], "rowCount": 0}
    start = max(int(request.get("startRow") or 0), 0)
    end = min(int(request.get("endRow") or start + BLOCK_ROWS), df.height)
    return {
        "rowData": result_rows(df, start, end, request.get("sortModel")),
        "rowCount": df.height,
    }


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


def _examples() -> html.Div:
    """Example queries, one click each (a link: the query lands in the URL and runs)."""
    links: list[Any] = ["Examples: "]
    for i, (label, query) in enumerate(EXAMPLES):
        if i:
            links.append(" · ")
        links.append(
            dcc.Link(label, href=f"{PATH}?q={quote(query)}", className="sql-example", title=query)
        )
    return html.Div(links, style={"margin": "4px 0 8px", "fontSize": "13px"})


def layout(q: Any = None, **_: Any) -> html.Div:
    """The console, pre-filled with `q` (and run once the page is shown, so a link shows its
    result without the page waiting for the query)."""
    data = current()
    query = str(q) if q else EXAMPLE
    return html.Div(
        [
            ui.title(
                "SQL",
                f"Read-only, one query at a time: at most {MAX_ROWS:,} rows (grid and CSV), "
                f"{TIMEOUT_S:.0f} s, {MEMORY_LIMIT // MIB:,} MiB of memory and "
                f"{MAX_BYTES // MIB} MiB of result per query; no files, no ATTACH, no "
                "extensions. Ctrl+Enter runs; the URL keeps the query.",
            ),
            _examples(),
            html.Div(
                [
                    html.Div(
                        [
                            dcc.Textarea(
                                id="sql-query",
                                value=query,
                                spellCheck=False,
                                style={
                                    "width": "100%",
                                    "height": "140px",
                                    "fontFamily": "monospace",
                                },
                            ),
                            html.Div(
                                [
                                    html.Button("Run", id="sql-run", title="Ctrl+Enter"),
                                    html.Button(
                                        "Download CSV", id="sql-csv", style={"marginLeft": "8px"}
                                    ),
                                ]
                            ),
                            html.Div(id="sql-error", style={"color": "#B00020", "margin": "6px 0"}),
                            # the spinner for Run only: not for each block of rows the
                            # grid fetches while it scrolls (that would hide the grid)
                            dcc.Loading(
                                html.Div(id="sql-result"),
                                target_components={"sql-result": "children"},  # type: ignore[arg-type]
                            ),
                            dcc.Download(id="sql-download"),
                            dcc.Store(id="sql-auto", data=bool(q)),
                            dcc.Store(id="sql-keys"),
                            dcc.Store(id="sql-url"),
                        ],
                        style={"flex": "1 1 600px", "minWidth": "0"},
                    ),
                    _catalog(data),
                ],
                style={"display": "flex", "gap": "12px", "alignItems": "flex-start"},
            ),
        ]
    )
