"""Load many ranks' traces into one DuckDB file.

Why: ranks are independent until the cross-rank tables, so files (and pieces of large files)
decode in worker processes while the main process is the single DuckDB writer. The database is
built under a temporary name and renamed at the end, so an interrupted ingest leaves nothing
half-written, and re-ingesting the same files gives the same database.
"""

from __future__ import annotations

import glob
import os
import shutil
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import duckdb
from ranklens.ingest.config import RunOptions
from ranklens.ingest.crossrank import finish_cross_rank
from ranklens.ingest.errors import NoTracesError
from ranklens.ingest.kineto_schedule import run_parallel, run_serial
from ranklens.ingest.nsys_inputs import split_formats
from ranklens.ingest.post import finish_database
from ranklens.ingest.schema import SCHEMA_VERSION, ddl
from ranklens.ingest.sink import IngestReport, Progress, Sink, Skipped, file_size

__all__ = ["IngestReport", "Progress", "Skipped", "find_traces", "load_traces"]

from ranklens import __version__

TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite", ".nsys-rep")
# Files a run directory may hold beside its traces (capture's manifest, a generator's truth).
NOT_TRACES = frozenset({"manifest.json", "truth.json"})
_SERIAL_BELOW_BYTES = 24 * 1024 * 1024


def find_traces(inputs: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Expand directories, globs and files into a sorted list of trace files."""
    found: list[str] = []
    for item in inputs:
        s = str(item)
        if os.path.isdir(s):
            for root, _dirs, files in os.walk(s):
                found += [
                    os.path.join(root, f)
                    for f in files
                    if f.endswith(TRACE_SUFFIXES) and f not in NOT_TRACES
                ]
        elif any(ch in s for ch in "*?["):
            found += [p for p in glob.glob(s, recursive=True) if os.path.isfile(p)]
        else:
            found.append(s)
    if not found:
        names = ", ".join(str(i) for i in inputs) or "(nothing)"
        raise NoTracesError(
            f"no trace files in {names}",
            "give a directory holding one *.json / *.json.gz (Kineto) or *.sqlite (Nsight) "
            "file per rank, a glob, or the files themselves",
        )
    return sorted(dict.fromkeys(found))


def load_traces(
    inputs: Sequence[str | os.PathLike[str]],
    db_path: str | os.PathLike[str],
    *,
    on_error: str = "raise",
    workers: int | None = None,
    progress: Progress | None = None,
    options: RunOptions | None = None,
    allow_mixed: bool = False,
) -> IngestReport:
    """Ingest trace files into a new DuckDB database at `db_path` (replaced atomically).

    Args:
        inputs: directories, globs or files (one file per rank, or Nsight reports).
        db_path: the database to write.
        on_error: "raise" stops at the first bad file; "skip" records it and goes on.
        workers: worker processes (default: CPU count, at most 8; 1 = in-process).
        progress: called with (bytes done, bytes total) as files complete.
        options: cross-rank options (clock alignment, user offsets, parallel layout).
        allow_mixed: ingest Kineto traces and Nsight reports together (refused by default).

    Raises:
        RanklensError: bad input (with on_error="raise"), or nothing left to ingest.
    """
    if on_error not in ("raise", "skip"):
        raise ValueError("on_error must be 'raise' or 'skip'")
    files, notes = split_formats(find_traces(inputs), allow_mixed=allow_mixed)
    out = Path(db_path)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    for p in (tmp, Path(str(tmp) + ".wal")):
        p.unlink(missing_ok=True)
    report = IngestReport(db_path=str(out), warnings=notes)
    try:
        con = duckdb.connect(str(tmp))
        con.execute("SET enable_progress_bar = false")
        # Bound the writer's memory; DuckDB spills to a temp dir beside the output instead.
        con.execute(f"SET memory_limit = '{_memory_limit_mb(files)}MB'")
        try:
            _ingest(con, files, report, on_error, workers, progress, options)
            con.execute("CHECKPOINT")
        finally:
            con.close()
        os.replace(tmp, out)
        Path(str(out) + ".wal").unlink(missing_ok=True)
    finally:
        tmp.unlink(missing_ok=True)
        Path(str(tmp) + ".wal").unlink(missing_ok=True)
        shutil.rmtree(str(tmp) + ".tmp", ignore_errors=True)  # DuckDB's spill directory
    return report


def _ingest(
    con: duckdb.DuckDBPyConnection,
    files: list[str],
    report: IngestReport,
    on_error: str,
    workers: int | None,
    progress: Progress | None,
    options: RunOptions | None = None,
) -> None:
    con.execute(ddl())
    now = datetime.now(timezone.utc).isoformat()
    con.executemany(
        "INSERT INTO meta VALUES (?, ?)",
        [
            ["schema_version", str(SCHEMA_VERSION)],
            ["tool_version", __version__],
            ["ingested_at", now],
            ["n_files", str(len(files))],
        ],
    )
    sink = Sink(con, report, on_error)
    kin = [f for f in files if not f.endswith((".sqlite", ".nsys-rep"))]
    nsys = [f for f in files if f.endswith((".sqlite", ".nsys-rep"))]
    total = sum(file_size(f) for f in files) or 1
    done = 0
    for tid, f in enumerate(nsys, start=len(kin)):
        sink.nsys(tid, f)
        done += file_size(f)
        if progress:
            progress(done, total)
    big = sum(file_size(f) for f in kin) >= _SERIAL_BELOW_BYTES
    n = workers if workers is not None else min(os.cpu_count() or 1, 8)
    if n <= 1 or not big:
        run_serial(sink, kin, progress, done, total)
    else:
        run_parallel(sink, kin, n, progress, done, total)
    if not sink.rank_of:
        reasons = "; ".join(f"{s.path}: {s.reason}" for s in report.skipped)
        raise NoTracesError(
            f"no trace could be ingested ({reasons})", "fix or remove the bad files"
        )
    finish_database(con, sink.groups)
    if nsys and not kin:
        # Nsight has no process-group metadata: infer communicators from collective sequences.
        # (Kineto runs carry pg_config/args; CPU gloo runs need per-thread attribution instead.)
        from ranklens.ingest.communicators import infer_communicators

        infer_communicators(con)
    finish_cross_rank(con, options)  # gloo groups, matching, clock alignment, attribution
    report.ranks = sorted(sink.rank_of.values())
    report.n_events = int(con.execute("SELECT count(*) FROM events").fetchall()[0][0])


def _memory_limit_mb(files: list[str]) -> int:
    """DuckDB's budget: a third of the input (at least 256 MB), so that with the decoding
    workers the whole ingest stays near the input's size."""
    return max(256, sum(file_size(f) for f in files) // (3 * 2**20))
