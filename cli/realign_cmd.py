"""`ranklens realign`: the cross-rank stage again on a stored run (logic in ingest/realign.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from ranklens.analysis.results_store import finalize_run
from ranklens.cli.app import LayoutOpt, NoAlignOpt, OffsetsOpt, app, open_options, out
from ranklens.ingest.realign import realign_run


@app.command()
def realign(
    run: Annotated[Path, typer.Argument(help="A ranklens database (written by ingest).")],
    no_align: NoAlignOpt = False,
    offsets: OffsetsOpt = None,
    layout: LayoutOpt = None,
) -> None:
    """Re-run collective matching, clock alignment and group labels on a stored run with these
    options (as a fresh ingest with them would; options left out come from [tool.ranklens],
    not from the earlier ingest). The database is replaced atomically; traces are not read."""
    opts = open_options(no_align=no_align, offsets=offsets, layout=layout).cross
    rep = realign_run(run, opts, finalize=finalize_run)  # stored results recomputed with it
    residual = "-" if rep.max_residual_ns is None else f"{rep.max_residual_ns:,} ns"
    out.print(
        f"realigned {rep.db_path}: {rep.matched:,} of {rep.comm_ops:,} comm ops matched; "
        f"clocks: {rep.align_method} (max residual {residual}); "
        f"layout: {rep.layout or 'none'}",
        highlight=False,
        soft_wrap=True,
    )
