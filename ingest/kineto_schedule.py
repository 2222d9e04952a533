"""Decoding Kineto files into the writer: serially for small runs, else in worker processes.

Why: files, and ~16 MB pieces of large files, decode independently; the main process stays the
only DuckDB writer and keeps a bounded number of files and pieces in flight.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable, Generator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import pyarrow as pa
from ranklens.ingest import kineto, lifecycle
from ranklens.ingest.errors import RanklensError
from ranklens.ingest.sink import Progress, Sink, file_size, is_file_error, unreadable


def _finish_file(
    sink: Sink, tid: int, prep: kineto.Prepared, rank: int, pieces: list[kineto.Piece]
) -> None:
    n = 0
    for pc in pieces:
        n += pc.rows
        sink.add_threads(rank, pc.threads)
        sink.groups += pc.groups
    sink.groups += prep.groups
    sink.add_rank(tid, prep.path, "kineto", prep.size_bytes, prep.sha256, rank, prep.info, n)


def _serial_file(sink: Sink, tid: int, prep: kineto.Prepared, rank: int) -> None:
    pieces = []
    i = 0
    while i < len(prep.pieces):
        pc = kineto.decode_piece(prep, i, rank, tid, serial=True)
        sink.add_events(pc.table, prep.path)
        pieces.append(pc)
        i += pc.consumed
    _finish_file(sink, tid, prep, rank, pieces)


def run_serial(
    sink: Sink,
    files: list[str],
    progress: Progress | None,
    done: int,
    total: int,
    tmp_root: str | None = None,
) -> None:
    for tid, f in enumerate(files):
        prep = None
        try:
            prep = kineto.prepare(f, tmp_root=tmp_root)
            rank = sink.claim_rank(tid, f, prep.rank, prep.info)
            _serial_file(sink, tid, prep, rank)
        except RanklensError as err:
            sink.fail(tid, f, err, file_size(f))
        except Exception as exc:
            if not is_file_error(exc):
                raise
            sink.fail(tid, f, unreadable(f, exc), file_size(f))
        finally:
            if prep is not None:
                kineto.cleanup(prep)
        done += file_size(f)
        if progress:
            progress(done, total)


def run_parallel(
    sink: Sink,
    files: list[str],
    n: int,
    progress: Progress | None,
    done: int,
    total: int,
    tmp_root: str | None = None,
) -> None:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["ranklens.ingest.kineto"])
    pool = ProcessPoolExecutor(
        max_workers=n,
        mp_context=ctx,
        initializer=lifecycle.die_with_parent,  # no orphan outlives a killed ingest
        initargs=(os.getpid(),),
    )
    try:
        _run_pool(sink, pool, files, n, progress, done, total, tmp_root)
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)  # only pieces already running finish
        raise
    pool.shutdown(wait=True)


def _run_pool(
    sink: Sink,
    pool: ProcessPoolExecutor,
    files: list[str],
    n: int,
    progress: Progress | None,
    done: int,
    total: int,
    tmp_root: str | None,
) -> None:
    # Files are prepared (hashed, inflated to temp files) at most `n` ahead of the one being
    # decoded, so temp disk and memory stay bounded however many ranks the run has.
    preps: list[Future[kineto.Prepared]] = []

    def prepare_upto(i: int) -> None:
        while len(preps) < min(len(files), i + n + 1):
            preps.append(
                pool.submit(kineto.prepare, files[len(preps)], kineto.PIECE_BYTES, False, tmp_root)
            )

    # A file's rank is written (steps assigned, one INSERT) only after the next file's
    # first pieces are in flight, so that the workers decode while the main process writes.
    deferred: Callable[[], None] | None = None
    try:
        for tid, f in enumerate(files):
            prepare_upto(tid)
            prep = None
            try:
                prep = preps[tid].result()
                rank = sink.claim_rank(tid, f, prep.rank, prep.info)
                decoding = _parallel_file(sink, pool, tid, prep, rank, n)
                next(decoding)  # this file's first pieces are now in flight
                if deferred is not None:
                    finish_last = deferred
                    deferred = None
                    finish_last()
                deferred = _drain(decoding)
            except RanklensError as err:
                sink.fail(tid, f, err, file_size(f))
            except BrokenProcessPool:
                raise RanklensError(
                    f"{f}: a decoding worker process died while reading it (out of memory?)",
                    "retry with fewer --workers (1 decodes in-process)",
                ) from None
            except Exception as exc:
                if not is_file_error(exc):
                    raise
                sink.fail(tid, f, unreadable(f, exc), file_size(f))
            finally:
                if prep is not None:
                    kineto.cleanup(prep)
            done += file_size(f)
            if progress:
                progress(done, total)
        if deferred is not None:
            deferred()
    finally:
        # On an early exit (error, interrupt) files prepared ahead still hold inflated .gz
        # copies: remove them as their preparation ends (the pool waits for it on exit).
        for fut in preps:
            fut.cancel()
            fut.add_done_callback(_cleanup_prepared)


def _drain(decoding: Generator[None, None, Callable[[], None]]) -> Callable[[], None]:
    """Run a file's decoding to its end; its value is what writes the file's rank."""
    while True:
        try:
            next(decoding)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]


def _cleanup_prepared(fut: Future[kineto.Prepared]) -> None:
    if not fut.cancelled() and fut.exception() is None:
        kineto.cleanup(fut.result())


def _parallel_file(
    sink: Sink, pool: ProcessPoolExecutor, tid: int, prep: kineto.Prepared, rank: int, n: int
) -> Generator[None, None, Callable[[], None]]:
    """Decode a file's pieces in the pool (yields once its first pieces are submitted); returns
    what writes its rank."""
    pending: list[Future[kineto.Piece]] = []
    pieces: list[kineto.Piece] = []
    nxt = 0
    first = True
    try:
        while nxt < len(prep.pieces) or pending:
            while nxt < len(prep.pieces) and len(pending) < n:
                pending.append(pool.submit(kineto.decode_piece, prep, nxt, rank, tid))
                nxt += 1
            if first:
                first = False
                yield
            if not prep.sha256:  # while the workers decode (hashlib releases the GIL)
                prep.sha256 = kineto.file_sha256(prep.path)
            pc = pending.pop(0).result()
            sink.add_events(pc.table, prep.path)
            pc.table = pa.table({})  # free the Arrow memory early
            pieces.append(pc)
    except kineto.BadCut:
        for f in pending:
            f.cancel()
        sink.drop_events(tid)
        _serial_file(sink, tid, prep, rank)  # now: the inflated copy of a .gz goes soon
        return lambda: None
    if first:  # no pieces at all
        yield
    return lambda: _finish_file(sink, tid, prep, rank, pieces)
