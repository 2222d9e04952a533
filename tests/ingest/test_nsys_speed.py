"""Ingest speed of the Nsight reader on a generated kernel table (a regression floor).

The target is >= 1 M kernel rows/s on the 2-core dev machine, reached with the optional ADBC
SQLite driver; the standard-library path is ~4x slower. The floor asserted here is far below
both (CPU time of all our threads, so neighbours on a shared machine barely move it); it
catches a slide back to per-row Python. Print the real numbers with `-s`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nsys_fixtures import make_kernel_db
from ranklens.ingest import nsys_sqlite
from ranklens.ingest.nsys import read_nsys

N = 300_000


@pytest.mark.slow
def test_kernel_rows_per_second(tmp_path: Path) -> None:
    path = make_kernel_db(tmp_path / "big.sqlite", N)
    read_nsys(path, 0)  # warm the page cache and imports
    cpu, wall = time.process_time(), time.perf_counter()
    (part,) = read_nsys(path, 0)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert part.n_events == N
    backend = "adbc" if nsys_sqlite._adbc is not None else "stdlib"
    print(f"\n{backend}: {N / wall / 1e6:.2f} M rows/s wall, {N / cpu / 1e6:.2f} M rows/cpu-s")
    assert N / cpu >= 120_000
    rows = sum(t.num_rows for t in part.events)
    assert rows == N and max(t.num_rows for t in part.events) <= nsys_sqlite.CHUNK_ROWS
