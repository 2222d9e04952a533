"""The CLI as a user runs it: exit codes, error/hint messages, formats, the read-only SQL."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from ranklens.cli.main import app
from typer.testing import CliRunner

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "straggler_rank3" / "raw"
runner = CliRunner()


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "run.duckdb"
    res = runner.invoke(app, ["ingest", str(SAMPLE), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "ingested 4 rank(s)" in res.output
    return out


def test_ingest_says_where_its_time_went(tmp_path: Path) -> None:
    res = runner.invoke(app, ["ingest", str(SAMPLE), "-o", str(tmp_path / "r.duckdb")])
    assert res.exit_code == 0, res.output
    m = re.search(r"in ([0-9.]+) s \(traces ([0-9.]+) s, stored results ([0-9.]+) s\)", res.output)
    assert m, res.output
    total, traces, results = (float(g) for g in m.groups())
    assert traces > 0 and results > 0
    assert traces + results <= total + 0.1  # stages within the whole (rounded to 0.1 s each)


def test_help_documents_exit_codes() -> None:
    res = runner.invoke(app, ["--help"])
    assert res.exit_code == 0
    assert "3 check threshold exceeded" in res.output
    for cmd in ("ingest", "report", "analyze", "sql", "demo"):
        sub = runner.invoke(app, [cmd, "--help"])
        assert sub.exit_code == 0, cmd


def test_report_formats(db: Path) -> None:
    text = runner.invoke(app, ["report", str(db)])
    assert text.exit_code == 0 and "Findings" in text.output and "Per rank" in text.output
    js = json.loads(runner.invoke(app, ["report", str(db), "--format", "json"]).output)
    assert js["facts"]["ranks"] == [0, 1, 2, 3]
    assert {"breakdown", "overlap"} <= set(js["analyses"])
    out = runner.invoke(app, ["report", str(db), "-f", "csv"]).output
    rows = list(csv.DictReader(io.StringIO(out)))
    assert {int(r["rank"]) for r in rows} == {0, 1, 2, 3}
    assert all(int(r["window_ns"]) > 0 for r in rows)
    md = runner.invoke(app, ["report", str(db), "-f", "markdown"]).output
    assert md.startswith("# ranklens report") and "| rank |" in md


def test_report_on_run_dir_equals_db(db: Path) -> None:
    a = json.loads(runner.invoke(app, ["report", str(SAMPLE), "-f", "json"]).output)
    b = json.loads(runner.invoke(app, ["report", str(db), "-f", "json"]).output)
    # Parallel aggregation may change the last bits of a float sum: compare at 1e-9.
    assert _rounded(a["analyses"]) == _rounded(b["analyses"])


def _rounded(x: object) -> object:
    if isinstance(x, float):
        return round(x, 9)
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x


def test_sql_and_views(db: Path) -> None:
    q = "SELECT rank, sum(dur_ns) AS t FROM events WHERE kind='comm' GROUP BY 1 ORDER BY 1"
    res = runner.invoke(app, ["sql", str(db), q, "--format", "json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    con = duckdb.connect(str(db), read_only=True)
    want = con.execute(q).fetchall()
    con.close()
    assert [(r["rank"], r["t"]) for r in got] == [(r, int(t)) for r, t in want]
    q2 = "SELECT count(*) AS n FROM overlap_by_step"
    view = runner.invoke(app, ["sql", str(db), q2, "-f", "csv"])
    assert view.exit_code == 0 and view.output.splitlines()[1] == str(4 * 3)


@pytest.mark.parametrize(
    "query",
    [
        "COPY (SELECT 1) TO '/tmp/ranklens_cli_pwned.csv'",
        "SELECT * FROM read_csv('/etc/passwd')",
        "ATTACH '/tmp/ranklens_other.duckdb'",
        "INSTALL httpfs",
        "DELETE FROM events",
        "DELETE FROM events_plain",
    ],
)
def test_sql_is_read_only_and_sandboxed(db: Path, query: str) -> None:
    res = runner.invoke(app, ["sql", str(db), query])
    assert res.exit_code == 1
    assert "error:" in res.output
    assert not Path("/tmp/ranklens_cli_pwned.csv").exists()


def test_bad_input_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "rank0.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1')
    res = runner.invoke(app, ["report", str(bad)])
    assert res.exit_code == 1
    assert "error:" in res.output and str(bad) in res.output and "hint:" in res.output
    assert "Traceback" not in res.output
    empty = runner.invoke(app, ["report", str(tmp_path / "nothing_here")])
    assert empty.exit_code == 1 and "error:" in empty.output


def test_skip_bad_reports_what_it_skipped(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for f in SAMPLE.iterdir():
        (run / f.name).write_bytes(f.read_bytes())
    (run / "rank9.json").write_text("not json")
    res = runner.invoke(app, ["report", str(run), "--skip-bad"], env={"COLUMNS": "60"})
    assert res.exit_code == 0, res.output
    bad = str(run / "rank9.json")
    assert len(bad) > 60  # wider than the report: its name stays whole, on one line
    assert any(ln.startswith("skipped:") and bad in ln for ln in res.output.splitlines())


def test_usage_error_exit_code(db: Path) -> None:
    assert runner.invoke(app, ["analyze", "nope", str(db)]).exit_code == 2
    assert runner.invoke(app, ["report", str(db), "--format", "xml"]).exit_code == 2


def test_installed_demo_runs() -> None:
    """The README's quick-start command, through the installed entry point."""
    exe = Path(sys.executable).with_name("ranklens")
    res = subprocess.run([str(exe), "demo"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "Findings" in res.stdout and "ranks: 8 of 8" in res.stdout


@pytest.mark.parametrize("sigterm", [True, False])
def test_a_query_interrupted_by_a_signal_ends_as_the_signal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], sigterm: bool
) -> None:
    """DuckDB turns a signal that lands during a query into RuntimeError("Query interrupted"),
    dropping Python's KeyboardInterrupt: the entry point still ends SIGTERM with 143 and
    Ctrl+C with 130, not with an internal error."""
    from ranklens.cli import main as cli_main
    from ranklens.ingest import lifecycle

    def interrupted() -> None:
        if sigterm:
            lifecycle._received.append(15)
        raise RuntimeError("Query interrupted")

    monkeypatch.setattr(lifecycle, "_received", [])
    monkeypatch.setattr(cli_main, "app", interrupted)
    monkeypatch.setattr(cli_main, "handle_sigterm", lambda: None)
    with pytest.raises(SystemExit) as stop:
        cli_main.main()
    assert stop.value.code == (143 if sigterm else 130)
    assert ("terminated" if sigterm else "interrupted") in capsys.readouterr().err
