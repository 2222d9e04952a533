"""The one write of a rank's events, each with its step, and of its step windows.

Why per rank, before the write: a rank's steps depend only on its own events, so they are
computed on its staged pieces (`step_assign.assign`, a pure function of the step columns) and
each event is written to the database once, with its step. Writing first and re-writing the
table to add the step cost twice the insert (DuckDB compresses every row group it writes), the
largest part of an ingest.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa
from ranklens.ingest import staging, step_assign
from ranklens.ingest.schema import TABLE_BY_NAME


def write_rank(
    con: duckdb.DuckDBPyConnection, rank: int, has_gpu: bool, pieces: list[staging.Piece]
) -> None:
    """Assign steps to one rank's events (its staged pieces), then write them and its steps to
    the database, a piece at a time. Consumes `pieces`."""
    n = sum(p.rows for p in pieces)
    if n == 0:
        pieces.clear()
        return
    step, windows = step_assign.assign(staging.step_table(pieces), has_gpu)
    insert_windows(con, rank, windows)
    at = 0
    for piece in staging.unpack_all(pieces):
        out = piece.append_column("step", step.slice(at, piece.num_rows))
        at += piece.num_rows
        del piece
        insert_events(con, out)
        del out


def insert_windows(
    con: duckdb.DuckDBPyConnection, rank: int, windows: list[step_assign.Window]
) -> None:
    """The rank's rows of `steps`."""
    if windows:
        con.executemany(
            "INSERT INTO steps VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                [rank, w.step, w.cpu_start_ns, w.cpu_end_ns, w.start_ns, w.end_ns, w.source]
                for w in windows
            ],
        )


def insert_events(con: duckdb.DuckDBPyConnection, table: pa.Table) -> None:
    """Append rows (with their step) to `events`, by column name; columns a reader does not
    fill stay NULL."""
    names = ", ".join(f'"{c}"' for c in _EVENTS if c in table.column_names)
    con.register("_ev", table)
    try:
        con.execute(f"INSERT INTO events ({names}) SELECT {names} FROM _ev")
    finally:
        con.unregister("_ev")


_EVENTS = TABLE_BY_NAME["events"].column_names
