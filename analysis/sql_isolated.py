"""One console query in a process of its own (the dashboard's SQL page).

Why a process: a server answers many users, so one query must not change what the next one
sees, and must not take the server's memory or time with it. The query's process (a fresh
interpreter: nothing of the server, no fork of a threaded process) opens its own sandboxed
connection (sql_console), caps its address space, answers one query, at most `max_bytes` of
Arrow, and exits; the server kills it when it outlives its time limit. One process waits ready
(imports done) for the next query, so a query costs its connection and not an interpreter's
start. At most `CONCURRENT` queries run at once; others wait their turn within their time.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading
import time

import polars as pl
import pyarrow as pa
from ranklens.analysis.sql_console import NARROW, SqlError, query_arrow
from ranklens.analysis.sql_types import to_frame
from ranklens.ingest.errors import RanklensError

CONCURRENT = 2  # console queries running at once per server
GRACE_S = 10.0  # beyond the query's own time limit (a cold process imports first)
_slots = threading.BoundedSemaphore(CONCURRENT)
_lock = threading.Lock()
_ready: list[subprocess.Popen[bytes]] = []


def run_sql_isolated(
    db_path: str | os.PathLike[str],
    query: str,
    *,
    max_rows: int | None,
    timeout_s: float,
    max_bytes: int,
) -> pl.DataFrame:
    """`sql_console.run_sql` in a process of its own: nothing survives the query."""
    start = time.monotonic()
    if not _slots.acquire(timeout=timeout_s):
        raise SqlError(f"the console is busy ({CONCURRENT} queries running); try again", None)
    try:
        left = max(timeout_s - (time.monotonic() - start), 0.1)
        request: dict[str, object] = {
            "db": str(db_path),
            "query": query,
            "max_rows": max_rows,
            "timeout_s": left,
            "max_bytes": max_bytes,
        }
        return to_frame(_ask(_take(), request, left))
    finally:
        _slots.release()


def _take() -> subprocess.Popen[bytes]:
    """A query process (the ready one if alive), and a new one made ready for the next."""
    with _lock:
        proc = None
        while _ready and proc is None:
            cand = _ready.pop()
            proc = cand if cand.poll() is None else None
        _ready.append(_start())
    return proc if proc is not None else _start()


def _start() -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "ranklens.analysis.sql_isolated"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )


@atexit.register
def _stop_ready() -> None:
    with _lock:
        for proc in _ready:
            proc.kill()
            proc.wait()
        _ready.clear()


def _ask(proc: subprocess.Popen[bytes], request: dict[str, object], timeout_s: float) -> pa.Table:
    """Send the request, read (a header line, an Arrow IPC stream); kill a process that
    outlives the query's time limit by GRACE_S."""
    try:
        out, _ = proc.communicate(json.dumps(request).encode(), timeout=timeout_s + GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise SqlError(
            f"query stopped after {timeout_s:.0f} s (the console's time limit)", NARROW
        ) from None
    head, _, body = out.partition(b"\n")
    try:
        answer = json.loads(head)
    except ValueError:
        raise SqlError(
            "the query's process ended without an answer (out of memory?)", NARROW
        ) from None
    if "error" in answer:
        raise SqlError(str(answer["error"]), answer.get("hint"))
    with pa.ipc.open_stream(body) as reader:
        return reader.read_all()


def _serve() -> None:
    """In the query's process: read one request from stdin, answer on stdout, exit."""
    raw = sys.stdin.buffer.read()
    if not raw:  # the server went away before asking
        return
    out = sys.stdout.buffer
    try:
        req = json.loads(raw)
        table = query_arrow(
            req["db"], req["query"], req["max_rows"], req["timeout_s"], req["max_bytes"]
        )
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        out.write(b'{"ok": true}\n')
        out.write(sink.getvalue().to_pybytes())
    except RanklensError as exc:
        out.write(json.dumps({"error": exc.message, "hint": exc.hint}).encode() + b"\n")
    except MemoryError:
        out.write(json.dumps({"error": "the query ran out of memory", "hint": NARROW}).encode())
    except Exception as exc:  # the server gets a message, never a traceback
        out.write(json.dumps({"error": f"the query failed ({type(exc).__name__})"}).encode())
    out.flush()


if __name__ == "__main__":
    _serve()
