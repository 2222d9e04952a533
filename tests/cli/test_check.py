"""`ranklens check`: thresholds, precedence, exit codes, output formats, baseline."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from xml.etree import ElementTree as ET

import duckdb
import jsonschema
import pytest
from ranklens.analysis import baseline, check_config
from ranklens.cli.main import app
from ranklens.ingest import load_traces
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_traces"
runner = CliRunner()


@pytest.fixture(scope="module")
def straggler_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("check") / "straggler.duckdb"
    load_traces([SAMPLES / "straggler_rank3" / "raw"], db)
    return db


def _overlap_by_rank(db: Path) -> dict[int, float]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        from ranklens.analysis import overlap

        t = overlap.run(con).tables["by_rank"]
    finally:
        con.close()
    return {r["rank"]: r["exposed_share"] for r in t.iter_rows(named=True)}


def test_pass_and_fail_exit_codes(straggler_db: Path) -> None:
    exposed = _overlap_by_rank(straggler_db)
    worst_rank = max(exposed, key=lambda r: exposed[r])
    ok = runner.invoke(app, ["check", str(straggler_db), "--max-exposed-comm", "0.99"])
    assert ok.exit_code == 0, ok.output
    bad = runner.invoke(app, ["check", str(straggler_db), "--max-exposed-comm", "1%"])
    assert bad.exit_code == 3, bad.output
    assert "FAIL" in bad.output and f"rank {worst_rank}" in bad.output


def test_no_thresholds_names_the_config_table(
    straggler_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no pyproject.toml here
    res = runner.invoke(app, ["check", str(straggler_db)])
    assert res.exit_code == 0, res.output
    assert "add [tool.ranklens.check] to pyproject.toml" in " ".join(res.output.split())


def test_per_parallelism_threshold_and_unknown_name(straggler_db: Path) -> None:
    args = ["check", str(straggler_db), "--max-exposed-comm", "tp=0.01", "-f", "json"]
    res = runner.invoke(app, [*args, "--allow-skipped"])
    doc = json.loads(res.output)
    # The straggler run has no TP communication: skipped, never a silent pass ...
    assert doc["checks"][0]["status"] == "skipped" and res.exit_code == 0
    # ... and without --allow-skipped a check that cannot be evaluated fails the gate.
    strict = runner.invoke(app, args)
    assert json.loads(strict.output)["checks"][0]["status"] == "fail" and strict.exit_code == 3
    with pytest.raises(check_config.ConfigError):
        check_config.parse_value("max_bubbles", "0.1")


def test_precedence_flag_over_file(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.ranklens.check]\nmax_idle = "40%"\nmax_exposed_comm = {dp = 0.05, tp = 0.1}\n'
    )
    cfg = check_config.resolve({"max_idle": "0.2", "min_overlap": None}, cwd=tmp_path)
    assert cfg.values["max_idle"] == 0.2 and cfg.sources["max_idle"] == "--max-idle"
    assert cfg.values["max_exposed_comm"] == {"DP": 0.05, "TP": 0.1}
    assert "pyproject.toml" in cfg.sources["max_exposed_comm"]
    other = tmp_path / "alerts.toml"
    other.write_text("[check]\nmin_overlap = 0.3\n")
    cfg2 = check_config.resolve({}, other, cwd=tmp_path)
    assert cfg2.values == {"min_overlap": 0.3} and cfg2.sources["min_overlap"] == str(other)


def test_json_matches_documented_schema(straggler_db: Path) -> None:
    schema = json.loads((ROOT / "docs" / "check-result.schema.json").read_text())
    res = runner.invoke(
        app,
        [
            "check",
            str(straggler_db),
            "--min-overlap",
            "0.5",
            "--max-idle",
            "0.9",
            "--max-bubble",
            "0.2",
            "-f",
            "json",
        ],
    )
    assert res.exit_code == 3
    doc = json.loads(res.output)
    jsonschema.validate(doc, schema)
    assert {c["name"] for c in doc["checks"]} == {"min_overlap", "max_idle", "max_bubble"}


def test_junit_one_case_per_check(straggler_db: Path) -> None:
    res = runner.invoke(
        app,
        ["check", str(straggler_db), "--min-overlap", "0.5", "--max-idle", "0.9", "-f", "junit"],
    )
    root = ET.fromstring(res.output.split("?>", 1)[1])
    suite = root.find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["min_overlap", "max_idle"]
    assert suite.get("tests") == "2" and suite.get("failures") == "1"
    assert cases[0].find("failure") is not None and cases[1].find("failure") is None


def test_github_annotations_and_summary(
    straggler_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    res = runner.invoke(
        app,
        ["check", str(straggler_db), "--min-overlap", "50%", "--max-idle", "0.9", "-f", "github"],
    )
    lines = res.output.strip().splitlines()
    pattern = re.compile(r"^::(error|warning|notice) title=[^:,\n]+::[^\n]+$")
    assert lines and all(pattern.match(line) for line in lines), lines
    assert lines[0].startswith("::error title=ranklens min_overlap::")
    assert "%25" in lines[0]  # '%' is escaped as the workflow-command syntax requires
    text = summary.read_text()
    assert text.startswith("## ranklens check: failed") and "| ❌ | min_overlap |" in text


def test_baseline_same_run_no_regression_slower_run_flagged(tmp_path: Path) -> None:
    """Same traces twice: no regression. A run whose steps are 30% longer: flagged."""
    base = tmp_path / "base.duckdb"
    load_traces([SAMPLES / "straggler_rank3" / "raw"], base)
    same = tmp_path / "same.duckdb"
    shutil.copy(base, same)
    res = runner.invoke(
        app, ["check", str(same), "--baseline", str(base), "--max-regression", "5%"]
    )
    assert res.exit_code == 0, res.output
    slow = tmp_path / "slow.duckdb"
    shutil.copy(base, slow)
    con = duckdb.connect(str(slow))
    # Stretch every step window by 30% (idle appended at the end): a uniformly slower run.
    con.execute("UPDATE steps SET end_ns = start_ns + CAST((end_ns - start_ns) * 1.3 AS BIGINT)")
    con.close()
    res = runner.invoke(
        app, ["check", str(slow), "--baseline", str(base), "--max-regression", "5%", "-f", "json"]
    )
    assert res.exit_code == 3, res.output
    doc = json.loads(res.output)
    reg = next(c for c in doc["checks"] if c["name"] == "max_regression")
    assert reg["status"] == "fail" and "step_time" in reg["worst"]["subject"]
    assert any(r.startswith("step time +30.0%") for r in doc["regressions"])


def _stretch(db: Path, factor: float, where: str = "TRUE") -> None:
    con = duckdb.connect(str(db))
    con.execute(
        f"UPDATE steps SET end_ns = start_ns + CAST((end_ns - start_ns) * {factor} AS BIGINT) "
        f"WHERE {where}"
    )
    con.close()


def test_baseline_warmup_step_does_not_hide_slowdown(tmp_path: Path) -> None:
    """A baseline whose first step on every rank took 4x (warm-up), 3 steps as captured: a run
    3x slower is still a step-time regression (the mean ± sd band called it noise)."""
    clean = tmp_path / "clean.duckdb"
    load_traces([SAMPLES / "straggler_rank3" / "raw"], clean)
    base, slow = tmp_path / "base.duckdb", tmp_path / "slow.duckdb"
    shutil.copy(clean, base)
    shutil.copy(clean, slow)
    _stretch(base, 4.0, "step = (SELECT min(step) FROM steps)")
    _stretch(slow, 3.0)
    args = ["--baseline", str(base), "--max-regression", "25%", "-f", "json"]
    res = runner.invoke(app, ["check", str(slow), *args])
    assert res.exit_code == 3, res.output
    assert any(r.startswith("step time +") for r in json.loads(res.output)["regressions"])
    # The warm-up baseline against the clean run: faster, never a regression.
    assert runner.invoke(app, ["check", str(clean), *args]).exit_code == 0


def test_noise_blocks_small_changes() -> None:
    c = baseline.Change("step_time", "all", 0, 100.0, 104.0, 0.04, 0.10, False)
    assert baseline.summarize([c]) == []
    assert baseline._ranges([0, 1, 2, 5, 7, 8]) == "0–2, 5, 7–8"
