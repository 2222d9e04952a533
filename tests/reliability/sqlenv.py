"""What the SQL console tests share: a sample run, the CLI in a process of its own, and the
dashboard served on 127.0.0.1 and driven over HTTP the way its page drives it.

Why HTTP without a browser: the defects are in what the server answers (a leaked view, a 500,
a cached page), and Dash's callback endpoint is what the page posts to; the browser tests in
tests/dashboards already show the page itself draws these answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from ranklens.ingest import load_traces

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "sample_traces" / "straggler_rank3" / "raw"
CLI = [sys.executable, "-c", "from ranklens.cli.main import main; main()"]


def make_db(folder: Path) -> Path:
    """The straggler sample ingested into `folder/run.duckdb`."""
    db = folder / "run.duckdb"
    load_traces([str(SAMPLE)], db, workers=1)
    return db


def cli(*args: str, timeout: float = 120, mem_gib: float = 6) -> subprocess.CompletedProcess[str]:
    """`ranklens ARGS` in its own process, bounded (so a regression fails instead of taking
    the machine: `mem_gib` of address space, `timeout` seconds)."""

    def bound() -> None:
        import resource

        cap = int((mem_gib + 2) * (1 << 30))  # + 2 GiB: Python and its libraries, mapped
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, preexec_fn=bound, env=env
    )


class Server:
    """The dashboard over one database, served in a thread (as `ranklens dashboard` serves)."""

    def __init__(self, db: Path) -> None:
        from ranklens.dashboards.app import create_app, warm_pages
        from ranklens.dashboards.data import RunData
        from werkzeug.serving import make_server

        self.data = RunData(db)
        self.app = create_app(db, data=self.data)
        warm_pages(self.app)
        self.server = make_server("127.0.0.1", 0, self.app.server, threaded=True)
        self.base = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        urllib.request.urlopen(self.base + "/", timeout=60).read()  # registers the page router
        _LIVE[:] = [self]  # cells() fetches a result grid's rows from the server serving it

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=10)
        self.data.close()

    def callback(
        self, outputs: list[tuple[str, str]], inputs: list[tuple[str, str, Any]], state: Any = ()
    ) -> tuple[int, Any]:
        """POST one callback as the page does: (HTTP status, the response's JSON or text)."""
        body = {
            "output": ".." + "...".join(f"{i}.{p}" for i, p in outputs) + ".."
            if len(outputs) > 1
            else f"{outputs[0][0]}.{outputs[0][1]}",
            "outputs": [{"id": i, "property": p} for i, p in outputs],
            "inputs": [{"id": i, "property": p, "value": v} for i, p, v in inputs],
            "changedPropIds": [f"{inputs[0][0]}.{inputs[0][1]}"],
            "state": [{"id": i, "property": p, "value": v} for i, p, v in state],
        }
        req = urllib.request.Request(
            self.base + "/_dash-update-component",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def run(self, query: str) -> tuple[int, Any, str]:
        """Type `query` and press Run: (status, result component, error text)."""
        status, got = self.callback(
            [("sql-result", "children"), ("sql-error", "children")],
            [("sql-run", "n_clicks", 1), ("sql-auto", "data", False)],
            [("sql-query", "value", query)],
        )
        if status != 200:
            return status, None, str(got)
        out = got["response"]
        return status, out["sql-result"]["children"], str(out["sql-error"]["children"])

    def link(self, query: str) -> tuple[int, Any]:
        """Open `/sql?q=QUERY` (the page router's callback, then the page's own run on load):
        (status, page component with the result and error the page then shows)."""
        status, got = self.callback(
            [("_pages_content", "children"), ("_pages_store", "data")],
            [
                ("_pages_location", "pathname", "/sql"),
                ("_pages_location", "search", "?" + urllib.parse.urlencode({"q": query})),
            ],
        )
        if status != 200:
            return status, got
        page = got["response"]["_pages_content"]["children"]
        status, got = self.callback(
            [("sql-result", "children"), ("sql-error", "children")],
            [("sql-run", "n_clicks", None), ("sql-auto", "data", True)],
            [("sql-query", "value", query)],
        )
        if status != 200:
            return status, got
        out = got["response"]
        shown = {"props": {"id": "sql-error", "children": out["sql-error"]["children"]}}
        return status, {"props": {"children": [out["sql-result"]["children"], shown, page]}}

    def rows(self, grid_id: dict[str, str], start: int = 0, end: int = 100_000) -> Any:
        """The rows the result grid `grid_id` fetches, as the page's grid asks for them."""
        prop = "getRowsResponse"
        body = {
            "output": '{"key":["MATCH"],"type":"sql-grid"}.' + prop,
            "outputs": {"id": grid_id, "property": prop},
            "inputs": [
                {
                    "id": grid_id,
                    "property": "getRowsRequest",
                    "value": {"startRow": start, "endRow": end},
                }
            ],
            "changedPropIds": [
                json.dumps(grid_id, sort_keys=True, separators=(",", ":")) + ".getRowsRequest"
            ],
            "state": [],
        }
        req = urllib.request.Request(
            self.base + "/_dash-update-component",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=120) as resp:
            out = json.loads(resp.read())
        return next(iter(out["response"].values()))[prop]


_LIVE: list[Server] = []


def find(component: Any, id_: str) -> Any:
    """The component with this id inside a Dash JSON tree, or None."""
    if isinstance(component, dict):
        props = component.get("props", {})
        if props.get("id") == id_:
            return component
        return find(props.get("children"), id_)
    if isinstance(component, list):
        for c in component:
            hit = find(c, id_)
            if hit is not None:
                return hit
    return None


def cells(component: Any) -> list[dict[str, str]]:
    """The rows of the result grid as {column: cell text}, fetched from the server as the
    page's grid fetches them (the grid's columns name the fields c0, c1, ...)."""
    grid = _grid(component)
    if grid is None:
        return []
    names = {c["field"]: c["headerName"] for c in grid["props"]["columnDefs"]}
    got = _LIVE[0].rows(grid["props"]["id"])
    return [
        {names[k]: "" if v is None else str(v) for k, v in row.items()} for row in got["rowData"]
    ]


def _grid(component: Any) -> Any:
    if isinstance(component, dict):
        props = component.get("props", {})
        if isinstance(props.get("id"), dict) and props["id"].get("type") == "sql-grid":
            return component
        return _grid(props.get("children"))
    if isinstance(component, list):
        for c in component:
            hit = _grid(c)
            if hit is not None:
                return hit
    return None


def error_text(component: Any) -> str:
    """The error line (`sql-error`) of a rendered SQL page."""
    hit = find(component, "sql-error")
    return "" if hit is None else str(hit["props"].get("children") or "")
