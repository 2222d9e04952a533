"""The Nsight reader on hand-built exports: drift, edge cases, damaged files, rank rules."""

from __future__ import annotations

import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nsys_fixtures import NsysDB, gtid
from ranklens.ingest import nsys_sqlite
from ranklens.ingest._model import EVENT_COLUMNS, RankPart, event_schema
from ranklens.ingest.errors import TraceFormatError
from ranklens.ingest.nsys import read_nsys
from ranklens.ingest.nsys_tables import plain

UTC = 1_700_000_000_000_000_000


def _ev(part: RankPart, **eq: object) -> list[dict[str, Any]]:
    t = plain(pa.concat_tables(part.events))
    for k, v in eq.items():
        t = t.filter(pc.equal(t.column(k), v))
    rows: list[dict[str, Any]] = t.sort_by("ts_ns").to_pylist()
    return rows


def _basic(tmp_path: Path, name: str = "r.sqlite", **meta: Any) -> NsysDB:
    db = NsysDB(tmp_path / name).meta(**meta)
    db.process(100, "python")
    db.gpu(0, "NVIDIA H100 80GB HBM3", 132)
    return db


def test_full_mapping_and_schema(tmp_path: Path) -> None:
    db = _basic(tmp_path, env={"RANK": "5", "WORLD_SIZE": "8"})
    db.runtime(100, 10, 20, "cudaLaunchKernel_v7000", 1)
    db.runtime(100, 10, 20, "cudaLaunchKernel_v7000", 1, event_class=67)  # backtrace row
    db.runtime(100, 30, 90, "cudaStreamSynchronize_v3020", 2)
    db.runtime(100, 25, 26, "cuLaunchKernelEx", 3, event_class=1)
    db.kernel(
        100,
        40,
        80,
        "void gemm<float>(float*)",
        corr=1,
        grid=(512, 2, 1),
        block=(256, 1, 1),
        stream=7,
    )
    nccl = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096UL>)"
    db.kernel(100, 45, 85, nccl, corr=3, stream=20)
    db.memcpy(100, 100, 110, 4096, kind=1, src=0, dst=2)
    db.memcpy(100, 120, 130, 64, kind=10, src=None, dst=None)
    db.memset(100, 140, 150, 128)
    db.sync(100, 30, 88, sync_type=3)
    db.nvtx(100, 5, 200, "ProfilerStep#7")
    db.nvtx(100, 6, 50, "forward", event_type=60)
    (p,) = read_nsys(db.save(), 0)
    assert p.rank == 5
    assert p.info == {
        "host": "node0",
        "pid": 100,
        "device_name": "NVIDIA H100 80GB HBM3",
        "num_sms": 132,
        "has_gpu": True,
        "backend": "nccl",
        "world_size": 8,
    }
    for t in p.events:
        assert plain(t).schema == event_schema() and tuple(t.column_names) == EVENT_COLUMNS
        assert t.schema.field("name").type == pa.dictionary(pa.int32(), pa.string())
    k, c = _ev(p, cat="kernel")
    assert (k["kind"], k["name"], k["device"], k["stream"], k["pid"], k["tid"]) == (
        "compute",
        "void gemm<float>(float*)",
        0,
        7,
        0,
        7,
    )
    assert (k["ts_ns"], k["dur_ns"], k["correlation"]) == (UTC + 40, 40, 1)
    assert k["launch"] == "grid=[512, 2, 1] block=[256, 1, 1]"
    assert (c["kind"], c["coll_op"], c["dtype"], c["stream"]) == (
        "comm",
        "all_reduce",
        "BFloat16",
        20,
    )
    api = _ev(p, device=-1, cat="cuda_runtime") + _ev(p, cat="cuda_driver")
    assert sorted((a["name"], a["kind"], a["correlation"]) for a in api) == [
        ("cuLaunchKernelEx", "runtime", 3),
        ("cudaLaunchKernel", "runtime", 1),
        ("cudaStreamSynchronize", "sync", 2),
    ]
    assert all(a["stream"] == a["tid"] == 100 and a["pid"] == 100 for a in api)
    mc = _ev(p, kind="memcpy")
    assert [(m["name"], m["bytes"]) for m in mc] == [
        ("Memcpy HtoD (Pageable -> Device)", 4096),
        ("Memcpy PtoP", 64),
    ]
    assert [(m["name"], m["bytes"]) for m in _ev(p, kind="memset")] == [("Memset (Device)", 128)]
    (sy,) = _ev(p, cat="cuda_sync")
    assert (sy["kind"], sy["name"], sy["device"], sy["stream"]) == ("sync", "Stream Sync", 0, 7)
    ann = _ev(p, kind="annotation")
    assert [(a["name"], a["cat"], a["dur_ns"], a["tid"]) for a in ann] == [
        ("ProfilerStep#7", "nvtx", 195, 100),
        ("forward", "nvtx", 44, 100),
    ]
    assert p.threads == [(100, -1, "python")]


def test_missing_optional_tables_and_strings_only_in_stringids(tmp_path: Path) -> None:
    db = NsysDB(tmp_path / "bare.sqlite")  # no metadata, no GPU info, no runtime, no NVTX
    db.kernel(7, 1000, 2000, "void k1(int)", demangled=False, short="k1_short")
    db.kernel(7, 3000, 4000, "void k2(int)", corr=None)
    (p,) = read_nsys(db.save(), 0)
    assert p.rank is None  # the loader falls back to the file name
    assert p.info["host"] is None and p.info["device_name"] is None
    assert any("TARGET_INFO_SESSION_START_TIME" in w for w in p.warnings)
    got = [(e["name"], e["ts_ns"], e["correlation"]) for e in _ev(p)]
    assert got == [("k1_short", 1000, None), ("void k2(int)", 3000, None)]
    # registered NVTX strings (textId) and runtime names live only in StringIds
    db2 = _basic(tmp_path, "reg.sqlite")
    db2.nvtx(100, 10, 20, "registered range", registered=True, domain=3)
    db2.add(
        "NVTX_EVENTS",
        start=0,
        end=None,
        eventType=75,
        text="MyDomain",
        globalTid=gtid(100),
        domainId=3,
    )
    db2.runtime(100, 1, 2, "cudaMalloc_v3020", 9)
    db2.kernel(100, 3, 4, "void k(int)", corr=9)
    (p2,) = read_nsys(db2.save(), 0)
    (a,) = _ev(p2, kind="annotation")
    assert (a["name"], a["cat"]) == ("registered range", "nvtx:MyDomain")
    assert [e["name"] for e in _ev(p2, device=-1, kind="runtime")] == ["cudaMalloc"]


def test_correlation_ids_repeat_across_processes(tmp_path: Path) -> None:
    db = NsysDB(tmp_path / "two.sqlite").meta(env={"RANK": "0"})  # env names the launcher
    for pid, dev, api_name in ((300, 1, "cudaLaunchKernel"), (200, 0, "cuLaunchKernel")):
        db.process(pid)
        for corr in (1, 2, 3):
            db.runtime(pid, 10 * corr, 10 * corr + 2, api_name, corr)
            db.kernel(
                pid, 10 * corr + 5, 10 * corr + 8, f"void k{pid}_{corr}()", corr=corr, device=dev
            )
    db.runtime(999, 1, 2, "cudaGetDevice", 1)  # a process without GPU work (the launcher)
    parts = read_nsys(db.save(), 0)
    assert [(p.rank, p.info["pid"]) for p in parts] == [(0, 200), (1, 300)]
    for p in parts:
        pid = p.info["pid"]
        kern = _ev(p, cat="kernel")
        api = {e["correlation"]: e["name"] for e in _ev(p, device=-1)}
        assert {e["correlation"] for e in kern} == set(api) == {1, 2, 3}
        assert all(e["name"].startswith(f"void k{pid}_") for e in kern)
        assert set(api.values()) == {"cudaLaunchKernel" if pid == 300 else "cuLaunchKernel"}
        assert any("pid order" in w for w in p.warnings)
    assert any("without GPU activity" in w for w in parts[0].warnings)


def test_kernels_spanning_the_window_edge(tmp_path: Path) -> None:
    db = _basic(tmp_path, normalized=True)
    db.add("ANALYSIS_DETAILS", globalVid=1, duration=1000, startTime=1000, stopTime=2000)
    db.kernel(100, 900, 1100, "void first()")  # started before the window
    db.kernel(100, 1900, 2300, "void last()")  # ends after it
    db.kernel(100, 1500, 1400, "void clock_glitch()")  # end < start
    db.nvtx(100, 950, None, "cut range")  # the window cut its end
    db.nvtx(100, 1000, 1990, "kept range")
    (p,) = read_nsys(db.save(), 0)
    assert [(e["name"], e["ts_ns"], e["dur_ns"]) for e in _ev(p, cat="kernel")] == [
        ("void first()", 900, 200),
        ("void clock_glitch()", 1500, 0),
        ("void last()", 1900, 400),
    ]
    assert [e["name"] for e in _ev(p, kind="annotation")] == ["kept range"]
    assert any("1 NVTX ranges have no end" in w for w in p.warnings)


@pytest.mark.parametrize(
    ("meta", "shift", "warned"),
    [
        ({"normalized": True}, 0, False),
        ({}, UTC, False),
        ({"system_clock": 28_000_000_000}, UTC - 28_000_000_000, True),
    ],
)
def test_clock_rules(tmp_path: Path, meta: dict[str, Any], shift: int, warned: bool) -> None:
    db = _basic(tmp_path, **meta)
    db.kernel(100, 60_000_000_000, 60_000_001_000, "void k()")
    (p,) = read_nsys(db.save(), 0)
    assert _ev(p)[0]["ts_ns"] == 60_000_000_000 + shift
    assert any("systemClockNs" in w for w in p.warnings) == warned


def test_rank_sources(tmp_path: Path) -> None:
    db = NsysDB(tmp_path / "mpi.sqlite").meta(env={"SLURM_PROCID": "9"})
    for pid, rank in ((10, 3), (11, 2)):
        db.kernel(pid, 1, 2, "void k()")
        db.add("MPI_RANKS", globalTid=gtid(pid), rank=rank)
    parts = read_nsys(db.save(), 0)
    assert [(p.info["pid"], p.rank) for p in parts] == [(10, 3), (11, 2)]
    assert all(not p.warnings for p in parts)
    one = NsysDB(tmp_path / "env.sqlite").meta(env={"OMPI_COMM_WORLD_RANK": "4", "PMI_RANK": "1"})
    one.kernel(10, 1, 2, "void k()")
    assert read_nsys(one.save(), 0)[0].rank == 4


def test_damaged_and_foreign_files(tmp_path: Path) -> None:
    db = _basic(tmp_path, "big.sqlite")
    for i in range(4000):
        db.kernel(100, i * 10, i * 10 + 5, f"void kernel_number_{i % 50}()", corr=i)
    good = db.save()
    data = good.read_bytes()
    cut = tmp_path / "truncated.sqlite"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError) as err:
        read_nsys(cut, 0)
    assert str(cut) in err.value.message and err.value.hint
    tiny = tmp_path / "tiny.sqlite"
    tiny.write_bytes(data[:60])
    with pytest.raises(TraceFormatError, match=r"tiny\.sqlite"):
        read_nsys(tiny, 0)
    text = tmp_path / "notes.sqlite"
    text.write_text("hello, not a database\n" * 100)
    with pytest.raises(TraceFormatError, match=r"notes\.sqlite"):
        read_nsys(text, 0)
    other = tmp_path / "other.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE people (name TEXT)")
    con.execute("INSERT INTO people VALUES ('x')")
    con.commit()
    con.close()
    with pytest.raises(TraceFormatError) as err2:
        read_nsys(other, 0)
    assert "not an Nsight Systems export" in err2.value.message and str(other) in err2.value.message
    with pytest.raises(TraceFormatError, match="no such file"):
        read_nsys(tmp_path / "missing.sqlite", 0)
    empty = tmp_path / "empty.sqlite"  # what an interrupted `nsys export` leaves
    empty.touch()
    with pytest.raises(TraceFormatError) as err3:
        read_nsys(empty, 0)
    assert err3.value.message == f"{empty}: the file is empty" and "export" in err3.value.hint


def test_locked_file(tmp_path: Path) -> None:
    path = _basic(tmp_path, "locked.sqlite").save()
    writer = sqlite3.connect(path, check_same_thread=False)
    writer.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(TraceFormatError) as err:
            read_nsys(path, 0)
        assert str(path) in err.value.message and "still writing" in (err.value.hint or "")
    finally:
        writer.rollback()
        writer.close()


def test_never_writes_next_to_the_file(tmp_path: Path) -> None:
    db = _basic(tmp_path, "ro.sqlite")
    db.kernel(100, 1, 2, "void k()")
    path = db.save()
    path.chmod(0o444)
    before = sorted(p.name for p in tmp_path.iterdir())
    read_nsys(path, 0)  # no -journal/-wal/-shm or export left beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_chunked_parallel_read_matches_single_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = _basic(tmp_path)
    for i in range(103):
        db.kernel(
            100,
            i * 10,
            i * 10 + 5,
            f"void k{i % 7}()",
            corr=i if i % 5 else None,
            stream=7 + i % 3,
            grid=(i + 1, 2, 3),
            block=(32, 4, 2),
        )
        db.runtime(100, i * 10, i * 10 + 1, "cudaLaunchKernel", i)
    path = db.save()
    whole = plain(pa.concat_tables(read_nsys(path, 0)[0].events))
    monkeypatch.setattr(nsys_sqlite, "CHUNK_ROWS", 8)
    calls: list[str] = []
    real = nsys_sqlite._HexChunk.read

    def spy(self: nsys_sqlite._HexChunk, start: int) -> Any:
        calls.append(threading.current_thread().name)
        return real(self, start)

    monkeypatch.setattr(nsys_sqlite, "_adbc", None)
    monkeypatch.setattr(nsys_sqlite._HexChunk, "read", spy)
    monkeypatch.setenv("RANKLENS_PURE_PYTHON", "1")  # SQLite's path (`whole`: the page scanner's)
    parts = plain(pa.concat_tables(read_nsys(path, 0)[0].events))
    assert len(calls) >= 26
    assert parts.sort_by([("cat", "ascending"), ("ts_ns", "ascending")]).equals(
        whole.sort_by([("cat", "ascending"), ("ts_ns", "ascending")])
    )
    kern = parts.filter(pc.equal(parts.column("cat"), "kernel")).sort_by("ts_ns")
    assert kern.column("launch")[5].as_py() == "grid=[6, 2, 3] block=[32, 4, 2]"
    assert kern.column("correlation").null_count == 21


def test_adbc_backend_matches_stdlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if nsys_sqlite._adbc is None:
        pytest.skip(reason="adbc_driver_sqlite is not installed (optional accelerator)")
    db = _basic(tmp_path)
    for i in range(50):
        db.kernel(100, i * 10, i * 10 + 5, f"void k{i % 7}()", corr=i if i % 5 else None)
    path = db.save()
    monkeypatch.setenv("RANKLENS_PURE_PYTHON", "1")  # SQLite's two paths, not the page scanner
    fast = plain(pa.concat_tables(read_nsys(path, 0)[0].events))
    monkeypatch.setattr(nsys_sqlite, "_adbc", None)
    slow = plain(pa.concat_tables(read_nsys(path, 0)[0].events))
    assert fast.sort_by("ts_ns").equals(slow.sort_by("ts_ns"))


def test_oversized_launch_dims_give_no_launch_string(tmp_path: Path) -> None:
    db = _basic(tmp_path)
    db.kernel(100, 1, 2, "void weird()", grid=(1, 70000, 1))
    (p,) = read_nsys(db.save(), 0)
    assert _ev(p)[0]["launch"] is None


def test_packed_columns_keep_extreme_ids(tmp_path: Path) -> None:
    """pid/device and stream/name travel packed in one integer each: extremes come back exact."""
    db = NsysDB(tmp_path / "x.sqlite").meta()
    top = 2**31 - 1
    db.add("StringIds", id=top, value="void far_away()")
    db.kernel(4194303, 1, 2, "void k()", device=15, stream=2**32 - 1)  # max Linux pid
    db.kernel(1, 3, 4, "void k()", device=0, stream=0)
    db.kernel(4194303, 5, 6, "void k()", device=7, stream=12)
    db.rows["CUPTI_ACTIVITY_KIND_KERNEL"][-1]["demangledName"] = top
    parts = read_nsys(db.save(), 0)
    got = sorted(
        (p.info["pid"], e["device"], e["stream"], e["name"]) for p in parts for e in _ev(p)
    )
    assert got == [
        (1, 0, 0, "void k()"),
        (4194303, 7, 12, "void far_away()"),
        (4194303, 15, 2**32 - 1, "void k()"),
    ]
