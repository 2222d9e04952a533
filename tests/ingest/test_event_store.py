"""`events` is two tables behind one view (ingest/event_store.py): rows with none of the sparse
columns are written without them. Whatever table a row lands in, the view gives it back with
every value in place, the cross-rank stage's UPDATEs reach every row they aim at (comm rows),
and a failure between the two INSERTs keeps nothing."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest
from ranklens.ingest import event_store
from ranklens.ingest.schema import EVENTS_SPARSE, TABLE_BY_NAME, ddl


def _rows() -> pa.Table:
    """Six events: a kernel, a comm kernel without args, a host op naming a collective, a
    memcpy with bytes, a host op with shapes, a runtime call."""
    kinds = ["compute", "comm", "cpu_op", "memcpy", "cpu_op", "runtime"]
    return pa.table(
        {
            "rank": pa.array([1] * 6, pa.int32()),
            "trace_id": pa.array([0] * 6, pa.int32()),
            "kind": pa.array(kinds).dictionary_encode(),
            "name": pa.array(
                [
                    "gemm",
                    "ncclKernel",
                    "record_param_comms",
                    "Memcpy",
                    "aten::mm",
                    "cudaLaunchKernel",
                ]
            ),
            "device": pa.array([0, 0, -1, 0, -1, -1], pa.int32()),
            "ts_ns": pa.array([10, 20, 30, 40, 50, 60], pa.int64()),
            "dur_ns": pa.array([5] * 6, pa.int64()),
            "coll_op": pa.array([None, None, "all_reduce", None, None, None]),
            "pg_name": pa.array([None, None, "0", None, None, None]),
            "bytes": pa.array([None, None, None, 4096, None, None], pa.int64()),
            "shapes": pa.array([None, None, None, None, "[[2, 2]]", None]),
            "launch": pa.array(["grid=[1,1,1] block=[32,1,1]", None, None, None, None, None]),
        }
    )


def _db() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(ddl())
    return con


def test_sparse_rows_go_to_the_rich_table_and_the_view_gives_every_row_back() -> None:
    con = _db()
    with event_store.transaction(con):
        event_store.insert_events(con, _rows())
    rich = con.execute("SELECT name FROM events_rich ORDER BY ts_ns").fetchall()
    plain = con.execute("SELECT name FROM events_plain ORDER BY ts_ns").fetchall()
    assert [r[0] for r in rich] == ["ncclKernel", "record_param_comms", "Memcpy", "aten::mm"]
    assert [r[0] for r in plain] == ["gemm", "cudaLaunchKernel"]
    got = con.execute(
        "SELECT name, kind::VARCHAR, coll_op, pg_name, bytes, shapes, launch FROM events "
        "ORDER BY ts_ns"
    ).fetchall()
    src = _rows()
    want = list(
        zip(
            *(src[c].to_pylist() for c in ("name",)),
            [str(k) for k in src["kind"].to_pylist()],
            *(src[c].to_pylist() for c in ("coll_op", "pg_name", "bytes", "shapes", "launch")),
            strict=True,
        )
    )
    assert got == want


def test_the_view_has_the_schema_columns_and_types() -> None:
    con = _db()
    got = [(r[0], r[1]) for r in con.execute("DESCRIBE events").fetchall()]
    want = [(c.name, c.type) for c in TABLE_BY_NAME["events"].columns]
    assert [g[0] for g in got] == [w[0] for w in want]
    for (name, typ), (_, declared) in zip(got, want, strict=True):
        assert typ.startswith("ENUM") if declared.startswith("ENUM") else typ == declared, name
    plain = {r[0] for r in con.execute("DESCRIBE events_plain").fetchall()}
    assert plain.isdisjoint(EVENTS_SPARSE) and "launch" in plain


def test_the_cross_rank_updates_reach_comm_rows() -> None:
    """A comm kernel without args lands in events_rich, where post.py gives it its group."""
    from ranklens.ingest.post import _fill_comm_args

    con = _db()
    t = _rows()
    ext = pa.array([None, 7, 7, None, None, None], pa.int64())
    event_store.insert_events(con, t.append_column("external_id", ext))
    _fill_comm_args(con)
    assert con.execute(
        "SELECT pg_name, coll_op FROM events WHERE name = 'ncclKernel'"
    ).fetchall() == [("0", "all_reduce")]


def test_a_failed_second_insert_keeps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    con = _db()
    real = event_store._append

    def failing(
        c: duckdb.DuckDBPyConnection,
        table: str,
        rows: pa.RecordBatchReader,
        cols: list[str] | None = None,
    ) -> None:
        if table == "events_rich":
            raise duckdb.ConversionException("bad value")
        real(c, table, rows, cols)

    monkeypatch.setattr(event_store, "_append", failing)
    with pytest.raises(duckdb.ConversionException), event_store.transaction(con):
        event_store.insert_events(con, _rows())
    assert con.execute("SELECT count(*) FROM events").fetchone() == (0,)
