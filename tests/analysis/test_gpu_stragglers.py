"""Stragglers at scale on GPU-shaped jobs with exact truth (sample_traces/gpu_job.py): the
injected slow rank is named and no other, with and without p2p peers in the trace; many slow
ranks make one finding naming them all; the text report of a job with more ranks than it shows
keeps the evidence of its findings and says what it left out."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest
from ranklens.analysis import stragglers
from ranklens.sample_traces.gpu_job import GpuJob, write_job

Ingest = Callable[..., duckdb.DuckDBPyConnection]


@pytest.mark.parametrize("peers", [True, False])
def test_one_straggler_of_64_named_alone(tmp_path: Path, ingest: Ingest, peers: bool) -> None:
    """tp2 x dp8 x pp4 = 64 ranks on 8 hosts (stages on their own hosts: only p2p joins their
    clocks); rank 37 (stage 2) computes 1.3x slower."""
    job = GpuJob(tp=2, dp=8, pp=4, m=8, steps=2, rank_factor={37: 1.3}, peers=peers)
    run = write_job(job, tmp_path / "run")
    con = ingest([tmp_path / "run"])
    res = stragglers.run(con)
    named = [f.ranks for f in res.findings if f.code == "STRAGGLER_RANK"]
    assert named == [(37,)]
    window = max(r["window_ns"] for r in run.truth["per_rank_step"])
    assert (res.table["net_held_back_per_step_ns"] <= window).all()
    assert (res.table["caused_wait_ns"] >= 0).all()


def test_many_stragglers_are_one_finding(tmp_path: Path, ingest: Ingest) -> None:
    """Five slow ranks in five DP replicas of one stage: one STRAGGLER_RANK finding that names
    exactly those five (worst first), not five findings."""
    slow = {8 + 2 * d: 1.3 for d in range(5)}  # tp rank 0 of stage 1 in DP replicas 0..4
    job = GpuJob(tp=2, dp=8, pp=2, m=4, steps=2, rank_factor=slow)
    write_job(job, tmp_path / "run")
    con = ingest([tmp_path / "run"])
    res = stragglers.run(con)
    found = [f for f in res.findings if f.code == "STRAGGLER_RANK"]
    assert len(found) == 1
    assert sorted(found[0].ranks) == sorted(slow)
    assert "5 ranks" in found[0].message and "2 more" in found[0].message
    per_rank = dict(
        zip(
            res.table["rank"].to_list(),
            res.table["net_held_back_per_step_ns"].to_list(),
            strict=True,
        )
    )
    assert found[0].time_at_stake_ns == max(per_rank[r] for r in slow)


def test_report_of_many_ranks_shows_the_evidence(tmp_path: Path) -> None:
    """A 64-rank report lists at most 32 ranks: the straggler's row is among them, the title
    says how many were left out, and the schedule of 16 agreeing PP groups is one line."""
    job = GpuJob(tp=2, dp=8, pp=4, m=8, steps=2, rank_factor={37: 1.3})
    write_job(job, tmp_path / "run")
    db = tmp_path / "run.duckdb"
    subprocess.run(["ranklens", "ingest", str(tmp_path / "run"), "-o", str(db)], check=True)
    out = subprocess.run(
        ["ranklens", "report", str(db)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "250"},
    ).stdout
    assert "32 of 64 ranks" in out
    rank_rows = [ln for ln in out.splitlines() if re.match(r"│\s+37 │", ln)]
    assert rank_rows, out
    assert "16 PP groups: 1f1b, p=4, m=8" in out
    assert not [ln for ln in out.splitlines() if ln.strip().startswith("PP group ")]


@pytest.mark.slow
def test_one_straggler_of_1024_named_alone(tmp_path: Path, ingest: Ingest) -> None:
    """tp8 x dp32 x pp4 = 1,024 ranks on 128 hosts, without p2p peers in the traces (inferred),
    rank 257 (stage 1) 1.3x slower: every send/recv matched, clocks of the stage hosts linked
    through p2p, the straggler named and no other rank, one finding."""
    job = GpuJob(tp=8, dp=32, pp=4, m=4, steps=2, rank_factor={257: 1.3}, peers=False)
    run = write_job(job, tmp_path / "run")
    con = ingest([tmp_path / "run"], workers=2)
    status = dict(con.execute("SELECT status, count(*) FROM collectives GROUP BY 1").fetchall())
    assert set(status) == {"matched"}, status
    offsets = dict(con.execute("SELECT rank, clock_offset_ns FROM ranks").fetchall())
    want = run.truth["clock_offset_ns"]
    assert max(abs(offsets[r] - want[str(r)]) for r in offsets) <= 1_000
    res = stragglers.run(con)
    assert [f.ranks for f in res.findings if f.code == "STRAGGLER_RANK"] == [(257,)]
    window = max(r["window_ns"] for r in run.truth["per_rank_step"])
    assert (res.table["net_held_back_per_step_ns"] <= window).all()


def test_batched_p2p_results_do_not_depend_on_row_order(tmp_path: Path) -> None:
    """A batched send and recv arrive at once on one rank: which was stored first must not
    change who released whom (each row's `ref`) or any instance's own delay. Ingested twice
    the same job gave different stragglers_by_instance rows before the ties were broken."""
    from ranklens.analysis._sql import apply_sql, query_pl
    from ranklens.ingest.loader import load_traces

    job = GpuJob(tp=1, pp=3, dp=2, m=6, steps=2, batched=True, contention=1.4, dp_overlap=True)
    write_job(job, tmp_path / "run")
    db = tmp_path / "run.duckdb"
    load_traces([str(tmp_path / "run")], db, workers=1)
    con = duckdb.connect(str(db))
    by_inst = "SELECT * FROM stragglers_by_instance ORDER BY instance_id"
    apply_sql(con, "stragglers")
    tied = query_pl(
        con,
        "SELECT a.ref, a.arr FROM _stragglers_rows a JOIN _stragglers_rows b ON a.rank = b.rank "
        "AND a.step = b.step AND a.arrive_ns = b.arrive_ns AND a.instance_id <> b.instance_id",
    )
    assert len(tied) > 0  # the job has such pairs
    assert (tied["ref"].is_null() | (tied["ref"] < tied["arr"])).all()  # not released by its twin
    before = query_pl(con, by_inst)
    for order in ("rowid DESC", "hash(rowid)"):
        con.execute(
            f"CREATE OR REPLACE TABLE collectives AS SELECT * FROM collectives ORDER BY {order}"
        )
        assert query_pl(con, by_inst).equals(before), order
    con.close()
