"""Small ranks are written together (steps.write_ranks, Sink.flush) with the rows of their
sources, ranks and threads (held_rows.HeldRows), and the run is the one a write per rank gives.

Why: a 1,024-rank job's ranks hold ~2 k events each, and their INSERTs and commits, not their
rows, were most of its ingest. What must not change: every table's rows, each event's step, the
order of a rank's rows, what a bad file leaves (nothing), and who is blamed when a write fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from ranklens.ingest import load_traces, sink, staging, steps
from ranklens.ingest.held_rows import HeldRows
from ranklens.ingest.schema import ddl
from test_write_rank import _piece

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
TABLES = ("events", "steps", "sources", "ranks", "threads", "collectives", "process_groups")


def _ranked(t: pa.Table, rank: int) -> pa.Table:
    return t.set_column(t.column_names.index("rank"), "rank", pa.array([rank] * len(t), pa.int32()))


def _ranks() -> list[tuple[int, bool, list[staging.Piece]]]:
    """Three ranks whose pieces differ in shape: names dictionary-encoded or plain, with and
    without collective arguments, each with a step window of its own."""
    return [
        (0, False, [staging.pack(_ranked(_piece(0, 5, dictionary=True, coll=True, step_at=0), 0))]),
        (
            1,
            False,
            [
                staging.pack(_ranked(_piece(5, 4, dictionary=False, coll=False, step_at=1), 1)),
                staging.pack(_ranked(_piece(9, 3, dictionary=True, coll=False), 1)),
            ],
        ),
        (
            2,
            False,
            [staging.pack(_ranked(_piece(12, 6, dictionary=False, coll=True, step_at=0), 2))],
        ),
    ]


def _dump(con: duckdb.DuckDBPyConnection, table: str) -> list[tuple[Any, ...]]:
    return con.execute(f"SELECT * FROM {table} ORDER BY ALL").fetchall()


def test_ranks_written_together_are_the_ranks_written_one_by_one() -> None:
    alone = duckdb.connect()
    alone.execute(ddl())
    for rank, gpu, pieces in _ranks():
        steps.write_rank(alone, rank, gpu, pieces)
    together = duckdb.connect()
    together.execute(ddl())
    steps.write_ranks(together, _ranks())
    for table in ("events", "steps"):
        assert _dump(together, table) == _dump(alone, table), table
    # each rank's rows in its own time order, ranks in the order given: as one write per rank
    order = "SELECT rank, ts_ns FROM events_plain"
    assert together.execute(order).fetchall() == alone.execute(order).fetchall()
    # the windows each rank's own events made (one per rank), and its events carry that step
    assert together.execute("SELECT rank, step FROM steps ORDER BY rank").fetchall() == [
        (0, 7),
        (1, 12),
        (2, 19),
    ]
    assert together.execute(
        "SELECT count(*) FROM events WHERE step IS NOT NULL AND step NOT IN (7, 12, 19)"
    ).fetchone() == (0,)


def test_ranks_whose_columns_arrow_cannot_unify_are_still_written() -> None:
    """Two readers typing one column apart (here `name` as text and as integers, which DuckDB
    casts but Arrow will not unify) fall back to one INSERT per rank, in one transaction."""
    a = _ranked(_piece(0, 3, dictionary=False, coll=False), 0)
    b = _ranked(_piece(3, 3, dictionary=False, coll=False), 1)
    b = b.set_column(b.column_names.index("name"), "name", pa.array([30, 31, 32], pa.int64()))
    con = duckdb.connect()
    con.execute(ddl())
    steps.write_ranks(con, [(0, False, [staging.pack(a)]), (1, False, [staging.pack(b)])])
    got = con.execute("SELECT rank, name FROM events ORDER BY ts_ns").fetchall()
    assert got == [(0, "k0"), (0, "k1"), (0, "k2"), (1, "30"), (1, "31"), (1, "32")]


def test_a_held_value_its_column_cannot_hold_fails_when_added() -> None:
    rows = HeldRows()
    with pytest.raises(pa.ArrowInvalid):
        rows.add("ranks", [(0, 2**40, 0, "h", 1, "nccl", "H100", 132, True, 0, "none", None)])
    # what DuckDB's INSERT cast, Arrow is given cast: text for text, whole numbers for integers
    rows.add("ranks", [(0, 8.0, 0, 17, "42", "nccl", None, None, True, 0, "none", None)])
    rows.add("ranks", [(1, 8, 5, "h", 43, "nccl", None, None, False, 0, "none", None)])
    rows.drop("ranks", "trace_id", [5])
    con = duckdb.connect()
    con.execute(ddl())
    rows.write(con)
    assert con.execute("SELECT rank, world_size, host, pid FROM ranks").fetchall() == [
        (0, 8, "17", 42)
    ]
    rows.write(con)  # written once
    assert con.execute("SELECT count(*) FROM ranks").fetchone() == (1,)


@pytest.fixture(scope="module")
def one_by_one(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 8-rank Megatron sample with every rank written on its own (no rank counts as small)."""
    mp = pytest.MonkeyPatch()
    mp.setattr(sink, "SMALL_RANK_ROWS", 0)
    try:
        db = tmp_path_factory.mktemp("alone") / "run.duckdb"
        load_traces([str(SAMPLES / "megatron_tp2_pp2_dp2")], db, workers=1)
    finally:
        mp.undo()
    return db


@pytest.mark.parametrize("batch_rows", [sink.BATCH_ROWS, 1_000])
def test_an_ingest_of_small_ranks_holds_the_same_tables(
    one_by_one: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch_rows: int
) -> None:
    """All eight ranks in one write, and in several (a flush every ~1,000 events)."""
    monkeypatch.setattr(sink, "BATCH_ROWS", batch_rows)
    flushes: list[int] = []
    real = steps.write_ranks
    monkeypatch.setattr(
        sink, "write_ranks", lambda con, ranks: (flushes.append(len(ranks)), real(con, ranks))
    )
    db = tmp_path / "run.duckdb"
    load_traces([str(SAMPLES / "megatron_tp2_pp2_dp2")], db, workers=1)
    assert sum(flushes) == 8 and (len([n for n in flushes if n]) > 1) == (batch_rows == 1_000)
    a, b = duckdb.connect(str(one_by_one), read_only=True), duckdb.connect(str(db), read_only=True)
    try:
        for table in TABLES:
            assert _dump(b, table) == _dump(a, table), table
        order = "SELECT rank, ts_ns, name FROM events_plain"
        assert b.execute(order).fetchall() == a.execute(order).fetchall()
    finally:
        a.close()
        b.close()


def test_a_failed_write_of_held_ranks_stops_the_ingest_and_blames_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The held ranks are written while a later file is read; their failure is not that file's
    (which --skip-bad would skip, losing the others' rows while their sources say ok)."""
    monkeypatch.setattr(sink, "BATCH_ROWS", 1_000)  # flushes while files are still read

    def broken(con: duckdb.DuckDBPyConnection, ranks: object) -> None:
        raise ValueError("a bug in the write")

    monkeypatch.setattr(sink, "write_ranks", broken)
    db = tmp_path / "run.duckdb"
    with pytest.raises(sink.WriteFailed, match=r"writing the events of ranks \[") as err:
        load_traces([str(SAMPLES / "megatron_tp2_pp2_dp2")], db, workers=1, on_error="skip")
    assert "a bug in the write" in err.value.message and err.value.hint
    assert not db.exists()  # an ingest that stopped leaves no database


def test_small_batches_are_joined_unless_arrow_cannot() -> None:
    names = pa.array(["a", "b", None]).dictionary_encode()
    batches = [
        pa.record_batch({"x": pa.array([i, i + 1, i + 2], pa.int64()), "name": names})
        for i in range(0, 30, 3)
    ]
    joined = list(steps._coalesced(iter(batches), rows=7))
    assert [b.num_rows for b in joined] == [9, 9, 9, 3]  # >= 7 rows each, the last what is left
    assert pa.Table.from_batches(joined).equals(pa.Table.from_batches(batches))
    # a dictionary holding a null (Nsight's kernel labels can): passed on as they came
    odd = [
        pa.record_batch(
            {"name": pa.DictionaryArray.from_arrays(pa.array([0, 1], pa.int32()), pa.array(d))}
        )
        for d in (["a", None], ["b", None], ["c", None])
    ]
    assert list(steps._coalesced(iter(odd), rows=4)) == odd
