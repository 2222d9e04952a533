"""A rank's events while they wait for its steps: the step columns as Arrow, the rest packed.

Why: a rank's steps depend on all its events, so nothing of the rank can be written before its
last piece is decoded. Holding every column of every piece until then made the staged rows the
largest part of an ingest's peak memory (~140 bytes a row, most of it 8-byte columns that are
largely null). The step assignment reads six columns, kept as they are; the others are kept as
LZ4-compressed Arrow IPC (a few times smaller, and fast to pack and unpack) and unpacked one
piece at a time as the piece is written (steps.write_rank). A rank written the moment it is
staged, whose events were all in memory anyway, is held as it is (pack's `compress`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.ipc as ipc

if TYPE_CHECKING:
    from ranklens.ingest.step_assign import Window

# What steps.py's SQL reads of a rank's events.
STEP_COLUMNS = ("name", "kind", "device", "ts_ns", "dur_ns", "correlation")

_OPTIONS = ipc.IpcWriteOptions(compression="lz4")


@dataclass
class Piece:
    """One staged piece: its step columns, and its other columns packed (or held as they are:
    pack's `compress`)."""

    trace_id: int
    rows: int
    step_cols: pa.Table
    packed: pa.Buffer | pa.Table
    # The rank's steps (step_assign.assign's answer), where the piece was decoded, when it
    # is the rank's only piece; else None (the writer assigns them on all its pieces).
    assigned: tuple[pa.Array, list[Window]] | None = None


def pack(table: pa.Table, *, compress: bool = True) -> Piece:
    """Stage `table` (one piece of one rank, one trace): the caller drops its own reference.

    `compress=False` holds the other columns as they are, for a rank written as soon as it is
    staged whose events were all in memory already (a per-file reader's large rank): packing
    them lowers no peak there and costs twice, packed then unpacked (the 5 M-kernel Nsight
    export: ~0.25 s of a 5.1 s ingest, +60 MB at the write)."""
    cols = [c for c in STEP_COLUMNS if c in table.column_names]
    trace = int(table["trace_id"][0].as_py()) if "trace_id" in table.column_names else -1
    rest = table.drop_columns(cols)
    return Piece(trace, table.num_rows, table.select(cols), packed(rest) if compress else rest)


def packed(rows: pa.Table | pa.RecordBatch) -> pa.Buffer:
    """`rows` as LZ4-compressed Arrow IPC (read back with `unpacked`)."""
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, rows.schema, options=_OPTIONS) as writer:
        writer.write(rows)
    return sink.getvalue()


def unpacked(buf: pa.Buffer) -> Iterator[pa.RecordBatch]:
    """The batches of a `packed` buffer."""
    with ipc.open_stream(buf) as reader:
        yield from reader


def step_table(pieces: list[Piece]) -> pa.Table:
    """The step columns of all the pieces, in order, as one table (zero-copy where it can)."""
    tables = same_types([p.step_cols for p in pieces])
    return pa.concat_tables(tables, promote_options="permissive")


def packed_schema(piece: Piece) -> pa.Schema:
    """The schema of a piece's packed columns, without unpacking them."""
    if isinstance(piece.packed, pa.Table):
        return piece.packed.schema
    with ipc.open_stream(piece.packed) as reader:
        return reader.schema


def _others(piece: Piece) -> pa.Table:
    """A piece's columns but the step columns, unpacked."""
    if isinstance(piece.packed, pa.Table):
        return piece.packed
    with ipc.open_stream(piece.packed) as reader:
        return reader.read_all()


def unpack_all(pieces: list[Piece]) -> Iterator[pa.Table]:
    """Each piece whole (its columns in no set order), in order; each is released from
    `pieces` as it is handed out."""
    pieces.reverse()
    while pieces:
        piece = pieces.pop()
        table = _others(piece)
        for name, col in zip(piece.step_cols.column_names, piece.step_cols.columns, strict=True):
            table = table.append_column(name, col)
        del piece
        yield table


def same_types(tables: list[pa.Table]) -> list[pa.Table]:
    """A column dictionary-encoded in some tables (the C scanner's names) is encoded in all, so
    that they concatenate without expanding the repeated strings."""
    encoded = {f.name for t in tables for f in t.schema if pa.types.is_dictionary(f.type)}
    out = []
    for t in tables:
        for name in encoded:
            if name not in t.column_names:
                continue
            i = t.column_names.index(name)
            if not pa.types.is_dictionary(t.schema.field(i).type):
                t = t.set_column(i, name, t.column(i).cast(pa.string()).dictionary_encode())
        out.append(t)
    return out
