"""Kineto pieces through the C scanner (`_kscan`): the same columns as kineto_events.columns.

Why: the reference decoder (msgspec structs -> Python lists -> Arrow) spends most of its time in
the interpreter; the scanner writes column buffers directly and this module only wraps them.
Everything the scanner does not handle it refuses (ValueError), and the caller falls back to the
reference decoder for that piece, so results and error messages never depend on which ran.
`RANKLENS_PURE_PYTHON=1` turns the scanner off (tests compare both paths).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from ranklens.ingest.classify import comm_op_of, kind_of
from ranklens.ingest.kineto_events import _DEVICE_LIKE, _HOST, _arg_groups, _Args, _first_type
from ranklens.ingest.kineto_events import _to_int as to_int

_kscan: Any
try:
    _kscan = importlib.import_module("ranklens.ingest._kscan")
except ImportError:  # built without a C compiler: the reference decoder does all the work
    _kscan = None


def available() -> bool:
    """Whether the scanner is built and not turned off."""
    return _kscan is not None and os.environ.get("RANKLENS_PURE_PYTHON", "") in ("", "0")


def skip_events(buf: Any, pos: int) -> int:
    """Index just past the `]` closing the events array, scanning from an event start at pos."""
    if _kscan is None:
        raise ValueError("the C scanner is not built")
    return int(_kscan.skip_events(buf, pos))


Columns = tuple[pa.Table, list[tuple[int, int, str]], list[dict[str, Any]]]


def columns(
    buf: Any,
    lo: int,
    hi: int,
    has_dev: bool,
    backend: str | None,
    base_ns: int,
    rank: int,
    trace_id: int,
) -> Columns | None:
    """Events of buf[lo:hi] as (table, threads, groups), or None where the reference decoder
    must decide (anything unusual, including every kind of bad input)."""
    if not available():
        return None
    try:
        r = _kscan.scan(buf, lo, hi)
    except ValueError:
        return None
    n: int = r["rows"]
    cat_codes = np.frombuffer(r["cat_codes"], np.int32)
    name_codes = np.frombuffer(r["name_codes"], np.int32)
    cats = pa.array(r["cats"], pa.string())
    names = pa.array(r["names"], pa.string())
    pids = np.frombuffer(r["pid"], np.int64)
    tids = np.frombuffer(r["tid"], np.int64)
    if r["id_strings"]:
        pids, tids = pids.copy(), tids.copy()
        for row, which, text in r["id_strings"]:
            (pids if which == 0 else tids)[row] = to_int(text)
    ints = {k: _ints(r[k]) for k in _INT_COLS}
    strs = {k: _strings(n, r[k]) for k in _STR_COLS}

    kinds, ops = _kinds_ops(r["cats"], r["names"], cat_codes, name_codes, strs["coll"], has_dev)
    device_like = np.isin(cat_codes, [i for i, c in enumerate(r["cats"]) if c in _DEVICE_LIKE])
    dev_vals, dev_ok = ints["device"]
    devices = np.where(device_like, np.where(dev_ok, dev_vals, pids), _HOST)
    stream_vals, stream_ok = ints["stream"]
    streams = np.where(device_like & stream_ok, stream_vals, tids)
    dtype = _dtypes(strs["dtype"], ops, strs["itypes"])
    if n and not (devices.min() >= _I32_MIN and devices.max() <= _I32_MAX):
        return None  # the reference reports it
    try:
        group_size = _int_array(ints["group_size"], pa.int32())
    except pa.ArrowInvalid:
        return None
    cols: dict[str, pa.Array] = {
        "rank": pa.array(np.full(n, rank, dtype=np.int32)),
        "trace_id": pa.array(np.full(n, trace_id, dtype=np.int32)),
        "kind": kinds,
        # dictionary-encoded: pieces travel between processes and into DuckDB at code size
        "cat": pa.DictionaryArray.from_arrays(pa.array(cat_codes), cats),
        "name": pa.DictionaryArray.from_arrays(pa.array(name_codes), names),
        "device": pa.array(devices.astype(np.int32)),
        "stream": pa.array(streams),
        "pid": pa.array(pids),
        "tid": pa.array(tids),
        "ts_ns": pa.array(np.frombuffer(r["ts_ns"], np.int64) + base_ns),
        "dur_ns": pa.array(np.frombuffer(r["dur_ns"], np.int64)),
        "correlation": _int_array(ints["correlation"]),
        "external_id": _int_array(ints["external_id"]),
        "coll_op": ops,
        "pg_name": strs["pg_name"],
        "in_nelems": _int_array(ints["in_nelems"]),
        "out_nelems": _int_array(ints["out_nelems"]),
        "dtype": dtype,
        "group_size": group_size,
        "seq": _int_array(ints["seq"]),
        "peer": _int_array(ints["peer"], pa.int32()),  # the scanner checked 0..INT32_MAX
        "bytes": _int_array(ints["bytes"]),
        "launch": strs["launch"],
        "shapes": strs["shapes"],
        "concrete": strs["concrete"],
    }
    threads = [
        (to_int(pid), -1 if proc else to_int(tid), name) for pid, tid, name, proc in r["threads"]
    ]
    return pa.table(cols), threads, _groups(strs, ints, backend)


_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1
_INT_COLS = (
    "external_id", "correlation", "stream", "device", "in_nelems", "out_nelems", "group_size",
    "seq", "bytes", "peer",
)  # fmt: skip
_STR_COLS = (
    "coll", "dtype", "pg_name", "pg_desc", "pg_ranks", "shapes", "itypes", "concrete", "launch",
)  # fmt: skip


def _ints(cell: tuple[bytes, bytes]) -> tuple[np.ndarray, np.ndarray]:
    return np.frombuffer(cell[0], np.int64), np.frombuffer(cell[1], np.bool_)


def _int_array(cell: tuple[np.ndarray, np.ndarray], typ: pa.DataType | None = None) -> pa.Array:
    vals, ok = cell
    arr = pa.array(vals, mask=~ok)
    return arr if typ is None else arr.cast(typ)


def _strings(n: int, cell: tuple[bytes, bytes, bytes]) -> pa.Array:
    offsets, data, ok = cell
    valid = np.frombuffer(ok, np.bool_)
    if not valid.any():
        return pa.nulls(n, pa.string())
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data), bitmap)


def _kinds_ops(
    cats: list[str],
    names: list[str],
    cat_codes: np.ndarray,
    name_codes: np.ndarray,
    coll: pa.Array,
    has_dev: bool,
) -> tuple[pa.Array, pa.Array]:
    """Kind and collective op as the reference gives them, classified once per distinct
    (cat, name), and an explicit `Collective name`'s op once per distinct (cat, name, text)."""
    width = max(len(names), 1)
    pair = cat_codes.astype(np.int64) * width + name_codes
    uniq, inverse = np.unique(pair, return_inverse=True)
    kinds, ops = [], []
    for p in uniq.tolist():
        kind, op = _classify(cats[p // width], names[p % width], has_dev)
        kinds.append(kind)
        ops.append(op)
    idx = pa.array(inverse.astype(np.int32))
    kind_arr = pa.DictionaryArray.from_arrays(idx, pa.array(kinds, pa.string()))
    op_arr = pa.array(ops, pa.string()).take(idx)
    if coll.null_count < len(coll):  # an explicit `Collective name` decides the op
        has = coll.is_valid()
        rows = np.flatnonzero(has.to_numpy(zero_copy_only=False))
        # once per distinct (cat, name, text), as the kinds above: every collective of a
        # rank carries one, and a call per row was a third of a small rank's decoding
        text = coll.take(pa.array(rows)).dictionary_encode()
        texts = text.dictionary.to_pylist()
        key = inverse[rows].astype(np.int64) * len(texts) + text.indices.to_numpy()
        ukey, at = np.unique(key, return_inverse=True)
        pairs, which = uniq[ukey // len(texts)].tolist(), (ukey % len(texts)).tolist()
        fixed = [
            comm_op_of(cats[c // width], names[c % width], texts[t])
            for c, t in zip(pairs, which, strict=True)
        ]
        op_arr = pc.replace_with_mask(
            op_arr, has, pa.array(fixed, pa.string()).take(pa.array(at.astype(np.int32)))
        )
    return kind_arr, op_arr


_CLASSIFIED: dict[tuple[str, str, bool], tuple[str, str | None]] = {}


def _classify(cat: str, name: str, has_dev: bool) -> tuple[str, str | None]:
    """kind_of and comm_op_of, remembered across the pieces a worker decodes (the same few
    hundred names recur in every piece)."""
    key = (cat, name, has_dev)
    hit = _CLASSIFIED.get(key)
    if hit is None:
        if len(_CLASSIFIED) > 100_000:
            _CLASSIFIED.clear()
        hit = _CLASSIFIED[key] = (kind_of(cat, name, has_dev), comm_op_of(cat, name, None))
    return hit


def _dtypes(dtype: pa.Array, ops: pa.Array, itypes: pa.Array) -> pa.Array:
    """A collective without `dtype` takes its first input tensor's type (as the reference)."""
    need = pc.and_(dtype.is_null(), ops.is_valid()).to_numpy(zero_copy_only=False)
    if not need.any():
        return dtype
    vals = dtype.to_pylist()
    for i in np.flatnonzero(need).tolist():
        raw = itypes[i].as_py()
        vals[i] = _first_type(msgspec.Raw(raw.encode()) if raw is not None else msgspec.Raw(b""))
    return pa.array(vals, pa.string())


def _groups(
    strs: dict[str, pa.Array], ints: dict[str, tuple[np.ndarray, np.ndarray]], backend: str | None
) -> list[dict[str, Any]]:
    """Process groups named on events, through the reference's own merging rules."""
    pg = strs["pg_name"]
    if pg.null_count == len(pg):
        return []
    # _arg_groups keeps the first row of each group name: only those rows are read (one per
    # collective and rank, row by row, was a fifth of a small rank's decoding)
    codes = pg.dictionary_encode().indices
    valid = np.flatnonzero(codes.is_valid().to_numpy(zero_copy_only=False))
    _, first = np.unique(codes.filter(codes.is_valid()).to_numpy(), return_index=True)
    rows = np.sort(valid[first]).tolist()
    gs_vals, gs_ok = ints["group_size"]
    args = []
    for i in rows:
        ranks_raw = strs["pg_ranks"][i].as_py()
        args.append(
            _Args(
                pg_name=pg[i].as_py(),
                pg_desc=strs["pg_desc"][i].as_py(),
                pg_ranks=None if ranks_raw is None else msgspec.json.decode(ranks_raw),
                group_size=int(gs_vals[i]) if gs_ok[i] else None,
            )
        )
    return _arg_groups(args, backend)
