"""The Nsight reader on a generated kernel table, and the layout choices that keep the write
cheap. Speed itself is measured by benchmarks/bench_nsys.py, not asserted here; `-s` prints this
run's rate for a glance.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nsys_fixtures import make_kernel_db
from ranklens.ingest import nsys_sqlite, sqlite_pages
from ranklens.ingest.nsys import read_nsys
from ranklens.ingest.nsys_tables import TEXT, constant

N = 300_000


@pytest.mark.slow
def test_kernel_table_reads_in_bounded_chunks(tmp_path: Path) -> None:
    path = make_kernel_db(tmp_path / "big.sqlite", N)
    read_nsys(path, 0)  # warm the page cache and imports
    cpu, wall = time.process_time(), time.perf_counter()
    (part,) = read_nsys(path, 0)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert part.n_events == N
    backend = "adbc" if nsys_sqlite._adbc is not None else "stdlib"
    backend = "pages" if sqlite_pages.available() else backend
    print(f"\n{backend}: {N / wall / 1e6:.2f} M rows/s wall, {N / cpu / 1e6:.2f} M rows/cpu-s")
    rows = sum(t.num_rows for t in part.events)
    assert rows == N and max(t.num_rows for t in part.events) <= nsys_sqlite.CHUNK_ROWS


def test_chunks_are_whole_duckdb_row_groups(tmp_path: Path) -> None:
    """Reader chunks become whole row groups of the events table, so each is compressed and
    written once: with a partial group per chunk, the next checkpoint (after any UPDATE of
    events) rewrote the whole table, as much CPU again as the insert."""
    con = duckdb.connect(str(tmp_path / "rg.duckdb"))
    con.execute("CREATE TABLE t AS SELECT range AS i FROM range(300000)")
    sizes = con.execute(
        """SELECT sum(count) FROM pragma_storage_info('t')
           WHERE column_id = 0 AND segment_type <> 'VALIDITY' GROUP BY row_group_id"""
    ).fetchall()
    group = max(int(n) for (n,) in sizes)
    assert nsys_sqlite.CHUNK_ROWS % group == 0


def test_constant_columns_share_one_buffer() -> None:
    """NULL and constant columns are slices of one array per (value, type), not copies."""
    a, b = constant(None, pa.int64(), 1000), constant(None, pa.int64(), 10)
    assert a.null_count == 1000 and len(b) == 10 and b.null_count == 10
    assert a.buffers()[1].address == b.buffers()[1].address
    text = constant("kernel", TEXT, 5)
    assert text.type == TEXT and text.to_pylist() == ["kernel"] * 5
    assert constant(-1, pa.int32(), 3).to_pylist() == [-1, -1, -1]
    assert constant(-1, pa.int32(), 7).to_pylist() == [-1] * 7  # grows past the first length
