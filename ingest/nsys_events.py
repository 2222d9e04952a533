"""CUDA activity tables of an Nsight export -> normalized event tables (Arrow).

Why this shape: rows come out as packed integers (nsys_sqlite.int_chunks, nsys_packed) and every
string, label and launch shape is looked up per *distinct* value with Arrow compute, so no
Python object is built per event. Each output table keeps an extra `_pid` column (OS process)
so the caller can split one report into one rank per process.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
from ranklens.ingest.classify import SYNC_RE, is_comm_kernel, kernel_op
from ranklens.ingest.nsys_packed import BLOCK, GRID, event_class_in, pid_device, stream_and_name
from ranklens.ingest.nsys_sqlite import Report
from ranklens.ingest.nsys_tables import (
    U24,
    Names,
    Strings,
    build,
    device_columns,
    duration,
    labels,
    np_u64_key,
    pair_key,
    pid_of,
    tid_of,
)
from ranklens.ingest.sqlite_pages import Expr

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"

_API_SUFFIX = re.compile(r"_v\d+$")
_DTYPES = {  # NCCL kernel-name dtype token -> (PyTorch scalar type name, bytes)
    "int8_t": ("Char", 1),
    "i8": ("Char", 1),
    "uint8_t": ("Byte", 1),
    "u8": ("Byte", 1),
    "int32_t": ("Int", 4),
    "i32": ("Int", 4),
    "uint32_t": ("UInt32", 4),
    "u32": ("UInt32", 4),
    "int64_t": ("Long", 8),
    "i64": ("Long", 8),
    "uint64_t": ("UInt64", 8),
    "u64": ("UInt64", 8),
    "half": ("Half", 2),
    "f16": ("Half", 2),
    "float": ("Float", 4),
    "f32": ("Float", 4),
    "double": ("Double", 8),
    "f64": ("Double", 8),
    "__nv_bfloat16": ("BFloat16", 2),
    "bf16": ("BFloat16", 2),
    "__nv_fp8_e4m3": ("Float8_e4m3fn", 1),
    "f8e4m3": ("Float8_e4m3fn", 1),
    "__nv_fp8_e5m2": ("Float8_e5m2", 1),
    "f8e5m2": ("Float8_e5m2", 1),
}
_DTYPE_RE = re.compile(
    r"_(" + "|".join(sorted(map(re.escape, _DTYPES), key=len, reverse=True)) + r")(?=[_(]|$)"
)

_KTYPES = {
    "name": pa.string(),
    "kind": pa.string(),
    "op": pa.string(),
    "dt": pa.string(),
    "ds": pa.int64(),
}
_RTYPES = {"name": pa.string(), "kind": pa.string(), "launch": pa.bool_()}


def _kernel_label(name: str) -> tuple[object, ...]:
    comm = is_comm_kernel(name)
    hit = _DTYPE_RE.search(name) if comm else None
    dt = _DTYPES[hit.group(1)] if hit else (None, None)
    return name, "comm" if comm else "compute", kernel_op(name) if comm else None, dt[0], dt[1]


def _api_label(raw: str) -> tuple[object, ...]:
    name = _API_SUFFIX.sub("", raw)
    return name, "sync" if SYNC_RE.match(name) else "runtime", "Launch" in name


@functools.lru_cache(maxsize=1 << 16)
def _launch_text(gv: int, bv: int) -> str | None:
    """Formatted once per distinct shape (chunks of one report repeat the same few shapes)."""
    if gv < 0 or bv < 0:
        return None
    return (
        f"grid=[{gv & 0x7FFFFFFF}, {(gv >> 31) & 0xFFFF}, {gv >> 47}] "
        f"block=[{bv & 0x1FFFFF}, {(bv >> 21) & 0x1FFFFF}, {bv >> 42}]"
    )


def launch_strings(grid: pa.Array, block: pa.Array) -> pa.Array:
    """'grid=[x, y, z] block=[x, y, z]' (Kineto's format) from the packed dims."""
    key, grids, blocks = pair_key(grid, block)
    g, b, nb = grids.to_pylist(), blocks.to_pylist(), max(len(blocks), 1)
    return labels(key, lambda k: _launch_text(g[k // nb], b[k % nb]))


class CommInfo:
    """NCCL facts per (pid, correlation id) of the kernel launches they belong to."""

    def __init__(self, table: pa.Table | None = None) -> None:
        self.table = table if table is not None and table.num_rows else None
        if self.table is not None:
            t = self.table
            self.keys = np_u64_key(
                t.column("pid").combine_chunks(), t.column("corr").combine_chunks(), 40
            )

    def columns(self, pid: pa.Array, corr: pa.Array, is_comm: pa.Array) -> dict[str, pa.Array]:
        if self.table is None:
            return {}
        idx = pc.index_in(np_u64_key(pid, corr, 40), value_set=self.keys)
        idx = pc.if_else(is_comm, idx, pa.scalar(None, idx.type))
        return {
            c: pc.take(self.table.column(c).combine_chunks(), idx)
            for c in ("pg_name", "op", "bytes", "group_size", "peer")
        }


def read_kernels(rep: Report, strings: Strings, shift: int, comm: CommInfo) -> Iterator[pa.Table]:
    """Kernels: comm/compute by name, with NCCL facts from `comm` where a launch has them."""
    if not rep.has(KERNEL):
        return
    t = KERNEL
    name = rep.col(t, "demangledName", rep.col(t, "shortName"))
    exprs: list[str | Expr] = [
        "start",
        '"end"',
        rep.col(t, "correlationId"),
        pid_device(rep.col(t, "globalPid", "0")),
        stream_and_name(name),
        GRID,
        BLOCK,
    ]
    names = Names(strings, _kernel_label, _KTYPES)
    for start, end, corr, pid_dev, stream_name, grid, block in rep.int_chunks(t, exprs):
        n = names.lookup(pc.shift_right(stream_name, 32))
        stream = pc.bit_wise_and(stream_name, 0xFFFFFFFF)
        pid = pc.bit_wise_and(pid_dev, U24)
        pid = pc.if_else(pc.equal(pid, U24), pa.scalar(None, pa.int64()), pid)
        dev = pc.shift_right(pid_dev, 24)
        ci = comm.columns(pid, corr, pc.equal(n["kind"], "comm"))
        size = ci.get("bytes")
        yield build(
            len(start),
            {
                "kind": n["kind"],
                "cat": "kernel",
                "name": n["name"],
                **device_columns(start, end, corr, dev, stream, shift),
                "coll_op": pc.coalesce(ci["op"], n["op"].cast(pa.string())) if ci else n["op"],
                "pg_name": ci.get("pg_name"),
                "group_size": ci.get("group_size"),
                "bytes": size,
                "in_nelems": pc.divide(size, n["ds"]) if size is not None else None,
                "peer": ci.get("peer"),
                "dtype": n["dt"],
                "launch": launch_strings(grid, block),
                "_pid": pid,
            },
        )


def read_runtime(
    rep: Report, strings: Strings, shift: int, nccl_threads: set[int], launches: list[pa.Table]
) -> Iterator[pa.Table]:
    """CUDA runtime/driver API rows (kind runtime or sync) on the host thread.

    Launch calls on NCCL threads (`(pid << 24) | tid` in nccl_threads) are also appended to
    `launches` (pid, tid, ts, corr) so NCCL NVTX ranges can be tied to the kernels they launched.
    """
    if not rep.has(RUNTIME):
        return
    t = RUNTIME
    cls = rep.col(t, "eventClass", "0")
    where = event_class_in((0, 1)) if "eventClass" in rep.columns(t) else ""  # not backtraces
    exprs = [
        "start",
        '"end"',
        rep.col(t, "correlationId"),
        rep.col(t, "globalTid", "0"),
        "nameId",
        cls,
    ]
    names = Names(strings, _api_label, _RTYPES)
    threads = pa.array(sorted(nccl_threads), pa.int64())
    for start, end, corr, gtid, nid, ecls in rep.int_chunks(t, exprs, where):
        n = names.lookup(nid)
        pid, tid = pid_of(gtid), tid_of(gtid)
        if len(threads):
            hit = pc.and_(
                n["launch"], pc.is_in(pc.bit_wise_and(gtid, (1 << 48) - 1), value_set=threads)
            )
            found = pa.table({"pid": pid, "tid": tid, "ts": start, "corr": corr}).filter(hit)
            if found.num_rows:
                launches.append(found)
        yield build(
            len(start),
            {
                "kind": n["kind"],
                "name": n["name"],
                "device": -1,
                "stream": tid,
                "pid": pid,
                "tid": tid,
                "ts_ns": pc.add(start, shift),
                "dur_ns": duration(start, end),
                "correlation": corr,
                "_pid": pid,
                "cat": pc.if_else(pc.equal(ecls, 1), "cuda_driver", "cuda_runtime"),
            },
        )
