"""Load many ranks' traces into one DuckDB file.

Why: ranks are independent until the cross-rank tables, so files (and pieces of large files)
decode in worker processes while the main process is the single DuckDB writer. The output is
checked before any work, locked against a second writer, built under a temporary name (views
included) and renamed at the end, so an interrupted or failed ingest leaves the previous file
as it was, and re-ingesting the same files gives the same database.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import duckdb
from ranklens.ingest import engines, output, post, readers, sanity, shards, workpool
from ranklens.ingest._model import Batch, Reader
from ranklens.ingest.config import RunOptions
from ranklens.ingest.errors import NoTracesError, RanklensError, storage_error
from ranklens.ingest.inputs import NOT_TRACES, Inputs, scan_inputs
from ranklens.ingest.post import finish_database
from ranklens.ingest.rank_task import RankResult
from ranklens.ingest.schema import SCHEMA_VERSION, ddl
from ranklens.ingest.sink import IngestReport, Progress, Sink, Skipped, file_size
from ranklens.ingest.tempfiles import private_dir

__all__ = [
    "NOT_TRACES",
    "IngestReport",
    "Progress",
    "Skipped",
    "find_traces",
    "load_traces",
]

from ranklens import __version__


def find_traces(inputs: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Expand directories, globs and files into a sorted list of trace files."""
    return scan_inputs(inputs, readers.trace_suffixes()).files


def load_traces(
    inputs: Sequence[str | os.PathLike[str]],
    db_path: str | os.PathLike[str],
    *,
    on_error: str = "raise",
    workers: int | None = None,
    progress: Progress | None = None,
    options: RunOptions | None = None,
    allow_mixed: bool = False,
    finalize: Callable[[duckdb.DuckDBPyConnection], None] | None = None,
    storage: str = "file",
    engine: str = "local",
    ray_address: str | None = None,
) -> IngestReport:
    """Ingest trace files into a new DuckDB database at `db_path` (replaced atomically).

    Args:
        inputs: directories, globs or files (one file per rank, or Nsight reports).
        db_path: the database to write; never one of the inputs, nor a non-database file.
        on_error: "raise" stops at the first bad file; "skip" records it and goes on.
        workers: worker processes (default: CPU count, at most 8; 1 = in-process).
        progress: called with (bytes done, bytes total) as files complete.
        options: cross-rank options (clock alignment, user offsets, parallel layout).
        allow_mixed: ingest Kineto traces and Nsight reports together (refused by default).
        finalize: called on the finished database before it is put in place (the CLI stores
            the analysis views with it, so they are part of the one atomic rename).
        storage: "file" (one DuckDB file) or "shards" (`db_path` is a directory: the catalog
            and each rank's events as Parquet written by per-rank tasks; shards.py).
        engine: who runs the per-rank tasks of a sharded ingest: "local" processes or "ray"
            (at `ray_address`, else a local Ray instance with `workers` CPUs).

    Raises:
        RanklensError: bad input (with on_error="raise"), nothing left to ingest, an output
            that cannot be written, or another ingest writing the same output.
    """
    if on_error not in ("raise", "skip"):
        raise ValueError("on_error must be 'raise' or 'skip'")
    if workers is not None and workers < 1:
        raise ValueError("workers must be at least 1")
    if storage not in STORAGES:
        raise ValueError(f"storage must be one of {STORAGES}")
    sharded = storage == "shards"
    if engine != "local" and not sharded:
        raise RanklensError(
            f"--engine {engine} writes a sharded run",
            "add --storage shards (the output is then a directory)",
        )
    started = time.perf_counter()
    found = scan_inputs(inputs, readers.trace_suffixes())
    routed, notes = readers.route(found.files, allow_mixed=allow_mixed)
    files = [f for _reader, mine in routed for f in mine]
    out = Path(db_path)
    output.check_output(out, [*files, *map(str, inputs)], sharded=sharded)
    report = IngestReport(db_path=str(out), warnings=notes)
    _unreadable_dirs(found, report, on_error)
    place = output.replacing_dir(out) if sharded else output.replacing(out)
    with _storage_errors_named(), place as tmp, private_dir("ingest") as scratch:
        con = duckdb.connect(str(tmp / shards.CATALOG if sharded else tmp))
        con.execute("SET enable_progress_bar = false")
        # Bound the writer's memory; DuckDB spills to a temp dir beside the output instead.
        con.execute(f"SET memory_limit = '{_memory_limit_mb(files, thirds=1)}MB'")
        try:
            how = _How(
                on_error, workers, options, str(tmp) if sharded else None, engine, ray_address
            )
            with _imported_meanwhile(_CROSS_RANK):
                _ingest(con, routed, found, report, how, progress, scratch)
            report.seconds["traces"] = time.perf_counter() - started
            if finalize is not None:
                budget = _memory_limit_mb(files, thirds=2, events=report.n_events)
                con.execute(f"SET memory_limit = '{budget}MB'")
                finalize(con)
                report.seconds["results"] = time.perf_counter() - started - report.seconds["traces"]
            con.execute("CHECKPOINT")
            engines.settle()  # Ray, shutting down since its last task (ray_engine.py)
        finally:
            con.close()
            with contextlib.suppress(Exception):  # the error being raised is the one to say
                engines.settle()
    report.seconds["total"] = time.perf_counter() - started  # the run in place
    report.warnings += _small_shards(sharded, files)  # about this ingest, not stored in the run
    if engine == "ray":
        from ranklens.ingest import ray_engine

        report.warnings += ray_engine.environment_notes()
    return report


# The cross-rank stage's module, imported while the traces decode: with polars (through the
# clock alignment) it took 0.11-0.13 s, on one core before any decoding began; on a thread,
# while this process mostly waits on its workers, it costs that much CPU shared with them.
_CROSS_RANK = "ranklens.ingest.crossrank"


@contextlib.contextmanager
def _imported_meanwhile(name: str) -> Iterator[None]:
    """Import `name` on a thread for the block, joined on the way out (a daemon thread left
    importing would meet the interpreter's shutdown). An import that fails there fails again,
    with its error, where the module is needed."""

    def load() -> None:
        with contextlib.suppress(BaseException):
            importlib.import_module(name)

    thread = threading.Thread(target=load, name="ranklens-import", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()


@contextlib.contextmanager
def _storage_errors_named() -> Iterator[None]:
    """A full, over-quota or read-only file system (the output's, or the temporary files'),
    which DuckDB and Python report as their own errors, as StorageFull: `error:` and a hint,
    not an internal error. The output is put in place only at the end, so nothing was kept."""
    try:
        yield
    except Exception as exc:
        full = storage_error(exc)
        if full is None or full is exc:
            raise
        raise full from exc


def _unreadable_dirs(found: Inputs, report: IngestReport, on_error: str) -> None:
    """A directory the scan could not enter (or that holds nothing) may have been meant to hold
    ranks: an error, or with skip a warning."""
    if found.unreadable_dirs and on_error == "raise":
        raise RanklensError(
            found.unreadable_dirs[0],
            "check the path and the directory's permissions, or pass --skip-bad to ingest what "
            "can be read",
        )
    report.warnings += [f"skipped {d}" for d in found.unreadable_dirs]
    if not found.files:
        raise NoTracesError(
            f"no trace could be read ({'; '.join(found.unreadable_dirs)})",
            "fix the directories' permissions",
        )


STORAGES = ("file", "shards")


@dataclass(frozen=True)
class _How:
    on_error: str
    workers: int | None
    options: RunOptions | None
    run_dir: str | None  # a sharded run being built
    engine: str
    ray_address: str | None


def _ingest(
    con: duckdb.DuckDBPyConnection,
    routed: list[tuple[Reader, list[str]]],
    found: Inputs,
    report: IngestReport,
    how: _How,
    progress: Progress | None,
    scratch: Path,
) -> None:
    files = [f for _reader, mine in routed for f in mine]
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
    sink = Sink(con, report, how.on_error, found=found.found, run_dir=how.run_dir)
    total = sum(file_size(f) for f in files) or 1
    done = 0

    def file_done(path: str) -> None:
        nonlocal done
        done += file_size(path)
        if progress:
            progress(done, total)

    n = how.workers if how.workers is not None else min(os.cpu_count() or 1, 8)
    batches: list[tuple[Reader, Batch]] = []
    for reader, mine in routed:  # trace ids in READERS order
        big = sum(file_size(f) for f in mine) >= workpool.SERIAL_BELOW_BYTES
        tids = list(enumerate(mine, start=sum(len(b.files) for _r, b in batches)))
        batches.append((reader, Batch(sink, tids, n if big else 1, str(scratch), file_done)))
    # Per-file readers first, then those scheduling their own workers (the order ingest always
    # had, so that a mixed run's rank claims and messages stay as they were).
    ordered = sorted(batches, key=lambda rb: rb[0].load is not None)
    if how.run_dir is not None:
        _run_tasks(ordered, sink, how, n, file_done)
    else:
        for reader, batch in ordered:
            readers.read_batch(reader, batch)
    sink.flush()  # the small ranks, and the rows of every table held with them
    if not sink.rank_of:
        reasons = "; ".join([s.message for s in report.skipped] + report.warnings)
        raise NoTracesError(
            f"no trace could be ingested ({reasons or 'no files'})", "fix or remove the bad files"
        )
    # Every rank is written and the decoding workers are gone: the cross-rank stage gets two
    # thirds of the input, or CROSS_RANK_BYTES_PER_EVENT per event (with a third, a 5 M-kernel
    # Nsight export's 250 k collectives took 0.61-0.63 s to match and align, 0.38-0.46 s with
    # 500 MB or more).
    from ranklens.ingest.crossrank import check_layout, finish_cross_rank  # _CROSS_RANK

    written = int(con.execute("SELECT count(*) FROM events").fetchall()[0][0])
    budget = _memory_limit_mb(files, 2, written, CROSS_RANK_BYTES_PER_EVENT)
    con.execute(f"SET memory_limit = '{budget}MB'")
    check_layout(con, how.options)
    finish_database(con, sink.groups)
    if readers.infers_communicators(routed):
        # No process-group metadata in any file: infer communicators from collective sequences.
        from ranklens.ingest.communicators import infer_communicators

        infer_communicators(con)
    finish_cross_rank(con, how.options)  # gloo groups, matching, clock alignment, attribution
    if how.run_dir is not None:
        shards.seal(con, how.run_dir)  # `events` = communication rows + the shards, from here
    post.fill_pids(con)
    report.ranks = sorted(sink.rank_of.values())
    report.n_events = int(con.execute("SELECT count(*) FROM events").fetchall()[0][0])
    report.warnings += sanity.run_warnings(con)
    sanity.store_warnings(con, report.warnings)


def _run_tasks(
    ordered: list[tuple[Reader, Batch]],
    sink: Sink,
    how: _How,
    n: int,
    file_done: Callable[[str], None],
) -> None:
    """A sharded ingest: each file is one per-rank task (engines.py) and the writer records
    what it returns, in the same file order as a file ingest (so a rank claimed twice is
    refused for the same file)."""
    assert how.run_dir is not None
    tasks = [(reader.name, path, tid) for reader, batch in ordered for tid, path in batch.files]

    def done(path: str, results: list[RankResult]) -> None:
        for res in results:
            sink.add_result(res)
        file_done(path)

    engines.run_tasks(
        tasks, how.run_dir, workers=n, engine=how.engine, address=how.ray_address, done=done
    )


_SMALL_RANK_BYTES = 8 * 2**20


def _small_shards(sharded: bool, files: list[str]) -> list[str]:
    """Shards pay a fixed cost per rank file and query (~0.3 ms to open each Parquet file):
    with small ranks a one-file run is faster to ingest and to query, so say so."""
    total = sum(file_size(f) for f in files)
    if not sharded or not files or total / len(files) >= _SMALL_RANK_BYTES:
        return []
    return [
        f"--storage shards with small ranks ({total / len(files) / 2**20:.1f} MB of trace per "
        "file on average): every query opens each rank's shard, so a one-file run (the "
        "default) is faster to ingest and to query below ~8 MB per rank"
    ]


# DuckDB's working set per event from the cross-rank stage on: 155 B/event did not spill on a
# 1,024-rank job's analyses alone (593 MB for 3.83 M events). The stored results run the
# analyses beside the dependency graph's own queries (the numbered events, the contention
# kernels), on the same budget: with 240 B/event that stage took 0.7 s less on that job (3
# pairs alternated: 10.3-10.9 s against 11.1-11.7; peak 1.40 -> 1.62 GB) and ~1 s less on a
# 5 M-kernel Nsight export (30.3-32.8 s against 32.2-33.0; peak unchanged, 4.5 GB).
CROSS_RANK_BYTES_PER_EVENT = 160
RESULTS_BYTES_PER_EVENT = 240


def _memory_limit_mb(
    files: list[str], thirds: int, events: int = 0, per_event: int | None = None
) -> int:
    """DuckDB's budget, `thirds` thirds of the input (_budget_mb bounds it). While the traces
    are decoded, a third, so that with the decoding workers the whole ingest stays near the
    input's size. For the stored results (`finalize`), two: the workers are gone by then, and
    with a third the analyses spilled their intermediates to disk (a 1,024-rank job, 889 MB of
    traces: 114 MB spilled, the stored results 1.6 s, 3.3 CPU-s, longer; the whole ingest's
    peak stays ~1.5 GB); and at least `per_event` bytes (default RESULTS_BYTES_PER_EVENT) per
    event (`events`), since what the analyses hold grows with the events, not with the bytes
    that held them: an Nsight export packs ~100 B a kernel, Kineto JSON ~300 (a 5 M-kernel
    export's 478 MB gave 318 MB, and overlap, contention and stragglers took 17.8 s there
    against 12.0 s with 775 MB)."""
    size = thirds * sum(file_size(f) for f in files) // 3
    each = RESULTS_BYTES_PER_EVENT if per_event is None else per_event
    return _budget_mb(max(size, each * events))


def results_budget_mb(events: int) -> int:
    """DuckDB's budget for a run's stored results computed outside an ingest (at first use,
    or by realign: ingest/realign.rewrite_run), as the ingest's own finalize would have it
    with no trace files to size it by: RESULTS_BYTES_PER_EVENT per event, bounded as
    _budget_mb says. DuckDB's default, 80% of the machine's memory, left the dependency
    graph's arrays none before it spilled."""
    return _budget_mb(RESULTS_BYTES_PER_EVENT * events)


def _budget_mb(nbytes: int) -> int:
    """`nbytes` in MB, at least 256 MB and at most half the machine's memory (where it can be
    read): past it DuckDB would not spill before the system ran out, the graph's arrays and
    the decoding workers being outside its budget."""
    mb = max(256, nbytes // 2**20)
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # not on this platform
        return mb
    return max(256, min(mb, ram // 2 // 2**20))
