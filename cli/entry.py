"""The `ranklens` console script. Why a module of its own: what must happen before the CLI's
imports, and only in the console script's process (and its workers), never in a session that
imports ranklens as a library: the allocators' settings put in the environment before numpy or
pyarrow is imported (lifecycle.settle_allocators), pyarrow's pandas probe settled
(lifecycle.skip_pandas_probe), an ingest's decoding workers' server started so that it
boots beside those imports (workpool.prestart_workers), and a dashboard's port held and
answering the last start's page and scripts meanwhile (dashboards.port.hold_early)."""

from __future__ import annotations

import contextlib
import sys
from typing import NoReturn

# `ingest`'s options that take a value (tests/cli/test_entry.py checks them against the CLI)
INGEST_VALUED = frozenset(
    {
        "-o",
        "--output",
        "--storage",
        "--engine",
        "--ray-address",
        "--workers",
        "--offsets",
        "--layout",
        "--results",
    }
)


def main() -> None:
    """Settle the process, start an ingest's workers' server, then run the CLI (cli.main)."""
    try:
        from ranklens.ingest.lifecycle import settle_allocators, skip_pandas_probe
        from ranklens.ingest.workpool import prestart_workers

        settle_allocators()
        early = dashboard_port(sys.argv[1:])
        if early is not None:  # answers the last start's page while the rest loads
            from ranklens.dashboards.port import hold_early

            hold_early(*early)
        skip_pandas_probe()
        pooled = pooled_ingest(sys.argv[1:])
        if pooled is not None:
            prestart_workers(*pooled)
        from ranklens.cli.main import main as run
    except KeyboardInterrupt:
        _interrupted()
    run()


def _interrupted() -> NoReturn:
    """A Ctrl+C while the command loads (~0.5 s of imports, before the CLI can say it itself):
    the CLI's word and exit code, not a traceback from inside an import."""
    with contextlib.suppress(KeyboardInterrupt):
        sys.stderr.write("interrupted\n")
    sys.exit(130)


def dashboard_port(args: list[str]) -> tuple[str, int] | None:
    """(--host, --port) of a `dashboard` command, with the CLI's defaults; None for any other
    command, --help, or a --port that is not a number. A guess ahead of the CLI's parse, as
    pooled_ingest's: the server takes the port only if the CLI gives the same."""
    if not args or args[0] != "dashboard" or "--help" in args:
        return None
    from ranklens.dashboards.port import DEFAULT_HOST, DEFAULT_PORT

    opts = {"--host": DEFAULT_HOST, "--port": str(DEFAULT_PORT)}
    rest = iter(args[1:])
    for arg in rest:
        if arg == "--":
            break
        name, eq, value = arg.partition("=")
        if name in opts:
            opts[name] = value if eq else next(rest, "")
    port = opts["--port"]
    return (opts["--host"], int(port)) if port.isdigit() else None


def pooled_ingest(args: list[str]) -> tuple[list[str], int | None] | None:
    """(inputs, --workers if given) of an `ingest` whose files local worker processes may
    decode; None for any other command, --help, --engine ray or a --workers that is not a
    number. A reading of the command line ahead of the CLI's, for a guess only: the CLI parses
    it again and checks it."""
    if not args or args[0] != "ingest":
        return None
    inputs: list[str] = []
    opts: dict[str, str] = {}
    rest = iter(args[1:])
    for arg in rest:
        if arg == "--":
            inputs += list(rest)
        elif arg == "--help":
            return None
        elif arg.partition("=")[0] in INGEST_VALUED:
            name, eq, value = arg.partition("=")
            opts[name] = value if eq else next(rest, "")
        elif not arg.startswith("-"):
            inputs.append(arg)
    workers = opts.get("--workers", "")
    if opts.get("--engine") == "ray" or not (workers.isdigit() or workers == ""):
        return None
    return inputs, int(workers) if workers else None
