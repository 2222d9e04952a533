"""The CI faces of `ranklens`: `check` (thresholds, baseline) and `capture` (profile a run)."""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from ranklens.analysis import baseline as baseline_mod
from ranklens.analysis import check as check_mod
from ranklens.analysis import check_config, run_compare
from ranklens.analysis.thresholds import THRESHOLDS
from ranklens.cli import capture_run, check_render
from ranklens.cli.app import (
    FROM_FLAGS,
    SourceArg,
    app,
    out,
    run_options,
)
from ranklens.ingest.run import OpenOptions, open_run


def threshold_options(command: Callable[..., None]) -> Callable[..., None]:
    """Give `command` a `--NAME` option per declared threshold (analysis/thresholds.py), passed
    in its `**thresholds`: after its arguments, or after `--baseline` for those judged against it.

    Why generated: a threshold is declared once; typer reads the options from the signature."""
    sig = inspect.signature(command, eval_str=True)
    params = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]

    def options(against_baseline: bool) -> list[inspect.Parameter]:
        return [
            inspect.Parameter(
                t.name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=None,
                annotation=Annotated[str | None, typer.Option(help=t.help)],
            )
            for t in THRESHOLDS.values()
            if (t.query is None) == against_baseline
        ]

    args = next(i for i, p in enumerate(params) if p.default is not p.empty)
    at_baseline = [p.name for p in params].index("baseline") + 1
    params = [
        *params[:args],
        *options(False),
        *params[args:at_baseline],
        *options(True),
        *params[at_baseline:],
    ]

    @functools.wraps(command)
    def with_options(**kwargs: Any) -> None:
        command(**kwargs)

    with_options.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    return with_options


@app.command()
@threshold_options
@run_options
def check(
    source: SourceArg,
    baseline: Annotated[
        str | None, typer.Option(help="Baseline run (database or trace directory) to compare with.")
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            help="TOML file with thresholds ([check] table or pyproject's [tool.ranklens.check])."
        ),
    ] = None,
    fmt: Annotated[
        str, typer.Option("--format", "-f", help="text, json, junit or github.")
    ] = "text",
    summary: Annotated[
        Path | None,
        typer.Option(
            help="Also write a Markdown summary here (default with github: $GITHUB_STEP_SUMMARY)."
        ),
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Say where each threshold came from.")
    ] = False,
    allow_skipped: Annotated[
        bool,
        typer.Option(
            "--allow-skipped",
            help="Pass checks the run has no data for (by default they fail: exit 3).",
        ),
    ] = False,
    opts: OpenOptions = FROM_FLAGS,
    **thresholds: str | None,
) -> None:
    """Fail a CI job (exit 3) when bubbles, exposed communication or regressions pass a
    threshold, or a requested check has no data. Thresholds: flag > --config /
    [tool.ranklens.check] > none."""
    if fmt not in check_render.CHECK_FORMATS:
        raise typer.BadParameter(f"unknown format {fmt!r}; use {check_render.CHECK_FORMATS}")
    flags = dict(thresholds)
    if baseline is None:
        cfg = check_config.resolve(flags, config)
    else:
        cfg = run_compare.baseline_config(flags, config)
    regressions: list[str] = []
    with open_run(source, opts) as run:
        if baseline is None:
            verdicts = check_mod.evaluate(run.con, cfg)
        else:  # the dashboard's compare page says the same (run_compare.check_against)
            with open_run([baseline], opts, for_baseline=True) as base:
                verdicts, changes = run_compare.check_against(run.con, base.con, cfg)
            regressions = baseline_mod.summarize(changes)
    if not allow_skipped:
        verdicts = check_mod.unevaluated_fail(verdicts)
    if fmt == "json":
        out.out(check_render.as_json(verdicts, regressions), highlight=False)
    elif fmt == "junit":
        out.out(check_render.as_junit(verdicts), highlight=False, end="")
    elif fmt == "github":
        out.out(check_render.as_github(verdicts), highlight=False, end="")
        env_summary = os.environ.get("GITHUB_STEP_SUMMARY")
        summary = summary or (Path(env_summary) if env_summary else None)
    else:
        check_render.as_text(verdicts, regressions, out, verbose)
    if summary is not None:
        with open(summary, "a") as fh:
            fh.write(check_render.as_markdown(verdicts, regressions))
    raise typer.Exit(check_mod.exit_code(verdicts))


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def capture(
    ctx: typer.Context,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Run directory to write.")] = Path(
        "ranklens-run"
    ),
    steps: Annotated[int, typer.Option(help="Steps to profile on every rank.")] = 3,
    wait: Annotated[int, typer.Option(help="Steps to skip first (warm-up runs after).")] = 1,
) -> None:
    """Run a training command and profile a few steps on every rank, e.g.
    `ranklens capture -o run -- torchrun --nproc-per-node 4 train.py`. Each optimizer.step()
    ends a step; processes with a RANK (torchrun, SLURM) write run/rank{r}.json.gz."""
    command = list(ctx.args)
    if not command:
        raise typer.BadParameter("give the command after --, e.g. -- torchrun ... train.py")
    result = capture_run.run(command, out_dir, steps=steps, wait=wait)
    out.print(f"captured {len(result['ranks'])} rank(s) into {out_dir}: ranks {result['ranks']}")
    out.print(f"next: ranklens report {out_dir}   |   ranklens check {out_dir} --max-bubble 0.25")
