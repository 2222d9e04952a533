"""CUDA activity tables of an Nsight export -> normalized event tables (Arrow).

Why this shape: rows come out of SQLite as packed integers (nsys_sqlite.int_chunks) and every
string, enum label and launch shape is made by DuckDB joins against small lookup tables, so no
Python object is built per event. Each output table keeps an extra `_pid` column (OS process)
so the caller can split one report into one rank per process.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
from ranklens.ingest._model import EVENT_COLUMNS, event_schema
from ranklens.ingest.classify import SYNC_RE, is_comm_kernel, kernel_op
from ranklens.ingest.nsys_meta import PID_SQL, TID_SQL
from ranklens.ingest.nsys_sqlite import Report

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
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
_SCHEMA = event_schema().append(pa.field("_pid", pa.int64()))
_SQLTYPE = {pa.int32(): "INTEGER", pa.int64(): "BIGINT", pa.string(): "VARCHAR"}

# CUDA limits (grid y/z <= 65535, block x/y <= 1024, z <= 64) let six dims ride in two integers;
# anything outside them reads as -1 and gets no launch string rather than a wrong one.
_GRID = (
    "CASE WHEN gridX BETWEEN 0 AND 2147483647 AND gridY BETWEEN 0 AND 65535 AND gridZ "
    "BETWEEN 0 AND 65535 THEN gridX | (gridY << 31) | (gridZ << 47) ELSE -1 END"
)
_BLOCK = (
    "CASE WHEN blockX BETWEEN 0 AND 2097151 AND blockY BETWEEN 0 AND 2097151 AND blockZ "
    "BETWEEN 0 AND 2097151 THEN blockX | (blockY << 21) | (blockZ << 42) ELSE -1 END"
)
_LAUNCH = (
    "CASE WHEN c7 >= 0 AND c8 >= 0 THEN 'grid=[' || (c7 & 2147483647) || ', ' || "
    "((c7 >> 31) & 65535) || ', ' || (c7 >> 47) || '] block=[' || (c8 & 2097151) || "
    "', ' || ((c8 >> 21) & 2097151) || ', ' || (c8 >> 42) || ']' END"
)


def select_events(exprs: dict[str, str]) -> str:
    """SELECT list producing exactly EVENT_COLUMNS (+ _pid), NULL where a column is not given."""
    out = []
    for f in _SCHEMA:
        out.append(f'CAST({exprs.get(f.name, "NULL")} AS {_SQLTYPE[f.type]}) AS "{f.name}"')
    return ", ".join(out)


def run(duck: duckdb.DuckDBPyConnection, chunk: pa.Table, select: str, rest: str) -> pa.Table:
    """Transform one chunk (registered as `c`) with DuckDB; cast to the event schema."""
    duck.register("c", chunk)
    try:
        rel = duck.sql(f"SELECT {select} FROM c {rest}")
        assert rel is not None
        return rel.to_arrow_table().cast(_SCHEMA)
    finally:
        duck.unregister("c")


class Strings:
    """StringIds lookups, fetched only for the ids a table actually uses."""

    def __init__(self, rep: Report) -> None:
        self.rep = rep
        self.cache: dict[int, str] = {}

    def get(self, ids: Iterable[int]) -> dict[int, str]:
        want = sorted({int(i) for i in ids} - self.cache.keys())
        if want and self.rep.has("StringIds"):
            for i in range(0, len(want), 900):
                part = want[i : i + 900]
                marks = ",".join("?" * len(part))
                for k, v in self.rep.query(
                    f"SELECT id, value FROM StringIds WHERE id IN ({marks})", part
                ):
                    self.cache[int(k)] = str(v)
        return self.cache


def _register(
    duck: duckdb.DuckDBPyConnection,
    name: str,
    cols: dict[str, list[object]],
    types: dict[str, pa.DataType],
) -> None:
    duck.register(name, pa.table({k: pa.array(v, types[k]) for k, v in cols.items()}))


class Names:
    """A growing DuckDB lookup table (id -> name, labels) for the string ids chunks use."""

    def __init__(
        self,
        duck: duckdb.DuckDBPyConnection,
        strings: Strings,
        table: str,
        label: Callable[[int, str], tuple[object, ...]],
        types: dict[str, pa.DataType],
    ) -> None:
        self.duck, self.strings, self.table, self.label = duck, strings, table, label
        self.types = types
        self.rows: dict[str, list[object]] = {k: [] for k in types}
        self.known: set[int] = set()
        self._publish()

    def add(self, chunk: pa.Table, col: str) -> None:
        ids = {v for v in pc.unique(chunk.column(col)).to_pylist() if v is not None}
        new = sorted(ids - self.known)
        if not new:
            return
        names = self.strings.get(new)
        for i in new:
            for k, v in zip(self.rows, (i, *self.label(i, names.get(i, f"#{i}"))), strict=True):
                self.rows[k].append(v)
        self.known.update(new)
        self._publish()

    def _publish(self) -> None:
        self.duck.register(
            self.table, pa.table({k: pa.array(v, self.types[k]) for k, v in self.rows.items()})
        )


def _kernel_label(_i: int, name: str) -> tuple[object, ...]:
    comm = is_comm_kernel(name)
    hit = _DTYPE_RE.search(name) if comm else None
    dt = _DTYPES[hit.group(1)] if hit else (None, None)
    return name, "comm" if comm else "compute", kernel_op(name) if comm else None, dt[0], dt[1]


def _api_label(_i: int, raw: str) -> tuple[object, ...]:
    name = _API_SUFFIX.sub("", raw)
    return name, "sync" if SYNC_RE.match(name) else "runtime", "Launch" in name


def read_kernels(
    rep: Report, duck: duckdb.DuckDBPyConnection, strings: Strings, shift: int
) -> Iterator[pa.Table]:
    """Kernels: comm/compute by name; expects a registered `comm_info(pid, corr, ...)` table."""
    t = KERNEL
    name = rep.col(t, "demangledName", rep.col(t, "shortName"))
    exprs = [
        "start",
        '"end"',
        rep.col(t, "correlationId"),
        rep.col(t, "globalPid", "0"),
        "deviceId",
        "streamId",
        name,
        _GRID,
        _BLOCK,
    ]
    names = Names(
        duck,
        strings,
        "knames",
        _kernel_label,
        {
            "id": pa.int64(),
            "name": pa.string(),
            "kind": pa.string(),
            "op": pa.string(),
            "dt": pa.string(),
            "ds": pa.int64(),
        },
    )
    sel = select_events(
        {
            "kind": "n.kind",
            "cat": "'kernel'",
            "name": "n.name",
            "device": "c4",
            "stream": "c5",
            "pid": "c4",
            "tid": "c5",
            "ts_ns": f"c0 + {shift}",
            "dur_ns": "greatest(c1 - c0, 0)",
            "correlation": "c2",
            "coll_op": "coalesce(ci.op, n.op)",
            "pg_name": "ci.pg_name",
            "group_size": "ci.group_size",
            "bytes": "ci.bytes",
            "dtype": "n.dt",
            "in_nelems": "ci.bytes // n.ds",
            "peer": "ci.peer",
            "launch": _LAUNCH,
            "_pid": PID_SQL.format(c="c3"),
        }
    )
    rest = (
        "LEFT JOIN knames n ON n.id = c6 LEFT JOIN comm_info ci ON n.kind = 'comm' "
        f"AND ci.pid = {PID_SQL.format(c='c3')} AND ci.corr = c2"
    )
    for chunk in rep.int_chunks(t, exprs):
        names.add(chunk, "c6")
        yield run(duck, chunk, sel, rest)


def read_memops(rep: Report, duck: duckdb.DuckDBPyConnection, shift: int) -> Iterator[pa.Table]:
    """Memcpy and memset rows, named the way Kineto names them."""
    for table, enum in ((COPY_KIND, "copy"), (MEM_KIND, "mem")):
        _register(
            duck,
            f"e_{enum}",
            {"id": list(table), "label": list(table.values())},
            {"id": pa.int64(), "label": pa.string()},
        )
    base = {
        "device": "c4",
        "stream": "c5",
        "pid": "c4",
        "tid": "c5",
        "ts_ns": f"c0 + {shift}",
        "dur_ns": "greatest(c1 - c0, 0)",
        "correlation": "c2",
        "bytes": "c6",
        "_pid": PID_SQL.format(c="c3"),
    }
    if rep.has(MEMCPY):
        t = MEMCPY
        exprs = [
            "start",
            '"end"',
            rep.col(t, "correlationId"),
            rep.col(t, "globalPid", "0"),
            "deviceId",
            "streamId",
            "bytes",
            "copyKind",
            rep.col(t, "srcKind"),
            rep.col(t, "dstKind"),
        ]
        sel = select_events(
            base
            | {
                "kind": "'memcpy'",
                "cat": "'gpu_memcpy'",
                "name": "'Memcpy ' || coalesce(k.label, 'Unknown') || CASE WHEN s.label IS NOT NULL "
                "AND d.label IS NOT NULL THEN ' (' || s.label || ' -> ' || d.label || ')' "
                "ELSE '' END",
            }
        )
        rest = (
            "LEFT JOIN e_copy k ON k.id = c7 LEFT JOIN e_mem s ON s.id = c8 "
            "LEFT JOIN e_mem d ON d.id = c9"
        )
        for chunk in rep.int_chunks(t, exprs):
            yield run(duck, chunk, sel, rest)
    if rep.has(MEMSET):
        t = MEMSET
        exprs = [
            "start",
            '"end"',
            rep.col(t, "correlationId"),
            rep.col(t, "globalPid", "0"),
            "deviceId",
            "streamId",
            "bytes",
            rep.col(t, "memKind"),
        ]
        sel = select_events(
            base
            | {
                "kind": "'memset'",
                "cat": "'gpu_memset'",
                "name": "'Memset (' || coalesce(m.label, 'Unknown') || ')'",
            }
        )
        for chunk in rep.int_chunks(t, exprs):
            yield run(duck, chunk, sel, "LEFT JOIN e_mem m ON m.id = c7")


def read_sync(rep: Report, duck: duckdb.DuckDBPyConnection, shift: int) -> Iterator[pa.Table]:
    """CUPTI synchronization records: the GPU-side view of a blocking sync (kind sync)."""
    if not rep.has(SYNC):
        return
    t = SYNC
    _register(
        duck,
        "e_sync",
        {"id": list(SYNC_KIND), "label": list(SYNC_KIND.values())},
        {"id": pa.int64(), "label": pa.string()},
    )
    exprs = [
        "start",
        '"end"',
        rep.col(t, "correlationId"),
        rep.col(t, "globalPid", "0"),
        "deviceId",
        "streamId",
        rep.col(t, "syncType", rep.col(t, "deprecatedSyncType")),
    ]
    sel = select_events(
        {
            "kind": "'sync'",
            "cat": "'cuda_sync'",
            "name": "coalesce(y.label, 'Unknown Sync')",
            "device": "c4",
            "stream": "c5",
            "pid": "c4",
            "tid": "c5",
            "ts_ns": f"c0 + {shift}",
            "dur_ns": "greatest(c1 - c0, 0)",
            "correlation": "c2",
            "_pid": PID_SQL.format(c="c3"),
        }
    )
    for chunk in rep.int_chunks(t, exprs):
        yield run(duck, chunk, sel, "LEFT JOIN e_sync y ON y.id = c6")


def read_runtime(
    rep: Report,
    duck: duckdb.DuckDBPyConnection,
    strings: Strings,
    shift: int,
    launches: list[pa.Table],
) -> Iterator[pa.Table]:
    """CUDA runtime/driver API rows (kind runtime or sync) on the host thread.

    Kernel-launch calls on threads registered in `nccl_threads(pid, tid)` are also appended to
    `launches` (pid, tid, ts, corr) so NCCL NVTX ranges can be tied to the kernels they launched.
    """
    if not rep.has(RUNTIME):
        return
    t = RUNTIME
    cls = rep.col(t, "eventClass", "0")
    where = f"{cls} IN (0, 1)" if "eventClass" in rep.columns(t) else ""  # not backtrace rows
    exprs = [
        "start",
        '"end"',
        rep.col(t, "correlationId"),
        rep.col(t, "globalTid", "0"),
        "nameId",
        cls,
    ]
    names = Names(
        duck,
        strings,
        "rnames",
        _api_label,
        {"id": pa.int64(), "name": pa.string(), "kind": pa.string(), "launch": pa.bool_()},
    )
    pid, tid = PID_SQL.format(c="c3"), TID_SQL.format(c="c3")
    sel = select_events(
        {
            "kind": "n.kind",
            "cat": "CASE WHEN c5 = 1 THEN 'cuda_driver' ELSE 'cuda_runtime' END",
            "name": "n.name",
            "device": "-1",
            "stream": tid,
            "pid": pid,
            "tid": tid,
            "ts_ns": f"c0 + {shift}",
            "dur_ns": "greatest(c1 - c0, 0)",
            "correlation": "c2",
            "_pid": pid,
        }
    )
    for chunk in rep.int_chunks(t, exprs, where):
        names.add(chunk, "c4")
        duck.register("c", chunk)
        try:
            rel = duck.sql(
                f"SELECT {pid} AS pid, {tid} AS tid, c0 AS ts, c2 AS corr FROM c "
                "JOIN rnames n ON n.id = c4 AND n.launch "
                f"JOIN nccl_threads h ON h.pid = {pid} AND h.tid = {tid}"
            )
            assert rel is not None
            found = rel.to_arrow_table()
        finally:
            duck.unregister("c")
        if found.num_rows:
            launches.append(found)
        yield run(duck, chunk, sel, "LEFT JOIN rnames n ON n.id = c4")


def dummy_tables(duck: duckdb.DuckDBPyConnection) -> None:
    """Empty lookup tables the readers join against when there is no NCCL information."""
    duck.execute(
        "CREATE OR REPLACE TABLE comm_info (pid BIGINT, corr BIGINT, pg_name VARCHAR, "
        "op VARCHAR, bytes BIGINT, group_size INTEGER, peer INTEGER)"
    )
    duck.execute("CREATE OR REPLACE TABLE nccl_threads (pid BIGINT, tid BIGINT)")


__all__ = [
    "EVENT_COLUMNS",
    "dummy_tables",
    "read_kernels",
    "read_memops",
    "read_runtime",
    "read_sync",
]
