"""Staged pieces (ingest/staging.py): what goes in comes out, smaller while it waits.

Why: a rank's events are held packed between their decoding and their write; a column lost,
reordered or retyped there would reach the database silently.
"""

from __future__ import annotations

import pyarrow as pa
from ranklens.ingest import staging


def _piece(n: int, offset: int, dict_names: bool) -> pa.Table:
    names = pa.array([f"k{(offset + i) % 7}" for i in range(n)])
    return pa.table(
        {
            "trace_id": pa.array([3] * n, pa.int32()),
            "name": names.dictionary_encode() if dict_names else names,
            "kind": pa.array(["compute", "runtime"] * (n // 2) + ["comm"] * (n % 2)),
            "device": pa.array([i % 2 - 1 for i in range(n)], pa.int64()),
            "ts_ns": pa.array(range(offset, offset + n), pa.int64()),
            "dur_ns": pa.array([5] * n, pa.int64()),
            "correlation": pa.array([None if i % 3 else i for i in range(n)], pa.int64()),
            "seq": pa.nulls(n, pa.int64()),  # null-heavy columns: what packing saves
            "bytes": pa.array([None] * (n - 1) + [42], pa.int64()),
            "launch": pa.array([None if i % 5 else "grid(1,1,1)" for i in range(n)]),
        }
    )


def test_pieces_come_back_whole_and_in_order() -> None:
    tables = [_piece(1000, 0, True), _piece(501, 1000, False), _piece(1, 1501, True)]
    pieces = [staging.pack(t) for t in tables]
    assert [p.rows for p in pieces] == [1000, 501, 1] and {p.trace_id for p in pieces} == {3}
    step = staging.step_table(pieces)
    assert step.column_names == list(staging.STEP_COLUMNS)
    assert step["ts_ns"].to_pylist() == list(range(1502))
    assert step["name"].to_pylist() == [n for t in tables for n in t["name"].to_pylist()]
    back = list(staging.unpack_all(pieces))
    assert pieces == []  # consumed
    for want, got in zip(tables, back, strict=True):
        assert sorted(got.column_names) == sorted(want.column_names)
        for name in want.column_names:
            assert got[name].to_pylist() == want[name].to_pylist(), name
            assert got[name].type == want[name].type, name


def test_packing_is_smaller_than_the_columns_it_holds() -> None:
    t = _piece(100_000, 0, True)
    p = staging.pack(t)
    rest = t.drop_columns(list(staging.STEP_COLUMNS))
    assert p.packed.size < rest.nbytes / 4, (p.packed.size, rest.nbytes)


def test_a_table_without_some_step_columns() -> None:
    t = _piece(10, 0, False).drop_columns(["correlation"])
    (got,) = staging.unpack_all([staging.pack(t)])
    assert sorted(got.column_names) == sorted(t.column_names)
