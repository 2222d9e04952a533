"""Kineto events -> Arrow columns: the per-event half of the Kineto reader.

Why separate: kineto.py plans and decodes pieces of a file; this module turns one piece's typed
structs into the normalized `events` columns (kind classified once, here, per distinct name).
"""

from __future__ import annotations

import math
import re
import zlib
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
from ranklens.ingest.classify import comm_op_of, kind_of
from ranklens.ingest.errors import TraceFormatError


class _Args(msgspec.Struct, gc=False):
    external_id: int | None = msgspec.field(name="External id", default=None)
    correlation: int | None = None
    stream: int | None = None
    device: int | None = None
    coll: str | None = msgspec.field(name="Collective name", default=None)
    in_nelems: int | None = msgspec.field(name="In msg nelems", default=None)
    out_nelems: int | None = msgspec.field(name="Out msg nelems", default=None)
    group_size: int | None = msgspec.field(name="Group size", default=None)
    dtype: str | None = None
    pg_name: str | None = msgspec.field(name="Process Group Name", default=None)
    pg_desc: str | None = msgspec.field(name="Process Group Description", default=None)
    pg_ranks: str | list[int] | None = msgspec.field(name="Process Group Ranks", default=None)
    seq: int | None = msgspec.field(name="Seq", default=None)
    # p2p peer (global rank) of torch's record_param_comms: Dst for a send, Src for a recv
    dst_rank: int | str | None = msgspec.field(name="Dst Rank", default=None)
    src_rank: int | str | None = msgspec.field(name="Src Rank", default=None)
    nbytes: int | float | None = msgspec.field(name="bytes", default=None)
    grid: list[int] | None = None
    block: list[int] | None = None
    dims: msgspec.Raw = msgspec.field(name="Input Dims", default=msgspec.Raw(b""))
    itypes: msgspec.Raw = msgspec.field(name="Input type", default=msgspec.Raw(b""))
    concrete: msgspec.Raw = msgspec.field(name="Concrete Inputs", default=msgspec.Raw(b""))
    name: str | None = None  # metadata events (process_name / thread_name)


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str | None = None
    name: str = ""
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float | None = None
    args: _Args | None = None


def _fail(path: str, what: str, hint: str | None = None) -> TraceFormatError:
    return TraceFormatError(
        f"{path}: {what}",
        hint or "check that the file is a complete PyTorch profiler (Kineto) JSON trace",
    )


def _parse_ranks(value: str | list[int] | None) -> list[int] | None:
    if value is None:
        return None
    if isinstance(value, list):
        return [int(v) for v in value]
    nums = re.findall(r"-?\d+", value)
    return [int(n) for n in nums] if nums else None


_HOST = -1


def _to_int(v: int | str | None) -> int:
    if isinstance(v, int):
        return v
    if v is None:
        return 0
    try:
        return int(v)
    except ValueError:
        return zlib.crc32(v.encode()) & 0x7FFFFFFF


# |µs| whose whole part is below this converts to ns inside +-2^62 (kineto_fast: the same bound).
US_LIMIT = float(2**62 // 1000)


def _us_to_ns(path: str, timed: list[_Event], field: str) -> np.ndarray:
    """Exact integer-µs part plus rounded sub-µs part (avoids float64 error on epoch µs).

    A value beyond +-2^62 ns (~146 years) cannot be stored: an error naming the event, never
    a silent zero or wrap (numpy casts NaN and out-of-range floats to garbage)."""
    arr = np.asarray([getattr(e, field) for e in timed], dtype=np.float64)
    whole = np.floor(arr)
    bad = ~(np.abs(whole) < US_LIMIT)  # also NaN and inf
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise _fail(
            path,
            f"event {timed[i].name!r} (timed event #{i} of a piece) has `{field}` = "
            f"{arr[i]:g} µs, out of range (|{field}| must stay below {US_LIMIT:.4g} µs)",
            "the trace is damaged; --skip-bad ingests the other ranks",
        )
    return whole.astype(np.int64) * 1000 + np.rint((arr - whole) * 1000.0).astype(np.int64)


def _checked_int(
    path: str, name: str, values: list[Any], timed: list[_Event], int32: bool = False
) -> pa.Array:
    """`values` as an Arrow integer column; a value beyond the column's type is an error naming
    the event (never a wrap or a traceback)."""
    typ = pa.int32() if int32 else pa.int64()
    try:
        return pa.array(values, typ)
    except (OverflowError, pa.ArrowInvalid, TypeError):
        top = 2**31 - 1 if int32 else 2**63 - 1
        bad = next(
            (
                i
                for i, v in enumerate(values)
                if v is not None and not (isinstance(v, int) and -top - 1 <= v <= top)
            ),
            0,
        )
        v = values[bad]
        shown = "a huge number" if isinstance(v, int) and abs(v) >= 10**36 else str(v)
        raise _fail(
            path,
            f"event {timed[bad].name!r}: `{name}` = {shown} is beyond {typ} "
            f"(timed event #{bad} of a piece)",
            "the trace holds a value ranklens cannot store; --skip-bad ingests the other ranks",
        ) from None


_RANK_MAX = 2**31 - 1


def _rank(path: str, name: str, v: int | str) -> int:
    """A global rank written as an int or a string of ASCII digits; anything else (negative,
    not digits, beyond int32) is an error naming the file, never a silent NULL or wrap."""
    if isinstance(v, int):
        num = v
        shown = str(v) if abs(v) < 10**36 else "a huge number"
    else:
        digits = v.lstrip("0") or "0"
        num = int(digits) if v.isascii() and v.isdigit() and len(digits) <= 10 else -1
        shown = repr(v) if len(v) <= 36 else repr(v[:36]) + "..."
    if 0 <= num <= _RANK_MAX:
        return num
    raise _fail(
        path,
        f"`{name}` of an event is not a global rank in int32 range ({shown})",
        "a p2p op's peer must be a rank number; report it with the file",
    )


def _peers(path: str, args: list[_Args]) -> pa.Array:
    """Peer of p2p ops: `Dst Rank` where present (a send), else `Src Rank` (a recv). torch
    writes exactly one of them; both are checked even then, as the C scanner does."""
    out: list[int | None] = []
    for a in args:
        if a.dst_rank is None and a.src_rank is None:
            out.append(None)
            continue
        src = None if a.src_rank is None else _rank(path, "Src Rank", a.src_rank)
        out.append(src if a.dst_rank is None else _rank(path, "Dst Rank", a.dst_rank))
    return pa.array(out, pa.int32())


def columns(
    path: str,
    has_dev: bool,
    backend: str | None,
    base_ns: int,
    events: list[_Event],
    rank: int,
    trace_id: int,
) -> tuple[pa.Table, list[tuple[int, int, str]], list[dict[str, Any]]]:
    """Typed structs -> Arrow event columns; metadata -> thread labels; args -> groups."""
    threads: list[tuple[int, int, str]] = []
    timed: list[_Event] = []
    for e in events:
        if e.ph == "X":
            if e.cat != "Trace":
                timed.append(e)
        elif e.ph == "M" and e.args is not None and e.args.name is not None:
            if e.name == "process_name":
                threads.append((_to_int(e.pid), -1, e.args.name))
            elif e.name == "thread_name":
                threads.append((_to_int(e.pid), _to_int(e.tid), e.args.name))
    for i, e in enumerate(timed):
        if e.ts is None or e.dur is None or e.dur < 0:
            what = (
                "no timestamp"
                if e.ts is None
                else ("no duration" if e.dur is None else f"a negative duration ({e.dur} µs)")
            )
            raise _fail(
                path,
                f"event {e.name!r} (timed event #{i} of a piece) has {what}",
                "the trace is damaged; --skip-bad ingests the other ranks",
            )
    empty = _Args()
    args = [e.args or empty for e in timed]
    cats = [e.cat or "" for e in timed]
    names = [e.name for e in timed]
    kind_cache: dict[tuple[str, str, str | None], tuple[str, str | None]] = {}
    kinds: list[str] = []
    ops: list[str | None] = []
    for c, nm, a in zip(cats, names, args, strict=True):
        key = (c, nm, a.coll)
        hit = kind_cache.get(key)
        if hit is None:
            hit = (kind_of(c, nm, has_dev), comm_op_of(c, nm, a.coll))
            kind_cache[key] = hit
        kinds.append(hit[0])
        ops.append(hit[1])
    device_like = [c in _DEVICE_LIKE for c in cats]
    pids = [_to_int(e.pid) for e in timed]
    tids = [_to_int(e.tid) for e in timed]
    devices = [
        (a.device if a.device is not None else p) if d else _HOST
        for a, p, d in zip(args, pids, device_like, strict=True)
    ]
    streams = [
        (a.stream if a.stream is not None else t) if d else t
        for a, t, d in zip(args, tids, device_like, strict=True)
    ]
    ts_ns = _us_to_ns(path, timed, "ts") + base_ns  # |base_ns| < 2^62: kineto.prepare
    dur_ns = _us_to_ns(path, timed, "dur")
    n = len(timed)
    cols: dict[str, pa.Array] = {
        "rank": pa.array(np.full(n, rank, dtype=np.int32)),
        "trace_id": pa.array(np.full(n, trace_id, dtype=np.int32)),
        "kind": pa.array(kinds, pa.string()),
        "cat": pa.array(cats, pa.string()),
        "name": pa.array(names, pa.string()),
        "device": _checked_int(path, "device", devices, timed, int32=True),
        "stream": _checked_int(path, "stream", streams, timed),
        "pid": _checked_int(path, "pid", pids, timed),
        "tid": _checked_int(path, "tid", tids, timed),
        "ts_ns": pa.array(ts_ns, pa.int64()),
        "dur_ns": pa.array(dur_ns, pa.int64()),
        "correlation": _checked_int(path, "correlation", [a.correlation for a in args], timed),
        "external_id": _checked_int(path, "External id", [a.external_id for a in args], timed),
        "coll_op": pa.array(ops, pa.string()),
        "pg_name": pa.array([a.pg_name for a in args], pa.string()),
        "in_nelems": _checked_int(path, "In msg nelems", [a.in_nelems for a in args], timed),
        "out_nelems": _checked_int(path, "Out msg nelems", [a.out_nelems for a in args], timed),
        # gloo/c10d ops name no dtype; their first tensor input's type stands in (sizes -> bytes)
        "dtype": pa.array(
            [
                a.dtype if a.dtype is not None or op is None else _first_type(a.itypes)
                for a, op in zip(args, ops, strict=True)
            ],
            pa.string(),
        ),
        "group_size": _checked_int(
            path, "Group size", [a.group_size for a in args], timed, int32=True
        ),
        "seq": _checked_int(path, "Seq", [a.seq for a in args], timed),
        "peer": _peers(path, args),
        "bytes": _checked_int(path, "bytes", [_whole(a.nbytes) for a in args], timed),
        "launch": pa.array([_launch(a) for a in args], pa.string()),
        "shapes": pa.array([_text(a.dims) for a in args], pa.string()),
        "concrete": pa.array([_text(a.concrete) for a in args], pa.string()),
    }
    return pa.table(cols), threads, _arg_groups(args, backend)


def _whole(v: float | None) -> float | None:
    """An int-valued arg written as a float; NaN/inf are kept so _checked_int names the event."""
    return None if v is None else (int(v) if math.isfinite(v) else v)


_DEVICE_LIKE = frozenset(("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"))


def _text(raw: msgspec.Raw) -> str | None:
    return bytes(raw).decode() if len(raw) else None


def _arg_groups(args: list[_Args], backend: str | None) -> list[dict[str, Any]]:
    """Process groups named on events (NCCL kernels, record_param_comms)."""
    seen: dict[str, dict[str, Any]] = {}
    for a in args:
        if a.pg_name is None or a.pg_name in seen:
            continue
        ranks = _parse_ranks(a.pg_ranks)
        desc = None if a.pg_desc in (None, "undefined") else a.pg_desc
        seen[a.pg_name] = {
            "pg_name": a.pg_name,
            "pg_desc": desc,
            "ranks": ranks,
            "size": a.group_size if a.group_size is not None else (len(ranks) if ranks else None),
            "backend": backend,
            "source": "event_args",
        }
    return list(seen.values())


def _ranks_text(v: str | list[int] | None) -> str | None:
    if v is None or isinstance(v, str):
        return v
    return "[" + ", ".join(str(x) for x in v) + "]"


_NOT_DTYPES = frozenset({"TensorList", "Scalar", "ScalarList", "GenericList", "None"})


def _first_type(raw: msgspec.Raw) -> str | None:
    """First non-empty entry of an `Input type` list, e.g. 'float'."""
    if not len(raw):
        return None
    try:
        types = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
    if isinstance(types, list):
        return next((t for t in types if isinstance(t, str) and t and t not in _NOT_DTYPES), None)
    return None


def _launch(a: _Args) -> str | None:
    if a.grid is None and a.block is None:
        return None
    return f"grid={a.grid} block={a.block}"
