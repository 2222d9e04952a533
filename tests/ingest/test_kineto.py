"""Ingest facts about Kineto JSON traces: ranks, inputs, kinds, steps, groups, idempotence,
atomic output, parallel pieces, and the real public traces checked against Python's json."""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest
from kineto_builder import KinetoTrace, PgConfig, cpu_trace, ns
from ranklens.ingest import kineto, kineto_schedule, load_traces, loader, workpool
from ranklens.ingest.errors import RankError

Ingest = Callable[..., duckdb.DuckDBPyConnection]


def q(con: duckdb.DuckDBPyConnection, sql: str) -> list[tuple[Any, ...]]:
    return con.sql(sql).fetchall()


def gpu_rank(rank: int = 0, world: int = 2) -> KinetoTrace:
    t = KinetoTrace(rank=rank, world_size=world)
    t.step(1, 0, 100)
    t.kernel("gemm", 10, 20)
    t.nccl("AllReduce", 20, 30, stream=9)
    return t


def dump_tables(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows, and `events`', sorted (meta without the ingest time)."""
    with duckdb.connect(str(db), read_only=True) as con:
        names = [r[0] for r in q(con, "SELECT table_name FROM duckdb_tables() ORDER BY 1")]
        names += ["events"]  # the view over events_rich and events_plain, whole
        out = {n: q(con, f"SELECT * FROM {n} ORDER BY ALL") for n in names}
    out["meta"] = [r for r in out["meta"] if r[0] != "ingested_at"]
    return out


# -- ranks --------------------------------------------------------------------------------------
def test_rank_from_distributed_info(tmp_path: Path) -> None:
    t = gpu_rank(rank=5, world=8)
    p = t.write(tmp_path / "trace_of_someone.json")  # no rank in the name
    report = load_traces([p], tmp_path / "o.duckdb", workers=1)
    assert report.ranks == [5] and report.skipped == []
    with duckdb.connect(str(tmp_path / "o.duckdb"), read_only=True) as con:
        assert q(
            con, "SELECT rank, world_size, backend, device_name, num_sms, has_gpu FROM ranks"
        ) == [(5, 8, "nccl", "NVIDIA H100 80GB HBM3", 132, True)]
        assert q(con, "SELECT DISTINCT rank FROM events") == [(5,)]


def test_rank_from_file_name(tmp_path: Path) -> None:
    t = gpu_rank()
    t.rank = None  # no distributedInfo at all
    paths = [t.write(tmp_path / "rank3.json"), t.write(tmp_path / "sampled_rank-12.json.gz")]
    assert load_traces(paths, tmp_path / "o.duckdb", workers=1).ranks == [3, 12]


def test_no_rank_anywhere_is_a_rank_error(tmp_path: Path) -> None:
    t = gpu_rank()
    t.rank = None
    p = t.write(tmp_path / "trace.json")
    with pytest.raises(RankError) as ei:
        load_traces([p], tmp_path / "o.duckdb", workers=1)
    assert str(p) in ei.value.message and ei.value.hint
    assert not (tmp_path / "o.duckdb").exists()


# -- inputs -------------------------------------------------------------------------------------
def test_json_and_gz_give_the_same_events(ingest: Ingest, tmp_path: Path) -> None:
    t = gpu_rank()
    plain = ingest([t.write(tmp_path / "a" / "rank0.json")])
    gz = ingest([t.write(tmp_path / "b" / "rank0.json.gz")])
    sql = "SELECT * FROM events ORDER BY ALL"
    assert q(plain, sql) == q(gz, sql) and len(q(plain, sql)) == 5


def test_directory_glob_and_list_inputs(tmp_path: Path) -> None:
    d = tmp_path / "run"
    gpu_rank(0).write(d / "rank0.json")
    gpu_rank(1).write(d / "nested" / "rank1.json.gz")
    (d / "README.md").write_text("not a trace")
    (d / "notes.txt").write_text("{}")
    got = []
    for i, inputs in enumerate(
        [[d], [str(d / "**" / "rank*.json*")], [d / "rank0.json", d / "nested" / "rank1.json.gz"]]
    ):
        r = load_traces(inputs, tmp_path / f"o{i}.duckdb", workers=1)
        got.append((r.ranks, r.n_events, r.skipped))
    assert got == [([0, 1], 10, [])] * 3


# -- kinds ------------------------------------------------------------------------------------
def test_kinds_in_a_gpu_trace(ingest: Ingest) -> None:
    t = KinetoTrace(rank=0)
    t.step(1, 0, 1000)
    t.host("aten::mm", 5, 50)
    t.host("record_param_comms", 60, 5)
    t.host("cudaStreamSynchronize", 900, 20, cat="cuda_runtime", args={"correlation": 9})
    t.kernel("sm90_xmma_gemm_bf16", 100, 10)
    t.nccl("AllGather", 120, 10, stream=9)
    t.device_event(
        "kernel", "void dpsk::ep::internode::dispatch<8, 1024>(int*)", 140, 10, stream=20
    )
    t.device_event("kernel", "void dpsk::ep::internode::combine<8>(int*)", 160, 10, stream=20)
    t.memcpy(200, 10, direction="DtoH (Device -> Pinned)")
    t.memset(220, 10)
    t.add(cat="gpu_user_annotation", name="## forward ##", pid=0, tid=7, ts=100, dur=80)
    con = ingest(t)
    got = {n: (k, op) for n, k, op in q(con, "SELECT name, kind::VARCHAR, coll_op FROM events")}
    assert got["sm90_xmma_gemm_bf16"] == ("compute", None)
    assert got["ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"] == (
        "comm",
        "all_gather",
    )
    assert got["void dpsk::ep::internode::dispatch<8, 1024>(int*)"] == ("comm", "all_to_all")
    assert got["void dpsk::ep::internode::combine<8>(int*)"] == ("comm", "all_to_all")
    # (in a GPU trace, host ops such as aten::mm only launch the work: cpu_op, not compute)
    assert [
        got[n][0]
        for n in (
            "Memcpy DtoH (Device -> Pinned)",
            "Memset (Device)",
            "cudaStreamSynchronize",
            "cudaLaunchKernel",
            "aten::mm",
            "record_param_comms",
            "ProfilerStep#1",
            "## forward ##",
        )
    ] == ["memcpy", "memset", "sync", "runtime", "cpu_op", "cpu_op", "annotation", "annotation"]
    # device events keep their device and stream; host events are device -1 on their thread
    assert q(
        con,
        "SELECT device, stream FROM events WHERE name IN ('Memset (Device)', "
        "'aten::mm') ORDER BY device",
    ) == [(-1, 4242), (0, 7)]


def test_kinds_in_a_cpu_trace(ingest: Ingest) -> None:
    t = cpu_trace(rank=1)
    t.step(1, 0, 1000, cat="cpu_op")
    t.host("aten::mm", 10, 100)
    t.host("c10d::allreduce_", 120, 5)
    t.gloo("all_reduce", 122, 50)
    t.gloo("broadcast", 200, 50)
    con = ingest(t)
    assert dict(q(con, "SELECT name, (kind::VARCHAR, coll_op) FROM events")) == {
        "ProfilerStep#1": ("annotation", None),
        "aten::mm": ("compute", None),
        "c10d::allreduce_": ("cpu_op", "all_reduce"),
        "gloo:all_reduce": ("comm", "all_reduce"),
        "gloo:broadcast": ("comm", "broadcast"),
    }
    assert q(con, "SELECT has_gpu, device_name, backend FROM ranks") == [(False, None, "gloo")]


def test_timestamps_keep_nanoseconds(ingest: Ingest) -> None:
    t = KinetoTrace(rank=0)
    t.host("aten::add", 100.001, 0.5)  # new flavour: ns decimals are exact
    t.host("aten::mul", 2_000_000.999, 1.25)
    con = ingest(t)
    assert q(con, "SELECT ts_ns, dur_ns FROM events ORDER BY ts_ns") == [
        (ns(100.001), 500),
        (ns(2_000_000.999), 1250),
    ]


# -- steps -------------------------------------------------------------------------------------
def test_steps_table(ingest: Ingest) -> None:
    t = KinetoTrace(rank=0)
    t.step(7, 0, 100)
    t.step(8, 100, 250)
    t.kernel("a", 50, 100, launch=10)  # launched in step 7, runs into host step 8
    t.kernel("b", 160, 20, launch=120)
    t.memcpy(190, 30, launch=130)
    t.kernel("outside", 400, 10, launch=300)  # launched after the last step: no step
    con = ingest(t)
    # (rank, step, cpu_start, cpu_end, start = first device start, end = last device end)
    assert q(con, "SELECT * FROM steps ORDER BY step") == [
        (0, 7, ns(0), ns(100), ns(50), ns(150), "profiler_step"),
        (0, 8, ns(100), ns(250), ns(160), ns(220), "profiler_step"),
    ]
    steps = dict(q(con, "SELECT name, step FROM events WHERE device >= 0"))
    assert steps == {"a": 7, "b": 8, "Memcpy HtoD (Pageable -> Device)": 8, "outside": None}


def test_trace_without_profiler_step_is_one_pseudo_step(ingest: Ingest) -> None:
    t = KinetoTrace(rank=0)
    t.kernel("a", 50, 10)
    t.kernel("b", 100, 20)
    con = ingest(t)
    assert q(con, "SELECT step, start_ns, end_ns, source FROM steps") == [
        (-1, ns(50), ns(120), "trace")
    ]
    assert q(con, "SELECT DISTINCT step FROM events") == [(-1,)]


# -- process groups ----------------------------------------------------------------------------
def test_process_groups_merged_across_ranks(ingest: Ingest) -> None:
    world = PgConfig("0", [0, 1, 2, 3], "default_pg")
    tp01 = PgConfig("1", [0, 1], "TENSOR_MODEL_PARALLEL_GROUP")
    tp23 = PgConfig("2", [2, 3], "TENSOR_MODEL_PARALLEL_GROUP")
    dp = PgConfig("3", [0, 2], "DATA_PARALLEL_GROUP", backend_config="cpu:gloo")
    odd = PgConfig("4", [1, 3])  # pg_desc "undefined" -> NULL
    traces = [gpu_rank(r, world=4) for r in range(4)]
    for t, groups in zip(
        traces,
        ([world, tp01, dp], [world, tp01, odd], [world, tp23, dp], [world, tp23, odd]),
        strict=True,
    ):
        t.pg_config = groups
    # a group known only from kernel args (not in any pg_config)
    traces[0].nccl(
        "SendRecv", 60, 5, stream=11, pg_name="9", pg_desc="mesh_ep", pg_ranks=[0, 3], group_size=2
    )
    con = ingest(traces)
    assert q(
        con,
        "SELECT pg_name, pg_desc, ranks, size, backend, parallelism, source "
        "FROM process_groups ORDER BY pg_name",
    ) == [
        ("0", "default_pg", [0, 1, 2, 3], 4, "nccl", "WORLD", "pg_config"),
        ("1", "TENSOR_MODEL_PARALLEL_GROUP", [0, 1], 2, "nccl", "TP", "pg_config"),
        ("2", "TENSOR_MODEL_PARALLEL_GROUP", [2, 3], 2, "nccl", "TP", "pg_config"),
        ("3", "DATA_PARALLEL_GROUP", [0, 2], 2, "gloo", "DP", "pg_config"),
        ("4", None, [1, 3], 2, "nccl", "OTHER", "pg_config"),
        ("9", "mesh_ep", [0, 3], 2, "nccl", "EP", "event_args"),
    ]


def test_comm_kernel_inherits_args_from_record_param_comms(ingest: Ingest) -> None:
    t = KinetoTrace(rank=0)
    t.step(1, 0, 100)
    k = t.nccl("AllReduce", 20, 10, stream=9)  # no args (older NCCL kernels)
    t.host(
        "record_param_comms",
        5,
        2,
        args={
            "External id": k["args"]["External id"],
            "Process Group Name": "1",
            "Collective name": "allreduce",
            "In msg nelems": 1024,
            "Out msg nelems": 1024,
            "Group size": 2,
            "dtype": "Float",
        },
    )
    con = ingest(t)
    assert q(
        con, "SELECT pg_name, coll_op, in_nelems, group_size, dtype FROM events WHERE kind = 'comm'"
    ) == [("1", "all_reduce", 1024, 2, "Float")]


# -- idempotence, atomic output, inputs left alone ----------------------------------------------
def test_reingest_is_idempotent(tmp_path: Path) -> None:
    paths = [gpu_rank(r).write(tmp_path / f"rank{r}.json.gz") for r in (0, 1)]
    db = tmp_path / "o.duckdb"
    load_traces(paths, db, workers=1)
    first = dump_tables(db)
    load_traces(paths, db, workers=1)  # over the existing database
    assert dump_tables(db) == first
    load_traces(paths[::-1], tmp_path / "other.duckdb", workers=1)  # order of inputs
    assert dump_tables(tmp_path / "other.duckdb") == first
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "o.duckdb",
        "other.duckdb",
        "rank0.json.gz",
        "rank1.json.gz",
    ]


@pytest.mark.parametrize("where", ["decode", "finish"])
def test_interrupted_ingest_leaves_no_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    src = tmp_path / "in"
    paths = [gpu_rank(r).write(src / f"rank{r}.json.gz") for r in (0, 1)]
    out, scratch = tmp_path / "out", tmp_path / "scratch"  # scratch: .gz inputs inflated there
    for d in (out, scratch):
        d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    def boom(*_a: object, **_k: object) -> None:
        raise KeyboardInterrupt

    if where == "decode":
        monkeypatch.setattr(kineto, "decode_piece", boom)  # mid-file
    else:
        monkeypatch.setattr(loader, "finish_database", boom)  # after every file
    with pytest.raises(KeyboardInterrupt):
        load_traces(paths, out / "run.duckdb", workers=1)
    assert list(out.iterdir()) == [] and list(scratch.iterdir()) == []
    # an existing database survives an interrupted re-ingest unchanged
    monkeypatch.undo()
    load_traces(paths, out / "run.duckdb", workers=1)
    before = hashlib.sha256((out / "run.duckdb").read_bytes()).hexdigest()
    monkeypatch.setattr(loader, "finish_database", boom)
    with pytest.raises(KeyboardInterrupt):
        load_traces(paths, out / "run.duckdb", workers=1)
    assert [p.name for p in out.iterdir()] == ["run.duckdb"]
    assert hashlib.sha256((out / "run.duckdb").read_bytes()).hexdigest() == before


def test_input_files_are_unchanged(tmp_path: Path) -> None:
    gpu_rank(0).write(tmp_path / "rank0.json")
    gpu_rank(1).write(tmp_path / "rank1.json.gz")

    def state() -> list[tuple[str, str, int]]:
        return sorted(
            (p.name, hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in tmp_path.iterdir()
        )

    before, db = state(), tmp_path.parent / f"{tmp_path.name}.duckdb"
    load_traces([tmp_path], db, workers=1)
    assert state() == before
    with duckdb.connect(str(db)) as con:
        got = q(con, "SELECT path, sha256, status FROM sources ORDER BY path")
    assert got == [(str(tmp_path / n), h, "ok") for n, h, _ in before]


# -- the parallel, multi-piece path -------------------------------------------------------------
def chunky(rank: int, nested: bool) -> KinetoTrace:
    """~100 KB of events; with `nested`, some args hold `},{` inside a string and a list of
    objects, so a cut planned at `},{` can land inside an event."""
    t = KinetoTrace(rank=rank)
    t.step(1, 0, 10_000)
    for i in range(300):
        ev = t.kernel(f"k{i}", 10 + 20 * i, 10, stream=7 + i % 3)
        if nested and i % 7 == 3:
            ev["args"]["note"] = "x},{y}, {z"
            ev["args"]["tree"] = [{"a": j, "b": [{"c": j}, {"d": [1, 2]}]} for j in range(30)]
    return t


def bad_cuts(prep: kineto.Prepared) -> int:
    """How many planned pieces do not decode on their own."""
    bad = 0
    for i in range(len(prep.pieces)):
        try:
            kineto.decode_piece(prep, i, 0, 0)
        except kineto.BadCut:
            bad += 1
    return bad


@pytest.mark.parametrize("nested", [False, True], ids=["clean-cuts", "bad-cuts"])
def test_parallel_pieces_match_serial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nested: bool
) -> None:
    paths = [chunky(r, nested).write(tmp_path / f"rank{r}.json") for r in (0, 1)]
    load_traces(paths, tmp_path / "serial.duckdb", workers=1)  # one piece per file
    monkeypatch.setattr(kineto, "PIECE_BYTES", 4096)
    monkeypatch.setattr(workpool, "SERIAL_BELOW_BYTES", 0)
    prep = kineto.prepare(str(paths[0]))
    assert len(prep.pieces) > 10
    assert (bad_cuts(prep) > 0) == nested
    planned: list[int] = []
    real = kineto_schedule._parallel_file

    def spy(sink: Any, pool: Any, tid: int, prep: kineto.Prepared, *rest: Any) -> Any:
        planned.append(len(prep.pieces))
        return real(sink, pool, tid, prep, *rest)

    monkeypatch.setattr(kineto_schedule, "_parallel_file", spy)
    load_traces(paths, tmp_path / "parallel.duckdb", workers=2)
    assert len(planned) == 2 and min(planned) > 10  # pieces really were planned and decoded
    a, b = dump_tables(tmp_path / "serial.duckdb"), dump_tables(tmp_path / "parallel.duckdb")
    assert a == b and len(a["events"]) == 2 * (1 + 2 * 300)
