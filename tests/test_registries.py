"""What is registered, and what each registry line brings with it.

Analyses (`analysis.REGISTRY`), `check` thresholds (`analysis.thresholds.THRESHOLDS`) and
dashboard pages (`dashboards.app.PAGES`) each have one list; the view files, the activity
users, the `check` flags and the page bar are derived from the modules' declarations. The
first tests pin the derived lists to what was written by hand before; the toy tests register
one analysis, threshold or page with its one line (monkeypatch) and find it everywhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import dash
import duckdb
import polars as pl
import pytest
import typer
from dash import html
from ranklens.analysis import REGISTRY, _activity, _sql, report, results_store, views
from ranklens.analysis._base import Result
from ranklens.analysis.thresholds import THRESHOLDS, Threshold
from ranklens.cli import ci_commands
from ranklens.cli.main import app as cli_app
from ranklens.dashboards import app as dashboard
from ranklens.dashboards import components as ui
from ranklens.dashboards.data import RunData
from ranklens.ingest import load_traces
from typer.testing import CliRunner

from ranklens import analysis

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "straggler_rank3" / "raw"
runner = CliRunner()


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("registries") / "run.duckdb"
    load_traces([SAMPLE], path, workers=1)
    return path


# ---------------------------------------------------------------------------------------------
# analyses
# ---------------------------------------------------------------------------------------------
def test_registered_analyses_and_what_derives_from_them() -> None:
    assert [m.NAME for m in REGISTRY] == [
        "breakdown",
        "overlap",
        "stragglers",
        "collectives",
        "pipeline",
        "contention",
        "critical_path",
    ]
    # views.VIEW_FILES and _activity.USERS as they were written by hand
    assert views.view_files() == (
        "intervals",
        "activity",
        "breakdown",
        "overlap",
        "stragglers",
        "collectives",
        "pipeline",
        "pipeline_p2p",
        "pipeline_steps",
        "contention",
    )
    assert _activity.users(REGISTRY) == ("breakdown", "overlap", "stragglers")


def test_declarations_match_the_sql() -> None:
    """USES_ACTIVITY is true exactly for the analyses whose SQL builds on activity.sql, and
    every view file of an analysis is named after it (so two cannot claim one file)."""
    for mod in REGISTRY:
        files = getattr(mod, "VIEW_FILES", ())
        assert all(f == mod.NAME or f.startswith(f"{mod.NAME}_") for f in files), mod.NAME
        uses = "activity" in _sql.with_requirements(list(files) or [mod.NAME])
        assert uses == bool(_activity.users([mod])), mod.NAME


TOY_SQL = """-- requires: activity
CREATE OR REPLACE TEMP VIEW toy_by_rank AS
SELECT rank, count(*)::BIGINT AS islands FROM _activity_union GROUP BY rank;
"""


def _toy_analysis(seen: list[list[str]]) -> ModuleType:
    """An analysis over the activity views; `seen` gets the views held during each run."""
    toy = ModuleType("ranklens_toy_analysis", "A toy analysis: activity islands per rank.")

    def run(con: duckdb.DuckDBPyConnection) -> Result:
        seen.append(_sql.held_views(con))
        _sql.apply_sql(con, "toy")
        return Result("toy", _sql.query_pl(con, "SELECT * FROM toy_by_rank ORDER BY rank"))

    for key, value in {
        "NAME": "toy",
        "COLUMNS": {"rank": "Global rank.", "islands": "Activity islands."},
        "VIEW_FILES": ("toy",),
        "USES_ACTIVITY": True,
        "run": run,
    }.items():
        setattr(toy, key, value)
    return toy


def test_a_toy_analysis_registered_with_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[list[str]] = []
    toy = _toy_analysis(seen)
    sql_text = _sql.sql_text
    monkeypatch.setattr(_sql, "sql_text", lambda n: TOY_SQL if n == "toy" else sql_text(n))
    monkeypatch.setattr(analysis, "REGISTRY", (*REGISTRY, toy))  # its one line

    assert views.view_files()[-1] == "toy"
    assert _activity.users(analysis.REGISTRY)[-1] == "toy"
    path = tmp_path / "run.duckdb"
    load_traces([SAMPLE], path, workers=1, finalize=results_store.finalize_run)
    # ingest held the activity views while it ran the toy, and stored its view and result
    assert seen and {"_activity_union", "_activity_comm"} <= set(seen[0])
    con = duckdb.connect(str(path), read_only=True)
    try:
        stored = _sql.query_pl(con, "SELECT * FROM toy_by_rank ORDER BY rank")
        assert stored.height == 4 and stored["islands"].min() > 0
        loaded = results_store.load(con, toy)
        assert loaded is not None and loaded.table.equals(stored)
        assert report.build_report(con).results["toy"].table.equals(stored)
    finally:
        con.close()
    # its own declaration is what gets them held: alone, only when it says it reads them
    for uses in (True, False):
        monkeypatch.setattr(toy, "USES_ACTIVITY", uses)
        con = duckdb.connect(str(path))
        try:
            assert results_store.store_all(con, (toy,)) == ["toy"]
        finally:
            con.close()
        assert ("_activity_union" in seen[-1]) == uses
    # the faces: `ranklens analyze toy` and the dashboard's results
    out = runner.invoke(cli_app, ["analyze", "toy", str(path), "-f", "json"])
    assert out.exit_code == 0, out.output
    assert pl.DataFrame(json.loads(out.output)).equals(stored)
    data = RunData(path)
    try:
        res = data.result("toy")
        assert res is not None and res.table.equals(stored)
    finally:
        data.close()


# ---------------------------------------------------------------------------------------------
# check thresholds
# ---------------------------------------------------------------------------------------------
def _check_options(command: Any) -> list[tuple[str, str | None]]:
    """(first flag, help) of every option of a click command, in order."""
    return [(p.opts[0], getattr(p, "help", None)) for p in command.params if p.opts[0][:2] == "--"]


def test_registered_thresholds_and_the_check_flags() -> None:
    # check_config.THRESHOLDS and check._ACTIVITY_METRICS as they were written by hand
    assert {n: (t.kind, t.label) for n, t in THRESHOLDS.items()} == {
        "max_bubble": ("max", "pipeline bubble fraction of the step, per stage"),
        "max_exposed_comm": ("max_by", "exposed communication share of the step, per parallelism"),
        "min_overlap": ("min", "overlap ratio |M ∩ C| / |M|, per rank"),
        "max_comm_share": ("max", "communication share |M| / |W|, per rank"),
        "max_idle": ("max", "idle share of the step, per rank"),
        "max_straggler_wait": ("max", "share of the step others spend waiting for a rank"),
        "max_align_residual_us": ("max", "clock alignment residual per rank, µs"),
        "max_regression": ("max", "regression vs --baseline, as a fraction (0.05 = 5%)"),
    }
    assert {n for n, t in THRESHOLDS.items() if t.activity} == {
        "min_overlap",
        "max_exposed_comm",
        "max_comm_share",
        "max_idle",
        "max_straggler_wait",
    }
    assert [n for n, t in THRESHOLDS.items() if t.query is None] == ["max_regression"]
    # the `ranklens check` options as they were written by hand, in the same order
    check = typer.main.get_command(cli_app).commands["check"]  # type: ignore[attr-defined]
    options = _check_options(check)
    assert options[:9] == [
        ("--max-bubble", "Pipeline bubble, per stage. Fraction (0.25) or percentage (25%)."),
        (
            "--max-exposed-comm",
            "Exposed comm share per parallelism: 0.1, or dp=0.05,tp=0.10.",
        ),
        ("--min-overlap", "Overlap ratio per rank."),
        ("--max-comm-share", "Comm share per rank."),
        ("--max-idle", "Idle share per rank."),
        ("--max-straggler-wait", "Share of the step others wait for one rank."),
        ("--max-align-residual-us", "Clock alignment residual per rank, µs."),
        ("--baseline", "Baseline run (database or trace directory) to compare with."),
        ("--max-regression", "Regression allowed vs --baseline (5%)."),
    ]
    assert [flag for flag, _ in options[9:]] == [
        "--config",
        "--format",
        "--summary",
        "--verbose",
        "--allow-skipped",
        "--skip-bad",
        "--workers",
        "--allow-mixed",
        "--no-align",
        "--offsets",
        "--layout",
    ]


def test_a_toy_threshold_declared_once(
    monkeypatch: pytest.MonkeyPatch, db: Path, tmp_path: Path
) -> None:
    toy = Threshold(
        "max_rank_number",
        "max",
        "the rank's number, per rank",
        "Largest rank number allowed.",
        "SELECT 'rank ' || rank AS subject, rank::DOUBLE AS value FROM ranks",
    )
    monkeypatch.setitem(THRESHOLDS, toy.name, toy)
    # the command as ci_commands builds it at import, now with the toy declared
    cli = typer.Typer()
    cli.command()(ci_commands.threshold_options(ci_commands.check.__wrapped__))  # type: ignore[attr-defined]
    options = _check_options(typer.main.get_command(cli))
    flags = [flag for flag, _ in options]
    assert flags.index("--max-rank-number") == flags.index("--baseline") - 1
    assert ("--max-rank-number", "Largest rank number allowed.") in options
    # a flag, a config key and a check: the straggler run has ranks 0..3
    failed = runner.invoke(cli, [str(db), "--max-rank-number", "2.5", "-f", "json"])
    assert failed.exit_code == 3, failed.output
    (verdict,) = json.loads(failed.output)["checks"]
    assert verdict["metric"] == toy.label
    assert verdict["worst"] == {"subject": "rank 3", "value": 3.0}
    config = tmp_path / "check.toml"
    config.write_text("[check]\nmax_rank_number = 3\n")
    passed = runner.invoke(cli, [str(db), "--config", str(config), "-f", "json"])
    assert passed.exit_code == 0, passed.output
    assert json.loads(passed.output)["checks"][0]["status"] == "pass"


# ---------------------------------------------------------------------------------------------
# dashboard pages
# ---------------------------------------------------------------------------------------------
def _nav(app: dash.Dash) -> list[tuple[str, str]]:
    """(href, label) of the page bar's links."""
    frame = app.layout()  # type: ignore[operator]
    (bar,) = [c for c in frame.children if isinstance(c, html.Nav)]
    return [(link.href, link.children) for link in bar.children]


@pytest.fixture(scope="module")
def run_data(db: Path) -> Iterator[RunData]:
    """One sandboxed connection for the apps of this module (DuckDB refuses a second one with
    other settings while it is open)."""
    data = RunData(db)
    yield data
    data.close()


@pytest.fixture
def fresh_pages() -> Iterator[None]:
    """dash.page_registry is global: what a test registers is dropped after it."""
    before = set(dash.page_registry)
    yield
    for module in set(dash.page_registry) - before:
        del dash.page_registry[module]


def test_registered_pages_and_the_page_bar(run_data: RunData, fresh_pages: None) -> None:
    app = dashboard.create_app(run_data.db_path, data=run_data)
    # components.PAGES as it was written by hand: the page bar, in order
    expected = [
        ("/", "Overview"),
        ("/timeline", "Timeline"),
        ("/pipeline", "Pipeline"),
        ("/communication", "Communication"),
        ("/contention", "Contention & stragglers"),
        ("/findings", "Findings"),
        ("/compare", "Compare"),
        ("/sql", "SQL"),
    ]
    with app.server.test_request_context("/"):
        assert _nav(app) == expected
    # each page registers the route and tab title it declares
    for page in dashboard.PAGES:
        entry = dash.page_registry[page.__name__]
        assert (entry["path"], entry["name"], entry["title"]) == (
            page.PATH,
            page.NAME,
            page.TITLE,
        )
        assert page.TITLE.lower() == f"ranklens · {page.NAME.lower()}"


def _toy_page() -> ModuleType:
    page = ModuleType("ranklens_toy_page", "A toy page.")

    def layout(**_: Any) -> html.Div:
        return html.Div("a toy page", id="toy-body")

    def register(app: dash.Dash) -> None:
        ui.register_page(
            page.__name__, path="/toy", name="Toy", title="ranklens · toy", layout=layout
        )

    for key, value in {
        "PATH": "/toy",
        "NAME": "Toy",
        "TITLE": "ranklens · toy",
        "layout": layout,
        "register": register,
    }.items():
        setattr(page, key, value)
    return page


def test_a_toy_page_registered_with_one_line(
    monkeypatch: pytest.MonkeyPatch, run_data: RunData, fresh_pages: None
) -> None:
    toy = _toy_page()
    monkeypatch.setattr(dashboard, "PAGES", (*dashboard.PAGES, toy))  # its one line
    app = dashboard.create_app(run_data.db_path, data=run_data)
    with app.server.test_request_context("/toy"):
        assert _nav(app)[-1] == ("/toy", "Toy")
    assert dash.page_registry[toy.__name__]["path"] == "/toy"
    served = app.server.test_client().get("/toy")
    assert served.status_code == 200 and "ranklens · toy" in served.get_data(as_text=True)
