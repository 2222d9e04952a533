"""`ranklens export`: a run's tables as Parquet other engines read (logic in ingest/export.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from ranklens.cli.app import FROM_FLAGS, SourceArg, app, out, run_options
from ranklens.ingest.export import export_run
from ranklens.ingest.run import OpenOptions


@app.command()
@run_options
def export(
    source: SourceArg,
    parquet: Annotated[
        Path,
        typer.Option(
            "--parquet",
            help="New (or empty) directory: per-rank tables as TABLE/rank=N/*.parquet, "
            "the others as TABLE.parquet.",
        ),
    ],
    opts: OpenOptions = FROM_FLAGS,
) -> None:
    """Write every table of the run as Parquet (hive-partitioned by rank where per rank),
    atomically; never into a non-empty directory or over an input."""
    rep = export_run(list(source), parquet, opts)
    out.print(
        f"exported {len(rep.rows)} tables, {rep.total_rows:,} rows -> {parquet} "
        f"(by rank: {', '.join(rep.partitioned) or 'none'})",
        highlight=False,
        soft_wrap=True,
    )
