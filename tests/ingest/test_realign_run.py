"""realign_run on generated GPU jobs: the same options give exactly the ingested tables (through
p2p peer inference, batched p2p and estimated cross-host offsets), user offsets land as given,
stored analysis results go stale, and a failed or refused realign leaves the file as it was."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import duckdb
import pytest
from crossrank_tables import crossrank_tables
from ranklens.analysis import REGISTRY
from ranklens.analysis.results_store import load, store_all
from ranklens.ingest import load_traces
from ranklens.ingest.config import RunOptions
from ranklens.ingest.errors import DatabaseError
from ranklens.ingest.output import OutputError, output_lock
from ranklens.ingest.realign import realign_run
from ranklens.sample_traces.gpu_job import GpuJob, write_job


# What the cross-rank stage writes, and the facts it records (stamps aside).
def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _job_db(tmp_path: Path, **kw: Any) -> Path:
    """A small pp=4 x dp=2 job on 4 hosts (two ranks each, clocks shifted per host)."""
    job = GpuJob(tp=1, pp=4, dp=2, m=4, steps=1, kernels_per_block=1, ranks_per_host=2, **kw)
    write_job(job, tmp_path / "raw")
    db = tmp_path / "run.duckdb"
    load_traces([str(tmp_path / "raw")], db, workers=1)
    return db


@pytest.mark.parametrize(
    ("peers", "batched"), [(False, False), (True, True)], ids=["peers_inferred", "batched"]
)
def test_same_options_same_crossrank_tables(tmp_path: Path, peers: bool, batched: bool) -> None:
    db = _job_db(tmp_path, peers=peers, batched=batched)
    before = crossrank_tables(db)
    meta = dict(before["meta"])
    # the paths realign must reproduce were taken: estimated offsets, inferred or batched p2p
    assert {r[10] for r in before["ranks"]} == {"collectives", "p2p"}  # clock_method
    assert any(r[9] != 0 for r in before["ranks"])
    assert int(meta.get("p2p_peers_inferred", 0)) > 0 or int(meta["p2p_batched_kernels"]) > 0
    assert int(meta["collectives_matched"]) == len(before["collectives"])
    rep = realign_run(db, RunOptions())
    assert crossrank_tables(db) == before
    assert (rep.matched, rep.comm_ops) == (len(before["collectives"]),) * 2
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM meta WHERE key = 'realigned_at'").fetchone() == (
            1,
        )


def test_user_offsets_by_host_then_back(tmp_path: Path) -> None:
    db = _job_db(tmp_path)
    before = crossrank_tables(db)
    realign_run(db, RunOptions(offsets={"node0001": 5_000, 6: -7}))
    with duckdb.connect(str(db), read_only=True) as con:
        got = con.execute("SELECT rank, clock_offset_ns, clock_method FROM ranks").fetchall()
        shift = con.execute(
            "SELECT DISTINCT rank, ats_ns - ts_ns FROM events_aligned ORDER BY ALL"
        ).fetchall()
    want = {2: 5_000, 3: 5_000, 6: -7}
    assert sorted(got) == [(r, want.get(r, 0), "user" if r in want else "none") for r in range(8)]
    assert shift == [(r, want.get(r, 0)) for r in range(8)]
    realign_run(db, RunOptions())  # estimated again: nothing of the user offsets is left
    assert crossrank_tables(db) == before


def test_stored_results_go_stale(tmp_path: Path) -> None:
    db = _job_db(tmp_path)
    mods = tuple(m for m in REGISTRY if m.NAME in ("breakdown", "collectives"))
    with duckdb.connect(str(db)) as con:
        assert store_all(con, mods) == ["breakdown", "collectives"]
    realign_run(db, RunOptions(offsets={0: 123}))  # no finalize: nothing recomputed
    with duckdb.connect(str(db), read_only=True) as con:
        assert [load(con, m) for m in mods] == [None, None]
        assert con.execute("SELECT count(*) FROM analysis_results").fetchone() == (2,)


def test_failed_realign_keeps_the_database(tmp_path: Path) -> None:
    db = _job_db(tmp_path)
    digest, names = sha(db), sorted(p.name for p in tmp_path.iterdir())

    def boom(con: duckdb.DuckDBPyConnection) -> None:
        raise KeyboardInterrupt  # as Ctrl+C or SIGTERM (lifecycle.py) after the tables changed

    with pytest.raises(KeyboardInterrupt):
        realign_run(db, RunOptions(offsets={0: 1}), finalize=boom)
    assert sha(db) == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == names  # no copy or lock left


def test_refusals_change_nothing(tmp_path: Path) -> None:
    db = _job_db(tmp_path)
    digest = sha(db)
    with output_lock(db), pytest.raises(OutputError, match="another ranklens ingest"):
        realign_run(db, RunOptions())
    with pytest.raises(DatabaseError, match="no such file"):
        realign_run(tmp_path / "nope.duckdb", RunOptions())
    with pytest.raises(DatabaseError, match="is a directory"):
        realign_run(tmp_path / "raw", RunOptions())
    text = tmp_path / "raw" / "rank0.json"
    with pytest.raises(DatabaseError, match="not a DuckDB database"):
        realign_run(text, RunOptions())
    with duckdb.connect(str(tmp_path / "other.duckdb")) as con:
        con.execute("CREATE TABLE t (x INT)")
    with pytest.raises(DatabaseError, match="not a ranklens database"):
        realign_run(tmp_path / "other.duckdb", RunOptions())
    assert sha(db) == digest


def test_a_link_realigns_its_target(tmp_path: Path) -> None:
    db = _job_db(tmp_path)
    link = tmp_path / "link.duckdb"
    link.symlink_to(db)
    realign_run(link, RunOptions(offsets={1: 42}))
    assert link.is_symlink()
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT clock_offset_ns FROM ranks WHERE rank = 1").fetchone() == (42,)
