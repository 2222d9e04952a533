"""Clock alignment: hand-built skews recovered exactly, options (--no-align, user offsets),
injected per-host offsets recovered on real traces (NCCL: median <= 5 µs, p99 <= 20 µs), and
the real cross-node Nsight set whose AllReduce ends must agree within the reported residual."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
import pytest
from align_injection import errors_of, load_tables, random_trials
from kineto_builder import KinetoTrace
from multirank import gpu_job
from ranklens.analysis import stragglers
from ranklens.ingest.config import RunOptions, resolve_options

Ingest = Callable[..., duckdb.DuckDBPyConnection]
SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
FS24 = "distributedsyslab-fs24-nccl"


def _skewed_job() -> tuple[list[KinetoTrace], dict[int, float]]:
    """4 ranks on 2 hosts; host b's clock runs 3,712.5 µs ahead. Every all-reduce ends at the
    same true time on all ranks (arrivals differ)."""
    shift = {2: 3712.5, 3: 3712.5}
    job = gpu_job(4, hosts=["a", "a", "b", "b"], shift_us=shift)
    for k in range(5):
        job.collective(
            "all_reduce", {r: 1000 + 2000 * k + 37 * r for r in range(4)}, 1900 + 2000 * k
        )
    return job.traces, shift


def _ranks(con: duckdb.DuckDBPyConnection) -> dict[int, tuple[int, str, int | None]]:
    rows = con.execute(
        "SELECT rank, clock_offset_ns, clock_method, align_residual_ns FROM ranks"
    ).fetchall()
    return {r: (o, m, res) for r, o, m, res in rows}


def test_host_offset_recovered(ingest: Ingest) -> None:
    traces, _ = _skewed_job()
    con = ingest(traces)
    got = _ranks(con)
    assert {r: (o, m) for r, (o, m, _) in got.items()} == {
        0: (0, "collectives"),
        1: (0, "collectives"),
        2: (-3_712_500, "collectives"),
        3: (-3_712_500, "collectives"),
    }
    assert all(res == 0 for _, _, res in got.values())
    # raw timestamps stay; the aligned views apply the offset
    ends = con.execute(
        "SELECT seq, min(aend_ns), max(aend_ns), min(end_ns), max(end_ns) "
        "FROM collectives_aligned GROUP BY seq"
    ).fetchall()
    for _, lo, hi, raw_lo, raw_hi in ends:
        assert lo == hi and raw_hi - raw_lo == 3_712_500
    (n,) = con.execute(
        "SELECT count(*) FROM events_aligned WHERE ats_ns <> ts_ns AND rank >= 2"
    ).fetchall()[0]
    assert n > 0


def test_no_align_and_user_offsets(ingest: Ingest, tmp_path: Path) -> None:
    traces, _ = _skewed_job()
    con = ingest(traces, options=RunOptions(align=False))
    got = _ranks(con)
    assert {o for o, _, _ in got.values()} == {0} and {m for _, m, _ in got.values()} == {"none"}
    # the residual still shows how far apart the raw clocks are
    assert max(res for *_, res in got.values() if res is not None) >= 1_800_000
    offsets = tmp_path / "offsets.json"
    offsets.write_text(json.dumps({"hosts": {"b": -3_712_000}}))
    opts = resolve_options(offsets_file=offsets)
    got = _ranks(ingest(traces, options=opts))
    assert got[2][:2] == (-3_712_000, "user") and got[0][:2] == (0, "none")
    assert got[2][2] == 250  # 0.5 µs left: half of it on each side of the consensus


def test_single_host_keeps_one_clock(ingest: Ingest) -> None:
    job = gpu_job(2, hosts=["a", "a"])
    job.collective("all_reduce", {0: 100, 1: 150}, 300)
    got = _ranks(ingest(job.traces))
    assert {(o, m) for o, m, _ in got.values()} == {(0, "single_host")}


@pytest.mark.parametrize(
    ("inputs", "ranks_per_host"),
    [
        ("param-dlrm-kineto/extracted", 1),
        ("param-dlrm-kineto/extracted", 2),
        ("param-dlrm-kineto/extracted", 4),
    ],
)
def test_injected_offsets_recovered_nccl(
    shared_traces: Path, ingest: Ingest, tmp_path: Path, inputs: str, ranks_per_host: int
) -> None:
    """Real NCCL ranks regrouped into hosts, offsets from 1 µs to 50 ms injected per host:
    recovered with median error <= 5 µs and 99th percentile <= 20 µs."""
    db = tmp_path / "run.duckdb"
    ingest([shared_traces / inputs]).close()
    src = sorted(tmp_path.glob("db/run*.duckdb"))[-1]
    src.rename(db)
    con = load_tables(db)
    errs = np.array(errors_of(random_trials(con, ranks_per_host, 20, seed=ranks_per_host)))
    assert errs.size
    assert np.median(errs) <= 5_000, errs
    assert np.percentile(errs, 99) <= 20_000, errs


def test_injected_offsets_on_gloo_cpu(ingest: Ingest, tmp_path: Path) -> None:
    """Same on real CPU gloo ranks: gloo collective ends disagree by up to milliseconds under
    preemption (8 ranks on 2 cores), so the bound is what we reach there, not the GPU one:
    median <= 0.5 ms, p99 <= 5 ms with 4 ranks per host (benchmarks/bench_align.py prints
    the full distribution)."""
    ingest([SAMPLES / "unnamed_tp2_pp2_dp2" / "raw"]).close()
    db = sorted(tmp_path.glob("db/run*.duckdb"))[-1]
    errs = np.array(errors_of(random_trials(load_tables(db), 4, 20, seed=4)))
    assert np.median(errs) <= 500_000 and np.percentile(errs, 99) <= 5_000_000, errs


@pytest.fixture(scope="module")
def fs24(
    shared_traces: Path, tmp_path_factory: pytest.TempPathFactory
) -> duckdb.DuckDBPyConnection:
    from ranklens.ingest import load_traces

    db = tmp_path_factory.mktemp("fs24") / "run.duckdb"
    load_traces([str(shared_traces / FS24 / "tree_allreduce_3nodes_9ranks" / "*.sqlite")], db)
    return duckdb.connect(str(db), read_only=True)


def test_cross_node_nsight_ends_agree_within_residual(fs24: duckdb.DuckDBPyConnection) -> None:
    """9 ranks on 3 hosts with real NTP-level skew (ms): after alignment every rank's
    AllReduce end is within its reported residual of the instance's consensus (median)."""
    ranks = dict(
        (r, (h, o, m, res))
        for r, h, o, m, res in fs24.execute(
            "SELECT rank, host, clock_offset_ns, clock_method, align_residual_ns FROM ranks"
        ).fetchall()
    )
    assert len(ranks) == 9 and {m for _, _, m, _ in ranks.values()} == {"collectives"}
    by_host: dict[str, set[int]] = {}
    for h, o, _, _ in ranks.values():
        by_host.setdefault(h, set()).add(o)
    assert len(by_host) == 3 and all(len(v) == 1 for v in by_host.values())  # one clock per host
    assert max(abs(next(iter(v))) for v in by_host.values()) > 1_000_000  # ms-level skew fixed
    rows = fs24.execute(
        "SELECT rank, aend_ns, quantile_disc(aend_ns, 0.5) OVER (PARTITION BY instance_id) FROM "
        "collectives_aligned WHERE op = 'all_reduce' AND status = 'matched'"
    ).fetchall()
    assert len(rows) == 9
    for rank, end, consensus in rows:
        assert abs(end - consensus) <= ranks[rank][3] + 1, (rank, end - consensus)
    # raw ends are spread by the clock skew, aligned ones only by the residuals
    raw = fs24.execute("SELECT max(end_ns) - min(end_ns) FROM collectives").fetchall()[0][0]
    aligned = fs24.execute(
        "SELECT max(aend_ns) - min(aend_ns) FROM collectives_aligned WHERE rank <> 0"
    ).fetchall()[0][0]
    assert aligned < 100_000 < raw


def test_poor_residual_is_reported(fs24: duckdb.DuckDBPyConnection) -> None:
    """One ault42 rank ends 5.8 ms before its node-mates: the report says the alignment is
    poor there instead of attributing cross-host skews below that."""
    res = stragglers.run(fs24)
    (f,) = [f for f in res.findings if f.code == "ALIGN_RESIDUAL_POOR"]
    assert 0 in f.ranks and f.value is not None and f.value > 5_000_000
