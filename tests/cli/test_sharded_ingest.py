"""`ranklens ingest --storage shards` as a user runs it: the console script, from a working
directory outside the run, with the stored results (finalize_run) that report, check and the
dashboard reuse.

Why: a sharded run's stored `events` view reads its shards by a path relative to the run
directory; the dependency graph, built on a connection of its own beside the analyses, read
that view and found no shard, and every such ingest ended in an internal error. The tests of
the storage compared tables of `load_traces` without stored results, and missed it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from ranklens.analysis.report import stored_report
from ranklens.ingest import shards

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "megatron_tp2_pp2_dp2" / "raw"
RANKLENS = str(Path(sys.executable).with_name("ranklens"))


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [RANKLENS, *args], cwd=cwd, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
    return done


def test_sharded_ingest_stores_the_results_of_the_one_file_run(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    one, sharded = tmp_path / "one.duckdb", tmp_path / "sharded"
    _run(elsewhere, "ingest", str(SAMPLE), "-o", str(one))
    said = _run(elsewhere, "ingest", str(SAMPLE), "-o", str(sharded), "--storage", "shards")
    assert "stored results" in said.stdout
    assert list((sharded / "events").glob("rank=*/*.parquet"))  # the events are in shards
    con = duckdb.connect(str(sharded / shards.CATALOG), read_only=True)
    try:
        shards.attach(con, sharded)
        assert stored_report(con) is not None  # every analysis and the report were stored
    finally:
        con.close()
    # what a user reads: the same report from either storage
    reports = [
        json.loads(_run(elsewhere, "report", str(run), "--format", "json").stdout)
        for run in (one, sharded)
    ]
    assert reports[0]["findings"] and reports[0]["findings"] == reports[1]["findings"]


def test_engine_ray_as_a_user_runs_it(tmp_path: Path) -> None:
    """`--engine ray` without an address: ranklens starts a local Ray instance of its own (the
    other Ray test starts it itself) and gives the one-file run's report; the output is
    ranklens' own, without Ray's timestamped log lines among it."""
    pytest.importorskip("ray", reason="Ray is part of the dev extra (CI installs it)")
    one, ray_run = tmp_path / "one.duckdb", tmp_path / "ray"
    _run(tmp_path, "ingest", str(SAMPLE), "-o", str(one))
    said = _run(
        tmp_path, "ingest", str(SAMPLE), "-o", str(ray_run), "--engine", "ray", "--workers", "2"
    )
    lines = (said.stdout + said.stderr).splitlines()
    assert lines and lines[0].startswith("ingested 8 rank(s)"), lines
    ray_lines = [ln for ln in lines if re.search(r"\b(INFO|WARNING)\b|Ray instance", ln)]
    assert ray_lines == []
    assert list((ray_run / "events").glob("rank=*/*.parquet"))  # the tasks wrote the shards
    reports = [
        json.loads(_run(tmp_path, "report", str(run), "--format", "json").stdout)
        for run in (one, ray_run)
    ]
    assert reports[0]["findings"] and reports[0]["findings"] == reports[1]["findings"]
