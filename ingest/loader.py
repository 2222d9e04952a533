"""Load many ranks' traces into one DuckDB file.

Why: ranks are independent until the cross-rank tables, so files (and pieces of large files)
decode in worker processes while the main process is the single DuckDB writer. The database is
built under a temporary name and renamed at the end, so an interrupted ingest leaves nothing
half-written, and re-ingesting the same files gives the same database.
"""

from __future__ import annotations

import glob
import multiprocessing as mp
import os
import shutil
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from ranklens.ingest import kineto
from ranklens.ingest._model import RankPart
from ranklens.ingest.config import RunOptions
from ranklens.ingest.crossrank import finish_cross_rank
from ranklens.ingest.errors import NoTracesError, RankError, RanklensError
from ranklens.ingest.nsys_inputs import split_formats
from ranklens.ingest.post import finish_database
from ranklens.ingest.schema import SCHEMA_VERSION, TABLE_BY_NAME, ddl

from ranklens import __version__

TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite", ".nsys-rep")
# Files a run directory may hold beside its traces (capture's manifest, a generator's truth).
NOT_TRACES = frozenset({"manifest.json", "truth.json"})
_SERIAL_BELOW_BYTES = 24 * 1024 * 1024
_EVENT_COLS = TABLE_BY_NAME["events"].column_names

Progress = Callable[[int, int], None]  # (bytes done, bytes total)


@dataclass
class Skipped:
    """A file that was not ingested, and why."""

    path: str
    reason: str


@dataclass
class IngestReport:
    """What an ingest did: ranks loaded, events, files skipped (never silently)."""

    db_path: str
    ranks: list[int] = field(default_factory=list)
    n_events: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


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
    sink = _Sink(con, report, on_error)
    kin = [f for f in files if not f.endswith((".sqlite", ".nsys-rep"))]
    nsys = [f for f in files if f.endswith((".sqlite", ".nsys-rep"))]
    total = sum(_size(f) for f in files) or 1
    done = 0
    for tid, f in enumerate(nsys, start=len(kin)):
        sink.nsys(tid, f)
        done += _size(f)
        if progress:
            progress(done, total)
    big = sum(_size(f) for f in kin) >= _SERIAL_BELOW_BYTES
    n = workers if workers is not None else min(os.cpu_count() or 1, 8)
    if n <= 1 or not big:
        _run_serial(sink, kin, progress, done, total)
    else:
        _run_parallel(sink, kin, n, progress, done, total)
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
    return max(256, sum(_size(f) for f in files) // (3 * 2**20))


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


class _Sink:
    """The single writer: files' results go into the database through here."""

    def __init__(self, con: duckdb.DuckDBPyConnection, report: IngestReport, on_error: str):
        self.con = con
        self.report = report
        self.on_error = on_error
        self.rank_of: dict[tuple[int, str], int] = {}  # (trace_id, path) -> rank
        self.path_of_rank: dict[int, str] = {}
        self.groups: list[dict[str, Any]] = []
        self.threads: set[tuple[int, int, int, str]] = set()

    def fail(self, trace_id: int, path: str, err: RanklensError, size: int = 0) -> None:
        if self.on_error == "raise":
            raise err
        for key in [k for k in self.rank_of if k[0] == trace_id]:
            self.path_of_rank.pop(self.rank_of.pop(key), None)
        for table in ("events", "ranks", "sources"):
            self.con.execute(f"DELETE FROM {table} WHERE trace_id = ?", [trace_id])
        self.report.skipped.append(Skipped(path, err.message))
        self.con.execute(
            "INSERT INTO sources VALUES (?, ?, 'unknown', ?, NULL, NULL, 0, 'skipped', ?)",
            [trace_id, path, size, err.message],
        )

    def claim_rank(self, trace_id: int, path: str, rank: int | None) -> int:
        if rank is None:
            raise RankError(
                f"{path}: cannot tell which rank wrote this trace (no distributedInfo.rank, "
                "no rank number in the file name)",
                "rename the file to include its rank, e.g. rank3.json.gz",
            )
        if rank in self.path_of_rank:
            raise RankError(
                f"{path}: rank {rank} is already claimed by {self.path_of_rank[rank]}",
                "each rank must come from exactly one file; remove the duplicate",
            )
        self.path_of_rank[rank] = path
        self.rank_of[(trace_id, f"{path}#{len(self.rank_of)}")] = rank
        return rank

    def add_events(self, table: pa.Table) -> None:
        self.con.register("_piece", table)
        cols = ", ".join(f'"{c}"' for c in table.column_names)
        self.con.execute(f"INSERT INTO events ({cols}) SELECT {cols} FROM _piece")
        self.con.unregister("_piece")

    def add_rank(
        self,
        trace_id: int,
        path: str,
        fmt: str,
        size: int,
        sha: str | None,
        rank: int,
        info: dict[str, Any],
        n_events: int,
    ) -> None:
        self.con.execute(
            "INSERT INTO sources VALUES (?, ?, ?, ?, ?, ?, ?, 'ok', NULL)",
            [trace_id, path, fmt, size, sha, rank, n_events],
        )
        self.con.execute(
            "INSERT INTO ranks VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 'none', NULL)",
            [
                rank,
                info.get("world_size"),
                trace_id,
                info.get("host"),
                info.get("pid"),
                info.get("backend"),
                info.get("device_name"),
                info.get("num_sms"),
                bool(info.get("has_gpu")),
            ],
        )

    def add_threads(self, rank: int, threads: Iterable[tuple[int, int, str]]) -> None:
        rows = {(rank, p, t, n) for p, t, n in threads}
        if rows:
            self.con.executemany("INSERT INTO threads VALUES (?, ?, ?, ?)", sorted(rows))

    def nsys(self, trace_id: int, path: str) -> None:
        """Nsight reports: each may hold several ranks (one per process)."""
        try:
            from ranklens.ingest.nsys import read_nsys

            parts: list[RankPart] = read_nsys(Path(path), trace_id)
            for part in parts:
                rank = self.claim_rank(
                    trace_id,
                    path,
                    part.rank if part.rank is not None else kineto._rank_from_name(path),
                )
                n = 0
                for t in part.events:
                    t = _with_rank(t, rank, trace_id)
                    self.add_events(t)
                    n += t.num_rows
                self.add_rank(trace_id, path, "nsys", _size(path), None, rank, part.info, n)
                self.add_threads(rank, part.threads)
                self.groups += part.groups
                self.report.warnings += [f"{path}: {w}" for w in part.warnings]
        except RanklensError as err:
            self.fail(trace_id, path, err, _size(path))


def _with_rank(t: pa.Table, rank: int, trace_id: int) -> pa.Table:
    n = t.num_rows
    for name, val in (("rank", rank), ("trace_id", trace_id)):
        col = pa.repeat(pa.scalar(val, pa.int32()), n)
        t = (
            t.set_column(t.column_names.index(name), name, col)
            if name in t.column_names
            else t.append_column(name, col)
        )
    return t


def _finish_file(
    sink: _Sink, tid: int, prep: kineto.Prepared, rank: int, pieces: list[kineto.Piece]
) -> None:
    n = 0
    for pc in pieces:
        n += pc.rows
        sink.add_threads(rank, pc.threads)
        sink.groups += pc.groups
    sink.groups += prep.groups
    sink.add_rank(tid, prep.path, "kineto", prep.size_bytes, prep.sha256, rank, prep.info, n)


def _serial_file(sink: _Sink, tid: int, prep: kineto.Prepared, rank: int) -> None:
    pieces = []
    i = 0
    while i < len(prep.pieces):
        pc = kineto.decode_piece(prep, i, rank, tid, serial=True)
        sink.add_events(pc.table)
        pieces.append(pc)
        i += pc.consumed
    _finish_file(sink, tid, prep, rank, pieces)


def _run_serial(
    sink: _Sink, files: list[str], progress: Progress | None, done: int, total: int
) -> None:
    for tid, f in enumerate(files):
        prep = None
        try:
            prep = kineto.prepare(f)
            rank = sink.claim_rank(tid, f, prep.rank)
            _serial_file(sink, tid, prep, rank)
        except RanklensError as err:
            sink.fail(tid, f, err, _size(f))
        finally:
            if prep is not None:
                kineto.cleanup(prep)
        done += _size(f)
        if progress:
            progress(done, total)


def _run_parallel(
    sink: _Sink, files: list[str], n: int, progress: Progress | None, done: int, total: int
) -> None:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["ranklens.ingest.kineto"])
    with ProcessPoolExecutor(max_workers=n, mp_context=ctx) as pool:
        # Files are prepared (hashed, inflated to temp files) at most `n` ahead of the one being
        # decoded, so temp disk and memory stay bounded however many ranks the run has.
        preps: list[Future[kineto.Prepared]] = []

        def prepare_upto(i: int) -> None:
            while len(preps) < min(len(files), i + n + 1):
                preps.append(pool.submit(kineto.prepare, files[len(preps)], kineto.PIECE_BYTES))

        try:
            for tid, f in enumerate(files):
                prepare_upto(tid)
                fut = preps[tid]
                prep = None
                try:
                    prep = fut.result()
                    rank = sink.claim_rank(tid, f, prep.rank)
                    _parallel_file(sink, pool, tid, prep, rank, n)
                except RanklensError as err:
                    sink.fail(tid, f, err, _size(f))
                finally:
                    if prep is not None:
                        kineto.cleanup(prep)
                done += _size(f)
                if progress:
                    progress(done, total)
        finally:
            # On an early exit (error, interrupt) files prepared ahead still hold inflated .gz
            # copies: remove them as their preparation ends (the pool waits for it on exit).
            for fut in preps:
                fut.cancel()
                fut.add_done_callback(_cleanup_prepared)


def _cleanup_prepared(fut: Future[kineto.Prepared]) -> None:
    if not fut.cancelled() and fut.exception() is None:
        kineto.cleanup(fut.result())


def _parallel_file(
    sink: _Sink, pool: ProcessPoolExecutor, tid: int, prep: kineto.Prepared, rank: int, n: int
) -> None:
    pending: list[Future[kineto.Piece]] = []
    pieces: list[kineto.Piece] = []
    nxt = 0
    try:
        while nxt < len(prep.pieces) or pending:
            while nxt < len(prep.pieces) and len(pending) < n:
                pending.append(pool.submit(kineto.decode_piece, prep, nxt, rank, tid))
                nxt += 1
            pc = pending.pop(0).result()
            sink.add_events(pc.table)
            pc.table = pa.table({})  # free the Arrow memory early
            pieces.append(pc)
    except kineto.BadCut:
        for f in pending:
            f.cancel()
        sink.con.execute("DELETE FROM events WHERE trace_id = ?", [tid])
        _serial_file(sink, tid, prep, rank)
        return
    _finish_file(sink, tid, prep, rank, pieces)
