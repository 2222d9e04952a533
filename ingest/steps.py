"""The one write of a rank's events, each with its step, and of its step windows.

Why per rank, before the write: a rank's steps depend only on its own events, so they are
computed on its staged pieces (`step_assign.assign`, a pure function of the step columns) and
each event is written to the database once, with its step. Writing first and re-writing the
table to add the step cost twice the insert (DuckDB compresses every row group it writes), the
largest part of an ingest.
"""

from __future__ import annotations

import duckdb
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
    if windows:
        con.executemany(
            "INSERT INTO steps VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                [rank, w.step, w.cpu_start_ns, w.cpu_end_ns, w.start_ns, w.end_ns, w.source]
                for w in windows
            ],
        )
    events = TABLE_BY_NAME["events"].column_names
    at = 0
    for piece in staging.unpack_all(pieces):
        cols = [c for c in events if c in piece.column_names and c != "step"]
        out = piece.select(cols).append_column("step", step.slice(at, piece.num_rows))
        at += piece.num_rows
        del piece
        names = ", ".join(f'"{c}"' for c in out.column_names)
        con.register("_ev", out)
        try:
            con.execute(f"INSERT INTO events ({names}) SELECT {names} FROM _ev")
        finally:
            con.unregister("_ev")
        del out
