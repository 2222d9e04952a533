"""NCCL NVTX payloads -> communicator facts on kernels; .nsys-rep conversion; loader round trip."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nsys_fixtures import NsysDB, comm_init_blob, send_blob
from ranklens.ingest import load_traces
from ranklens.ingest._model import RankPart
from ranklens.ingest.errors import TraceFormatError
from ranklens.ingest.nsys import read_nsys
from ranklens.ingest.nsys_inputs import MixedFormatsError
from ranklens.ingest.nsys_tables import plain

COMM = 0xABC123


def _comm(part: RankPart) -> list[dict[str, Any]]:
    t = plain(pa.concat_tables(part.events))
    rows: list[dict[str, Any]] = (
        t.filter(pc.equal(t.column("kind"), "comm")).sort_by("ts_ns").to_pylist()
    )
    return rows


def _nccl_report(db: NsysDB, pid: int, rank: int, *, t0: int = 0, named: bool = True) -> None:
    """One rank's NCCL calls: init, a grouped send/recv, an all-reduce - each with its kernel."""
    db.process(pid)
    if named:
        db.nvtx(pid, t0, None, "NCCL", event_type=75, domain=1)
    rng: dict[str, Any] = {"domain": 1, "registered": True}
    db.nvtx(
        pid,
        t0 + 10,
        t0 + 50,
        "ncclCommInitRank",
        binaryData=comm_init_blob(COMM, 4, rank, 0),
        **rng,
    )
    db.nvtx(pid, t0 + 100, t0 + 101, "ncclGroupStart", **rng)
    db.nvtx(pid, t0 + 102, t0 + 103, "ncclSend", binaryData=send_blob(COMM, 1000, 3), **rng)
    db.nvtx(pid, t0 + 104, t0 + 105, "ncclRecv", binaryData=send_blob(COMM, 2000, 1), **rng)
    db.nvtx(pid, t0 + 106, t0 + 120, "ncclGroupEnd", **rng)
    db.runtime(pid, t0 + 110, t0 + 111, "cuLaunchKernelEx", 7, event_class=1)
    db.kernel(
        pid,
        t0 + 130,
        t0 + 140,
        "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<(unsigned long)4096>)",
        corr=7,
        stream=20,
    )
    ar = COMM.to_bytes(8, "little") + (4096).to_bytes(8, "little") + bytes(8)
    db.nvtx(pid, t0 + 200, t0 + 220, "ncclAllReduce", binaryData=ar, **rng)
    db.runtime(pid, t0 + 210, t0 + 211, "cuLaunchKernelEx", 8, event_class=1)
    db.kernel(
        pid,
        t0 + 230,
        t0 + 260,
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096UL>)",
        corr=8,
        stream=20,
    )
    db.runtime(pid, t0 + 300, t0 + 301, "cudaLaunchKernel", 9)  # outside any NCCL range
    db.kernel(pid, t0 + 310, t0 + 320, "ncclKernel_Broadcast_RING_LL_Sum_int8_t()", corr=9)


def test_binary_payload_gives_communicator_size_and_rank(tmp_path: Path) -> None:
    db = NsysDB(tmp_path / "nccl.sqlite").meta(normalized=True)
    db.nccl_schemas()
    _nccl_report(db, 500, rank=2)
    _nccl_report(db, 501, rank=3, t0=5, named=False)  # domain name lost (windowed export)
    parts = read_nsys(db.save(), 0)
    assert [(p.rank, p.info["world_size"], p.info["pid"]) for p in parts] == [
        (2, 4, 500),
        (3, 4, 501),
    ]
    for p in parts:
        assert not any("pid order" in w for w in p.warnings)
        sr, ar, bc = _comm(p)
        assert (sr["pg_name"], sr["coll_op"], sr["bytes"], sr["group_size"]) == (
            f"{COMM:#x}",
            "send_recv",
            3000,
            4,
        )
        assert (
            ar["pg_name"],
            ar["coll_op"],
            ar["bytes"],
            ar["in_nelems"],
            ar["dtype"],
            ar["group_size"],
        ) == (f"{COMM:#x}", "all_reduce", 4096, 1024, "Float", 4)
        assert (bc["pg_name"], bc["coll_op"], bc["dtype"]) == (None, "broadcast", "Char")
        assert p.groups == [
            {
                "pg_name": f"{COMM:#x}",
                "pg_desc": None,
                "ranks": None,
                "size": 4,
                "backend": "nccl",
                "source": "nsys_nccl_nvtx",
            }
        ]
        ann = plain(pa.concat_tables(p.events))
        cats = set(ann.filter(pc.equal(ann.column("kind"), "annotation")).column("cat").to_pylist())
        assert cats == {"nvtx:NCCL"}


def test_json_payload_and_single_communicator_without_id(tmp_path: Path) -> None:
    db = NsysDB(tmp_path / "json.sqlite").meta(normalized=True, env={"PMI_RANK": "6"})
    db.process(9)
    rng: dict[str, Any] = {"domain": 2, "registered": True}
    db.nvtx(9, 0, None, "NCCL", event_type=75, domain=2)
    db.nvtx(9, 1, 5, "ncclCommInitRank", jsonText=json.dumps({"No. of ranks": 8, "Rank": 6}), **rng)
    db.nvtx(9, 10, 20, "ncclAllGather", jsonText=json.dumps({"Message size [bytes]": 256}), **rng)
    db.runtime(9, 12, 13, "cudaLaunchKernel_v7000", 1)
    db.kernel(
        9, 30, 40, "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096UL>)", corr=1
    )
    (p,) = read_nsys(db.save(), 0)
    assert (p.rank, p.info["world_size"]) == (6, 8)
    (k,) = _comm(p)
    assert (k["pg_name"], k["group_size"], k["bytes"], k["coll_op"]) == (None, 8, 256, "all_gather")


def _fake_nsys(tmp_path: Path, body: str) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir(parents=True)
    exe = bindir / "nsys"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return bindir


def test_nsys_rep_without_nsys_says_how(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rep = tmp_path / "runs" / "rank3.nsys-rep"
    rep.parent.mkdir()
    rep.write_bytes(b"\0" * 64)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(TraceFormatError) as err:
        read_nsys(rep, 0)
    assert str(rep) in err.value.message and "nsys" in err.value.message
    assert (
        f"nsys export --type sqlite --ts-normalize=true --output {rep.with_suffix('.sqlite')} {rep}"
    ) in (err.value.hint or "")


def test_nsys_rep_is_converted_in_a_temp_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = NsysDB(tmp_path / "src.sqlite").meta(normalized=True, env={"RANK": "3"})
    src.kernel(42, 1, 2, "void k()")
    src.save()
    log = tmp_path / "args.txt"
    bindir = _fake_nsys(
        tmp_path,
        f'echo "$@" > {log}\nwhile [ "$1" != "--output" ]; do shift; done\ncp {src.path} "$2"\n',
    )
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    rep = tmp_path / "runs" / "rank3.nsys-rep"
    rep.parent.mkdir()
    rep.write_bytes(b"\0" * 64)
    (p,) = read_nsys(rep, 0)
    assert p.rank == 3 and p.n_events == 1
    args = log.read_text().split()
    assert args[:4] == ["export", "--type", "sqlite", "--ts-normalize=true"]
    out = Path(args[args.index("--output") + 1])
    assert out.parent != rep.parent and not out.exists()  # temp dir removed afterwards
    assert sorted(x.name for x in rep.parent.iterdir()) == ["rank3.nsys-rep"]
    failing = _fake_nsys(tmp_path / "f", "echo 'cannot open report' >&2\nexit 3\n")
    monkeypatch.setenv("PATH", f"{failing}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(TraceFormatError, match="cannot open report"):
        read_nsys(rep, 0)


def test_loader_round_trip(tmp_path: Path) -> None:
    db = NsysDB(tmp_path / "traces" / "node.sqlite").meta(normalized=True)
    db.nccl_schemas()
    _nccl_report(db, 500, rank=2)
    _nccl_report(db, 501, rank=3, t0=5)
    db.nvtx(500, 0, 1000, "ProfilerStep#4")
    db.nvtx(501, 0, 1000, "ProfilerStep#4")
    out = tmp_path / "run.duckdb"
    load_traces([str(db.save())], out, workers=1)
    con = duckdb.connect(str(out), read_only=True)
    try:
        ranks = con.execute(
            "SELECT rank, world_size, pid, backend, has_gpu FROM ranks ORDER BY rank"
        ).fetchall()
        assert ranks == [(2, 4, 500, "nccl", True), (3, 4, 501, "nccl", True)]
        n = con.execute(
            "SELECT rank, count(*) FILTER (kind = 'comm'), count(DISTINCT step) "
            "FILTER (step IS NOT NULL) FROM events GROUP BY rank ORDER BY rank"
        ).fetchall()
        assert n == [(2, 3, 1), (3, 3, 1)]
        pg = con.execute(
            "SELECT pg_name, size, backend FROM process_groups WHERE source <> 'inferred_sequence'"
        ).fetchall()
        assert pg == [(f"{COMM:#x}", 4, "nccl")]
    finally:
        con.close()


def test_report_beside_its_export_and_mixed_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """X.nsys-rep beside X.sqlite is read once, from the export (no nsys needed); Kineto and
    Nsight files together are refused unless allow_mixed."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no nsys anywhere
    run = tmp_path / "run"
    db = NsysDB(run / "rank0.sqlite").meta(normalized=True)
    db.kernel(42, 1, 2, "void k()")
    db.save()
    (run / "rank0.nsys-rep").write_bytes(b"\0" * 64)
    rep = load_traces([str(run)], tmp_path / "a.duckdb", workers=1)
    assert rep.ranks == [0] and not rep.skipped
    assert rep.warnings[0].startswith("1 .nsys-rep report(s) have their .sqlite export beside")
    kineto = Path(__file__).resolve().parents[2] / "sample_traces" / "straggler_rank3" / "raw"
    mixed = [str(run), str(kineto / "rank3.json.gz")]
    with pytest.raises(MixedFormatsError) as err:
        load_traces(mixed, tmp_path / "b.duckdb", workers=1)
    assert "mixes 1 Kineto trace(s)" in err.value.message and "allow_mixed" in (
        err.value.hint or ""
    )
    assert not (tmp_path / "b.duckdb").exists()
    both = load_traces(mixed, tmp_path / "b.duckdb", workers=1, allow_mixed=True)
    assert both.ranks == [0, 3] and any("mixed run allowed" in w for w in both.warnings)
