"""Low-level access to an Nsight Systems SQLite export: open safely, probe, read fast.

Why a module of its own: every other part of the Nsight reader only asks "which tables and
columns exist" and "give me these integer columns as Arrow", so version drift and speed are
handled once, here.

Speed: Python's sqlite3 builds one Python object per value (~0.3 us each here), far too slow
for tens of millions of kernel rows. Integer columns are therefore read either through the
ADBC SQLite driver (Arrow-native, used when `adbc_driver_sqlite` is installed) or, with the
standard library only, by letting SQLite itself pack a rowid range of rows into one hex string
(`group_concat(printf('%016x...'))`) that numpy decodes in one call. Both read rowid ranges
on two threads (sqlite3 releases the GIL while it steps), so memory stays bounded by the
chunk size and both cores work. Faster still, and first: the table's own pages, decoded by
the C page scanner (sqlite_pages.py) where the file and the values allow it.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from ranklens.ingest.errors import TraceFormatError
from ranklens.ingest.sqlite_pages import NULL_INT, Expr, Pages, TablePages, raw_columns, scanned
from ranklens.ingest.threads import ordered_parallel

NULL_SQL = "(-9223372036854775807 - 1)"  # written so SQLite keeps it an INTEGER
# DuckDB's row group: pieces of whole row groups are written once; others are merged and
# rewritten at the next checkpoint (as much CPU again as the insert).
CHUNK_ROWS = 122_880
_WORKERS = 3

_adbc: Any
_BATCH_ROWS = "adbc.sqlite.query.batch_rows"
try:  # accelerator (a dependency); the stdlib path below is the fallback
    import adbc_driver_sqlite.dbapi as _adbc
except ImportError:  # pragma: no cover - depends on the environment
    _adbc = None


def _lenient(raw: bytes) -> str:
    """Decode TEXT that may not be valid UTF-8 (seen in real exports) without failing."""
    return raw.decode("utf-8", "replace")


def connect(path: Path) -> sqlite3.Connection:
    """A read-only connection that never creates or modifies the file."""
    con = sqlite3.connect(
        f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=2.0, check_same_thread=False
    )
    con.text_factory = _lenient
    return con


def as_format_error(path: Path, err: sqlite3.Error) -> TraceFormatError:
    """Turn an SQLite failure into an error that names the file and says what to do."""
    msg = str(err)
    if "locked" in msg or "busy" in msg:
        hint = "another process (nsys export?) is still writing it; wait for it to finish"
    elif "not a database" in msg or "malformed" in msg or "disk I/O" in msg:
        hint = (
            "the file is truncated or damaged; copy it again or re-export it with "
            f"`nsys export --type sqlite --ts-normalize=true --output {path} "
            f"{path.with_suffix('.nsys-rep')}`"
        )
    else:
        hint = "check that it is an Nsight Systems SQLite export (`nsys export --type sqlite`)"
    return TraceFormatError(f"{path}: cannot read the Nsight SQLite file ({msg})", hint)


class Report:
    """One open export: which tables and columns exist, plus typed read helpers."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.con = connect(path)
        try:
            rows = self.con.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'"
            ).fetchall()
        except sqlite3.Error as err:
            self.con.close()
            raise as_format_error(path, err) from err
        self._tables = {r[0] for r in rows}
        self._cols: dict[str, list[str]] = {}
        self._rows: dict[str, bool] = {}
        self._pages: Pages | None = None
        self._opened = False  # whether _pages was looked for

    def close(self) -> None:
        self.con.close()
        if self._pages is not None:
            self._pages.close()

    def exists(self, table: str) -> bool:
        return table in self._tables

    def has(self, table: str) -> bool:
        """True when the table exists *and* has rows (old exports keep empty tables)."""
        if table not in self._rows:
            self._rows[table] = self.exists(table) and bool(
                self.con.execute(f'SELECT 1 FROM "{table}" LIMIT 1').fetchall()
            )
        return self._rows[table]

    def columns(self, table: str) -> list[str]:
        if table not in self._cols:
            self._cols[table] = (
                [r[1] for r in self.con.execute(f'PRAGMA table_info("{table}")')]
                if self.exists(table)
                else []
            )
        return self._cols[table]

    def col(self, table: str, name: str, default: str = "NULL") -> str:
        """The column if this export has it, else a constant: selects stay valid across drift."""
        return f'"{name}"' if name in self.columns(table) else default

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.con.execute(sql, params).fetchall()

    def kv(self, table: str) -> dict[str, str]:
        """A (name, value) metadata table as a dict; empty when the table is missing."""
        if not self.has(table):
            return {}
        return {str(k): str(v) for k, v in self.query(f'SELECT name, value FROM "{table}"')}

    def notnull(self, table: str) -> set[str]:
        """Columns declared NOT NULL (2.x exports declare every column so)."""
        return {r[1] for r in self.con.execute(f'PRAGMA table_info("{table}")') if r[3]}

    def int_chunks(
        self, table: str, exprs: Sequence[str | Expr], where: str | Expr = ""
    ) -> Iterator[list[pa.Array]]:
        """Yield column lists (int64 Arrow arrays, nullable) of integer SQL expressions, in
        rowid order: a str is a column, an integer or NULL; an Expr anything else.

        Every expression must evaluate to an INTEGER or NULL on each row. The page scanner
        reads what it can; from the first row it cannot, SQLite reads the rest.
        """
        after = None
        scan = self._scanner(table, exprs, where)
        if scan is not None:
            try:
                for cols, last in scanned(scan, exprs, where, CHUNK_ROWS):
                    after = last
                    if len(cols[0]):
                        yield cols
                return
            except ValueError:  # a value or page only SQLite reads as it should
                pass
        yield from self._sql_chunks(table, exprs, where, after)

    def _scanner(
        self, table: str, exprs: Sequence[str | Expr], where: str | Expr
    ) -> TablePages | None:
        """The table's pages when every expression has a twin (else None)."""
        raw = raw_columns(exprs, where, set(self.columns(table)))
        if not raw:
            return None
        if not self._opened:
            self._pages, self._opened = Pages.open(self.path), True
        return self._pages.table(self.con, table, raw) if self._pages is not None else None

    def _sql_chunks(
        self, table: str, exprs: Sequence[str | Expr], where: str | Expr, after: int | None
    ) -> Iterator[list[pa.Array]]:
        """The rows SQLite reads (those past rowid `after` when it is given)."""
        # two queries: SQLite answers a lone min() or max() of the rowid from the b-tree ends
        lo = self.query(f'SELECT min(rowid) FROM "{table}"')[0][0]
        hi = self.query(f'SELECT max(rowid) FROM "{table}"')[0][0]
        if lo is None or hi is None:
            return
        lo = lo if after is None else after + 1
        cols, strict = self.columns(table), self.notnull(table)
        sqls = [e.sql if isinstance(e, Expr) else e for e in exprs]
        wrapped = [
            e
            if e.strip('"') in strict or (e.startswith("CASE") and e.strip('"') not in cols)
            else f"ifnull({e}, {NULL_SQL})"
            for e in sqls
        ]
        starts = list(range(int(lo), int(hi) + 1, CHUNK_ROWS))
        fetch = _AdbcChunk if _adbc is not None else _HexChunk
        cond = where.sql if isinstance(where, Expr) else where
        reader = fetch(self.path, table, wrapped, cond)
        try:
            for cols in ordered_parallel(reader.read, starts, _WORKERS):
                if len(cols[0]):
                    yield cols
        finally:
            reader.close()


def _to_arrow(columns: Sequence[npt.NDArray[np.int64]]) -> list[pa.Array]:
    out = []
    for c in columns:
        null = c == NULL_INT
        out.append(pa.array(c, pa.int64(), mask=null if null.any() else None))
    return out


def _empty(n: int) -> list[pa.Array]:
    return [pa.array([], pa.int64()) for _ in range(n)]


class _HexChunk:
    """Standard-library reader: SQLite packs a rowid range into one hex string."""

    def __init__(self, path: Path, table: str, exprs: Sequence[str], where: str) -> None:
        self.path = path
        self.n = len(exprs)
        packed = ", ".join(exprs)
        fmt = "%016x" * self.n
        cond = f" AND ({where})" if where else ""
        self.sql = (
            f"SELECT group_concat(printf('{fmt}', {packed}), '') FROM \"{table}\" "
            f"WHERE rowid >= ? AND rowid < ?{cond}"
        )
        self.local = threading.local()
        self.cons: list[sqlite3.Connection] = []

    def read(self, start: int) -> list[pa.Array]:
        con = getattr(self.local, "con", None)
        if con is None:
            con = self.local.con = connect(self.path)
            self.cons.append(con)
        (text,) = con.execute(self.sql, (start, start + CHUNK_ROWS)).fetchone()
        if not text:
            return _empty(self.n)
        mat = np.frombuffer(bytes.fromhex(text), dtype=">i8").reshape(-1, self.n)
        return _to_arrow([mat[:, i].astype(np.int64) for i in range(self.n)])

    def close(self) -> None:
        for c in self.cons:
            c.close()


class _AdbcChunk:
    """Arrow-native reader through the ADBC SQLite driver (C, no Python objects per value)."""

    def __init__(self, path: Path, table: str, exprs: Sequence[str], where: str) -> None:
        self.uri = f"{path.resolve().as_uri()}?mode=ro"
        self.n = len(exprs)
        cols = ", ".join(f"{e} AS c{i}" for i, e in enumerate(exprs))
        cond = f" AND ({where})" if where else ""
        self.sql = f'SELECT {cols} FROM "{table}" WHERE rowid >= ? AND rowid < ?{cond}'
        self.local = threading.local()
        self.cons: list[Any] = []

    def read(self, start: int) -> list[pa.Array]:
        con = getattr(self.local, "con", None)
        if con is None:
            assert _adbc is not None
            con = self.local.con = _adbc.connect(self.uri)
            self.cons.append(con)
        cur = con.cursor()
        try:
            # one Arrow batch per chunk: the driver's default of 1024 rows costs ~30% more CPU
            cur.adbc_statement.set_options(**{_BATCH_ROWS: str(CHUNK_ROWS)})
            cur.execute(
                self.sql.replace("?", str(start), 1).replace("?", str(start + CHUNK_ROWS), 1)
            )
            tab: pa.Table = cur.fetch_arrow_table()
        finally:
            cur.close()
        if tab.num_rows == 0:
            return _empty(self.n)
        out = []
        for i in range(self.n):
            col = tab.column(i).combine_chunks().cast(pa.int64())
            hit = pc.equal(col, NULL_INT)
            if pc.any(hit).as_py():
                col = pc.if_else(hit, pa.scalar(None, pa.int64()), col)
            out.append(col)
        return out

    def close(self) -> None:
        for c in self.cons:
            c.close()
