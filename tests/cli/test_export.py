"""`ranklens export --parquet`: the run's tables as hive-partitioned Parquet other engines read,
checked against the database itself, and the targets it must refuse."""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl
import pytest
from ranklens.cli.main import app
from ranklens.ingest.export import PER_RANK
from ranklens.ingest.schema import TABLES
from typer.testing import CliRunner

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "megatron_tp2_pp2_dp2" / "raw"
runner = CliRunner()


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "run.duckdb"
    res = runner.invoke(app, ["ingest", str(SAMPLE), "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def exported(db: Path) -> Path:
    out = db.parent / "pq"
    res = runner.invoke(app, ["export", str(db), "--parquet", str(out)])
    assert res.exit_code == 0, res.output
    assert f"-> {out}" in res.output
    return out


def _db_counts(db: Path, table: str) -> tuple[int, dict[int, int]]:
    """Rows of `table`, and per rank the sum of a column that differs between rows."""
    col = {"events": "dur_ns", "collectives": "end_ns", "steps": "end_ns", "threads": "tid"}
    con = duckdb.connect(str(db), read_only=True)
    try:
        n = int(con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0])
        sums = con.execute(f"SELECT rank, sum({col[table]}) FROM {table} GROUP BY rank").fetchall()
    finally:
        con.close()
    return n, {int(r): int(s) for r, s in sums}


def test_layout(db: Path, exported: Path) -> None:
    """Per-rank tables in rank=N/ directories (one per rank of the run), the others one file."""
    for t in TABLES:
        if t.name in PER_RANK:
            parts = sorted(p.name for p in (exported / t.name).iterdir())
            assert parts == [f"rank={r}" for r in range(8)], t.name
            assert list((exported / t.name / "rank=0").glob("*.parquet")), t.name
        else:
            assert (exported / f"{t.name}.parquet").is_file(), t.name
    assert not [p for p in exported.parent.iterdir() if ".tmp-" in p.name]  # renamed, none left


@pytest.mark.parametrize("table", PER_RANK)
def test_duckdb_reads_it_back(db: Path, exported: Path, table: str) -> None:
    n, sums = _db_counts(db, table)
    assert n > 0
    col = {"events": "dur_ns", "collectives": "end_ns", "steps": "end_ns", "threads": "tid"}
    glob = str(exported / table / "**" / "*.parquet")
    con = duckdb.connect()
    got = con.execute(
        f"SELECT count(*) FROM read_parquet('{glob}', hive_partitioning = true)"
    ).fetchall()[0][0]
    rows = con.execute(
        f"SELECT rank, sum({col[table]}) FROM read_parquet('{glob}', hive_partitioning = true) "
        "GROUP BY rank"
    ).fetchall()
    assert got == n
    assert {int(r): int(s) for r, s in rows} == sums


def test_polars_reads_it_back(db: Path, exported: Path) -> None:
    n, sums = _db_counts(db, "events")
    ev = pl.scan_parquet(exported / "events" / "**" / "*.parquet", hive_partitioning=True)
    per = ev.group_by("rank").agg(pl.col("dur_ns").sum()).collect()
    assert ev.select(pl.len()).collect().item() == n
    assert {int(r): int(s) for r, s in per.iter_rows()} == sums
    kinds = ev.select(pl.col("kind").cast(pl.String).unique()).collect().to_series().to_list()
    assert "compute" in kinds and "comm" in kinds  # the ENUM survives as its labels
    groups = pl.read_parquet(exported / "process_groups.parquet")
    assert groups.height > 0 and groups.schema["ranks"] == pl.List(pl.Int32)


def test_export_from_traces_and_empty_dir(db: Path, tmp_path: Path) -> None:
    """Trace inputs are ingested first; an existing empty directory is written into."""
    out = tmp_path / "empty"
    out.mkdir()
    res = runner.invoke(app, ["export", str(SAMPLE), "--parquet", str(out)])
    assert res.exit_code == 0, res.output
    n, _ = _db_counts(db, "events")
    glob = str(out / "events" / "**" / "*.parquet")
    con = duckdb.connect()
    assert con.execute(f"SELECT count(*) FROM read_parquet('{glob}')").fetchall()[0][0] == n


def test_empty_per_rank_table_is_one_readable_file(tmp_path: Path) -> None:
    from ranklens.ingest.export import export_parquet
    from ranklens.ingest.schema import ddl

    con = duckdb.connect()
    con.execute(ddl())
    con.execute("INSERT INTO threads VALUES (0, 1, 2, 'main'), (3, 1, 5, 'x')")
    rep = export_parquet(con, tmp_path / "pq")
    assert rep.partitioned == ["threads"] and rep.rows["events"] == 0
    glob = str(tmp_path / "pq" / "events" / "**" / "*.parquet")
    assert con.execute(f"SELECT count(*) FROM read_parquet('{glob}')").fetchall()[0][0] == 0
    assert sorted(p.name for p in (tmp_path / "pq" / "threads").iterdir()) == ["rank=0", "rank=3"]


def _refused(args: list[str]) -> str:
    res = runner.invoke(app, ["export", *args])
    assert res.exit_code == 1, res.output
    assert "error:" in res.output and "hint:" in res.output
    assert "Traceback" not in res.output
    return res.output


def test_refuses_non_empty_dir(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "full"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert "not empty" in _refused([str(db), "--parquet", str(out)])
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert (out / "keep.txt").read_text() == "mine"


def test_refuses_an_input_or_inside_one(db: Path, tmp_path: Path) -> None:
    before = db.stat().st_size, db.stat().st_mtime_ns
    assert "one of the inputs" in _refused([str(db), "--parquet", str(db)])
    assert (db.stat().st_size, db.stat().st_mtime_ns) == before
    inside = SAMPLE / "pq"
    assert "overlaps the input" in _refused([str(SAMPLE), "--parquet", str(inside)])
    assert not inside.exists()


def test_refuses_a_file_and_a_missing_parent(db: Path, tmp_path: Path) -> None:
    f = tmp_path / "afile"
    f.write_text("x")
    assert "not a directory" in _refused([str(db), "--parquet", str(f)])
    assert f.read_text() == "x"
    assert "does not exist" in _refused([str(db), "--parquet", str(tmp_path / "no" / "pq")])


def test_a_killed_exports_leftover_is_removed_by_the_next(db: Path, tmp_path: Path) -> None:
    """A killed export leaves `.NAME.tmp-PID` beside its target; the next export to that target
    removes it (under the target's lock, so never a running export's), and finishes."""
    out = tmp_path / "pq"
    stale = tmp_path / ".pq.tmp-999999"
    (stale / "events").mkdir(parents=True)
    (stale / "events" / "part.parquet").write_bytes(b"half")
    res = runner.invoke(app, ["export", str(db), "--parquet", str(out)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pq"]
    assert (out / "events").is_dir()


def test_a_second_export_to_the_same_target_is_refused_while_one_runs(
    db: Path, tmp_path: Path
) -> None:
    from ranklens.ingest.output import output_lock

    out = tmp_path / "pq"
    with output_lock(out.absolute(), "export"):
        assert "another ranklens export" in _refused([str(db), "--parquet", str(out)])
    assert not out.exists()
