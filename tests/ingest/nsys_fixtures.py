"""Hand-built Nsight Systems SQLite exports for the reader's tests, and the shared-trace helper.

Why hand-built: real exports cover three schema versions but not the edge cases (lazy tables,
correlation ids repeated across processes, payloads, window edges). The DDL below is a subset
of the real 3.25.0 DDL (docs/nsys-ddl-3.25.0.sql): same table and column names, fewer columns,
and - like `nsys export` - a table is only created when it gets a row.
"""

from __future__ import annotations

import os
import sqlite3
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "public"


def shared_dir(*parts: str) -> Path:
    """A path under ../shared/traces/public: skip when absent, fail if RANKLENS_REQUIRE_SHARED=1."""
    path = SHARED.joinpath(*parts)
    if path.exists():
        return path
    msg = f"shared traces not found: {path}"
    if os.environ.get("RANKLENS_REQUIRE_SHARED") == "1":
        pytest.fail(msg + " (RANKLENS_REQUIRE_SHARED=1)")
    pytest.skip(reason=msg)


# One table per line: `Name: column definitions` (types and NOT NULLs as nsys writes them).
_DDL_TEXT = """
StringIds: id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL
META_DATA_EXPORT: name TEXT NOT NULL, value TEXT
META_DATA_CAPTURE: name TEXT NOT NULL, value TEXT
TARGET_INFO_SESSION_START_TIME: utcEpochNs INTEGER, utcTime TEXT, localTime TEXT, systemClockNs INTEGER
ANALYSIS_DETAILS: globalVid INTEGER NOT NULL, duration INTEGER NOT NULL, startTime INTEGER NOT NULL, stopTime INTEGER NOT NULL
TARGET_INFO_SYSTEM_ENV: globalVid INTEGER, devStateName TEXT NOT NULL, name TEXT NOT NULL, nameEnum INTEGER NOT NULL, value TEXT NOT NULL
TARGET_INFO_GPU: vmId INTEGER, id INTEGER, name TEXT, smCount INTEGER, cuDevice INTEGER
PROCESSES: globalPid INTEGER, pid INTEGER, name TEXT
ThreadNames: nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER
MPI_RANKS: globalTid INTEGER, rank INTEGER
CUPTI_ACTIVITY_KIND_KERNEL: start INTEGER NOT NULL, "end" INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER, gridX INTEGER NOT NULL, gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL, blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL
CUPTI_ACTIVITY_KIND_MEMCPY: start INTEGER NOT NULL, "end" INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, srcKind INTEGER, dstKind INTEGER
CUPTI_ACTIVITY_KIND_MEMSET: start INTEGER NOT NULL, "end" INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, value INTEGER NOT NULL, bytes INTEGER NOT NULL, memKind INTEGER
CUPTI_ACTIVITY_KIND_RUNTIME: start INTEGER NOT NULL, "end" INTEGER NOT NULL, eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL
CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: start INTEGER NOT NULL, "end" INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, syncType INTEGER NOT NULL, eventId INTEGER NOT NULL
NVTX_EVENTS: start INTEGER NOT NULL, "end" INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER, domainId INTEGER, uint64Value INTEGER, int64Value INTEGER, jsonTextId INTEGER, jsonText TEXT, binaryData TEXT
NVTX_PAYLOAD_SCHEMAS: domainId INTEGER, schemaId INTEGER, name TEXT, type INTEGER, flags INTEGER, numEntries INTEGER, payloadSize INTEGER, alignTo INTEGER
NVTX_PAYLOAD_SCHEMA_ENTRIES: domainId INTEGER NOT NULL, schemaId INTEGER NOT NULL, idx INTEGER NOT NULL, flags INTEGER, type INTEGER, name TEXT, description TEXT, arrayOrUnionDetail INTEGER, offset INTEGER
"""  # noqa: E501
DDL: dict[str, str] = {
    name: cols for name, cols in (line.split(": ", 1) for line in _DDL_TEXT.strip().splitlines())
}

# NCCL 2.25's payload schemas as S5 (nsys-ai) exports them: schemaId -> (type, label, offset).
_ID, _SIZE = (18, "NCCL communicator ID", None), (22, "Message size [bytes]", 8)
NCCL_SCHEMAS: dict[int, list[tuple[int, str, int | None]]] = {
    16777218: [_ID, (5, "No. of ranks", 8), (5, "Rank", 12), (5, "CUDA device", 16)],
    16777223: [_ID, _SIZE, (16777232, "Reduction operation", 16)],
    16777226: [_ID, _SIZE, (5, "Peer rank", 16)],
    16777225: [_ID, _SIZE, (5, "Peer rank", 16)],
}


def gtid(pid: int, tid: int | None = None, vm: int = 1) -> int:
    """Serialized GlobalId: <hw:8><vm:8><pid:24><tid:24>."""
    return (vm << 48) | (pid << 24) | (pid if tid is None else tid)


def gpid(pid: int, vm: int = 1) -> int:
    return (vm << 48) | (pid << 24)


@dataclass
class NsysDB:
    """Rows of a fake export; `save()` writes only the tables that got rows (lazy export)."""

    path: Path
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    strings: dict[str, int] = field(default_factory=dict)

    def add(self, table: str, **row: Any) -> None:
        self.rows.setdefault(table, []).append(row)

    def sid(self, text: str) -> int:
        """StringIds id of text (interned)."""
        if text not in self.strings:
            self.strings[text] = len(self.strings) + 1
            self.add("StringIds", id=self.strings[text], value=text)
        return self.strings[text]

    def meta(
        self,
        *,
        normalized: bool = False,
        utc: int = 1_700_000_000_000_000_000,
        system_clock: int | None = None,
        host: str | None = "node0",
        env: dict[str, str] | None = None,
        schema: str = "3.25.0",
    ) -> NsysDB:
        self.add("META_DATA_EXPORT", name="EXPORT_SCHEMA_VERSION", value=schema)
        self.add(
            "META_DATA_EXPORT",
            name="EXPORT_PARAM_TIME_NORMALIZE",
            value="true" if normalized else "false",
        )
        self.add(
            "TARGET_INFO_SESSION_START_TIME",
            utcEpochNs=utc,
            utcTime="",
            localTime="",
            systemClockNs=system_clock,
        )
        if host:
            self.add(
                "TARGET_INFO_SYSTEM_ENV",
                globalVid=1,
                devStateName="",
                name="Hostname",
                nameEnum=0,
                value=host,
            )
        for k, v in (env or {}).items():
            self.add("META_DATA_CAPTURE", name="PROCESS_0:ENVIRONMENT_VARIABLE", value=f'{k}="{v}"')
        return self

    def gpu(
        self, cu_device: int, name: str = "NVIDIA H100", sms: int = 132, nsys_id: int | None = None
    ) -> None:
        self.add(
            "TARGET_INFO_GPU",
            vmId=1 << 48,
            id=cu_device if nsys_id is None else nsys_id,
            name=name,
            smCount=sms,
            cuDevice=cu_device,
        )

    def process(self, pid: int, name: str = "python") -> None:
        self.add("PROCESSES", globalPid=gpid(pid), pid=pid, name=name)

    def device_row(
        self,
        table: str,
        pid: int,
        start: int,
        end: int,
        corr: int | None,
        *,
        device: int = 0,
        stream: int = 7,
        **cols: Any,
    ) -> None:
        """A row of a CUPTI device table (kernel, memcpy, memset, sync): the columns they share
        (context 1), then the table's own."""
        self.add(
            table,
            start=start,
            end=end,
            deviceId=device,
            contextId=1,
            streamId=stream,
            correlationId=corr,
            globalPid=gpid(pid),
            **cols,
        )

    def kernel(
        self,
        pid: int,
        start: int,
        end: int,
        name: str,
        *,
        corr: int | None = None,
        device: int = 0,
        stream: int = 7,
        grid: tuple[int, int, int] = (1, 1, 1),
        block: tuple[int, int, int] = (128, 1, 1),
        short: str | None = None,
        demangled: bool = True,
    ) -> None:
        ids = self.sid(name), self.sid(short or name.split("(")[0])
        self.device_row(
            "CUPTI_ACTIVITY_KIND_KERNEL",
            pid,
            start,
            end,
            corr,
            device=device,
            stream=stream,
            demangledName=ids[0] if demangled else ids[1],
            shortName=ids[1],
            mangledName=None,
            gridX=grid[0],
            gridY=grid[1],
            gridZ=grid[2],
            blockX=block[0],
            blockY=block[1],
            blockZ=block[2],
        )

    def runtime(
        self,
        pid: int,
        start: int,
        end: int,
        name: str,
        corr: int | None,
        tid: int | None = None,
        event_class: int = 0,
    ) -> None:
        self.add(
            "CUPTI_ACTIVITY_KIND_RUNTIME",
            start=start,
            end=end,
            eventClass=event_class,
            globalTid=gtid(pid, tid),
            correlationId=corr,
            nameId=self.sid(name),
            returnValue=0,
        )

    def memcpy(
        self,
        pid: int,
        start: int,
        end: int,
        nbytes: int,
        kind: int = 1,
        src: int | None = 0,
        dst: int | None = 2,
        corr: int | None = None,
    ) -> None:
        self.device_row(
            "CUPTI_ACTIVITY_KIND_MEMCPY",
            pid,
            start,
            end,
            corr,
            bytes=nbytes,
            copyKind=kind,
            srcKind=src,
            dstKind=dst,
        )

    def memset(self, pid: int, start: int, end: int, nbytes: int, corr: int | None = None) -> None:
        self.device_row(
            "CUPTI_ACTIVITY_KIND_MEMSET",
            pid,
            start,
            end,
            corr,
            value=0,
            bytes=nbytes,
            memKind=2,
        )

    def sync(self, pid: int, start: int, end: int, sync_type: int = 3) -> None:
        self.device_row(
            "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
            pid,
            start,
            end,
            None,
            syncType=sync_type,
            eventId=0,
        )

    def nvtx(
        self,
        pid: int,
        start: int,
        end: int | None,
        text: str,
        *,
        tid: int | None = None,
        domain: int = 0,
        registered: bool = False,
        event_type: int = 59,
        **payload: Any,
    ) -> None:
        self.add(
            "NVTX_EVENTS",
            start=start,
            end=end,
            eventType=event_type,
            text=None if registered else text,
            textId=self.sid(text) if registered else None,
            globalTid=gtid(pid, tid),
            domainId=domain,
            **payload,
        )

    def nccl_schemas(self, domain: int = 1) -> None:
        for sid, entries in NCCL_SCHEMAS.items():
            self.add(
                "NVTX_PAYLOAD_SCHEMAS",
                domainId=domain,
                schemaId=sid,
                type=1,
                numEntries=len(entries),
                payloadSize=24 if len(entries) > 1 else 8,
            )
            for i, (typ, label, off) in enumerate(entries):
                self.add(
                    "NVTX_PAYLOAD_SCHEMA_ENTRIES",
                    domainId=domain,
                    schemaId=sid,
                    idx=i,
                    type=typ,
                    name=label,
                    offset=off,
                )

    def save(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(self.path)
        try:
            for table, rows in self.rows.items():
                con.execute(f'CREATE TABLE "{table}" ({DDL[table]})')
                cols = sorted({k for r in rows for k in r})
                marks = ", ".join("?" * len(cols))
                names = ", ".join(f'"{c}"' for c in cols)
                con.executemany(
                    f'INSERT INTO "{table}" ({names}) VALUES ({marks})',
                    [[r.get(c) for c in cols] for r in rows],
                )
            con.commit()
        finally:
            con.close()
        return self.path


def comm_init_blob(comm: int, nranks: int, rank: int, device: int) -> bytes:
    """Binary payload of ncclCommInitRank (schema 16777218)."""
    return struct.pack("<Qiii", comm, nranks, rank, device) + b"\0" * 4


def send_blob(comm: int, nbytes: int, peer: int) -> bytes:
    """Binary payload of ncclSend/ncclRecv (schema 16777226/16777225)."""
    return struct.pack("<QQi", comm, nbytes, peer) + b"\0" * 4


def make_kernel_db(path: Path, n: int, n_names: int = 200) -> Path:
    """A large export with only kernels (plus metadata), written fast, for speed tests."""
    db = NsysDB(path).meta(normalized=True)
    db.process(100)
    db.sid("nccl")  # creates StringIds
    db.save()
    con = sqlite3.connect(path)
    con.execute(f"CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL ({DDL['CUPTI_ACTIVITY_KIND_KERNEL']})")
    con.executemany(
        "INSERT INTO StringIds VALUES (?, ?)",
        [(1000 + i, f"void kernel_{i}<float, 4>(float const*, int)") for i in range(n_names)],
    )

    def rows() -> Iterator[tuple[int, ...]]:
        t = 1_700_000_000_000_000_000
        for i in range(n):
            t += 1500
            yield (
                t,
                t + 1000,
                i % 2,
                1,
                7 + i % 3,
                i,
                gpid(100),
                1000 + i % n_names,
                1000 + i % n_names,
                512,
                1,
                1,
                256,
                1,
                1,
            )

    con.executemany(
        'INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, "end", deviceId, contextId, '
        "streamId, correlationId, globalPid, demangledName, shortName, gridX, gridY, "
        "gridZ, blockX, blockY, blockZ) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        rows(),
    )
    con.commit()
    con.close()
    return path
