"""infer_communicators: process groups recovered from the collectives each rank ran."""

from __future__ import annotations

import sys
from pathlib import Path

import duckdb
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nsys_fixtures import shared_dir
from ranklens.ingest import load_traces
from ranklens.ingest.communicators import infer_communicators
from ranklens.ingest.schema import ddl

MB = 1 << 20


def _db() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(ddl())
    for r in range(4):
        con.execute("INSERT INTO ranks (rank, backend) VALUES (?, 'nccl')", [r])
    return con


def _comm(
    con: duckdb.DuckDBPyConnection,
    rank: int,
    ts: int,
    op: str,
    nbytes: int | None,
    stream: int = 20,
    pg: str | None = None,
) -> None:
    con.execute(
        "INSERT INTO events_rich (rank, kind, cat, name, device, stream, ts_ns, dur_ns, "
        "coll_op, bytes, pg_name) VALUES (?, 'comm', 'kernel', ?, ?, ?, ?, 10, ?, ?, ?)",
        [rank, f"nccl_{op}", rank, stream, ts, op, nbytes, pg],
    )


def _tp_plus_world(con: duckdb.DuckDBPyConnection, world_stream: int) -> None:
    """Two TP pairs all-reducing different sizes, then all four all-gathering."""
    for step in range(3):
        t = step * 1000
        for r in range(4):
            size = 1 * MB if r < 2 else 2 * MB
            _comm(con, r, t + 10, "all_reduce", size)
            _comm(con, r, t + 20, "all_reduce", size)
            _comm(con, r, t + 500, "all_gather", 4 * MB, stream=world_stream)


def _groups(con: duckdb.DuckDBPyConnection) -> list[tuple[object, ...]]:
    return con.execute(
        "SELECT pg_name, ranks, size, backend, parallelism, source "
        "FROM process_groups ORDER BY pg_name"
    ).fetchall()


@pytest.mark.parametrize("world_stream", [24, 20])  # own stream, or shared with the TP ops
def test_tp_pairs_and_world_group(world_stream: int) -> None:
    con = _db()
    _tp_plus_world(con, world_stream)
    assert infer_communicators(con) == 3
    assert _groups(con) == [
        ("inferred:0", [0, 1], 2, "nccl", None, "inferred_sequence"),
        ("inferred:1", [2, 3], 2, "nccl", None, "inferred_sequence"),
        ("inferred:2", [0, 1, 2, 3], 4, "nccl", None, "inferred_sequence"),
    ]
    got = con.execute(
        "SELECT rank, coll_op, bytes, pg_name, group_size, count(*) FROM events "
        "GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    assert got == [
        (0, "all_gather", 4 * MB, "inferred:2", 4, 3),
        (0, "all_reduce", MB, "inferred:0", 2, 6),
        (1, "all_gather", 4 * MB, "inferred:2", 4, 3),
        (1, "all_reduce", MB, "inferred:0", 2, 6),
        (2, "all_gather", 4 * MB, "inferred:2", 4, 3),
        (2, "all_reduce", 2 * MB, "inferred:1", 2, 6),
        (3, "all_gather", 4 * MB, "inferred:2", 4, 3),
        (3, "all_reduce", 2 * MB, "inferred:1", 2, 6),
    ]
    ev = con.execute("SELECT evidence FROM process_groups WHERE pg_name = 'inferred:0'").fetchone()
    assert ev is not None and "ranks 0, 1" in ev[0] and "all_reduce(1048576 B) x6" in ev[0]
    assert "same order on every member" in ev[0]
    assert infer_communicators(con) == 0  # nothing left unlabelled


def test_labelled_events_and_existing_names_are_kept() -> None:
    con = _db()
    con.execute("INSERT INTO process_groups (pg_name, size) VALUES ('inferred:0', 2)")
    for r in (0, 1):
        _comm(con, r, 5, "all_reduce", MB, pg="7")  # already known from the trace
        _comm(con, r, 9, "send_recv", None)  # Nsight without payload: size unknown
    _comm(con, 0, 30, "send_recv", None)  # rank 1's last one fell outside its trace window
    assert infer_communicators(con) == 1
    rows = con.execute(
        "SELECT pg_name, ranks, evidence FROM process_groups WHERE source = 'inferred_sequence'"
    ).fetchall()
    assert [(r[0], r[1]) for r in rows] == [("inferred:1", [0, 1])]
    assert "send_recv x1-2" in rows[0][2] and "order differs on ranks 1" in rows[0][2]
    assert con.execute("SELECT count(*) FROM events WHERE pg_name = '7'").fetchone() == (2,)
    assert con.execute("SELECT count(*) FROM events WHERE pg_name IS NULL").fetchone() == (0,)


def test_reported_group_size_disagreement_is_flagged() -> None:
    con = _db()
    for r in range(4):  # two same-shaped TP pairs: indistinguishable by their collectives
        _comm(con, r, 10, "all_reduce", MB)
    con.execute("UPDATE events_rich SET group_size = 2")  # comm rows live there
    assert infer_communicators(con) == 1
    (ev,) = con.execute("SELECT evidence FROM process_groups").fetchone() or ("",)
    assert "group size [2]" in ev
    assert con.execute("SELECT DISTINCT group_size FROM events").fetchall() == [(2,)]


def test_real_nsys_ranks(tmp_path: Path) -> None:
    files = sorted(
        shared_dir("distributedsyslab-fs24-nccl", "tree_2xallreduce_3nodes_9ranks").glob("*.sqlite")
    )
    two = shared_dir("nsys-ai", "mfu_2gpu_before.sqlite")
    for name, paths, want in (
        ("dsl", files, [(list(range(9)), "all_reduce", 18)]),
        ("ai", [two], [([0, 1], "send_recv", 66)]),
    ):
        out = tmp_path / f"{name}.duckdb"
        load_traces([str(p) for p in paths], out, workers=1)
        con = duckdb.connect(str(out))
        try:
            # load_traces already inferred them for this Nsight-only run; a second pass finds
            # nothing left to label.
            assert infer_communicators(con) == 0
            got = con.execute(
                "SELECT g.ranks, any_value(e.coll_op), count(*) FROM process_groups g "
                "JOIN events e USING (pg_name) GROUP BY g.ranks"
            ).fetchall()
            assert got == [(r, op, n) for r, op, n in want]
        finally:
            con.close()
