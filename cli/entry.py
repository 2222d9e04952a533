"""The `ranklens` console script. Why a module of its own: pyarrow's pandas probe must be
settled before the CLI's imports run pyarrow (lifecycle.skip_pandas_probe), and only in the
console script's process, never in a session that imports ranklens as a library."""

from __future__ import annotations


def main() -> None:
    """Settle pyarrow's pandas probe, then run the CLI (ranklens.cli.main.main)."""
    from ranklens.ingest.lifecycle import skip_pandas_probe

    skip_pandas_probe()
    from ranklens.cli.main import main as run

    run()
