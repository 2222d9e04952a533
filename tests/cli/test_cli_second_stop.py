"""The CLI's last words survive a second Ctrl+C (tests/ingest/test_second_stop.py: the rest of
the way out)."""

from __future__ import annotations

import pytest
from ranklens.cli import main as cli


def test_a_stop_while_saying_interrupted_still_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's last words: a second Ctrl+C that lands in them (rich imports its emoji table
    on the first print) printed a traceback and died of the signal (2 of 10 on Nsight)."""

    def print_stopped(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.err, "print", print_stopped)
    with pytest.raises(SystemExit) as ended:
        cli._stopped("interrupted", 130)
    assert ended.value.code == 130
