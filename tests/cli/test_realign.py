"""`ranklens realign` on the bundled samples: the same layout gives the ingested tables, another
layout exactly a fresh ingest's (tables, stored results and the report), offsets shift the
aligned clock by what was given, and bad input is an `error:` + `hint:` that changes nothing."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import duckdb
import pytest
from crossrank_tables import crossrank_tables
from ranklens.cli.main import app
from typer.testing import CliRunner

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
LAYOUT = "tp=2,pp=2,dp=2"
runner = CliRunner()


def invoke(*args: str) -> str:
    res = runner.invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return str(res.output)


def copy(src: Path, dst: Path) -> Path:
    shutil.copyfile(src, dst)
    return dst


@pytest.fixture(scope="module")
def unnamed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sample whose groups carry no names, ingested with and without the layout (the only
    evidence that labels its TP/PP/DP groups)."""
    d = tmp_path_factory.mktemp("unnamed")
    raw = str(SAMPLES / "unnamed_tp2_pp2_dp2" / "raw")
    invoke("ingest", raw, "-o", str(d / "layout.duckdb"), "--layout", LAYOUT)
    invoke("ingest", raw, "-o", str(d / "plain.duckdb"))
    return {"layout": d / "layout.duckdb", "plain": d / "plain.duckdb"}


def test_same_layout_same_crossrank_tables(unnamed: dict[str, Path], tmp_path: Path) -> None:
    db = copy(unnamed["layout"], tmp_path / "run.duckdb")
    said = invoke("realign", str(db), "--layout", LAYOUT)
    assert "368 of 368 comm ops matched" in said and "layout: tp=2,dp=2,pp=2" in said
    assert crossrank_tables(db) == crossrank_tables(unnamed["layout"])


@pytest.mark.parametrize("direction", ["drop_layout", "add_layout"])
def test_other_layout_is_a_fresh_ingest(
    unnamed: dict[str, Path], tmp_path: Path, direction: str
) -> None:
    start, want, args = {
        "drop_layout": ("layout", "plain", []),
        "add_layout": ("plain", "layout", ["--layout", LAYOUT]),
    }[direction]
    assert (
        crossrank_tables(unnamed[start])["process_groups"]
        != crossrank_tables(unnamed[want])["process_groups"]
    )
    db = copy(unnamed[start], tmp_path / "run.duckdb")
    invoke("realign", str(db), *args)
    assert crossrank_tables(db) == crossrank_tables(unnamed[want])
    # stored results were recomputed (fresh, with the new stamp) and the report is the fresh
    # ingest's, findings and every analysis table included
    with duckdb.connect(str(db), read_only=True) as con:
        stamps = con.execute("SELECT DISTINCT run_stamp FROM analysis_results").fetchall()
    assert len(stamps) == 1 and "realigned_at=" in stamps[0][0]
    got = json.loads(invoke("report", str(db), "--format", "json"))
    fresh = json.loads(invoke("report", str(unnamed[want]), "--format", "json"))
    assert got["findings"] == fresh["findings"] and got["analyses"] == fresh["analyses"]


def test_offsets_shift_alignment(tmp_path: Path) -> None:
    raw = str(SAMPLES / "straggler_rank3" / "raw")
    db = tmp_path / "run.duckdb"
    invoke("ingest", raw, "-o", str(db))
    before = crossrank_tables(db)
    given = {"3": 1_000, "1": -2_500_000}
    offsets = tmp_path / "offsets.json"
    offsets.write_text(json.dumps(given))
    invoke("realign", str(db), "--offsets", str(offsets))
    want = {int(r): v for r, v in given.items()}
    with duckdb.connect(str(db), read_only=True) as con:
        for view, raw_col in (("events_aligned", "ts_ns"), ("collectives_aligned", "end_ns")):
            col = "ats_ns" if raw_col == "ts_ns" else "aend_ns"
            shift = con.execute(
                f"SELECT DISTINCT rank, {col} - {raw_col} FROM {view} ORDER BY ALL"
            ).fetchall()
            assert shift == [(r, want.get(r, 0)) for r in range(4)]
        rows = con.execute("SELECT rank, clock_method FROM ranks ORDER BY rank").fetchall()
    assert rows == [(0, "none"), (1, "user"), (2, "none"), (3, "user")]
    assert "collectives: 12 of 12 comm ops matched" in invoke("report", str(db), "-f", "markdown")
    invoke("realign", str(db))  # and back: one host, one clock, as ingested
    assert crossrank_tables(db) == before


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--layout", "tp=two"], "layout size 'tp=two' is not a positive integer"),
        (["--layout", "tp=2,dp=2"], "layout tp=2,dp=2,order=tp-dp describes 4 ranks"),
        (["--offsets", "missing.json"], "cannot read offsets"),
        (["RUN=nope.duckdb"], "no such file"),
        (["RUN=raw"], "is a directory"),
        (["RUN=raw/rank0.json.gz"], "not a DuckDB database"),
    ],
)
def test_bad_input_is_error_and_hint(
    unnamed: dict[str, Path], tmp_path: Path, args: list[str], message: str
) -> None:
    db = copy(unnamed["plain"], tmp_path / "run.duckdb")
    shutil.copytree(SAMPLES / "unnamed_tp2_pp2_dp2" / "raw", tmp_path / "raw")
    digest = _digest(db)
    run = [str(tmp_path / a[4:]) for a in args if a.startswith("RUN=")] or [str(db)]
    opts = [str(tmp_path / a) if a.endswith(".json") else a for a in args]
    res = runner.invoke(app, ["realign", *run, *[a for a in opts if not a.startswith("RUN=")]])
    assert res.exit_code == 1, res.output
    assert "error: " in res.output and "hint: " in res.output, res.output
    assert message in res.output and "Traceback" not in res.output
    assert _digest(db) == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw", "run.duckdb"]


def test_database_options_hint_names_realign(unnamed: dict[str, Path]) -> None:
    res = runner.invoke(app, ["report", str(unnamed["plain"]), "--layout", LAYOUT])
    assert res.exit_code == 1 and "ranklens realign" in res.output
