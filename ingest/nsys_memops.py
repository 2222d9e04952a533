"""GPU memory operations and CUDA synchronization records of an Nsight export.

Why separate: these tables need only enum labels (no string ids), named the way Kineto names
the same operations, so analyses see one vocabulary whatever the format.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
from ranklens.ingest.nsys_sqlite import Report
from ranklens.ingest.nsys_tables import Value, build, device_columns, labels, pid_of

MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
SYNC = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"

# ENUM_CUDA_MEMCPY_OPER / ENUM_CUDA_MEM_KIND / ENUM_CUPTI_SYNC_TYPE: identical in every schema
# version we hold (2.9.1 has no ENUM tables at all), so they are constants here.
COPY_KIND = {
    0: "Unknown",
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
    11: "HtoD",
    12: "DtoH",
    13: "DtoD",
}
MEM_KIND = {
    0: "Pageable",
    1: "Pinned",
    2: "Device",
    3: "Array",
    4: "Managed",
    5: "Device Static",
    6: "Managed Static",
    7: "Unknown",
}
SYNC_KIND = {
    0: "Unknown Sync",
    1: "Event Sync",
    2: "Stream Wait Event",
    3: "Stream Sync",
    4: "Context Sync",
}


def _memcpy_name(key: int) -> str:
    kind, src, dst = key >> 16, (key >> 8 & 0xFF) - 1, (key & 0xFF) - 1
    text = f"Memcpy {COPY_KIND.get(kind, 'Unknown')}"
    if src >= 0 and dst >= 0:
        text += f" ({MEM_KIND.get(src, 'Unknown')} -> {MEM_KIND.get(dst, 'Unknown')})"
    return text


def _small(col: pa.Array) -> pa.Array:
    """An enum column as 0..254 with NULL (or out of range) -> 0, everything else +1."""
    ok = pc.and_(pc.greater_equal(col, 0), pc.less(col, 255))
    return pc.if_else(pc.fill_null(ok, False), pc.add(col, 1), 0)


def _device(cols: list[pa.Array], shift: int) -> dict[str, Value]:
    start, end, corr, gpid, dev, stream = cols[:6]
    return device_columns(start, end, corr, dev, stream, shift) | {"_pid": pid_of(gpid)}


def _device_exprs(rep: Report, t: str) -> list[str]:
    """The columns `_device` reads, in its order, for a memcpy/memset/sync table."""
    return [
        "start",
        '"end"',
        rep.col(t, "correlationId"),
        rep.col(t, "globalPid", "0"),
        "deviceId",
        "streamId",
    ]


def _rows(cols: list[pa.Array], shift: int, kind: str, cat: str, **more: Value) -> pa.Table:
    """One chunk of a device table as events of `kind`/`cat`, with its own columns `more`."""
    return build(len(cols[0]), _device(cols, shift) | {"kind": kind, "cat": cat, **more})


def read_memops(rep: Report, shift: int) -> Iterator[pa.Table]:
    """Memcpy and memset rows, named the way Kineto names them."""
    if rep.has(MEMCPY):
        t = MEMCPY
        exprs = [
            *_device_exprs(rep, t),
            "bytes",
            "copyKind",
            rep.col(t, "srcKind"),
            rep.col(t, "dstKind"),
        ]
        for cols in rep.int_chunks(t, exprs):
            kind, src, dst = cols[7], _small(cols[8]), _small(cols[9])
            key = pc.add(
                pc.add(pc.shift_left(pc.fill_null(kind, 0), 16), pc.shift_left(src, 8)), dst
            )
            name = labels(key, _memcpy_name)
            yield _rows(cols, shift, "memcpy", "gpu_memcpy", bytes=cols[6], name=name)
    if rep.has(MEMSET):
        t = MEMSET
        exprs = [*_device_exprs(rep, t), "bytes", rep.col(t, "memKind")]
        for cols in rep.int_chunks(t, exprs):
            name = labels(_small(cols[7]), lambda k: f"Memset ({MEM_KIND.get(k - 1, 'Unknown')})")
            yield _rows(cols, shift, "memset", "gpu_memset", bytes=cols[6], name=name)


def read_sync(rep: Report, shift: int) -> Iterator[pa.Table]:
    """CUPTI synchronization records: the GPU-side view of a blocking sync (kind sync)."""
    if not rep.has(SYNC):
        return
    t = SYNC
    exprs = [*_device_exprs(rep, t), rep.col(t, "syncType", rep.col(t, "deprecatedSyncType"))]
    for cols in rep.int_chunks(t, exprs):
        name = labels(pc.fill_null(cols[6], 0), lambda k: SYNC_KIND.get(k, "Unknown Sync"))
        yield _rows(cols, shift, "sync", "cuda_sync", name=name)
