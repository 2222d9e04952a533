"""The Nsight reader on real exports (three schema generations), checked against raw SQL."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lookups import sqlite_rows
from nsys_fixtures import shared_dir
from ranklens.ingest._model import EVENT_COLUMNS, RankPart, event_schema
from ranklens.ingest.nsys import read_nsys
from ranklens.ingest.nsys_tables import plain

DSL = "distributedsyslab-fs24-nccl"


def _events(part: RankPart) -> pa.Table:
    return plain(pa.concat_tables(part.events))


def _kind(t: pa.Table, kind: str) -> pa.Table:
    return t.filter(pc.equal(t.column("kind"), kind))


@pytest.mark.parametrize(
    ("folder", "n_ranks", "n_kernels"),
    [
        ("tree_allreduce_3nodes_9ranks", 9, 1),
        ("tree_2xallreduce_3nodes_9ranks", 9, 2),
        ("ring_allreduce_2nodes_6ranks", 6, 1),
    ],
)
def test_distributedsyslab_one_report_per_rank(folder: str, n_ranks: int, n_kernels: int) -> None:
    files = sorted(shared_dir(DSL, folder).glob("*.sqlite"))
    assert len(files) == n_ranks
    ranks = []
    for f in files:
        parts = read_nsys(f, 0)
        assert len(parts) == 1
        p = parts[0]
        env = sqlite_rows(
            f, "SELECT value FROM META_DATA_CAPTURE WHERE value LIKE 'SLURM_PROCID=%'"
        )
        assert p.rank == int(str(env[0][0]).split('"')[1])
        host = sqlite_rows(f, "SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'")
        assert p.info["host"] == host[0][0] and f.name.split("_")[-2] == host[0][0]
        assert p.info["pid"] == int(f.stem.split("_")[-1])
        assert p.info | {"host": None, "pid": None} == {
            "host": None,
            "pid": None,
            "device_name": "NVIDIA GeForce RTX 3090",
            "num_sms": 82,
            "has_gpu": True,
            "backend": "nccl",
            "world_size": n_ranks,
        }
        ev = _events(p)
        assert ev.schema == event_schema() and tuple(ev.column_names) == EVENT_COLUMNS
        comm = _kind(ev, "comm")
        assert _kind(ev, "compute").num_rows == 0 and comm.num_rows == n_kernels
        algo = "TREE" if folder.startswith("tree") else "RING"
        assert set(comm.column("name").to_pylist()) == {
            f"ncclKernel_AllReduce_{algo}_LL_Sum_float(ncclDevComm *, unsigned long, ncclWork *)"
        }
        assert set(comm.column("coll_op").to_pylist()) == {"all_reduce"}
        assert set(comm.column("dtype").to_pylist()) == {"Float"}
        # --ts-normalize=true export: timestamps are already UTC epoch ns, kept as they are
        raw = sqlite_rows(
            f,
            'SELECT start, "end", streamId, deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL '
            "ORDER BY start",
        )
        got = sorted(
            zip(
                comm.column("ts_ns").to_pylist(),
                comm.column("dur_ns").to_pylist(),
                comm.column("stream").to_pylist(),
                comm.column("device").to_pylist(),
                strict=True,
            )
        )
        assert got == [(s, e - s, st, d) for s, e, st, d in raw]  # type: ignore[operator]
        assert set(comm.column("stream").to_pylist()) == {15}
        assert p.warnings == []
        ranks.append(p.rank)
    assert sorted(ranks) == list(range(n_ranks))


def test_distributedsyslab_known_rank_and_nvtx() -> None:
    f = shared_dir(
        DSL, "tree_allreduce_3nodes_9ranks", "example_2_nsys_report_ault42.cscs.ch_337169.sqlite"
    )
    (p,) = read_nsys(f, 3)
    assert (p.rank, p.info["host"], p.info["pid"]) == (1, "ault42.cscs.ch", 337169)
    ev = _events(p)
    ann = _kind(ev, "annotation")
    (n_ranges,) = sqlite_rows(
        f, 'SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND "end" IS NOT NULL'
    )[0]
    assert ann.num_rows == n_ranges
    nccl = ann.filter(pc.equal(ann.column("cat"), "nvtx:NCCL"))
    assert sorted(nccl.column("name").to_pylist()) == [
        "ncclAllReduce",
        "ncclCommDestroy",
        "ncclCommInitRank",
    ]
    assert set(nccl.column("device").to_pylist()) == {-1}
    assert (337169, -1, "./example_2") in p.threads


def test_nsys_ai_two_ranks_in_one_report() -> None:
    f = shared_dir("nsys-ai", "h100_2gpu_1s.sqlite")
    parts = read_nsys(f, 0)
    assert [(p.rank, p.info["pid"]) for p in parts] == [(0, 111), (1, 112)]
    raw = Counter(
        {
            (int(str(pid)), int(str(st))): int(str(n))
            for pid, st, n in sqlite_rows(
                f,
                "SELECT (globalPid >> 24) & 16777215, streamId, count(*) "
                "FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY 1, 2",
            )
        }
    )
    assert sum(raw.values()) == 3442
    utc, sys_clock = sqlite_rows(
        f, "SELECT utcEpochNs, systemClockNs FROM TARGET_INFO_SESSION_START_TIME"
    )[0]
    for p in parts:
        ev = _events(p)
        kern = ev.filter(pc.equal(ev.column("cat"), "kernel"))
        got = Counter(kern.column("stream").to_pylist())
        assert {(p.info["pid"], s): n for s, n in got.items()} == {
            k: v for k, v in raw.items() if k[0] == p.info["pid"]
        }
        assert _kind(ev, "comm").num_rows == 0  # no NCCL kernel inside this 1 s window
        assert p.info["has_gpu"] is True and p.info["host"] == "modal"
        assert any("pid order" in w for w in p.warnings)
        assert any("systemClockNs" in w for w in p.warnings) == (p.rank == 0)  # said once
        (first,) = sqlite_rows(
            f,
            "SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL "
            f"WHERE (globalPid >> 24) & 16777215 = {p.info['pid']}",
        )[0]
        assert pc.min(kern.column("ts_ns")).as_py() == first + utc - sys_clock  # type: ignore
        assert set(kern.column("device").to_pylist()) == {p.rank}


def test_nsys_ai_sendrecv_and_repeated_correlation_ids() -> None:
    f = shared_dir("nsys-ai", "mfu_2gpu_before.sqlite")
    parts = read_nsys(f, 0)
    assert [p.info["pid"] for p in parts] == [144, 145]
    dup = sqlite_rows(
        f,
        "SELECT count(*) FROM (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL "
        "GROUP BY 1 HAVING count(DISTINCT globalPid) > 1)",
    )[0][0]
    assert int(str(dup)) > 0  # the same correlation id is used by both processes
    for p in parts:
        ev = _events(p)
        comm = _kind(ev, "comm")
        (n_nccl,) = sqlite_rows(
            f,
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
            "ON s.id = k.shortName WHERE s.value LIKE 'nccl%' AND "
            f"(k.globalPid >> 24) & 16777215 = {p.info['pid']}",
        )[0]
        assert comm.num_rows == n_nccl == 33
        assert set(comm.column("coll_op").to_pylist()) == {"send_recv"}
        assert all(n.startswith("ncclDevKernel_SendRecv") for n in comm.column("name").to_pylist())
        assert p.info["backend"] == "nccl"
        # every kernel's correlation id resolves to a launch of *this* process
        api = ev.filter(pc.equal(ev.column("device"), -1))
        launches = dict(
            zip(api.column("correlation").to_pylist(), api.column("name").to_pylist(), strict=True)
        )
        joinable = [c for c in comm.column("correlation").to_pylist() if c in launches]
        assert len(joinable) >= 31  # the window cut the launch of the first kernel or two
        assert {launches[c] for c in joinable} == {"cuLaunchKernelEx"}
        kern = ev.filter(pc.equal(ev.column("cat"), "kernel"))
        mine = sum(c in launches for c in kern.column("correlation").to_pylist())
        (want,) = sqlite_rows(
            f,
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE EXISTS ("
            "SELECT 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME r WHERE r.eventClass IN (0, 1)"
            " AND r.correlationId = k.correlationId AND (r.globalTid >> 24) = "
            "(k.globalPid >> 24)) AND (k.globalPid >> 24) & 16777215 = "
            f"{p.info['pid']}",
        )[0]
        assert mine == want


@pytest.mark.parametrize(
    ("name", "kernels", "memcpy", "rank", "host"),
    [
        ("saxpy-mpi-cuda_nsys_perlmutter0.sqlite", 5, 15, 0, "nid001608"),
        ("perlmutter-cloverleaf-cuda.sqlite", 1312, 279, 0, "nid008553"),
    ],
)
def test_pipit_old_schemas(name: str, kernels: int, memcpy: int, rank: int, host: str) -> None:
    f = shared_dir("pipit-nsys", name)
    (p,) = read_nsys(f, 0)
    ev = _events(p)
    assert ev.schema == event_schema()
    assert (_kind(ev, "compute").num_rows, _kind(ev, "comm").num_rows) == (kernels, 0)
    assert _kind(ev, "memcpy").num_rows == memcpy
    assert (p.rank, p.info["host"], p.info["num_sms"]) == (rank, host, 108)
    assert p.info["device_name"].startswith("NVIDIA A100-SXM4")
    (n_api,) = sqlite_rows(
        f, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass IN (0, 1)"
    )[0]
    api = ev.filter(pc.equal(ev.column("device"), -1))
    assert api.filter(pc.is_in(api.column("kind"), pa.array(["runtime", "sync"]))).num_rows == n_api
    utc = sqlite_rows(f, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")[0][0]
    (k0,) = sqlite_rows(f, "SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0]
    kern = ev.filter(pc.equal(ev.column("cat"), "kernel"))
    assert pc.min(kern.column("ts_ns")).as_py() == k0 + utc  # type: ignore[operator]
    launch = kern.column("launch").to_pylist()
    assert all(s.startswith("grid=[") and "] block=[" in s for s in launch)
    assert not any("_v" in n for n in api.column("name").to_pylist() if n.startswith("cuda"))


def test_pipit_saxpy_rank_from_nvtx_thread_name() -> None:
    f = shared_dir("pipit-nsys", "saxpy-mpi-cuda_nsys_perlmutter0.sqlite")
    assert sqlite_rows(f, "SELECT text FROM NVTX_EVENTS WHERE eventType = 39") == [("MPI Rank 0",)]
    (p,) = read_nsys(f, 0)
    ann = _kind(_events(p), "annotation")
    assert set(ann.column("cat").to_pylist()) == {"nvtx", "nvtx:MPI"}
