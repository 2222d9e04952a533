"""The cross-rank options as a user gives them: --layout, --no-align, --offsets, and
[tool.ranklens] in ./pyproject.toml; the report's alignment and straggler lines."""

from __future__ import annotations

import json
import os
from pathlib import Path

import duckdb
import pytest
from ranklens.cli.main import app
from typer.testing import CliRunner

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
runner = CliRunner()


def _labels(db: Path) -> dict[str, str]:
    with duckdb.connect(str(db), read_only=True) as con:
        return dict(con.execute("SELECT pg_name, parallelism FROM process_groups").fetchall())


def test_layout_flag_and_pyproject(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = str(SAMPLES / "unnamed_tp2_pp2_dp2" / "raw")
    out = tmp_path / "a.duckdb"
    res = runner.invoke(app, ["ingest", raw, "-o", str(out), "--layout", "tp=2,pp=2,dp=2"])
    assert res.exit_code == 0, res.output
    assert _labels(out)["7"] == "TP" and _labels(out)["1"] == "DP"
    # the same from [tool.ranklens] in the current directory
    (tmp_path / "pyproject.toml").write_text('[tool.ranklens]\nlayout = "tp=2,pp=2,dp=2"\n')
    monkeypatch.chdir(tmp_path)
    out2 = tmp_path / "b.duckdb"
    assert runner.invoke(app, ["ingest", raw, "-o", str(out2)]).exit_code == 0
    assert _labels(out2) == _labels(out)
    bad = runner.invoke(app, ["ingest", raw, "-o", str(out2), "--layout", "tp=two"])
    assert bad.exit_code == 1 and "error:" in bad.output and "hint:" in bad.output


def test_report_lines_and_options(tmp_path: Path) -> None:
    raw = str(SAMPLES / "straggler_rank3" / "raw")
    res = runner.invoke(app, ["report", raw, "--format", "markdown"])
    assert res.exit_code == 0, res.output
    assert "clock alignment: single_host" in res.output
    assert "collectives: 12 of 12 comm ops matched (100.0%)" in res.output
    assert "stragglers: holding the job back: rank 3 by" in res.output
    offsets = tmp_path / "o.json"
    offsets.write_text(json.dumps({"3": 1000}))
    out = tmp_path / "c.duckdb"
    res = runner.invoke(app, ["ingest", raw, "-o", str(out), "--offsets", str(offsets)])
    assert res.exit_code == 0, res.output
    with duckdb.connect(str(out), read_only=True) as con:
        rows = con.execute("SELECT rank, clock_offset_ns, clock_method FROM ranks").fetchall()
    assert sorted(rows)[3] == (3, 1000, "user") and sorted(rows)[0] == (0, 0, "none")
    # options belong to ingest: refused with a database
    res = runner.invoke(app, ["report", str(out), "--no-align"])
    assert res.exit_code == 1 and "--no-align" in res.output
    assert os.path.exists(out)
