"""The `ranklens` console script. Why a module of its own: the allocators' settings must be in
the environment before anything imports numpy or pyarrow (lifecycle.settle_allocators), and
pyarrow's pandas probe settled before the CLI's imports run pyarrow
(lifecycle.skip_pandas_probe); both only in the console script's process (and its workers),
never in a session that imports ranklens as a library."""

from __future__ import annotations


def main() -> None:
    """Settle the allocators and pyarrow's pandas probe, then run the CLI (cli.main.main)."""
    from ranklens.ingest.lifecycle import settle_allocators, skip_pandas_probe

    settle_allocators()
    skip_pandas_probe()
    from ranklens.cli.main import main as run

    run()
