"""Arrow helpers shared by the Nsight table readers.

Why: every reader turns packed integer chunks into event tables the same way - vectorized
Arrow compute plus lookups into small tables of labels - so no Python object is made per event;
Python only runs once per *distinct* string id, launch shape or enum value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from ranklens.ingest._model import event_schema
from ranklens.ingest.nsys_sqlite import Report

# Text columns are dictionary-encoded: a kernel name repeats millions of times, and copying it
# per row was a third of the reader's time and most of its memory. DuckDB and Arrow compute
# read them as plain strings; `plain()` decodes a table for code that needs pa.string().
TEXT = pa.dictionary(pa.int32(), pa.string())
SCHEMA = pa.schema(
    [pa.field(f.name, TEXT if f.type == pa.string() else f.type) for f in event_schema()]
).append(pa.field("_pid", pa.int64()))  # _pid: OS process, for splitting
Value = Union[pa.Array, str, int, None]  # noqa: UP007 - a runtime alias, kept 3.10-compatible
U24 = 0xFFFFFF


def build(n: int, cols: dict[str, Value]) -> pa.Table:
    """A table with exactly the event columns (+ _pid); constants repeat, missing are NULL."""
    arrays: list[pa.Array] = []
    for f in SCHEMA:
        v = cols.get(f.name)
        if isinstance(v, pa.Array):
            if v.type == f.type:
                arrays.append(v)
            elif f.type == TEXT:
                arrays.append(pc.dictionary_encode(v.cast(pa.string())).cast(TEXT))
            else:
                arrays.append(v.cast(f.type))
        else:
            arrays.append(constant(v, f.type, n))
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


_CONSTANTS: dict[tuple[object, pa.DataType], pa.Array] = {}


def constant(value: str | int | None, typ: pa.DataType, n: int) -> pa.Array:
    """n copies of value (NULL for None) as a zero-copy slice of one shared array.

    Why: a kernel row leaves about half of the event columns NULL or constant; a fresh array per
    column and chunk was ~0.5 GB of identical buffers held until the rank is written.
    """
    key = (value, typ)
    base = _CONSTANTS.get(key)
    if base is None or len(base) < n:
        if value is None:
            base = pa.nulls(n, typ)
        elif typ == TEXT:
            zeros = pa.repeat(pa.scalar(0, pa.int32()), n)
            base = pa.DictionaryArray.from_arrays(zeros, pa.array([value], pa.string()))
        else:
            base = pa.repeat(pa.scalar(value, typ), n)
        _CONSTANTS[key] = base
    return base.slice(0, n)


def plain(t: pa.Table) -> pa.Table:
    """The table with text columns decoded to pa.string() (the schema `event_schema()` names)."""
    return t.cast(pa.schema([pa.field(f.name, _plain_type(f.type)) for f in t.schema]))


def _plain_type(typ: pa.DataType) -> pa.DataType:
    return pa.string() if typ == TEXT else typ


def text_of(ids: pa.Array, values: pa.Array) -> pa.Array:
    """A dictionary-encoded text column: row i is values[ids[i]] (ids may be null)."""
    return pa.DictionaryArray.from_arrays(ids.cast(pa.int32()), values.cast(pa.string()))


def pid_of(gid: pa.Array) -> pa.Array:
    """OS pid from a serialized globalTid/globalPid (<hw:8><vm:8><pid:24><tid:24>)."""
    return pc.bit_wise_and(pc.shift_right(gid, 24), U24)


def tid_of(gid: pa.Array) -> pa.Array:
    return pc.bit_wise_and(gid, U24)


def duration(start: pa.Array, end: pa.Array) -> pa.Array:
    """end - start, never negative (clock glitches and unfinished rows become 0); an overflow
    raises (ArrowInvalid: the file is reported as unreadable) instead of wrapping to a zero."""
    return pc.max_element_wise(pc.subtract_checked(end, start), 0)


def device_columns(
    start: pa.Array, end: pa.Array, corr: pa.Array, dev: pa.Array, stream: pa.Array, shift: int
) -> dict[str, Value]:
    """The columns every device-side row (kernel, copy, set, sync) has: device and stream, also
    as Kineto's pid/tid, the interval on the job clock (`shift`), the CUDA correlation id."""
    return {
        "device": dev,
        "stream": stream,
        "pid": dev,
        "tid": stream,
        "ts_ns": pc.add(start, shift),
        "dur_ns": duration(start, end),
        "correlation": corr,
    }


def labels(key: pa.Array, label: Callable[[int], str | None]) -> pa.Array:
    """Map an integer key column through `label`, calling it once per distinct key."""
    uniq = pc.unique(key).drop_null()
    text = pa.array([label(k) for k in uniq.to_pylist()], pa.string())
    return text_of(pc.index_in(key, value_set=uniq), text)


def pair_key(a: pa.Array, b: pa.Array) -> tuple[pa.Array, pa.Array, pa.Array]:
    """(key, a values, b values): one exact int64 key per (a, b) pair via dictionary codes."""
    da, db = pc.dictionary_encode(a), pc.dictionary_encode(b)
    nb = max(len(db.dictionary), 1)
    key = pc.add(pc.multiply(da.indices.cast(pa.int64()), nb), db.indices.cast(pa.int64()))
    return key, da.dictionary, db.dictionary


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


class Names:
    """A growing lookup (string id -> name and labels derived from it), per reader."""

    def __init__(
        self,
        strings: Strings,
        label: Callable[[str], Sequence[object]],
        types: dict[str, pa.DataType],
    ) -> None:
        self.strings, self.label, self.types = strings, label, types
        self.ids: list[int] = []
        self.values: dict[str, list[object]] = {k: [] for k in types}
        self._arrays: dict[str, pa.Array] = {}

    def lookup(self, ids: pa.Array) -> dict[str, pa.Array]:
        """The label columns for a column of string ids (learning new ids on the way)."""
        new = sorted(set(pc.unique(ids).drop_null().to_pylist()) - set(self.ids))
        if new or not self._arrays:
            names = self.strings.get(new)
            for i in new:
                self.ids.append(i)
                for k, v in zip(self.values, self.label(names.get(i, f"#{i}")), strict=True):
                    self.values[k].append(v)
            self._arrays = {k: pa.array(v, self.types[k]) for k, v in self.values.items()}
            self._arrays["_ids"] = pa.array(self.ids, pa.int64())
        idx = pc.index_in(ids, value_set=self._arrays["_ids"])
        out = {}
        for k, v in self._arrays.items():
            if k == "_ids":
                continue
            if v.null_count == len(v):  # no comm kernel yet: op, dtype stay NULL cheaply
                out[k] = constant(None, TEXT if v.type == pa.string() else v.type, len(ids))
            elif v.type == pa.string():
                out[k] = text_of(idx, v)
            else:
                out[k] = pc.take(v, idx)
        return out


def np_u64_key(hi: pa.Array, lo: pa.Array, shift: int) -> pa.Array:
    """(hi << shift) | lo as int64 (wrapping), null where either side is null."""
    h = hi.fill_null(0).to_numpy(zero_copy_only=False).astype(np.uint64)
    low = lo.fill_null(0).to_numpy(zero_copy_only=False).astype(np.uint64)
    key = ((h << np.uint64(shift)) | low).view(np.int64)
    return pa.array(key, pa.int64(), mask=np.asarray(lo.is_null()))
