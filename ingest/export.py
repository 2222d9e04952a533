"""Export a run's tables as Parquet: per-rank tables hive-partitioned by rank, the rest one file.

Why: a run is a DuckDB file, which only DuckDB opens; Parquet is what every other engine
(polars, Spark, pandas, Trino, Ray) reads, and `rank=N/` directories let them prune ranks without
reading the others. This is also the layout the per-rank shards of docs/scale.md would use.
The target is checked before any work (a run given as traces is ingested first), built in a
temporary directory beside it and put in place by one rename, so a reader never sees half.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
from ranklens.ingest.output import (
    OutputError,
    check_parent,
    check_writable,
    output_lock,
    sweep_leftovers,
    temp_path,
)
from ranklens.ingest.run import OpenOptions, open_run
from ranklens.ingest.schema import EVENTS_PLAIN, EVENTS_RICH, TABLES
from ranklens.ingest.shards import COMM_TABLE
from ranklens.ingest.tempfiles import remove_tree

PER_RANK: tuple[str, ...] = ("events", "collectives", "steps", "threads")
_EVENTS_STORAGE = (COMM_TABLE, EVENTS_RICH, EVENTS_PLAIN)  # exported as `events` whole


@dataclass
class ExportReport:
    """What was written: rows per table, and which tables are partitioned by rank."""

    out_dir: str
    rows: dict[str, int] = field(default_factory=dict)
    partitioned: list[str] = field(default_factory=list)

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())


def export_run(
    source: list[str], out_dir: str | os.PathLike[str], options: OpenOptions | None = None
) -> ExportReport:
    """Open `source` (a database or trace inputs) and export it to `out_dir` (see module doc).

    Raises:
        OutputError: `out_dir` is a file, not empty, an input or inside one, or unwritable.
    """
    out = Path(out_dir)
    check_target(out, source)
    with open_run(source, options) as run:
        return export_parquet(run.con, out)


def check_target(out: Path, inputs: list[str]) -> None:
    """Refuse a target that exists with content, is (or holds, or lies in) an input, or whose
    parent cannot be written, before a possibly long ingest."""
    here = Path(os.path.realpath(out))
    for f in inputs:
        src = Path(os.path.realpath(f))
        if here == src:
            raise OutputError(f"{out}: the output is one of the inputs ({f})", _ELSEWHERE)
        if here.is_relative_to(src) or src.is_relative_to(here):
            raise OutputError(f"{out}: the output overlaps the input {f}", _ELSEWHERE)
    if os.path.lexists(out):
        if not out.is_dir() or out.is_symlink():
            raise OutputError(f"{out}: exists and is not a directory (or is a link)", _ELSEWHERE)
        if any(out.iterdir()):
            raise OutputError(
                f"{out}: the directory is not empty; export never writes over files",
                "give a new or empty directory, or remove this one yourself",
            )
    check_parent(out, here.parent)
    check_writable(out, here.parent)


_ELSEWHERE = "give a new directory outside the inputs, e.g. --parquet run_parquet"


def export_parquet(con: duckdb.DuckDBPyConnection, out: Path) -> ExportReport:
    """Write every base table of `con` under `out` (checked by check_target), atomically:
    built in `.NAME.tmp-PID` beside it, under `.NAME.lock`, which also lets it remove what a
    killed export to `out` left there."""
    dest = Path(os.path.abspath(out))
    tmp = temp_path(dest)
    report = ExportReport(out_dir=str(out))
    with output_lock(dest, "export"):
        sweep_leftovers(dest)
        tmp.mkdir()
        try:
            for name in _tables(con):
                report.rows[name] = _copy(con, name, tmp)
                if name in PER_RANK and report.rows[name]:
                    report.partitioned.append(name)
            _publish(tmp, dest)
        finally:
            remove_tree(tmp)
    return report


def _tables(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The schema's tables in schema order, then any other base table the run holds (a sharded
    run's `events` whole, never its communication part alone)."""
    have = [
        str(r[0])
        for r in con.execute(
            "SELECT table_name FROM duckdb_tables() "
            "WHERE database_name = current_database() AND schema_name = 'main' AND NOT temporary "
            "ORDER BY table_name"
        ).fetchall()
    ]
    if COMM_TABLE in have or EVENTS_RICH in have:  # `events` is a view over these
        have = [*have, "events"]
    known = [t.name for t in TABLES if t.name in have]
    return known + [t for t in have if t not in known and t not in _EVENTS_STORAGE]


def _copy(con: duckdb.DuckDBPyConnection, name: str, tmp: Path) -> int:
    """COPY one table; returns its row count. An empty per-rank table is one empty file (a
    partitioned COPY of no rows writes nothing, and readers refuse a glob that matches none)."""
    n = int(con.execute(f"SELECT count(*) FROM {_ident(name)}").fetchall()[0][0])
    if name in PER_RANK and n:
        dest = tmp / name
        opts = "FORMAT parquet, COMPRESSION zstd, PARTITION_BY (rank)"
    elif name in PER_RANK:
        (tmp / name).mkdir()
        dest, opts = tmp / name / "empty.parquet", "FORMAT parquet, COMPRESSION zstd"
    else:
        dest, opts = tmp / f"{name}.parquet", "FORMAT parquet, COMPRESSION zstd"
    con.execute(f"COPY {_ident(name)} TO {_literal(str(dest))} ({opts})")
    return n


def _publish(tmp: Path, out: Path) -> None:
    """Rename the finished directory into place (over an empty directory, never a full one)."""
    try:
        os.replace(tmp, out)
    except OSError as exc:
        raise OutputError(
            f"{out}: could not put the export in place ({exc.strerror}); something wrote "
            "there during the export",
            "give a new or empty directory, and let one export write it at a time",
        ) from None


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
