"""Rows of the per-rank tables (`sources`, `ranks`, `threads`) held until the Sink writes them,
together and with the events they go with (Sink.flush), in one transaction.

Why: one INSERT of a row costs ~1 ms of DuckDB statement and commit, and a rank added three
(5.6 ms a rank: 5.8 s of a 1,024-rank ingest). Each row is typed as it is added, so a value the
column cannot hold is an error of the file being read then, as the INSERT's was; the held rows
are written in the order they came.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
from ranklens.ingest.database import registered
from ranklens.ingest.schema import TABLE_BY_NAME

_TYPES = {
    "INTEGER": pa.int32(),
    "BIGINT": pa.int64(),
    "VARCHAR": pa.string(),
    "BOOLEAN": pa.bool_(),
}
TABLES = ("sources", "ranks", "threads")


def _value(v: Any, typ: pa.DataType) -> Any:
    """`v` as DuckDB's INSERT would have cast it: text for a VARCHAR, a whole float or a numeric
    string as an integer (anything else is left for Arrow to refuse)."""
    if v is None:
        return None
    if typ == pa.string():
        return v if isinstance(v, str) else str(v)
    if pa.types.is_integer(typ) and isinstance(v, float | str) and not isinstance(v, bool):
        try:
            return int(v) if not isinstance(v, float) or v.is_integer() else v
        except ValueError:
            return v
    return v


class HeldRows:
    """Rows for `TABLES`, held as typed Arrow tables until `write`."""

    def __init__(self) -> None:
        self._schemas = {
            t: pa.schema([(c.name, _TYPES[c.type]) for c in TABLE_BY_NAME[t].columns])
            for t in TABLES
        }
        self._held: dict[str, list[pa.Table]] = {t: [] for t in TABLES}

    def add(self, table: str, rows: Sequence[Sequence[Any]]) -> None:
        """Hold `rows` (tuples in the table's column order); raises on a value its column
        cannot hold."""
        if not rows:
            return
        schema = self._schemas[table]
        types = [f.type for f in schema]
        typed = [tuple(_value(v, t) for v, t in zip(row, types, strict=True)) for row in rows]
        # one Arrow call for every column (a struct of them): 77 -> 35 us a row of a rank
        whole = pa.array(typed, type=pa.struct(list(schema)))
        self._held[table].append(pa.Table.from_struct_array(whole))

    def drop(self, table: str, column: str, values: Iterable[int]) -> None:
        """Forget held rows of `table` whose `column` is one of `values` (a bad file's)."""
        gone = pa.array(sorted(set(values)), self._schemas[table].field(column).type)
        self._held[table] = [
            t.filter(pc.invert(pc.is_in(t[column], value_set=gone))) for t in self._held[table]
        ]

    def write(self, con: duckdb.DuckDBPyConnection) -> None:
        """INSERT every held row, a statement per table, and forget them. The held tables are
        joined into one chunk first: DuckDB scans an Arrow chunk at a fixed cost, and a batch
        of ~1,000 small ranks' rows, a chunk each, took 0.5 s to insert instead of 0.01."""
        for table in TABLES:
            held, self._held[table] = self._held[table], []
            rows = pa.concat_tables(held).combine_chunks() if held else None
            if rows is not None and rows.num_rows:
                with registered(con, "_held_rows", rows):
                    con.execute(f"INSERT INTO {table} SELECT * FROM _held_rows")
