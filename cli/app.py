"""The `ranklens` Typer app and what every command shares: consoles, options, error output.

Exit codes: 0 ok, 1 error (bad input, with `error:` and `hint:`), 2 usage error,
3 a `check` threshold was exceeded.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from ranklens.ingest import RanklensError
from ranklens.ingest.run import OpenOptions, resolve_open_options
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn
from typer.core import TyperGroup

from ranklens import __version__

EXIT_HELP = "Exit codes: 0 ok, 1 error, 2 usage error, 3 check threshold exceeded."


class _Commands(TyperGroup):
    """The command group. A RanklensError from any command (or its option parsing) ends as
    `error:`/`hint:` lines and exit 1 here, once, so no command catches it itself."""

    def invoke(self, ctx: Any) -> Any:  # Any: click's Context, or typer's vendored one
        try:
            return super().invoke(ctx)
        except RanklensError as exc:
            raise fail(exc) from None


app = typer.Typer(
    cls=_Commands,
    name="ranklens",
    help="Where did each training step's time go, on which rank, and what to change.\n\n"
    + EXIT_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help texts are plain: "[tool.ranklens]" must not read as markup
)
out = Console(soft_wrap=False)
err = Console(stderr=True, soft_wrap=True)  # one line per message: greppable CI logs
state = {"debug": False}

SourceArg = Annotated[
    list[str], typer.Argument(help="A ranklens database, or trace inputs.")
]  # what every command reading a run takes
FormatOpt = Annotated[
    str, typer.Option("--format", "-f", help="table (rich text), json, csv or markdown.")
]
NoStoreOpt = Annotated[
    bool,
    typer.Option(
        "--no-store",
        help="Leave a database whose stored results are missing or stale as it is (they are "
        "computed, not kept).",
    ),
]
SkipBadOpt = Annotated[
    bool, typer.Option("--skip-bad", help="Skip unreadable files (listed in the report).")
]
WorkersOpt = Annotated[
    int | None,
    typer.Option("--workers", min=1, help="Decoding processes (default: CPUs, at most 8)."),
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


def progress_bar() -> Progress:
    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )


def open_options(
    skip_bad: bool = False,
    workers: int | None = None,
    allow_mixed: bool = False,
    no_align: bool = False,
    offsets: Path | None = None,
    layout: str | None = None,
) -> OpenOptions:
    """How every command opens a run: flags, else [tool.ranklens] of ./pyproject.toml."""
    return resolve_open_options(
        skip_bad=skip_bad,
        workers=workers,
        allow_mixed=allow_mixed,
        no_align=no_align,
        offsets=offsets,
        layout=layout,
    )


# the options that say how a run is opened, declared once: (parameter, annotation, default)
_RUN_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    ("skip_bad", SkipBadOpt, False),
    ("workers", WorkersOpt, None),
    ("allow_mixed", AllowMixedOpt, False),
    ("no_align", NoAlignOpt, False),
    ("offsets", OffsetsOpt, None),
    ("layout", LayoutOpt, None),
)
FROM_FLAGS: Any = None  # `opts`' default in a command's own signature; run_options fills it


def run_options(command: Callable[..., None]) -> Callable[..., None]:
    """Give `command` the options that say how a run is opened (--skip-bad, --workers,
    --allow-mixed, --no-align, --offsets, --layout) where its `opts` parameter stands, and pass
    them to it as `opts` (open_options: flags, else [tool.ranklens]).

    Why generated: every command that opens a run takes them; typer reads the signature."""
    sig = inspect.signature(command, eval_str=True)
    params = list(sig.parameters.values())
    at = [p.name for p in params].index("opts")
    params[at : at + 1] = [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=d, annotation=a)
        for name, a, d in _RUN_OPTIONS
    ]

    @functools.wraps(command)
    def with_options(**kwargs: Any) -> None:
        flags = {name: kwargs.pop(name) for name, _, _ in _RUN_OPTIONS}
        command(**kwargs, opts=open_options(**flags))

    with_options.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    return with_options


def internal_error(exc: BaseException) -> int:
    """The last resort for an exception no layer foresaw: one line, never a traceback (those
    are for --debug), exit 1."""
    what = (str(exc).splitlines() or [""])[0][:300]
    err.print(f"[bold red]error:[/] internal error: {type(exc).__name__}: {escape(what)}")
    err.print("[bold]hint:[/] run again with --debug for the traceback and report it")
    return 1


def fail(exc: RanklensError) -> typer.Exit:
    """The `error:`/`hint:` lines of a RanklensError and exit 1 (--debug: the traceback)."""
    if state["debug"]:
        raise exc
    err.print(f"[bold red]error:[/] {escape(exc.message)}", highlight=False)
    if exc.hint:
        err.print(f"[bold]hint:[/] {escape(exc.hint)}", highlight=False)
    return typer.Exit(1)


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
    version: Annotated[bool, typer.Option("--version", help="Print the version.")] = False,
) -> None:
    state["debug"] = debug
    if version:
        out.print(f"ranklens {__version__}")
        raise typer.Exit(0)
