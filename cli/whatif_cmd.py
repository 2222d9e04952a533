"""`ranklens whatif`: what each fix would save, by replaying the run's dependency graph."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from ranklens.analysis import whatif_run
from ranklens.cli.app import FROM_FLAGS, SourceArg, app, out, run_options
from ranklens.ingest.run import OpenOptions, open_run
from rich.table import Table


@app.command()
@run_options
def whatif(
    source: SourceArg,
    fix: Annotated[
        list[str] | None,
        typer.Option(
            help="straggler[:RANK,...], stage-balance, balance:PAR, contention or overlap:PAR (dp, "
            "tp, pp, cp, ...); repeat for several. Default: every one that applies."
        ),
    ] = None,
    scale_comm: Annotated[
        list[str] | None, typer.Option(help="PAR=F: its transfers F times faster (dp=2).")
    ] = None,
    scale_kernels: Annotated[
        list[str] | None,
        typer.Option(help="REGEX=F: matching compute/copy events take F times as long."),
    ] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table or json.")] = "table",
    opts: OpenOptions = FROM_FLAGS,
) -> None:
    """Replay the cross-rank dependency graph with each fix (same order and dependencies,
    changed durations) and print the predicted step time and the saving per scenario."""
    if fmt not in ("table", "json"):
        raise typer.BadParameter(f"unknown format {fmt!r}; use table or json")
    names = [*(fix or []), *(f"scale-comm:{s}" for s in scale_comm or [])]
    names += [f"scale-kernels:{s}" for s in scale_kernels or []]
    scenarios = whatif_run.parse_all(names)  # a typo fails before any work
    with open_run(source, opts) as run:
        ans = whatif_run.answer(run.con, scenarios)
    if fmt == "json":
        out.out(json.dumps(ans, indent=2), highlight=False)
        return
    ms = 1e6
    out.print(
        f"measured step {ans['measured_step_ns'] / ms:.3f} ms (mean of steps {ans['steps']}); "
        f"replayed {ans['replayed_step_ns'] / ms:.3f} ms (error {ans['replay_error']:+.2%})",
        highlight=False,
    )
    table = Table("scenario", "predicted ms/step", "saves ms/step", "saves %", "note")
    for s in ans["scenarios"]:
        table.add_row(
            s["name"],
            f"{s['predicted_step_ns'] / ms:.3f}",
            f"{s['saving_ns'] / ms:.3f}",
            f"{s['saving_share']:.1%}",
            s["note"] or "",
        )
    out.print(table)
    if ans["unmatched_note"]:
        out.print(f"[yellow]note:[/] {ans['unmatched_note']}", highlight=False)
