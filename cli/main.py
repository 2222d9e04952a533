"""The `ranklens` command. It narrates and renders; every number comes from ranklens.analysis.

Exit codes: 0 ok, 1 error (bad input, with `error:` and `hint:`), 2 usage error,
3 a `check` threshold was exceeded.
"""

from __future__ import annotations

import os
import sys
from importlib import resources
from pathlib import Path
from typing import Annotated

import typer
from ranklens.analysis import BY_NAME, check_config
from ranklens.analysis import baseline as baseline_mod
from ranklens.analysis import check as check_mod
from ranklens.analysis.report import build_report
from ranklens.analysis.sql_console import SqlError, run_sql
from ranklens.analysis.views import install_views
from ranklens.cli import capture_run, check_render, render
from ranklens.ingest import RanklensError, load_traces
from ranklens.ingest.config import RunOptions, pyproject_section, resolve_options
from ranklens.ingest.database import open_run
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

from ranklens import __version__

EXIT_HELP = "Exit codes: 0 ok, 1 error, 2 usage error, 3 check threshold exceeded."

app = typer.Typer(
    name="ranklens",
    help="Where did each training step's time go, on which rank, and what to change.\n\n"
    + EXIT_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console(soft_wrap=False)
err = Console(stderr=True)
_state = {"debug": False}

FormatOpt = Annotated[
    str, typer.Option("--format", "-f", help="table (rich text), json, csv or markdown.")
]
SkipBadOpt = Annotated[
    bool, typer.Option("--skip-bad", help="Skip unreadable files (listed in the report).")
]
AllowMixedOpt = Annotated[
    bool,
    typer.Option(
        "--allow-mixed", help="Ingest Kineto and Nsight files together (refused by default)."
    ),
]
NoAlignOpt = Annotated[
    bool, typer.Option("--no-align", help="Keep raw clocks (no cross-host offset estimate).")
]
OffsetsOpt = Annotated[
    Path | None,
    typer.Option(
        "--offsets", help='JSON of clock offsets in ns per rank or host: {"0": 0, "4": -1200}.'
    ),
]
LayoutOpt = Annotated[
    str | None,
    typer.Option(
        "--layout",
        help="Parallel layout to label groups from their ranks: tp=2,pp=2,dp=2"
        "[,order=tp-cp-ep-dp-pp] (fastest first). Default: [tool.ranklens] layout.",
    ),
]


def _progress() -> Progress:
    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )


def _options(no_align: bool, offsets: Path | None, layout: str | None) -> RunOptions:
    """Cross-rank options: flags, else [tool.ranklens] of ./pyproject.toml, else defaults."""
    try:
        return resolve_options(
            no_align=no_align, offsets_file=offsets, layout=layout, section=pyproject_section()
        )
    except RanklensError as exc:
        raise _fail(exc) from None


def _fail(exc: RanklensError) -> typer.Exit:
    if _state["debug"]:
        raise exc
    err.print(f"[bold red]error:[/] {exc.message}", highlight=False)
    if exc.hint:
        err.print(f"[bold]hint:[/] {exc.hint}", highlight=False)
    return typer.Exit(1)


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
    version: Annotated[bool, typer.Option("--version", help="Print the version.")] = False,
) -> None:
    _state["debug"] = debug
    if version:
        out.print(f"ranklens {__version__}")
        raise typer.Exit(0)


@app.command()
def ingest(
    inputs: Annotated[list[str], typer.Argument(help="Run directory, glob, or trace files.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="DuckDB file to write.")],
    skip_bad: SkipBadOpt = False,
    workers: Annotated[int | None, typer.Option(help="Worker processes (default: CPUs).")] = None,
    allow_mixed: AllowMixedOpt = False,
    no_align: NoAlignOpt = False,
    offsets: OffsetsOpt = None,
    layout: LayoutOpt = None,
) -> None:
    """Load one trace per rank (Kineto JSON/.json.gz, Nsight SQLite) into a DuckDB file."""
    opts = _options(no_align, offsets, layout)
    try:
        with _progress() as prog:
            task = prog.add_task("ingesting", total=None)
            rep = load_traces(
                inputs,
                output,
                on_error="skip" if skip_bad else "raise",
                workers=workers,
                progress=lambda done, total: prog.update(task, completed=done, total=total),
                options=opts,
                allow_mixed=allow_mixed,
            )
        install_views(output)
    except RanklensError as exc:
        raise _fail(exc) from None
    out.print(f"ingested {len(rep.ranks)} rank(s), {rep.n_events:,} events -> {output}")
    for s in rep.skipped:
        err.print(f"[yellow]skipped:[/] {s.path}: {s.reason}", highlight=False)
    for w in rep.warnings:
        err.print(f"[yellow]warning:[/] {w}", highlight=False)


def _report(
    source: list[str],
    fmt: str,
    skip_bad: bool,
    opts: RunOptions | None = None,
    allow_mixed: bool = False,
) -> None:
    if fmt not in render.FORMATS:
        raise typer.BadParameter(f"unknown format {fmt!r}; use one of {render.FORMATS}")
    try:
        with _progress() as prog:
            task = prog.add_task("ingesting", total=None)
            with open_run(
                source,
                on_error="skip" if skip_bad else "raise",
                progress=lambda d, t: prog.update(task, completed=d, total=t),
                options=opts,
                allow_mixed=allow_mixed,
            ) as (con, _):
                rep = build_report(con)
    except RanklensError as exc:
        raise _fail(exc) from None
    if fmt == "json":
        out.out(render.report_json(rep), highlight=False)
    elif fmt == "csv":
        out.out(render.report_csv(rep), end="", highlight=False)
    elif fmt == "markdown":
        out.out(render.report_markdown(rep), end="", highlight=False)
    else:
        render.render_table(rep, out)


@app.command()
def report(
    source: Annotated[list[str], typer.Argument(help="A ranklens database, or trace inputs.")],
    fmt: FormatOpt = "table",
    skip_bad: SkipBadOpt = False,
    allow_mixed: AllowMixedOpt = False,
    no_align: NoAlignOpt = False,
    offsets: OffsetsOpt = None,
    layout: LayoutOpt = None,
) -> None:
    """Findings ranked by time at stake, then per-rank breakdown, overlap and parallelism,
    alignment quality and stragglers. Alignment/layout options apply to trace inputs."""
    _report(source, fmt, skip_bad, _options(no_align, offsets, layout), allow_mixed)


@app.command()
def analyze(
    name: Annotated[str, typer.Argument(help="Analysis: " + ", ".join(BY_NAME))],
    source: Annotated[list[str], typer.Argument(help="A ranklens database, or trace inputs.")],
    fmt: FormatOpt = "table",
    table: Annotated[str | None, typer.Option(help="Secondary table (e.g. by_group).")] = None,
    no_align: NoAlignOpt = False,
    offsets: OffsetsOpt = None,
    layout: LayoutOpt = None,
) -> None:
    """Run one analysis and print its table (or a secondary table) and findings."""
    if name not in BY_NAME:
        raise typer.BadParameter(f"unknown analysis {name!r}; choose from {', '.join(BY_NAME)}")
    opts = _options(no_align, offsets, layout)
    try:
        with open_run(source, options=opts) as (con, _):
            res = BY_NAME[name].run(con)
    except RanklensError as exc:
        raise _fail(exc) from None
    df = res.table if table is None else res.tables.get(table)
    if df is None:
        raise typer.BadParameter(f"no table {table!r}; have: {', '.join(res.tables)}")
    render.frame_out(df, fmt, out, title=f"{name}{'.' + table if table else ''}")
    if fmt == "table":
        for fd in res.findings:
            out.print(f"[bold]{fd.code}[/] ({fd.severity.value}): {fd.message}\n  fix: {fd.fix}")


@app.command()
def sql(
    database: Annotated[Path, typer.Argument(help="A ranklens DuckDB file.")],
    query: Annotated[str, typer.Argument(help="SQL over tables and analysis views.")],
    fmt: Annotated[
        str, typer.Option("--format", "-f", help="table, csv, json or parquet.")
    ] = "table",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="File (parquet).")] = None,
    max_rows: Annotated[int, typer.Option(help="Row limit for table output.")] = 1000,
) -> None:
    """Read-only SQL over the run: tables (events, steps, ranks, ...) and analysis views."""
    try:
        df = run_sql(database, query, max_rows=None if fmt != "table" else max_rows)
    except SqlError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        err.print(
            "[bold]hint:[/] tables: meta, sources, ranks, process_groups, events, "
            "steps, threads; views: <analysis>_by_step, ...",
            highlight=False,
        )
        raise typer.Exit(1) from None
    except RanklensError as exc:
        raise _fail(exc) from None
    if fmt == "parquet":
        if output is None:
            raise typer.BadParameter("--format parquet needs --output FILE")
        df.write_parquet(output)
        out.print(f"wrote {df.height} rows to {output}")
        return
    if output is not None:
        with open(output, "w") as fh:
            render.frame_out(df, fmt, Console(file=fh, width=10_000), title=None)
        return
    render.frame_out(df, fmt, out)


@app.command()
def demo(
    fmt: FormatOpt = "table",
    scenario: Annotated[
        str, typer.Option(help="Bundled scenario to analyze.")
    ] = "megatron_tp2_pp2_dp2",
    layout: LayoutOpt = None,
) -> None:
    """Ingest the bundled sample traces (a real 8-rank torch.distributed run) and report."""
    base = resources.files("ranklens.sample_traces")
    raw = Path(str(base.joinpath(scenario, "raw")))
    if not raw.is_dir():
        names = sorted(p.name for p in Path(str(base)).iterdir() if (p / "raw").is_dir())
        raise _fail(
            RanklensError(f"no bundled scenario {scenario!r}", f"choose one of: {', '.join(names)}")
        )
    err.print(f"demo: {scenario} ({len(list(raw.iterdir()))} rank files in {raw})")
    _report([str(raw)], fmt, False, _options(False, None, layout))


_THRESHOLD_HELP = "Fraction (0.25) or percentage (25%)."


@app.command()
def check(
    source: Annotated[list[str], typer.Argument(help="A ranklens database, or trace inputs.")],
    max_bubble: Annotated[
        str | None, typer.Option(help="Pipeline bubble, per stage. " + _THRESHOLD_HELP)
    ] = None,
    max_exposed_comm: Annotated[
        str | None,
        typer.Option(help="Exposed comm share per parallelism: 0.1, or dp=0.05,tp=0.10."),
    ] = None,
    min_overlap: Annotated[str | None, typer.Option(help="Overlap ratio per rank.")] = None,
    max_comm_share: Annotated[str | None, typer.Option(help="Comm share per rank.")] = None,
    max_idle: Annotated[str | None, typer.Option(help="Idle share per rank.")] = None,
    max_straggler_wait: Annotated[
        str | None, typer.Option(help="Share of the step others wait for one rank.")
    ] = None,
    max_align_residual_us: Annotated[
        str | None, typer.Option(help="Clock alignment residual per rank, µs.")
    ] = None,
    baseline: Annotated[
        str | None, typer.Option(help="Baseline run (database or trace directory) to compare with.")
    ] = None,
    max_regression: Annotated[
        str | None, typer.Option(help="Regression allowed vs --baseline (5%).")
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
    skip_bad: SkipBadOpt = False,
) -> None:
    """Fail a CI job (exit 3) when bubbles, exposed communication or regressions pass a
    threshold. Thresholds: flag > --config / [tool.ranklens.check] > none."""
    if fmt not in check_render.CHECK_FORMATS:
        raise typer.BadParameter(f"unknown format {fmt!r}; use {check_render.CHECK_FORMATS}")
    flags = {
        "max_bubble": max_bubble,
        "max_exposed_comm": max_exposed_comm,
        "min_overlap": min_overlap,
        "max_comm_share": max_comm_share,
        "max_idle": max_idle,
        "max_straggler_wait": max_straggler_wait,
        "max_align_residual_us": max_align_residual_us,
        "max_regression": max_regression,
    }
    try:
        cfg = check_config.resolve(flags, config)
        if baseline is not None and "max_regression" not in cfg.values:
            cfg = check_config.resolve({**flags, "max_regression": "5%"}, config)
        with open_run(source, on_error="skip" if skip_bad else "raise") as (con, _):
            verdicts = check_mod.evaluate(con, cfg)
            regressions: list[str] = []
            if baseline is not None:
                with open_run([baseline]) as (bcon, _):
                    changes = baseline_mod.compare(con, bcon, cfg.values["max_regression"])
                regressions = baseline_mod.summarize(changes)
                verdicts.append(
                    baseline_mod.verdict(
                        changes, cfg.values["max_regression"], cfg.sources["max_regression"]
                    )
                )
    except RanklensError as exc:
        raise _fail(exc) from None
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
    try:
        result = capture_run.run(command, out_dir, steps=steps, wait=wait)
    except RanklensError as exc:
        raise _fail(exc) from None
    out.print(f"captured {len(result['ranks'])} rank(s) into {out_dir}: ranks {result['ranks']}")
    out.print(f"next: ranklens report {out_dir}   |   ranklens check {out_dir} --max-bubble 0.25")


@app.command()
def dashboard(
    source: Annotated[list[str], typer.Argument(help="A ranklens database, or trace inputs.")],
    port: Annotated[int, typer.Option(help="Port to serve on.")] = 8050,
    host: Annotated[
        str, typer.Option(help="Interface to bind; 127.0.0.1 keeps it to this machine.")
    ] = "127.0.0.1",
    skip_bad: SkipBadOpt = False,
) -> None:
    """Serve the dashboard: overview, aligned timeline, pipeline, communication, contention and
    stragglers, findings, read-only SQL. Trace inputs are ingested into a temporary database."""
    from ranklens.dashboards.server import serve  # dash loads only for this command

    try:
        serve(
            source,
            host=host,
            port=port,
            on_error="skip" if skip_bad else "raise",
            log=lambda msg: err.print(msg, highlight=False),
        )
    except RanklensError as exc:
        raise _fail(exc) from None


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
