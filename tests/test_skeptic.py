"""What a skeptic checks first, on every bundled sample and every public trace: no per-step
figure exceeds its step, no finding's time exceeds the longest step or names a rank or step
the run does not have, and the critical path adds up to the replayed step, which is no longer
than the measured one. These catch an overstatement anywhere (a figure per row instead of per
step, a sum instead of a union); an understatement needs the hand-worked cases beside each
analysis (tests/analysis/test_contention.py's copies both ways)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl
import pytest
from ranklens.analysis.report import build_report
from ranklens.ingest import load_traces

from tests.test_goldens_public import PUBLIC

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
SAMPLE_RUNS = sorted(p.parent.name for p in SAMPLES.glob("*/raw"))
# every public run, as one ingest each (files of one run together)
PUBLIC_RUNS: dict[str, list[str]] = {
    **PUBLIC,
    "nsys_h100_2gpu": ["nsys-ai/h100_2gpu_1s.sqlite"],
    "nsys_mfu_before": ["nsys-ai/mfu_2gpu_before.sqlite"],
    "nsys_mfu_after": ["nsys-ai/mfu_2gpu_after.sqlite"],
    "nccl_ring_6": ["distributedsyslab-fs24-nccl/ring_allreduce_2nodes_6ranks"],
    "nccl_tree_9": ["distributedsyslab-fs24-nccl/tree_allreduce_3nodes_9ranks"],
    "nccl_tree2_9": ["distributedsyslab-fs24-nccl/tree_2xallreduce_3nodes_9ranks"],
    "pipit_cloverleaf": ["pipit-nsys/perlmutter-cloverleaf-cuda.sqlite"],
    "pipit_saxpy": ["pipit-nsys/saxpy-mpi-cuda_nsys_perlmutter0.sqlite"],
}
# (analysis, table or "" for its main one): per (rank, step) rows with window_ns
PER_STEP = (("breakdown", ""), ("overlap", ""), ("stragglers", "by_step"), ("pipeline", ""))
NOT_TIME = {"start_ns", "window_ns"}  # a position, and the step itself


def _check(con: duckdb.DuckDBPyConnection, name: str) -> None:
    steps = pl.from_arrow(
        con.sql("SELECT rank, step, end_ns - start_ns AS w FROM steps").to_arrow_table()
    )
    assert isinstance(steps, pl.DataFrame) and steps.height, name
    longest = int(steps["w"].max())  # type: ignore[arg-type]
    ranks, step_ids = set(steps["rank"].to_list()), set(steps["step"].to_list())
    rep = build_report(con)
    for mod, key in PER_STEP:
        res = rep.results.get(mod)
        if res is None:
            continue
        df = res.table if not key else res.tables[key]
        for col in (c for c in df.columns if c.endswith("_ns") and c not in NOT_TIME):
            over = df.filter((pl.col(col) > pl.col("window_ns")) | (pl.col(col) < 0))
            assert over.is_empty(), (name, mod, key, col, over.head(3).to_dicts())
    # per (rank, step) tables without a window column, against the step
    for mod, key, col in (
        ("contention", "memcpy", "exposed_ns"),  # one direction's exposed copy time
        ("contention", "memcpy_steps", "copy_ns"),  # the copies' wall-clock time
        ("contention", "comm_steps", "lost_ns"),  # comm slowed by comm, wall-clock
        ("collectives", "slow_by_rank", "excess_ns"),  # time beyond the median, slow colls
    ):
        df = rep.results[mod].tables[key].join(steps, on=["rank", "step"], how="left")
        over = df.filter(pl.col(col) > pl.col("w"))
        assert over.is_empty(), (name, mod, key, col, over.head(3).to_dicts())
    wall = rep.results["contention"].tables["memcpy_steps"]  # its exposed part within it
    assert wall.filter(pl.col("exposed_ns") > pl.col("copy_ns")).is_empty(), name
    for f in rep.findings:
        assert 0 <= f.time_at_stake_ns <= longest, (name, f.code, f.time_at_stake_ns, longest)
        assert f.saving_ns is None or f.saving_ns <= longest, (name, f.code, f.saving_ns)
        assert set(f.ranks) <= ranks and set(f.steps) <= step_ids, (name, f.code)
    cp = rep.results.get("critical_path")
    if cp is not None and cp.table.height:
        parts = ("compute_ns", "comm_transfer_ns", "comm_wait_ns", "memory_ns")
        parts += ("host_launch_ns", "idle_ns")
        t = cp.table.with_columns(pl.sum_horizontal(*parts).alias("path_ns"))
        bad = t.filter(
            (pl.col("path_ns") != pl.col("replayed_step_ns"))
            | (pl.col("replayed_step_ns") > pl.col("measured_step_ns"))
        )
        assert bad.is_empty(), (name, bad.head(3).to_dicts())


@pytest.mark.parametrize("sample", SAMPLE_RUNS)
def test_samples_survive_a_skeptic(sample: str, tmp_path: Path) -> None:
    db = tmp_path / "run.duckdb"
    load_traces([SAMPLES / sample / "raw"], db)
    with duckdb.connect(str(db), read_only=True) as con:
        _check(con, sample)


@pytest.mark.parametrize("run", sorted(PUBLIC_RUNS))
def test_public_traces_survive_a_skeptic(run: str, shared_traces: Path, tmp_path: Path) -> None:
    db = tmp_path / "run.duckdb"
    load_traces([shared_traces / r for r in PUBLIC_RUNS[run]], db)
    with duckdb.connect(str(db), read_only=True) as con:
        _check(con, run)
