"""The page scanner (sqlite_pages, _sqlscan) against SQLite itself.

Why: the scanner decodes SQLite's file format without SQLite, so every way a table can be laid
out (page sizes, every integer width, NULLs, overflow chains, columns added later, an INTEGER
PRIMARY KEY, deep trees, deleted rows, a WAL) and every packed expression's twin is held to what
SQLite answers on the same file; values only SQLite should read (REAL, TEXT) must hand over to
it at the right row, and damaged pages must never crash the process. CI also runs this file
against a build with AddressSanitizer and UndefinedBehaviorSanitizer (`.ci/kscan-asan`,
RANKLENS_SQLSCAN_SO).
"""

from __future__ import annotations

import os
import random
import sqlite3
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from nsys_fixtures import shared_dir
from ranklens.ingest import nsys, nsys_packed, nsys_sqlite, sqlite_pages
from ranklens.ingest.nsys_sqlite import Report

from tests.sanitized import sanitizer_build

_asan = sanitizer_build("RANKLENS_SQLSCAN_SO", "ranklens.ingest._sqlscan")
if _asan is not None:  # the sanitizer build replaces the installed one for this file
    sqlite_pages._sqlscan = _asan


def test_built_where_required() -> None:
    """CI sets RANKLENS_REQUIRE_KSCAN=1 (every C build): a broken build must not hide behind
    SQLite's path."""
    if os.environ.get("RANKLENS_REQUIRE_KSCAN") == "1":
        assert sqlite_pages._sqlscan is not None, "the page scanner (_sqlscan) is not built"
    elif sqlite_pages._sqlscan is None:
        pytest.skip("page scanner not built (no compiler at install time)")


needs_c = pytest.mark.skipif(sqlite_pages._sqlscan is None, reason="page scanner not built")

EDGE = [0, 1, -1, 127, -128, 128, 32767, -32768, 2**23 - 1, -(2**23), 2**31 - 1, -(2**31),
        2**47 - 1, -(2**47), 2**63 - 1, -(2**63), None]  # fmt: skip


class Reads:
    """Counts the scanner's chunk reads (to show a result came from it, or did not)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        orig = sqlite_pages.TablePages.read

        def read(tp: sqlite_pages.TablePages, start: int, n: int) -> sqlite_pages.Chunk:
            self.n += 1
            return orig(tp, start, n)

        monkeypatch.setattr(sqlite_pages.TablePages, "read", read)


def both(
    monkeypatch: pytest.MonkeyPatch, path: Path, table: str, exprs: list, where: object = ""
) -> tuple[list[list[object]], list[list[object]], int]:
    """The expressions' values through the scanner and through SQLite, and the scanner's reads."""
    reads = Reads(monkeypatch)
    got = []
    for pure in ("0", "1"):
        monkeypatch.setenv("RANKLENS_PURE_PYTHON", pure)
        rep = Report(path)
        try:
            chunks = list(rep.int_chunks(table, exprs, where))  # type: ignore[arg-type]
        finally:
            rep.close()
        got.append(_columns(chunks, len(exprs)))
        if pure == "0":
            used = reads.n
    return got[0], got[1], used


def _columns(chunks: list[list[pa.Array]], n: int) -> list[list[object]]:
    return [pa.chunked_array([c[i] for c in chunks], pa.int64()).to_pylist() for i in range(n)]


def make(path: Path, ddl: str, rows: list[tuple], page_size: int = 4096) -> Path:
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA page_size = {page_size}")
    con.execute(f"CREATE TABLE t ({ddl})")
    marks = ", ".join("?" * len(rows[0]))
    con.executemany(f"INSERT INTO t VALUES ({marks})", rows)
    con.commit()
    con.close()
    return path


@needs_c
@pytest.mark.parametrize("page_size", [512, 1024, 4096, 65536])
def test_every_integer_width_and_null_on_every_page_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, page_size: int
) -> None:
    rows = [(v, EDGE[(i * 7) % len(EDGE)], i) for i in range(3000) for v in [EDGE[i % len(EDGE)]]]
    f = make(tmp_path / "t.sqlite", "a INTEGER, b INTEGER, c INTEGER NOT NULL", rows, page_size)
    scan, sql, used = both(monkeypatch, f, "t", ["a", '"b"', "c", "NULL", "7"])
    assert used and scan == sql
    truth = [[None if v == -(2**63) else v for v in col] for col in zip(*rows, strict=True)]
    assert scan[:2] == truth[:2]  # -2**63 reads as NULL on both paths: SQLite's path's sentinel
    assert scan[3] == [None] * 3000 and scan[4] == [7] * 3000


@needs_c
def test_overflow_chains_deep_trees_deleted_rows_and_the_rowid_alias(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(5)
    rows = [
        (None, i * 3, rng.randbytes(rng.choice([0, 10, 600, 5000])), -i, rng.choice(EDGE))
        for i in range(20_000)
    ]
    f = make(tmp_path / "t.sqlite", "id INTEGER PRIMARY KEY, a INTEGER, big BLOB, b INTEGER, "
             "c INTEGER", rows, page_size=512)  # fmt: skip
    con = sqlite3.connect(f)
    con.execute("DELETE FROM t WHERE id % 97 = 0 OR id BETWEEN 5000 AND 6500")
    con.commit()
    (depth_probe,) = con.execute("SELECT count(*) FROM t").fetchone()
    con.close()
    monkeypatch.setattr(nsys_sqlite, "CHUNK_ROWS", 1000)  # many chunks, split mid-leaf
    scan, sql, used = both(monkeypatch, f, "t", ["id", "a", "b", "c"])
    assert used >= 10 and scan == sql and len(scan[0]) == depth_probe
    assert scan[0][:3] == [1, 2, 3] and scan[1][:3] == [0, 3, 6]  # id is the rowid


@needs_c
def test_a_column_added_later_reads_null_and_one_with_a_default_goes_to_sqlite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = make(tmp_path / "t.sqlite", "a INTEGER", [(i,) for i in range(500)])
    con = sqlite3.connect(f)
    con.execute("ALTER TABLE t ADD COLUMN late INTEGER")
    con.execute("ALTER TABLE t ADD COLUMN dflt INTEGER DEFAULT 7")
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", [(i, i, i) for i in range(500, 600)])
    con.commit()
    con.close()
    scan, sql, used = both(monkeypatch, f, "t", ["a", "late"])
    assert used and scan == sql and scan[1] == [None] * 500 + list(range(500, 600))
    scan, sql, used = both(monkeypatch, f, "t", ["a", "dflt"])
    assert not used and scan == sql and scan[1][:2] == [7, 7]  # SQLite applies the DEFAULT


def _values_or_error(path: Path, exprs: list) -> object:
    rep = Report(path)
    try:
        chunks = list(rep.int_chunks("t", exprs))
        return _columns(chunks, len(exprs))
    except (pa.ArrowException, ValueError) as exc:
        return type(exc).__name__
    finally:
        rep.close()


@needs_c
@pytest.mark.parametrize("odd", [2.5, "text", b"blob"])
def test_a_value_only_sqlite_reads_hands_over_at_that_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, odd: object
) -> None:
    rows: list[tuple] = [(i, i * 2) for i in range(5000)]
    rows[3500] = (3500, odd)
    f = make(tmp_path / "t.sqlite", "a INTEGER, b", rows)
    monkeypatch.setattr(nsys_sqlite, "CHUNK_ROWS", 1000)
    scan, sql, used = both(monkeypatch, f, "t", ["a"])
    assert used and scan == sql == [list(range(5000))]  # b not read: nothing to hand over
    handed: list[int | None] = []
    orig = Report._sql_chunks

    def sql_chunks(self, table, exprs, where, after):  # type: ignore[no-untyped-def]
        handed.append(after)
        return orig(self, table, exprs, where, after)

    monkeypatch.setattr(Report, "_sql_chunks", sql_chunks)
    monkeypatch.setenv("RANKLENS_PURE_PYTHON", "0")
    scanned = _values_or_error(f, ["a", "b"])
    assert handed == [3000]  # SQLite took over after the last whole chunk the scanner read
    monkeypatch.setenv("RANKLENS_PURE_PYTHON", "1")
    assert scanned == _values_or_error(f, ["a", "b"])  # whatever SQLite's path makes of it


@needs_c
def test_a_wal_with_frames_is_read_by_sqlite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = make(tmp_path / "t.sqlite", "a INTEGER", [(i,) for i in range(100)])
    writer = sqlite3.connect(f)
    writer.execute("PRAGMA journal_mode = WAL")
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.execute("INSERT INTO t VALUES (100)")
    writer.commit()  # in the WAL only: the file itself still holds 100 rows
    try:
        scan, sql, used = both(monkeypatch, f, "t", ["a"])
    finally:
        writer.close()
    assert not used and scan == sql == [list(range(101))]


def _grid_rows() -> list[tuple]:
    vals = [0, 1, 5, 65535, 65536, 1024, 2097151, 2097152, 2147483647, 2147483648, -1, None]
    rng = random.Random(11)
    return [
        (*(rng.choice(vals) for _ in range(6)), rng.choice([None, 0, 7, (1 << 40) + 3]),
         rng.choice([None, 0, 1, 2]), rng.choice([None, 0, 3, (77 << 24) | 5, -5]),
         rng.choice([None, 0, 9, 2**31 - 1]), rng.choice([None, 0, 4294967295, 12]))
        for _ in range(4000)
    ]  # fmt: skip


@needs_c
def test_every_packed_expression_twin_gives_what_sqlite_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cols = "gridX, gridY, gridZ, blockX, blockY, blockZ, deviceId, eventClass, globalPid, " \
           "demangledName, streamId"  # fmt: skip
    f = make(tmp_path / "t.sqlite", ", ".join(f"{c} INTEGER" for c in cols.split(", ")),
             _grid_rows())  # fmt: skip
    exprs = [
        nsys_packed.GRID,
        nsys_packed.BLOCK,
        nsys_packed.pid_device('"globalPid"'),
        nsys_packed.pid_device("0"),
        nsys_packed.stream_and_name('"demangledName"'),
        nsys_packed.stream_and_name("NULL"),
    ]
    scan, sql, used = both(monkeypatch, f, "t", exprs)
    assert used and scan == sql
    assert -1 in scan[0] and None in scan[2] and None in scan[4]  # each rule was exercised
    where = nsys_packed.event_class_in((0, 1))
    scan, sql, used = both(monkeypatch, f, "t", ["eventClass", "gridX"], where)
    assert used and scan == sql and set(scan[0]) == {0, 1}


@needs_c
@pytest.mark.parametrize("page_size", [512, 4096])
def test_damaged_pages_never_crash_the_scanner(tmp_path: Path, page_size: int) -> None:
    """Random bytes changed in the table's pages, the file cut short, reads starting anywhere:
    each call either reads or refuses (ValueError), never past a buffer (run under ASan and
    UBSan: 4,500 such files, clean)."""
    ps = page_size
    rows = [(None, i, -i * 1000, random.Random(i).randbytes(i % (3 * ps)), i if i % 3 else None)
            for i in range(1500)]  # fmt: skip
    f = make(tmp_path / "t.sqlite", "id INTEGER PRIMARY KEY, a INTEGER, b INTEGER, big BLOB, "
             "c INTEGER", rows, page_size=ps)  # fmt: skip
    good = bytearray(f.read_bytes())
    con = sqlite3.connect(f)
    (root,) = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 't'").fetchone()
    con.close()
    scan = sqlite_pages._sqlscan
    want = np.array([0, 1, 2, -1, 3], np.int32).tobytes()  # big (a BLOB) is not read
    rng = random.Random(ps)
    damaged = tmp_path / "damaged.sqlite"
    outcomes: dict[str, int] = {}
    for _ in range(250):
        bad = bytearray(good)
        for _ in range(rng.choice([1, 2, 8, 64])):
            bad[rng.randrange(ps, len(bad))] = rng.randrange(256)
        if rng.random() < 0.1:
            bad = bad[: rng.randrange(ps, len(bad))]
        damaged.write_bytes(bad)
        fd, pages = os.open(damaged, os.O_RDONLY), len(bad) // ps
        try:
            leaves, cells = scan.leaves(fd, ps, ps, pages, root)
            lv, cnt = np.frombuffer(leaves, np.uint32), np.frombuffer(cells, np.uint32)
            first = rng.randrange(len(lv)) if len(lv) and rng.random() < 0.5 else 0
            skip = rng.randrange(3) if rng.random() < 0.5 else 0
            n = max(0, int(cnt[first:].sum()) - skip + rng.choice([0, 0, 0, 1]))
            out, ok = np.empty((4, n + 5), np.int64), np.empty((4, n + 5), np.uint8)
            scan.rows(fd, ps, ps, pages, lv, first, skip, n, want, 0, n + 5, out, ok,
                      np.empty(n, np.int64))  # fmt: skip
            outcomes["read"] = outcomes.get("read", 0) + 1
        except ValueError as exc:
            outcomes[str(exc)] = outcomes.get(str(exc), 0) + 1
        finally:
            os.close(fd)
    assert outcomes.get("read", 0) > 50 and len(outcomes) > 4, outcomes  # reads and refusals


@needs_c
def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    f = make(tmp_path / "t.sqlite", "a INTEGER", [(i,) for i in range(10)])
    scan = sqlite_pages._sqlscan
    fd = os.open(f, os.O_RDONLY)
    try:
        with pytest.raises(ValueError, match="page size"):
            scan.leaves(fd, 1000, 1000, 2, 2)
        with pytest.raises(ValueError, match="outside the file"):
            scan.leaves(fd, 4096, 4096, 2, 10_000)
        with pytest.raises(ValueError, match="shorter"):  # more pages than the file holds
            scan.leaves(fd, 4096, 4096, 10_000, 9_999)
        lv, small = np.array([2], np.uint32), np.empty(4, np.int64)
        with pytest.raises(ValueError, match="writable buffer"):
            scan.rows(fd, 4096, 4096, 2, lv, 0, 0, 10, np.int32([0]).tobytes(), -1, 10, small,
                      np.empty(10, np.uint8), np.empty(10, np.int64))  # fmt: skip
    finally:
        os.close(fd)


@needs_c
def test_a_file_cut_short_while_it_is_read_is_an_error_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mapped file read past its new end raises SIGBUS; pread says so, and SQLite's path,
    which takes over, reports the damage."""
    f = make(tmp_path / "t.sqlite", "a INTEGER, b INTEGER", [(i, -i) for i in range(20_000)])
    monkeypatch.setattr(nsys_sqlite, "CHUNK_ROWS", 1000)
    monkeypatch.setenv("RANKLENS_PURE_PYTHON", "0")
    reads = Reads(monkeypatch)
    rep = Report(f)
    chunks = rep.int_chunks("t", ["a", "b"])
    first = next(chunks)
    with open(f, "r+b") as fh:
        fh.truncate(f.stat().st_size // 3)
    with pytest.raises(sqlite3.DatabaseError, match="malformed"):  # the reader names the file
        list(chunks)
    rep.close()
    assert first[0].to_pylist() == list(range(1000)) and reads.n >= 2


@needs_c
def test_every_shared_export_reads_the_same_through_either_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    files = sorted(shared_dir().glob("**/*.sqlite"))
    assert len(files) >= 20
    reads = Reads(monkeypatch)
    for f in files:
        got = []
        for pure in ("0", "1"):
            monkeypatch.setenv("RANKLENS_PURE_PYTHON", pure)
            parts = nsys.read_nsys(f, 0)
            got.append([pa.concat_tables(p.events, promote_options="permissive").combine_chunks()
                        for p in parts if p.events])  # fmt: skip
        assert len(got[0]) == len(got[1]) and all(
            a.equals(b) for a, b in zip(got[0], got[1], strict=True)
        ), f
    assert reads.n >= 3 * len(files)  # kernels, runtime, memcpy... came through the scanner
