"""A stop (SIGTERM, Ctrl+C) that lands while DuckDB scans an Arrow stream fed by Python code
(a rank's pieces being written) comes out of the query as DuckDB's InvalidInputException, a
Python traceback in its text. It must end the run as the stop it is, never as "cannot read
the file" naming a good rank (seen once in CI: test_sigterm_cleans_up_and_exits_143)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from ranklens.ingest import lifecycle
from ranklens.ingest.errors import TraceFormatError
from ranklens.ingest.sink import IngestReport, Sink

SIGNALS = {"sigterm": signal.SIGTERM, "ctrl-c": signal.SIGINT}


@pytest.fixture
def handlers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The entry point's real handlers, put back afterwards."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    monkeypatch.setattr(lifecycle, "_received", [])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    lifecycle.handle_sigterm()
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


def _write_rank_stopped_by(sig: int | None, path: str) -> None:
    """Write a rank from a stream in which the handler installed for `sig` runs between two
    batches. Called directly, not through os.kill: Python runs a signal's handler in the main
    thread, and DuckDB may pull the stream from one of its own (the handler would then run
    wherever the main thread is next, making the test flaky)."""

    def batches() -> Iterator[pa.RecordBatch]:
        yield pa.record_batch([pa.array([1, 2])], names=["ts"])
        if sig is not None:
            handler = signal.getsignal(sig)
            assert callable(handler)
            handler(sig, None)
        yield pa.record_batch([pa.array([3])], names=["ts"])
        raise ValueError("a damaged piece")  # what a bad file does, with no signal

    stream = pa.RecordBatchReader.from_batches(pa.schema([("ts", pa.int64())]), batches())
    con = duckdb.connect()
    con.register("stream", stream)
    sink = Sink(con, IngestReport("o.duckdb"), "raise")
    with sink.reading(1, path):
        con.execute("CREATE TABLE t AS SELECT * FROM stream")


@pytest.mark.parametrize("name", list(SIGNALS))
def test_a_stop_in_a_scanned_stream_is_not_the_files_fault(handlers: None, name: str) -> None:
    with pytest.raises(duckdb.InvalidInputException) as raised:
        _write_rank_stopped_by(SIGNALS[name], "/run/rank1.json")
    assert "Traceback" in str(raised.value)  # DuckDB's wrapping, which once named the file
    assert lifecycle.was_stopped()
    assert lifecycle.was_terminated() == (name == "sigterm")


def test_without_a_stop_the_same_failure_is_the_files(handlers: None) -> None:
    with pytest.raises(TraceFormatError, match=r"rank1\.json: cannot read the file"):
        _write_rank_stopped_by(None, "/run/rank1.json")
    assert not lifecycle.was_stopped()


@pytest.mark.parametrize("name", list(SIGNALS))
def test_the_command_ends_as_the_stop(
    handlers: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    name: str,
) -> None:
    from ranklens.cli import main as cli_main

    monkeypatch.setattr(
        cli_main, "app", lambda: _write_rank_stopped_by(SIGNALS[name], str(tmp_path / "r1.json"))
    )
    monkeypatch.setattr(cli_main, "handle_sigterm", lambda: None)  # installed by `handlers`
    with pytest.raises(SystemExit) as stop:
        cli_main.main()
    err = capsys.readouterr().err
    assert stop.value.code == (143 if name == "sigterm" else 130)
    assert err.strip() == ("terminated" if name == "sigterm" else "interrupted")
