"""steps.write_rank writes a rank's pieces in one stream (two at once for a large rank): pieces
whose columns differ (one has a column the other lacks, one holds names dictionary-encoded, the
other plain) still land row for row, each value where it belongs and with its step; when one of
the two streams fails, nothing of the rank is kept."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest
from ranklens.ingest import staging, steps
from ranklens.ingest.schema import ddl


def _piece(
    first: int, n: int, *, dictionary: bool, coll: bool, step_at: int | None = None
) -> pa.Table:
    """n cpu ops k<first>.. 1 us apart; `step_at`: row i is instead ProfilerStep#<7 + first>,
    from the piece's first op to 3.5 us after row i (a step window over the ops it spans)."""
    names = pa.array(
        [f"ProfilerStep#{7 + first}" if i == step_at else f"k{first + i}" for i in range(n)]
    )
    kinds = ["annotation" if i == step_at else "cpu_op" for i in range(n)]
    cols: dict[str, pa.Array] = {
        "rank": pa.array([3] * n, pa.int32()),
        "trace_id": pa.array([0] * n, pa.int32()),
        "kind": pa.array(kinds).dictionary_encode(),
        "name": names.dictionary_encode() if dictionary else names,
        "device": pa.array([-1] * n, pa.int32()),
        "ts_ns": pa.array(
            [1_000 * first if i == step_at else 1_000 * (first + i) for i in range(n)], pa.int64()
        ),
        "dur_ns": pa.array(
            [1_000 * i + 3_500 if i == step_at else 500 for i in range(n)], pa.int64()
        ),
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
    rows = con.execute("SELECT name, ts_ns, coll_op, rank FROM events ORDER BY ts_ns").fetchall()
    assert [r[0] for r in rows] == [f"k{i}" for i in range(9)]
    assert [r[1] for r in rows] == [1_000 * i for i in range(9)]
    assert [r[2] for r in rows] == [None, "all_reduce", None, "all_reduce", None] + [None] * 4
    assert {r[3] for r in rows} == {3}


def _four_pieces() -> list[staging.Piece]:
    return [
        staging.pack(_piece(0, 5, dictionary=True, coll=True, step_at=0)),
        staging.pack(_piece(5, 4, dictionary=False, coll=False)),
        staging.pack(_piece(9, 3, dictionary=True, coll=False)),
        staging.pack(_piece(12, 6, dictionary=False, coll=True, step_at=0)),
    ]


def _written(con: duckdb.DuckDBPyConnection) -> list[tuple[object, ...]]:
    return con.execute(
        "SELECT name, ts_ns, dur_ns, coll_op, step FROM events ORDER BY ts_ns, name"
    ).fetchall()


def test_a_large_rank_is_two_inserts_with_the_same_rows_order_and_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    one = duckdb.connect()
    one.execute(ddl())
    steps.write_rank(one, 3, False, _four_pieces())
    expected = _written(one)
    # ProfilerStep#7 (0 to 3.5 us) covers k1..k3, ProfilerStep#19 (12 to 15.5 us) k13..k15:
    # one step in each half, so a step misplaced by the split would show
    got = [r[4] for r in expected]
    assert got == [7, 7, 7, 7] + [None] * 8 + [19, 19, 19, 19, None, None]

    monkeypatch.setattr(steps, "PARALLEL_ROWS", 1)
    calls: list[int] = []
    real = steps.insert_events

    def counted(con: duckdb.DuckDBPyConnection, table: pa.RecordBatchReader) -> None:
        calls.append(1)
        real(con, table)

    monkeypatch.setattr(steps, "insert_events", counted)
    two = duckdb.connect()
    two.execute(ddl())
    steps.write_rank(two, 3, False, _four_pieces())
    assert len(calls) == 2  # the two-INSERT path ran
    assert _written(two) == expected


@pytest.mark.parametrize("which", [0, 1])
def test_when_one_of_two_inserts_fails_nothing_of_the_rank_is_kept(
    monkeypatch: pytest.MonkeyPatch, which: int
) -> None:
    monkeypatch.setattr(steps, "PARALLEL_ROWS", 1)
    real = steps.insert_events
    seen: list[int] = []

    def failing(con: duckdb.DuckDBPyConnection, table: pa.RecordBatchReader) -> None:
        batch = table.read_next_batch()
        seen.append(1)
        if (batch["ts_ns"][0].as_py() == 0) == (which == 0):  # the first half, or the second
            raise duckdb.IOException("disk full")
        real(con, pa.RecordBatchReader.from_batches(table.schema, [batch, *table]))

    monkeypatch.setattr(steps, "insert_events", failing)
    con = duckdb.connect()
    con.execute(ddl())
    with pytest.raises(duckdb.IOException, match="disk full"):
        steps.write_rank(con, 3, False, _four_pieces())
    assert len(seen) == 2
    assert con.execute("SELECT count(*) FROM events").fetchone() == (0,)


def test_ctrl_c_during_the_first_insert_is_what_the_caller_sees(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl+C (or SIGTERM, a KeyboardInterrupt here) in the caller's INSERT: the other INSERT
    is stopped and rolled back, and the interrupt, not an error of the other thread, is
    raised (the CLI turns it into exit 130/143)."""
    import threading

    monkeypatch.setattr(steps, "PARALLEL_ROWS", 1)
    real = steps.insert_events
    second_started = threading.Event()

    def interrupted(con: duckdb.DuckDBPyConnection, table: pa.RecordBatchReader) -> None:
        batch = table.read_next_batch()
        if batch["ts_ns"][0].as_py() == 0:  # the caller's half
            assert second_started.wait(10)
            raise KeyboardInterrupt
        second_started.set()
        real(con, pa.RecordBatchReader.from_batches(table.schema, [batch, *table]))
        raise duckdb.InterruptException("Query interrupted")  # as DuckDB reports it

    monkeypatch.setattr(steps, "insert_events", interrupted)
    con = duckdb.connect()
    con.execute(ddl())
    with pytest.raises(KeyboardInterrupt):
        steps.write_rank(con, 3, False, _four_pieces())
    assert con.execute("SELECT count(*) FROM events").fetchone() == (0,)
    assert [t.name for t in threading.enumerate() if t.name == "ranklens-insert"] == []
