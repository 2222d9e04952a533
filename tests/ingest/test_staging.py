"""Staged pieces (ingest/staging.py): what goes in comes out, smaller while it waits.

Why: a rank's events are held packed between their decoding and their write; a column lost,
reordered or retyped there would reach the database silently.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from nsys_fixtures import make_kernel_db
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


@pytest.mark.parametrize("compress", [True, False])
def test_pieces_come_back_whole_and_in_order(compress: bool) -> None:
    """Packed, or held as they are (a rank written at once), the same rows come back."""
    tables = [_piece(1000, 0, True), _piece(501, 1000, False), _piece(1, 1501, True)]
    pieces = [staging.pack(t, compress=compress) for t in tables]
    assert all(isinstance(p.packed, pa.Buffer) == compress for p in pieces)
    others = [f for f in tables[0].schema if f.name not in staging.STEP_COLUMNS]
    assert list(staging.packed_schema(pieces[0])) == others
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


def test_a_per_file_readers_large_rank_is_held_unpacked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sink.add_part packs a small rank (it may wait for others: sink.SMALL_RANK_ROWS) and
    holds a large one as it is (written at once); the database gets the same events."""
    from ranklens.ingest import load_traces
    from ranklens.ingest import sink as sink_mod

    seen: list[bool] = []
    real = staging.pack

    def pack(table: pa.Table, *, compress: bool = True) -> staging.Piece:
        seen.append(compress)
        return real(table, compress=compress)

    monkeypatch.setattr(staging, "pack", pack)
    trace = make_kernel_db(tmp_path / "rank0.sqlite", 3000)
    got = {}
    for small_rank_rows in (10**9, 1000):  # the rank small, then large
        seen.clear()
        monkeypatch.setattr(sink_mod, "SMALL_RANK_ROWS", small_rank_rows)
        out = tmp_path / f"r{small_rank_rows}.duckdb"
        load_traces([trace], out, workers=1)
        assert seen and set(seen) == {small_rank_rows > 3000}
        con = duckdb.connect(str(out), read_only=True)
        got[small_rank_rows] = con.execute("SELECT * FROM events ORDER BY ALL").fetchall()
        con.close()
    assert len(got[1000]) >= 3000 and got[1000] == got[10**9]
