"""Integer columns of a SQLite table read from the file's pages (the `_sqlscan` accelerator).

Why: reading an Nsight export's kernels through SQLite costs about 1 us a row for the values a
kernel needs (its virtual machine, then the crossing into Arrow), the largest part of an Nsight
ingest; the table's b-tree leaves are plain records the C scanner decodes many times faster,
without the GIL. It reads the file with pread (no mapping: a file cut short while it is read is
an error SQLite then reports, not a SIGBUS; and the file does not count as the process's
memory). Only a file SQLite itself would read the same way is read so: no WAL with
frames in it, no hot journal, a rowid table. Anything else, and any value that is not an
integer, is left to SQLite (the caller's reader): `RANKLENS_PURE_PYTHON=1` turns this off, and
tests compare both paths on every export.
"""

from __future__ import annotations

import importlib
import os
import re
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from ranklens.ingest.threads import ordered_parallel

_sqlscan: Any
try:
    _sqlscan = importlib.import_module("ranklens.ingest._sqlscan")
except ImportError:  # built without a C compiler: SQLite reads every table
    _sqlscan = None

_MAGIC = b"SQLite format 3\x00"
_WORKERS = 2  # decoding needs no I/O wait: a thread a core
NULL_INT = -(2**63)  # SQLite's path reads NULL through this sentinel (nsys_sqlite)
_PAD = 72  # a column's buffer is n + _PAD long: the columns' starts fall in different cache sets
Ints = npt.NDArray[np.int64]
Col = tuple[Ints, npt.NDArray[np.bool_]]  # values, and which of them are not NULL


@dataclass(frozen=True)
class Expr:
    """An integer SQL expression and its twin over the raw columns it reads, for the page
    scanner (sqlite_pages): `fn` gets those columns as (values, valid) and gives the value SQLite
    would, NULLs included. Tests hold the two to each other on every export."""

    sql: str
    cols: tuple[str, ...]
    fn: Callable[..., Col]


_COLUMN = re.compile(r'^"?([A-Za-z_]\w*)"?$')
_LITERAL = re.compile(r"^-?\d+$")


def available() -> bool:
    """Whether the page scanner is built and not turned off."""
    return _sqlscan is not None and os.environ.get("RANKLENS_PURE_PYTHON", "") in ("", "0")


@dataclass
class Chunk:
    """Rows of a table: each wanted column's values and validity, and the rows' rowids."""

    values: Ints  # (columns, rows)
    valid: npt.NDArray[np.bool_]  # (columns, rows)
    keys: Ints


class Pages:
    """One export's file, open for reading, its page geometry read from its header."""

    def __init__(self, fd: int, page_size: int, usable: int, pages: int) -> None:
        self.fd, self.page_size, self.usable = fd, page_size, usable
        self.pages = pages  # the file's whole pages when opened: no read goes past them

    @classmethod
    def open(cls, path: Path) -> Pages | None:
        """The file's pages, or None where SQLite must read it (see the module's docstring)."""
        if not available() or _pending(path):
            return None
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            head = os.pread(fd, 100, 0)
            size = os.fstat(fd).st_size
        except OSError:
            head, size = b"", 0
        if len(head) < 100 or head[:16] != _MAGIC:
            os.close(fd)
            return None
        code = int.from_bytes(head[16:18], "big")
        page_size = 65536 if code == 1 else code
        return cls(fd, page_size, page_size - head[20], size // max(page_size, 1))

    def close(self) -> None:
        os.close(self.fd)

    def table(self, con: sqlite3.Connection, table: str, columns: list[str]) -> TablePages | None:
        """A reader of `columns` of `table` (a rowid table whose columns missing from an old
        row read as NULL), or None where SQLite must read it."""
        got = con.execute(
            "SELECT rootpage, sql FROM sqlite_master WHERE type = 'table' AND name = ?", [table]
        ).fetchone()
        if not got or not got[0] or re.search(r"WITHOUT\s+ROWID", got[1] or "", re.I):
            return None
        info = con.execute(f'PRAGMA table_info("{table}")').fetchall()
        index = {r[1]: r[0] for r in info}
        if any(c not in index or info[index[c]][4] is not None for c in columns):
            return None  # a column with a DEFAULT reads as it in rows written before it was added
        pks = [r for r in info if r[5]]
        alias = pks[0][0] if len(pks) == 1 and str(pks[0][2]).upper() == "INTEGER" else -1
        try:
            pages, cells = _sqlscan.leaves(
                self.fd, self.page_size, self.usable, self.pages, int(got[0])
            )
        except ValueError:
            return None
        want = np.full(max(index[c] for c in columns) + 1, -1, np.int32)
        for slot, c in enumerate(columns):
            want[index[c]] = slot
        return TablePages(self, columns, np.frombuffer(pages, np.uint32),
                          np.frombuffer(cells, np.uint32), want, alias)  # fmt: skip


class TablePages:
    """A table's leaves, read a row range at a time (any range, on any thread): the values of
    `columns`, in that order."""

    def __init__(
        self, pages: Pages, columns: list[str], leaves: npt.NDArray[np.uint32],
        cells: npt.NDArray[np.uint32], want: npt.NDArray[np.int32], alias: int,
    ) -> None:  # fmt: skip
        self.pages, self.columns, self.leaves = pages, columns, leaves
        self.want, self.alias = want, alias
        self.ends = np.cumsum(cells, dtype=np.int64)  # rows up to and with each leaf
        self.rows = int(self.ends[-1]) if len(self.ends) else 0
        self.slots = int(want.max()) + 1

    def read(self, start: int, n: int) -> Chunk:
        """Rows start .. start + n (in rowid order). ValueError: what SQLite must read."""
        n = max(0, min(n, self.rows - start))
        first = int(np.searchsorted(self.ends, start, side="right"))
        skip = start - (int(self.ends[first - 1]) if first else 0)
        stride = n + _PAD
        values = np.empty((self.slots, stride), np.int64)
        valid = np.empty((self.slots, stride), np.uint8)
        keys = np.empty(n, np.int64)
        p = self.pages
        want = self.want.tobytes()
        _sqlscan.rows(p.fd, p.page_size, p.usable, p.pages, self.leaves, first, skip, n,
                      want, self.alias, stride, values, valid, keys)  # fmt: skip
        return Chunk(values[:, :n], valid.view(np.bool_)[:, :n], keys)


def _pending(path: Path) -> bool:
    """True when what SQLite would read is not the file alone: a WAL with frames in it, or a
    rollback journal left by an interrupted writer."""
    for suffix in ("-wal", "-journal"):
        try:
            if os.path.getsize(f"{path}{suffix}") > 0:
                return True
        except OSError:
            continue
    return False


def raw_columns(exprs: Sequence[str | Expr], where: str | Expr, have: set[str]) -> list[str] | None:
    """The table columns the expressions read, or None when one has no twin."""
    out: list[str] = []
    for e in [*exprs, where] if where else exprs:
        if isinstance(e, Expr):
            need = list(e.cols)
        elif e == "NULL" or _LITERAL.match(e):
            need = []
        elif (m := _COLUMN.match(e)) and m.group(1) in have:
            need = [m.group(1)]
        else:
            return None
        out += [c for c in need if c not in out]
    return out


def scanned(
    pages: TablePages, exprs: Sequence[str | Expr], where: str | Expr, chunk_rows: int
) -> Iterator[tuple[list[pa.Array], int | None]]:
    """The expressions' columns a chunk of rows at a time, and each chunk's last rowid."""

    def one(start: int) -> tuple[list[pa.Array], int | None]:
        chunk = pages.read(start, chunk_rows)
        got = {c: (chunk.values[i], chunk.valid[i]) for i, c in enumerate(pages.columns)}
        cols = [_evaluate(e, got, len(chunk.keys)) for e in exprs]
        if where:  # SQL keeps a row whose condition is true: not NULL, not 0
            keep, ok = _evaluate(where, got, len(chunk.keys))
            mask = (keep != 0) & ok
            cols = [(v[mask], m[mask]) for v, m in cols]
        last = int(chunk.keys[-1]) if len(chunk.keys) else None
        return [_arrow(v, m) for v, m in cols], last

    starts = list(range(0, pages.rows, chunk_rows))
    yield from ordered_parallel(one, starts, _WORKERS)


def _evaluate(e: str | Expr, got: dict[str, Col], n: int) -> Col:
    """One expression's values over a chunk's raw columns."""
    if isinstance(e, Expr):
        return e.fn(*(got[c] for c in e.cols))
    if e == "NULL":
        return np.zeros(n, np.int64), np.zeros(n, np.bool_)
    if _LITERAL.match(e):
        return np.full(n, int(e), np.int64), np.ones(n, np.bool_)
    m = _COLUMN.match(e)
    assert m is not None
    values, valid = got[m.group(1)]
    return values.copy(), valid  # not a view: that would hold the chunk's every column


def _arrow(values: Ints, valid: npt.NDArray[np.bool_]) -> pa.Array:
    """int64 Arrow, NULL where not valid, and where the value is -2**63: the SQLite path reads
    NULLs through that sentinel (NULL_INT), so it is NULL on both."""
    valid = valid & (values != NULL_INT)
    if valid.all():
        return pa.array(values, pa.int64())
    return pa.array(values, pa.int64(), mask=~valid)
