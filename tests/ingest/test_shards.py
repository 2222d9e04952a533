"""Sharded runs (--storage shards): a directory holding the catalog and each rank's events as
Parquet written by per-rank tasks. Every table and view equals a one-file ingest of the same
traces (bundled samples, generated GPU jobs with injected truth, public NCCL and Nsight traces,
in-process and in a process pool, and on a local Ray instance), and the run behaves as a run:
bad files skipped with their shards gone, a failed ingest keeps the previous run, the directory
can be moved, and the sandboxed SQL console reads the shards and nothing else."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import duckdb
import pytest
from nsys_fixtures import NsysDB
from ranklens.analysis.report import build_report
from ranklens.analysis.sql_console import SqlError, run_sql
from ranklens.ingest import crossrank, load_traces
from ranklens.ingest.database import connect
from ranklens.ingest.errors import RanklensError
from ranklens.ingest.output import OutputError
from ranklens.ingest.schema import TABLES
from ranklens.ingest.shards import CATALOG, COMM_TABLE
from ranklens.sample_traces.gpu_job import GpuJob, write_job

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
_STAMPS = ("ingested_at",)


def tables(run: Path) -> dict[str, list[Any]]:
    """Every row of every schema table (and the aligned view), sorted; stamps aside. Sorted
    with `kind` as text: a sharded run's `events.kind` is VARCHAR, not the ENUM (shards.py
    _view_sql says why), so ORDER BY ALL would order the same rows differently."""
    con = connect(run)
    try:
        out = {}
        for name in [t.name for t in TABLES] + ["events_aligned"]:
            cols = [r[0] for r in con.execute(f"DESCRIBE {name}").fetchall()]
            order = ", ".join(f'"{c}"::VARCHAR' if c == "kind" else f'"{c}"' for c in cols)
            rows = con.execute(f"SELECT * FROM {name} ORDER BY {order}").fetchall()
            out[name] = [r for r in rows if not (name == "meta" and r[0] in _STAMPS)]
        return out
    finally:
        con.close()


def both(src: list[str], tmp: Path, **kw: Any) -> tuple[Path, Path]:
    """The same traces ingested into one file and into a sharded run."""
    tmp.mkdir(parents=True, exist_ok=True)
    a, b = tmp / "one.duckdb", tmp / "sharded"
    ra = load_traces(src, a, **kw)
    rb = load_traces(src, b, storage="shards", **kw)
    small = [w for w in rb.warnings if w.startswith("--storage shards with small ranks")]
    assert small  # these test ranks are small: the user is told a one-file run is faster
    rest = [w for w in rb.warnings if w not in small]
    assert (ra.n_events, ra.ranks, ra.warnings) == (rb.n_events, rb.ranks, rest)
    return a, b


def assert_same(a: Path, b: Path) -> None:
    ta, tb = tables(a), tables(b)
    for name in ta:
        assert ta[name] == tb[name], name
    assert ta["events"]  # something was compared


def _job(tmp: Path, **kw: Any) -> tuple[Path, dict[str, Any]]:
    job = GpuJob(tp=2, pp=4, dp=2, m=4, steps=2, kernels_per_block=2, **kw)
    write_job(job, tmp / "raw")
    return tmp / "raw", json.loads((tmp / "raw" / "truth.json").read_text())


@pytest.mark.parametrize("workers", [1, 2])
def test_generated_gpu_job_same_tables_and_truth(tmp_path: Path, workers: int) -> None:
    raw, truth = _job(tmp_path, rank_factor={5: 1.5}, batched=True)
    a, b = both([str(raw)], tmp_path, workers=workers)
    assert_same(a, b)
    con = connect(b)
    # the catalog holds only the communication rows; each rank has its own shard directory
    kinds = dict(con.execute(f"SELECT kind, count(*) FROM {COMM_TABLE} GROUP BY ALL").fetchall())
    assert kinds.get("comm", 0) > 0 and "compute" not in kinds
    assert sorted(p.name for p in (b / "events").iterdir()) == sorted(
        f"rank={r}" for r in range(16)
    )
    # independent facts: every injected p2p message matched, the injected straggler named
    matched = con.execute(
        "SELECT count(*) FROM collectives WHERE op = 'send' AND status = 'matched'"
    ).fetchone()
    assert matched is not None and matched[0] == truth["p2p_messages"]
    rep = build_report(con)
    con.close()
    assert truth["straggler_ranks"] == [5]
    named = {r for f in rep.findings if f.code.startswith("STRAGGLER") for r in f.ranks}
    assert named == {5}, [(f.code, f.ranks) for f in rep.findings]


def test_bundled_samples_same_tables(tmp_path: Path) -> None:
    for name in ("pp4_1f1b_m8", "megatron_tp2_pp2_dp2"):
        a, b = both([str(SAMPLES / name)], tmp_path / name, workers=2)
        assert_same(a, b)


def test_public_nccl_and_nsight_same_tables(tmp_path: Path, shared_traces: Path) -> None:
    dlrm = shared_traces / "param-dlrm-kineto" / "extracted"
    a, b = both([str(dlrm)], tmp_path / "dlrm", workers=2)
    assert_same(a, b)
    nsys = shared_traces / "nsys-ai" / "h100_2gpu_1s.sqlite"
    a, b = both([str(nsys)], tmp_path / "nsys", workers=1)
    assert_same(a, b)


def test_nsight_compute_and_nccl_kernels_same_tables(tmp_path: Path) -> None:
    """A Nsight export whose kernels are both compute and NCCL: the reader labels only the NCCL
    ones with a collective, and Parquet refused the null label in its dictionary (every such
    export failed with --storage shards)."""
    db = NsysDB(tmp_path / "rank0.sqlite").meta(env={"RANK": "0"})
    db.process(100)
    t = 1_000_000
    for i in range(40):
        name = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)" if i % 4 == 0 else "gemm"
        db.kernel(100, t, t + 700, name, corr=i, stream=7 + (i % 4 == 0))
        t += 1000
    a, b = both([str(db.save())], tmp_path / "run", workers=1)
    assert_same(a, b)
    con = connect(b)
    try:
        got = con.execute(
            "SELECT coll_op IS NULL, count(*) FROM events GROUP BY ALL ORDER BY ALL"
        ).fetchall()
    finally:
        con.close()
    assert got == [(False, 10), (True, 30)]


def test_local_ray_same_tables(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray", reason="Ray is part of the dev extra (CI installs it)")
    raw, _ = _job(tmp_path, peers=False)
    a = tmp_path / "one.duckdb"
    load_traces([str(raw)], a, workers=2)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        load_traces([str(raw)], tmp_path / "ray", storage="shards", engine="ray")
    finally:
        ray.shutdown()
    assert_same(a, tmp_path / "ray")


def test_own_local_ray_shuts_down_beside_the_rest(tmp_path: Path) -> None:
    """The Ray instance an ingest starts for itself is shut down on a thread once its tasks
    are done (its 1.1-1.3 s of waiting for Ray's processes overlaps the stored results), and
    is gone when load_traces returns: no Ray left initialized, nothing pending."""
    ray = pytest.importorskip("ray", reason="Ray is part of the dev extra (CI installs it)")
    from ranklens.ingest import ray_engine

    assert not ray.is_initialized()
    raw, _ = _job(tmp_path, peers=False)
    seen: list[bool] = []

    def finalize(con: duckdb.DuckDBPyConnection) -> None:  # runs after the traces stage
        seen.append(bool(ray_engine._closing))

    rep = load_traces([str(raw)], tmp_path / "ray", storage="shards", engine="ray", workers=2,
                      finalize=finalize)  # fmt: skip
    assert seen == [True]  # still shutting down while the ingest went on
    assert not [w for w in rep.warnings if "Ray" in w]  # nothing here slows Ray's processes
    assert not ray.is_initialized() and ray_engine._closing == []
    one = tmp_path / "one.duckdb"
    load_traces([str(raw)], one, workers=1)
    assert_same(one, tmp_path / "ray")


def test_a_ray_ingest_says_what_slows_ray_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In an environment with Jupyter's rfc3987_syntax (and not rfc3987), which each Ray
    process imports through jsonschema, the ingest's warnings say so and what to do."""
    pytest.importorskip("ray", reason="Ray is part of the dev extra (CI installs it)")
    from ranklens.ingest import ray_engine

    monkeypatch.setattr(ray_engine, "_installed", lambda name: name == "rfc3987_syntax")
    raw, _ = _job(tmp_path, peers=False)
    rep = load_traces([str(raw)], tmp_path / "ray", storage="shards", engine="ray", workers=2)
    said = [w for w in rep.warnings if "Ray" in w]
    assert len(said) == 1 and "rfc3987_syntax" in said[0] and "pip install rfc3987" in said[0]
    local = load_traces([str(raw)], tmp_path / "local", storage="shards", workers=2)
    assert not [w for w in local.warnings if "Ray" in w]  # only a Ray ingest says it


def test_bad_file_skipped_with_its_shards(tmp_path: Path) -> None:
    raw, _ = _job(tmp_path)
    (raw / "rank3.json").write_text('{"traceEvents": [')  # truncated
    with pytest.raises(RanklensError, match=r"rank3\.json"):
        load_traces([str(raw)], tmp_path / "strict", storage="shards", workers=2)
    assert not (tmp_path / "strict").exists()
    assert not list(tmp_path.glob(".strict*"))  # no half-written run left beside it
    a, b = both([str(raw)], tmp_path, workers=2, on_error="skip")
    assert_same(a, b)
    assert not (b / "events" / "rank=3").exists() or not list((b / "events" / "rank=3").iterdir())
    con = connect(b)
    assert con.execute("SELECT count(*) FROM events WHERE rank = 3").fetchone() == (0,)
    assert con.execute("SELECT status FROM sources WHERE path LIKE '%rank3.json'").fetchone() == (
        "skipped",
    )


def test_failed_ingest_keeps_previous_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw, _ = _job(tmp_path)
    run = tmp_path / "run"
    load_traces([str(raw)], run, storage="shards")
    before = tables(run)
    files = sorted(str(p.relative_to(run)) for p in run.rglob("*"))

    def boom(*_a: Any, **_k: Any) -> None:
        raise KeyboardInterrupt  # as Ctrl+C during the cross-rank stage

    monkeypatch.setattr(crossrank, "finish_cross_rank", boom)
    with pytest.raises(KeyboardInterrupt):
        load_traces([str(raw)], run, storage="shards")
    monkeypatch.undo()
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*")) == files
    assert tables(run) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".run")] == []
    load_traces([str(raw)], run, storage="shards")  # an earlier sharded run is replaced
    assert tables(run) == before


def test_outputs_refused(tmp_path: Path) -> None:
    raw, _ = _job(tmp_path)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="not empty"):
        load_traces([str(raw)], busy, storage="shards")
    assert (busy / "notes.txt").read_text() == "mine"
    one = tmp_path / "one.duckdb"
    load_traces([str(raw)], one)
    with pytest.raises(OutputError, match="not a directory"):
        load_traces([str(raw)], one, storage="shards")
    with pytest.raises(OutputError, match="one of the inputs"):
        load_traces([str(raw)], raw, storage="shards")
    with pytest.raises(OutputError, match="holds an input"):
        load_traces([str(raw / "rank0.json")], raw, storage="shards")
    with pytest.raises(RanklensError, match="writes a sharded run"):
        load_traces([str(raw)], tmp_path / "x.duckdb", engine="ray")


def test_moved_run_and_plain_duckdb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw, _ = _job(tmp_path)
    load_traces([str(raw)], tmp_path / "run", storage="shards")
    before = tables(tmp_path / "run")
    moved = tmp_path / "elsewhere" / "copy"
    shutil.copytree(tmp_path / "run", moved)
    shutil.rmtree(tmp_path / "run")
    assert tables(moved) == before
    # A plain DuckDB client started in the run directory reads `events` as stored.
    monkeypatch.chdir(moved)
    with duckdb.connect(CATALOG, read_only=True) as con:
        n = con.execute("SELECT count(*) FROM events").fetchone()
    assert n == (len(before["events"]),)


def test_sandboxed_console_reads_only_the_shards(tmp_path: Path) -> None:
    raw, _ = _job(tmp_path)
    run = tmp_path / "run"
    load_traces([str(raw)], run, storage="shards")
    (tmp_path / "secret.csv").write_text("a\n1\n")
    n = run_sql(run, "SELECT count(*) AS n FROM events")["n"][0]
    assert n == len(tables(run)["events"])
    assert run_sql(run, "SELECT count(*) AS n FROM events_aligned WHERE rank = 3")["n"][0] > 0
    for q in (
        f"SELECT * FROM read_csv('{tmp_path / 'secret.csv'}')",
        f"SELECT * FROM read_csv('{run / 'events'}/../../secret.csv')",
        "SELECT * FROM read_csv('/etc/passwd')",
    ):
        with pytest.raises(SqlError, match="disabled"):
            run_sql(run, q)
