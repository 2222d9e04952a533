"""How `events` is stored: two tables read through one view.

Why: DuckDB appends at ~30 ns per value per column, whether the value is NULL or not (docs/
scale.md, "Session 19"), and eleven of the 26 columns are empty on most rows of a trace (the
collective arguments, `bytes`, `shapes`, `concrete`). Rows that carry none of them (kernels,
runtime calls, host ops without shapes: 95% of the rows of the 400 MB benchmark trace and of
the 5 M-kernel Nsight export) go to `events_plain`, which lacks those columns; the others, and
every `comm` row (the cross-rank stage fills their group, peer and sizes later, by UPDATE), go
to `events_rich`. The view `events` (schema.events_ddl) is their
UNION ALL with the table's columns and types, so every reader sees one table; a filter on a
sparse column prunes the plain side.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
from ranklens.ingest import staging
from ranklens.ingest.database import registered
from ranklens.ingest.schema import EVENTS_PLAIN, EVENTS_RICH, EVENTS_SPARSE, TABLE_BY_NAME
from ranklens.ingest.shards import text_is_in

_EVENTS = TABLE_BY_NAME["events"].column_names
_COMM = pa.array(["comm"])
_RICH = "_rich"  # the mark of a row that goes to events_rich, while it streams to events_plain


def rich_mask(batch: pa.RecordBatch) -> pa.Array:
    """Rows that go to `events_rich`: a `comm` row, or one with any sparse column set."""
    names = batch.schema.names
    mask: pa.Array | None = None
    if "kind" in names:  # False for NULL; tested on a dictionary's few values when encoded
        comm = text_is_in(batch.column(names.index("kind")), _COMM)
        mask = comm.combine_chunks() if isinstance(comm, pa.ChunkedArray) else comm
    for c in EVENTS_SPARSE:
        if c in names:
            col = batch.column(names.index(c))
            if col.null_count < len(col):
                valid = col.is_valid()
                mask = valid if mask is None else pc.or_(mask, valid)
    if mask is None:
        return pa.array([False] * batch.num_rows, pa.bool_())
    return pc.fill_null(mask, False)  # a NULL mark would keep the row out of both tables


def insert_events(
    con: duckdb.DuckDBPyConnection, rows: pa.Table | pa.RecordBatchReader, pack: bool = True
) -> None:
    """Append rows (with their step) to `events`, by column name (columns a reader does not fill
    stay NULL): the plain ones streamed into `events_plain`, then the rich ones into
    `events_rich`, held meanwhile LZ4-packed (they may be many when a trace records shapes), or
    as they are with `pack=False`, for a caller whose rows are bounded (the batched small ranks:
    packing and unpacking cost ~0.15 s a million rows of the one writer's time)."""
    reader = rows.to_reader() if isinstance(rows, pa.Table) else rows
    names = [c for c in _EVENTS if c in reader.schema.names]
    plain = [c for c in names if c not in EVENTS_SPARSE]
    marked = pa.schema([*(reader.schema.field(c) for c in plain), pa.field(_RICH, pa.bool_())])
    held: list[pa.Buffer | pa.RecordBatch] = []

    def plain_batches() -> Iterator[pa.RecordBatch]:
        # Every batch goes on whole, marked: DuckDB drops the rich rows as it reads (a copy of
        # each batch without them cost 0.15 s and 70 MB on a 400 MB trace); only the few rich
        # rows are copied, to be held.
        for batch in reader:
            mask = rich_mask(batch)
            if pc.any(mask).as_py():
                rich = batch.filter(mask).select(names)
                held.append(staging.packed(rich) if pack else rich)
            yield pa.RecordBatch.from_arrays(
                [*(batch.column(c) for c in plain), mask], schema=marked
            )

    _append(con, EVENTS_PLAIN, pa.RecordBatchReader.from_batches(marked, plain_batches()), plain)
    if held:
        rich_schema = pa.schema([reader.schema.field(c) for c in names])
        _append(con, EVENTS_RICH, _unpacked(held, rich_schema))


@contextlib.contextmanager
def transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """`insert_events` is two INSERTs: on a connection outside any transaction, wrap it in one
    so that a failure between them leaves none of the rows."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield
    except BaseException:
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def _append(
    con: duckdb.DuckDBPyConnection,
    table: str,
    rows: pa.RecordBatchReader,
    cols: list[str] | None = None,
) -> None:
    """INSERT `rows` (their columns `cols`; all when None; those marked rich left out)."""
    names = ", ".join(f'"{c}"' for c in (cols or rows.schema.names))
    where = f' WHERE NOT "{_RICH}"' if _RICH in rows.schema.names else ""
    with registered(con, "_ev", rows):
        con.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM _ev{where}")


def _unpacked(held: list[pa.Buffer | pa.RecordBatch], schema: pa.Schema) -> pa.RecordBatchReader:
    """The held rows, one held batch at a time, unpacked if packed (each released as it is
    read)."""

    def batches() -> Iterator[pa.RecordBatch]:
        held.reverse()
        while held:
            item = held.pop()
            if isinstance(item, pa.RecordBatch):
                yield item
            else:
                yield from staging.unpacked(item)

    return pa.RecordBatchReader.from_batches(schema, batches())


def delete_trace(con: duckdb.DuckDBPyConnection, trace_id: int) -> None:
    """Forget a file's written events (it turned out bad)."""
    for table in (EVENTS_RICH, EVENTS_PLAIN):
        con.execute(f"DELETE FROM {table} WHERE trace_id = ?", [trace_id])
