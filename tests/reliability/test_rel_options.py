"""Issue 14 item 3 (= issue 17 item 1): every command opens a run one way, with the same options
resolved the same way (flag > [tool.ranklens] > default); `--workers` below 1 and a layout
that cannot describe the run are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from ranklens.cli.main import app

from reliability.conftest import write_run
from reliability.harness import clear_error, ok, run, snapshot, unchanged

ROOT = Path(__file__).resolve().parents[2]
UNNAMED = ROOT / "sample_traces" / "unnamed_tp2_pp2_dp2" / "raw"  # group names carry no DP/TP/PP
RUN_COMMANDS = ("report", "analyze", "check", "sql", "dashboard")
OPEN_OPTIONS = {"--skip-bad", "--workers", "--allow-mixed", "--no-align", "--offsets", "--layout"}


def _options(name: str) -> set[str]:
    cmd = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    return {o for p in cmd.params for o in p.opts if o.startswith("--")}


@pytest.mark.parametrize("name", ["ingest", *RUN_COMMANDS])
def test_every_command_has_the_run_options(name: str) -> None:
    assert _options(name) >= OPEN_OPTIONS, OPEN_OPTIONS - _options(name)


def test_one_run_opening_path() -> None:
    """The faces open runs through ingest.run only: no temporary ingest of their own."""
    for face in ("cli", "dashboards"):
        for py in (ROOT / face).rglob("*.py"):
            text = py.read_text()
            assert "load_traces" not in text and "mkdtemp" not in text, py
    assert "database_for" not in (ROOT / "dashboards" / "server.py").read_text()


@pytest.mark.parametrize("how", ["pyproject", "flag"])
def test_check_uses_the_layout_the_report_uses(tmp_path: Path, how: str) -> None:
    """On a run whose groups need the layout, report labels DP and check evaluates DP (it used
    to say "skipped, no DP communication" and exit 0)."""
    flags: list[str] = []
    if how == "pyproject":
        (tmp_path / "pyproject.toml").write_text('[tool.ranklens]\nlayout = "tp=2,pp=2,dp=2"\n')
    else:
        flags = ["--layout", "tp=2,pp=2,dp=2"]
    rep = run(["report", UNNAMED, "-f", "json", *flags], tmp_path)
    ok(rep)
    pars = {r["parallelism"] for r in json.loads(rep.out)["analyses"]["overlap"]["by_parallelism"]}
    assert "DP" in pars, pars
    res = run(["check", UNNAMED, "--max-exposed-comm", "dp=0.99", "-f", "json", *flags], tmp_path)
    ok(res)
    (verdict,) = json.loads(res.out)["checks"]
    assert verdict["status"] == "pass" and verdict["subjects"] == 8, verdict
    sql = run(
        ["sql", UNNAMED, "SELECT count(*) AS n FROM process_groups WHERE parallelism = 'DP'",
         "-f", "csv", *flags],
        tmp_path,
    )  # fmt: skip
    ok(sql)
    assert int(sql.out.splitlines()[1]) > 0


def test_analyze_skips_bad_files_like_report(tmp_path: Path) -> None:
    runs = write_run(tmp_path)
    (runs / "rank9.json").write_text("not json")
    before = snapshot(tmp_path)
    clear_error(run(["analyze", "breakdown", runs], tmp_path), str(runs / "rank9.json"))
    res = run(["analyze", "breakdown", runs, "--skip-bad"], tmp_path)
    ok(res)
    unchanged(before, snapshot(tmp_path))


@pytest.mark.parametrize("name", ["ingest", "report", "check"])
@pytest.mark.parametrize("value", ["-3", "0"])
def test_workers_below_one_is_a_usage_error(tmp_path: Path, name: str, value: str) -> None:
    runs = write_run(tmp_path)
    args = [name, runs, "--workers", value] + (["-o", "o.duckdb"] if name == "ingest" else [])
    res = run(args, tmp_path)
    assert res.rc == 2 and "--workers" in res.err and "Traceback" not in res.text, res.text
    assert not (tmp_path / "o.duckdb").exists()


def test_workers_from_pyproject_checked(tmp_path: Path) -> None:
    runs = write_run(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[tool.ranklens]\nworkers = 0\n")
    clear_error(run(["report", runs], tmp_path), "workers must be at least 1")


def test_misspelt_pyproject_key_is_an_error(tmp_path: Path) -> None:
    """`skip-bad` for `skip_bad` left the option at its default without a word: a CI job
    believed it skipped bad files (or ran with the workers it asked for)."""
    runs = write_run(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[tool.ranklens]\nskip-bad = true\nworker = 2\n")
    res = run(["report", runs], tmp_path)
    clear_error(res, "unknown key(s) in [tool.ranklens]: skip-bad, worker")
    assert "did you mean skip_bad, workers?" in " ".join(res.err.split()), res.err
    # the keys it knows, and its check table, pass
    (tmp_path / "pyproject.toml").write_text(
        "[tool.ranklens]\nskip_bad = true\nworkers = 1\n"
        "[tool.ranklens.check]\nmax_comm_share = 0.99\n"
    )
    ok(run(["check", runs], tmp_path))


@pytest.mark.parametrize(
    "layout,fragment",
    [
        ("tp=3", "describes 3 ranks, but the run has world size 2"),
        ("tp=2,pp=2", "describes 4 ranks"),
        ("tp=2,tp=4", "gives tp twice"),
        ("tp=2,order=tp-tp", "repeats a dimension"),
    ],
)
def test_impossible_layout_is_refused(tmp_path: Path, layout: str, fragment: str) -> None:
    runs = write_run(tmp_path)
    before = snapshot(tmp_path)
    clear_error(run(["ingest", runs, "-o", "o.duckdb", "--layout", layout], tmp_path), fragment)
    unchanged(before, snapshot(tmp_path))


def test_database_with_ingest_flags_is_an_error(tmp_path: Path) -> None:
    runs = write_run(tmp_path)
    ok(run(["ingest", runs, "-o", "o.duckdb"], tmp_path))
    for name in ("report", "check", "sql"):
        extra = ["SELECT 1"] if name == "sql" else []
        res = run([name, "o.duckdb", *extra, "--layout", "tp=2"], tmp_path)
        clear_error(res, "is a database; --layout apply when traces are ingested")
