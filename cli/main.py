"""The `ranklens` command. It narrates and renders; every number comes from ranklens.analysis.

Commands live in this module (runs: ingest, report, analyze, sql, demo, dashboard) and in
ci_commands.py (check, capture), whatif_cmd.py (whatif), export_cmd.py (export) and
realign_cmd.py (realign); app.py holds what they share.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from ranklens.analysis import by_name, results_keep, results_store, run_compare
from ranklens.analysis.advice import tailor
from ranklens.analysis.report import build_report
from ranklens.analysis.run_profile import profile
from ranklens.analysis.sql_console import run_sql
from ranklens.cli import render, render_json
from ranklens.cli.app import (
    FROM_FLAGS,
    FormatOpt,
    LayoutOpt,
    NoStoreOpt,
    SourceArg,
    app,
    err,
    fail,
    internal_error,
    open_options,
    out,
    progress_bar,
    run_options,
    state,
)
from ranklens.ingest import RanklensError
from ranklens.ingest.engines import ENGINES
from ranklens.ingest.errors import storage_error
from ranklens.ingest.lifecycle import (
    EXIT_TERMINATED,
    handle_sigterm,
    was_stopped,
    was_terminated,
)
from ranklens.ingest.loader import STORAGES
from ranklens.ingest.output import check_result_file, replacing_file
from ranklens.ingest.run import OpenOptions, ingest_traces, open_run
from rich.console import Console
from rich.markup import escape


@app.command()
@run_options
def ingest(
    inputs: Annotated[list[str], typer.Argument(help="Run directory, glob, or trace files.")],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="DuckDB file (or, with shards, directory).")
    ],
    storage: Annotated[
        str,
        typer.Option(
            "--storage",
            help="file: one DuckDB file. shards: a directory with the catalog and each "
            "rank's events as Parquet, written by per-rank tasks (large runs, --engine ray).",
        ),
    ] = "file",
    engine: Annotated[
        str,
        typer.Option("--engine", help="Who reads the ranks of a sharded run: local or ray."),
    ] = "local",
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address",
            help="Ray cluster to use (e.g. auto, ray://head:10001); default: a local Ray.",
        ),
    ] = None,
    results: Annotated[
        str,
        typer.Option(
            "--results",
            help="now: store every analysis' results in the run (faces start fast). later: "
            "the views only; the first report or dashboard stores them (a large capture is "
            "queryable sooner).",
        ),
    ] = "now",
    opts: OpenOptions = FROM_FLAGS,
) -> None:
    """Load one trace per rank (Kineto JSON/.json.gz, Nsight SQLite) into a DuckDB file, or a
    directory of Parquet shards (--storage shards)."""
    if storage not in STORAGES:
        raise typer.BadParameter(f"unknown storage {storage!r}; use one of {STORAGES}")
    if engine not in ENGINES:
        raise typer.BadParameter(f"unknown engine {engine!r}; use one of {ENGINES}")
    if results not in results_keep.WHEN:
        raise typer.BadParameter(f"unknown --results {results!r}; use one of {results_keep.WHEN}")
    with progress_bar() as prog:
        task = prog.add_task("ingesting", total=None)
        rep = ingest_traces(
            list(inputs),
            output,
            opts,
            progress=lambda done, total: prog.update(task, completed=done, total=total),
            finalize=results_keep.finalizer(results),  # before the atomic rename
            storage="shards" if engine == "ray" else storage,
            engine=engine,
            ray_address=ray_address,
        )
    out.print(f"ingested {len(rep.ranks)} rank(s), {rep.n_events:,} events -> {output}")
    last = "views" if results == "later" else "stored results"
    out.print(render.ingest_seconds(rep.seconds, last), highlight=False)
    for s in rep.skipped:
        err.print(f"[yellow]skipped:[/] {escape(s.message)}", highlight=False)
    for w in rep.warnings:
        err.print(f"[yellow]warning:[/] {escape(w)}", highlight=False)
    if results == "later":
        err.print(f"note: {results_keep.LATER_NOTE}", highlight=False)


def _report(source: list[str], fmt: str, opts: OpenOptions, store: bool = True) -> None:
    if fmt not in render.FORMATS:
        raise typer.BadParameter(f"unknown format {fmt!r}; use one of {render.FORMATS}")
    with progress_bar() as prog:
        task = prog.add_task("ingesting", total=None)
        with open_run(
            source, opts, progress=lambda d, t: prog.update(task, completed=d, total=t)
        ) as run:
            if store:  # a database's results stored at first use
                results_keep.keep_run(run, log=_note)
            rep = build_report(run.con)
    if fmt == "json":
        render_json.write_report_json(rep, out.file)  # a table at a time: gigabytes at scale
    elif fmt == "csv":
        out.out(render.report_csv(rep), end="", highlight=False)
    elif fmt == "markdown":
        out.out(render.report_markdown(rep), end="", highlight=False)
    else:
        render.render_table(rep, out)


@app.command()
@run_options
def report(
    source: SourceArg,
    fmt: FormatOpt = "table",
    opts: OpenOptions = FROM_FLAGS,
    no_store: NoStoreOpt = False,
) -> None:
    """Findings ranked by time at stake, then per-rank breakdown, overlap and parallelism,
    alignment quality and stragglers. Alignment/layout options apply to trace inputs. A
    database whose results are missing or stale (ingest --results later, another ranklens)
    gets them stored, atomically, when it can be written (not with --no-store)."""
    _report(source, fmt, opts, store=not no_store)


def _note(msg: str) -> None:
    err.print(f"note: {escape(msg)}", highlight=False)


@app.command()
@run_options
def analyze(
    name: Annotated[str, typer.Argument(help="Analysis: " + ", ".join(by_name()))],
    source: SourceArg,
    fmt: FormatOpt = "table",
    table: Annotated[str | None, typer.Option(help="Secondary table (e.g. by_group).")] = None,
    opts: OpenOptions = FROM_FLAGS,
) -> None:
    """Run one analysis and print its table (or a secondary table) and findings: its result
    stored in the run when fresh (results_store), else computed."""
    analyses = by_name()
    if name not in analyses:
        raise typer.BadParameter(f"unknown analysis {name!r}; choose from {', '.join(analyses)}")
    with open_run(source, opts) as run:
        res = results_store.compute_or_load(run.con, analyses[name])
        res = replace(res, findings=tuple(tailor(list(res.findings), profile(run.con))))
    df = res.table if table is None else res.tables.get(table)
    if df is None:
        raise typer.BadParameter(f"no table {table!r}; have: {', '.join(res.tables)}")
    render.frame_out(df, fmt, out, title=f"{name}{'.' + table if table else ''}")
    if fmt == "table":
        for fd in res.findings:
            out.print(f"[bold]{fd.code}[/] ({fd.severity.value}): {fd.message}\n  fix: {fd.fix}")


@app.command()
@run_options
def sql(
    database: Annotated[
        str, typer.Argument(help="A ranklens DuckDB file, or trace inputs (a directory, a glob).")
    ],
    query: Annotated[str, typer.Argument(help="SQL over tables and analysis views.")],
    fmt: Annotated[
        str, typer.Option("--format", "-f", help="table, csv, json or parquet.")
    ] = "table",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="File (parquet).")] = None,
    max_rows: Annotated[int, typer.Option(help="Row limit for table output.")] = 1000,
    opts: OpenOptions = FROM_FLAGS,
) -> None:
    """Read-only SQL over the run: tables (events, steps, ranks, ...) and analysis views."""
    if fmt == "parquet" and output is None:
        raise typer.BadParameter("--format parquet needs --output FILE")
    if output is not None:
        check_result_file(output, [database])  # never over an input, a run or a trace
    with open_run([database], opts) as run:  # the console opens run.db_path sandboxed
        df = run_sql(run.db_path, query, max_rows=None if fmt != "table" else max_rows)
    if output is None:
        render.frame_out(df, fmt, out)
        return
    with replacing_file(output) as tmp:  # the old file stays if the write is cut short
        if fmt == "parquet":
            df.write_parquet(tmp)
        else:
            with open(tmp, "w") as fh:
                render.frame_out(df, fmt, Console(file=fh, width=10_000), title=None)
    if fmt == "parquet":
        out.print(f"wrote {df.height} rows to {output}")


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
        raise RanklensError(
            f"no bundled scenario {scenario!r}", f"choose one of: {', '.join(names)}"
        )
    err.print(f"demo: {scenario} ({len(list(raw.iterdir()))} rank files in {raw})")
    _report([str(raw)], fmt, open_options(layout=layout))


@app.command()
@run_options
def dashboard(
    source: SourceArg,
    port: Annotated[int, typer.Option(help="Port to serve on (0: any free one).")] = 8050,
    host: Annotated[
        str, typer.Option(help="Interface to bind; 127.0.0.1 keeps it to this machine.")
    ] = "127.0.0.1",
    opts: OpenOptions = FROM_FLAGS,
    baseline: Annotated[
        str | None,
        typer.Option(
            help="A baseline run (database or trace directory) for the Compare page, "
            "judged as `check --baseline` judges it."
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            help="Thresholds for the Compare page, as `check --config` reads them "
            "([check] table or pyproject's [tool.ranklens.check])."
        ),
    ] = None,
    max_regression: Annotated[
        str | None,
        typer.Option(help="Regression allowed vs --baseline on the Compare page (5%), as check's."),
    ] = None,
    no_store: NoStoreOpt = False,
) -> None:
    """Serve the dashboard: overview, aligned timeline, pipeline, communication, contention and
    stragglers, findings, a comparison with --baseline, read-only SQL. Trace inputs are
    ingested into a temporary database. The Compare page's verdict is `ranklens check RUN
    --baseline BASE` with the same --config and --max-regression."""
    from ranklens.dashboards.server import serve  # dash loads only for this command

    thresholds = None
    if baseline is not None:  # resolved before anything is read: a bad value is check's error
        thresholds = run_compare.baseline_config({"max_regression": max_regression}, config)
    elif config is not None or max_regression is not None:
        raise RanklensError(
            "--config and --max-regression set the Compare page's thresholds, which needs a "
            "baseline",
            "add --baseline BASE (a ranklens database or trace directory)",
        )

    serve(
        source,
        opts,
        host=host,
        port=port,
        log=lambda msg: err.print(msg, highlight=False),
        baseline=baseline,
        check_config=thresholds,
        store=not no_store,
    )


# Registered last so `ranklens --help` lists the run commands first.
from ranklens.cli import ci_commands, export_cmd, realign_cmd, whatif_cmd  # noqa: E402, F401


def main() -> None:
    """Console-script entry point: SIGTERM unwinds like Ctrl+C (cleanup runs, exit 143), and
    nothing unforeseen ends in a traceback unless --debug asks for it."""
    handle_sigterm()
    try:
        app()
    except SystemExit as exc:
        # Typer ends Ctrl+C (and SIGTERM, already unwound) with 130; a server that swallowed
        # the interrupt (werkzeug) returns normally. Either way a SIGTERM'd run ends with 143.
        if was_terminated():
            _stopped("terminated", EXIT_TERMINATED)
        if exc.code == 130:
            _stopped("interrupted", 130)
        raise
    except KeyboardInterrupt:
        if was_terminated():
            _stopped("terminated", EXIT_TERMINATED)
        _stopped("interrupted", 130)
    except GeneratorExit:
        raise
    except BaseException as exc:  # also native panics (pyo3's PanicException)
        # DuckDB turns a signal that arrives during a query into its own "Query interrupted"
        # error, or, raised in Python code it was calling, an InvalidInputException, losing
        # the KeyboardInterrupt (or Terminated): every cleanup has run all the same.
        if was_terminated():
            _stopped("terminated", EXIT_TERMINATED)
        if _interrupted_query(exc) or was_stopped():
            _stopped("interrupted", 130)
        if isinstance(exc, Exception) and (full := storage_error(exc)) is not None:
            fail(full)  # a full disk (export, realign...): `error:` and `hint:`, exit 1
            sys.exit(1)
        if state["debug"]:
            raise
        sys.exit(internal_error(exc))


def _stopped(said: str, code: int) -> NoReturn:
    """Say how a stopped run ended and exit `code`. A second Ctrl+C while it says so (rich
    imports its emoji table on the first print) printed a traceback and died of the signal."""
    with contextlib.suppress(KeyboardInterrupt):
        err.print(said)
    sys.exit(code)


def _interrupted_query(exc: BaseException) -> bool:
    """A DuckDB query stopped by Ctrl+C (DuckDB's own error for it)."""
    return isinstance(exc, RuntimeError) and str(exc).startswith("Query interrupted")
