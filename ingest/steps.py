"""The one write of a rank's events, each with its step, and of its step windows (small ranks
several at a time: write_ranks).

Why per rank, before the write: a rank's steps depend only on its own events, so they are
computed on its staged pieces (`step_assign.assign`, a pure function of the step columns) and
each event is written to the database once, with its step. Writing first and re-writing the
table to add the step cost twice the insert (DuckDB compresses every row group it writes), the
largest part of an ingest.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import duckdb
import pyarrow as pa
from ranklens.ingest import event_store, staging, step_assign
from ranklens.ingest.database import registered
from ranklens.ingest.event_store import insert_events
from ranklens.ingest.schema import TABLE_BY_NAME
from ranklens.ingest.threads import Helper

PARALLEL_ROWS = 400_000  # a rank this large is written by two INSERTs at once (_insert_two)


def write_rank(
    con: duckdb.DuckDBPyConnection, rank: int, has_gpu: bool, pieces: list[staging.Piece]
) -> None:
    """Assign steps to one rank's events (its staged pieces), then write them and its steps to
    the database, a piece at a time. Consumes `pieces`."""
    n = sum(p.rows for p in pieces)
    if n < PARALLEL_ROWS:
        write_ranks(con, [(rank, has_gpu, pieces)])
        return
    step, windows = step_assign.assign(staging.step_table(pieces), has_gpu)
    insert_windows(con, [(rank, windows)])
    schema = _stream_schema(pieces)
    # A large rank is two INSERTs on two threads (_insert_two: 1.2 -> 0.74 s for the 400 MB
    # trace's 1.3 M rows).
    half = _second_half(pieces)
    second = pieces[half:]
    del pieces[half:]
    at = n - sum(p.rows for p in second)
    _insert_two(con, _reader(pieces, step, 0, schema), _reader(second, step, at, schema))


def write_ranks(
    con: duckdb.DuckDBPyConnection, ranks: list[tuple[int, bool, list[staging.Piece]]]
) -> None:
    """Ranks (rank, has_gpu, its pieces), each with its steps assigned on its own pieces, written
    in one transaction: one INSERT of their windows, one stream of all their events. Consumes
    the pieces.

    Why together: DuckDB pays its per-statement setup and half-filled row groups once per
    INSERT, not once per piece (the write of a 400 MB trace's 1.3 M rows: 1.7 -> 1.2 s), and
    its commit once per transaction. A rank of a 1,024-rank job holds ~2 k events, for which
    that overhead (~20 ms: Arrow registration, planning, commit) was the whole write: the
    Sink collects small ranks (sink.SMALL_RANK_ROWS) and writes them here together. Memory
    stays one unpacked piece at a time."""
    for _r, _g, pieces in ranks:
        if not any(p.rows for p in pieces):
            pieces.clear()
    ranks = [(r, g, pieces) for r, g, pieces in ranks if pieces]
    if not ranks:
        return
    assigned = [_assigned(pieces, g) for _r, g, pieces in ranks]
    try:
        one = _stream_schema([p for _r, _g, pieces in ranks for p in pieces])
        schemas = [one] * len(ranks)
    except pa.ArrowException:  # a column typed apart by two readers: an INSERT per rank
        schemas = [_stream_schema(pieces) for _r, _g, pieces in ranks]
    streams: list[tuple[pa.Schema, list[pa.RecordBatchReader]]] = []
    for (_r, _g, pieces), (step, _w), schema in zip(ranks, assigned, schemas, strict=True):
        if not streams or streams[-1][0] is not schema:
            streams.append((schema, []))
        streams[-1][1].append(_reader(pieces, step, 0, schema))
    with event_store.transaction(con):
        insert_windows(con, [(r, w) for (r, _g, _p), (_s, w) in zip(ranks, assigned, strict=True)])
        for schema, readers in streams:
            batches = _coalesced(batch for reader in readers for batch in reader)
            # at most ~sink.BATCH_ROWS rows: the rich ones held as they are, not packed
            insert_events(con, pa.RecordBatchReader.from_batches(schema, batches), pack=False)


def _assigned(
    pieces: list[staging.Piece], has_gpu: bool
) -> tuple[pa.Array, list[step_assign.Window]]:
    """The rank's steps: as the worker that decoded its only piece assigned them, else here."""
    if len(pieces) == 1 and pieces[0].assigned is not None:
        return pieces[0].assigned
    return step_assign.assign(staging.step_table(pieces), has_gpu)


def _coalesced(batches: Iterator[pa.RecordBatch], rows: int = 65_536) -> Iterator[pa.RecordBatch]:
    """The batches joined into batches of at least `rows` (the last may be fewer): a small
    rank's events are one batch of ~2 k rows, and every batch costs DuckDB's scan and the
    rich/plain split a fixed amount (the flushes of a 1,024-rank job: 8.6 -> 5.4 s)."""
    held: list[pa.RecordBatch] = []
    n = 0
    for batch in batches:
        held.append(batch)
        n += batch.num_rows
        if n >= rows:
            yield from _joined(held)
            held, n = [], 0
    if held:
        yield from _joined(held)


def _joined(batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
    """One batch of `batches`' rows; themselves where Arrow cannot join them (a dictionary
    holding a null, as Nsight's kernel labels may: "cannot yet unify dictionaries")."""
    try:
        joined: list[pa.RecordBatch] = pa.Table.from_batches(batches).combine_chunks().to_batches()
        return joined
    except pa.ArrowInvalid:
        return batches


def _reader(
    pieces: list[staging.Piece], step: pa.Array, at: int, schema: pa.Schema
) -> pa.RecordBatchReader:
    """The pieces' rows with their steps (from row `at` of the rank's `step`), a piece at a
    time, in `schema`."""

    def batches() -> Iterator[pa.RecordBatch]:
        pos = at
        for piece in staging.unpack_all(pieces):
            out = piece.append_column("step", step.slice(pos, piece.num_rows))
            pos += piece.num_rows
            del piece
            yield from _conform(out, schema).to_batches()
            del out

    return pa.RecordBatchReader.from_batches(schema, batches())


def _second_half(pieces: list[staging.Piece]) -> int:
    """Where the rank's pieces split into two runs of about half its rows (len: no split)."""
    total, acc = sum(p.rows for p in pieces), 0
    for i, p in enumerate(pieces):
        if acc >= total / 2:
            return i
        acc += p.rows
    return len(pieces)


def _insert_two(
    con: duckdb.DuckDBPyConnection, first: pa.RecordBatchReader, second: pa.RecordBatchReader
) -> None:
    """Two INSERTs at once, each in its own transaction on its own connection to `con`'s
    database: DuckDB compresses a stream's row groups on one thread (~1 us a row), and a large
    rank is most of a one-file ingest's write. The first commits before the second, so the
    table holds the rows in the order one INSERT would; when either INSERT fails, neither is
    kept. Ctrl+C or SIGTERM (raised in this thread) stops the other INSERT too, and is what
    the caller sees."""
    curs = (con.cursor(), con.cursor())
    failed: list[BaseException] = []

    def later() -> None:
        try:
            insert_events(curs[1], second)
        except BaseException as exc:  # re-raised in the caller's thread
            failed.append(exc)

    helper = Helper(later, name="ranklens-insert")
    try:
        for cur in curs:
            cur.execute("BEGIN TRANSACTION")
        helper.start()
        insert_events(curs[0], first)
        helper.wait()
        if failed:
            raise failed[0]
        for cur in curs:
            cur.execute("COMMIT")
    except BaseException:
        helper.outlast(curs[1].interrupt)
        for cur in curs:
            with contextlib.suppress(duckdb.Error):  # none open: not begun, or committed
                cur.execute("ROLLBACK")
        raise
    finally:
        for cur in curs:
            cur.close()


def insert_windows(
    con: duckdb.DuckDBPyConnection,
    ranks: list[tuple[int, list[step_assign.Window]]],
) -> None:
    """Ranks' rows of `steps` (rank, its windows), in one statement (executemany costs ~0.5 ms
    a row: 75 ms for a trace of 144 steps)."""
    ws = [(rank, w) for rank, windows in ranks for w in windows]
    if not ws:
        return
    rows = pa.table(
        {
            "rank": pa.array([rank for rank, _w in ws], pa.int32()),
            "step": pa.array([w.step for _r, w in ws], pa.int32()),
            "cpu_start_ns": pa.array([w.cpu_start_ns for _r, w in ws], pa.int64()),
            "cpu_end_ns": pa.array([w.cpu_end_ns for _r, w in ws], pa.int64()),
            "start_ns": pa.array([w.start_ns for _r, w in ws], pa.int64()),
            "end_ns": pa.array([w.end_ns for _r, w in ws], pa.int64()),
            "source": pa.array([w.source for _r, w in ws], pa.string()),
        }
    )
    with registered(con, "_steps", rows):
        con.execute("INSERT INTO steps SELECT * FROM _steps")


def _stream_schema(pieces: list[staging.Piece]) -> pa.Schema:
    """One schema for all of a rank's pieces: each `events` column any piece has (with `step`),
    in table order; a column some pieces hold dictionary-encoded and others not is plain."""
    fields: dict[str, list[pa.DataType]] = {}
    for piece in pieces:
        for f in (*piece.step_cols.schema, *staging.packed_schema(piece)):
            fields.setdefault(f.name, []).append(f.type)
    fields["step"] = [pa.int32()]
    out = []
    for name in _EVENTS:
        types = fields.get(name)
        if types:
            kinds = set(types)
            if len(kinds) > 1:
                plain = [t.value_type if pa.types.is_dictionary(t) else t for t in kinds]
                typ = (
                    pa.unify_schemas(
                        [pa.schema([(name, t)]) for t in plain], promote_options="permissive"
                    )
                    .field(0)
                    .type
                )
            else:
                typ = types[0]
            out.append(pa.field(name, typ))
    return pa.schema(out)


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` with exactly `schema`'s columns (NULL where it has none), types and order."""
    have = set(table.column_names)
    if have.issuperset(schema.names):  # the usual case: one call, no per-column Python
        out = table.select(schema.names)
    else:
        n = table.num_rows
        cols = [table.column(f.name) if f.name in have else pa.nulls(n, f.type) for f in schema]
        out = pa.table(cols, names=schema.names)
    return out if out.schema.equals(schema) else out.cast(schema)


_EVENTS = TABLE_BY_NAME["events"].column_names
