"""The dashboard benchmarks' replicated run (benchmarks/bench_dashboard.py `build`) is the run it
says: every table copied COPIES x REPEAT times, with the storage the ingest gives.

Why: CI runs no benchmark, and `build` writes tables directly; when `events` became a view over
two tables (ingest/event_store.py) its `INSERT INTO events` failed, and the dashboard figures
of issue 15 could not be measured until a later session tried. This builds the smallest such
run and checks it against the source run it copies (counts and values from DuckDB, none typed).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import duckdb
import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(BENCH))
    try:
        import bench_dashboard
    finally:
        sys.path.remove(str(BENCH))
    return bench_dashboard


def _count(con: duckdb.DuckDBPyConnection, sql: str) -> int:
    return int(con.execute(sql).fetchall()[0][0])


def test_replicated_run_copies_every_event_into_its_own_table(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ranklens.ingest import load_traces

    monkeypatch.setattr(bench, "WORK", tmp_path)
    repeat = 2
    built = bench.build(repeat)
    src = tmp_path / "src.duckdb"
    load_traces([str(bench.SAMPLE)], src, workers=1)
    copies = bench.COPIES * repeat
    con = duckdb.connect(str(built), read_only=True)
    try:
        con.execute(f"ATTACH '{src}' AS s (READ_ONLY)")
        n_ranks = _count(con, "SELECT count(*) FROM s.ranks")
        assert _count(con, "SELECT count(*) FROM ranks") == n_ranks * bench.COPIES
        for table in ("events_rich", "events_plain", "events", "steps", "collectives"):
            n = _count(con, f"SELECT count(*) FROM s.{table}")
            assert n > 0 and _count(con, f"SELECT count(*) FROM {table}") == n * copies, table
        # each copy of a rank holds that rank's events, comm rows with their renamed group
        per_rank = con.execute(
            f"SELECT rank % {n_ranks}, count(*) // {copies}, count(*) % {copies} FROM events "
            "GROUP BY ALL ORDER BY 1"
        ).fetchall()
        source = con.execute(
            "SELECT rank, count(*), 0 FROM s.events GROUP BY ALL ORDER BY 1"
        ).fetchall()
        assert per_rank == source
        assert _count(
            con, "SELECT count(*) FROM events WHERE kind = 'comm' AND pg_name IS NULL"
        ) == (
            _count(con, "SELECT count(*) FROM s.events WHERE kind = 'comm' AND pg_name IS NULL")
            * copies
        )
        unknown = _count(
            con,
            "SELECT count(*) FROM events e ANTI JOIN process_groups g USING (pg_name) "
            "WHERE e.pg_name IS NOT NULL",
        )
        assert unknown == 0  # every copied group name is a group of the copied run
    finally:
        con.close()
