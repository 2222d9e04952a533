"""steps.write_rank writes a rank's pieces in one INSERT: pieces whose columns differ (one has
a column the other lacks, one holds names dictionary-encoded, the other plain) still land
row for row, in order, each value where it belongs."""

from __future__ import annotations

import duckdb
import pyarrow as pa
from ranklens.ingest import staging, steps
from ranklens.ingest.schema import ddl


def _piece(first: int, n: int, *, dictionary: bool, coll: bool) -> pa.Table:
    names = pa.array([f"k{first + i}" for i in range(n)])
    cols: dict[str, pa.Array] = {
        "rank": pa.array([3] * n, pa.int32()),
        "trace_id": pa.array([0] * n, pa.int32()),
        "kind": pa.array(["cpu_op"] * n).dictionary_encode(),
        "name": names.dictionary_encode() if dictionary else names,
        "device": pa.array([-1] * n, pa.int32()),
        "ts_ns": pa.array([1_000 * (first + i) for i in range(n)], pa.int64()),
        "dur_ns": pa.array([500] * n, pa.int64()),
        "correlation": pa.array([None] * n, pa.int64()),
    }
    if coll:
        cols["coll_op"] = pa.array(["all_reduce" if i % 2 else None for i in range(n)])
    return pa.table(cols)


def test_pieces_of_different_shapes_land_in_order() -> None:
    con = duckdb.connect()
    con.execute(ddl())
    a = _piece(0, 5, dictionary=True, coll=True)
    b = _piece(5, 4, dictionary=False, coll=False)
    steps.write_rank(con, 3, False, [staging.pack(a), staging.pack(b)])
    rows = con.execute("SELECT name, ts_ns, coll_op, rank FROM events ORDER BY rowid").fetchall()
    assert [r[0] for r in rows] == [f"k{i}" for i in range(9)]
    assert [r[1] for r in rows] == [1_000 * i for i in range(9)]
    assert [r[2] for r in rows] == [None, "all_reduce", None, "all_reduce", None] + [None] * 4
    assert {r[3] for r in rows} == {3}
