"""Contention on a GPU-shaped job with exact truth (sample_traces/gpu_job.py): compute that
starts while the overlapped DP reduce-scatter runs is made 1.25x slower by the generator; the
kernels of one class (name, grid, launching op's input shapes) that ran alone give T_alone."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import duckdb
from ranklens.analysis import contention
from ranklens.sample_traces.gpu_job import GpuJob, write_job

Ingest = Callable[..., duckdb.DuckDBPyConnection]


def test_time_lost_to_contention_against_truth(tmp_path: Path, ingest: Ingest) -> None:
    job = GpuJob(pp=4, m=8, dp=2, dp_overlap=True, dp_us=4000.0, contention=1.25)
    run = write_job(job, tmp_path / "run")
    res = contention.run(ingest([tmp_path / "run"]))
    truth = run.truth["contention"]
    lost = int(res.table["time_lost_ns"].sum())
    assert abs(lost - truth["time_lost_ns"]) <= 0.10 * truth["time_lost_ns"], (lost, truth)
    compared = int(res.table["n_matched"].sum())
    assert compared == truth["slowed_kernels"]
    (found,) = [f for f in res.findings if f.code == "CONTENTION_COMPUTE_SLOWDOWN"]
    assert found.value is not None and abs(found.value - truth["slowdown"]) <= 0.10 * 0.25


def test_no_contention_no_finding(tmp_path: Path, ingest: Ingest) -> None:
    """The same job without the slowdown: nothing lost, no finding (forward and backward
    GEMMs of one kernel name are different classes, so a 2x longer backward is not a
    'slowdown')."""
    job = GpuJob(pp=4, m=8, dp=2, dp_overlap=True, dp_us=4000.0)
    write_job(job, tmp_path / "run")
    res = contention.run(ingest([tmp_path / "run"]))
    assert abs(int(res.table["time_lost_ns"].fill_null(0).sum())) <= 1_000
    assert "CONTENTION_COMPUTE_SLOWDOWN" not in [f.code for f in res.findings]
