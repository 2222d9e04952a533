"""`ranklens sql -o FILE` never writes over what the user gave (the database, a trace, another
run) and replaces an earlier result in one rename: an interrupted write keeps the old file."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from ranklens.cli.main import app
from ranklens.ingest.output import replacing_file
from typer.testing import CliRunner

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "straggler_rank3" / "raw"
runner = CliRunner()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sqlout") / "run.duckdb"
    res = runner.invoke(app, ["ingest", str(SAMPLE), "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out


def test_the_database_itself_is_refused_and_kept(db: Path) -> None:
    before = _digest(db)
    res = runner.invoke(app, ["sql", str(db), "SELECT 1 AS x", "-f", "csv", "-o", str(db)])
    assert res.exit_code == 1
    assert "error:" in res.output and "one of the inputs" in res.output and "hint:" in res.output
    assert _digest(db) == before


def test_another_run_and_a_trace_a_glob_matches_are_refused(db: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.duckdb"
    shutil.copyfile(db, other)
    traces = tmp_path / "traces"
    shutil.copytree(SAMPLE, traces)
    rank0 = sorted(traces.iterdir())[0]
    kept = {p: _digest(p) for p in (other, rank0)}
    res = runner.invoke(app, ["sql", str(db), "SELECT 1", "-o", str(other)])
    assert res.exit_code == 1 and "is a DuckDB database" in res.output
    res = runner.invoke(app, ["sql", str(traces / "*.json.gz"), "SELECT 1", "-o", str(rank0)])
    assert res.exit_code == 1 and "one of the inputs" in res.output
    assert {p: _digest(p) for p in kept} == kept


def test_an_earlier_result_is_replaced_whole(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "result.csv"
    out.write_text("old,rows\n1,2\n")
    res = runner.invoke(app, ["sql", str(db), "SELECT 7 AS x", "-f", "csv", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_text().split() == ["x", "7"]
    assert [p.name for p in tmp_path.iterdir()] == ["result.csv"]  # no temporary left


def test_an_interrupted_write_keeps_the_old_file(tmp_path: Path) -> None:
    out = tmp_path / "result.csv"
    out.write_text("old\n")
    with pytest.raises(KeyboardInterrupt), replacing_file(out) as tmp:
        tmp.write_text("half of the new")
        raise KeyboardInterrupt
    assert out.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["result.csv"]
