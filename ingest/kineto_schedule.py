"""The Kineto reader: its declaration (`READER`), and its files decoded into the writer,
serially for small runs, else in worker processes.

Why a `load` of its own rather than a per-file `read`: files, and ~16 MB pieces of large files,
decode independently; the main process stays the only DuckDB writer and keeps a bounded number
of files and pieces in flight, staging each piece as it arrives instead of a whole rank.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Callable, Generator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from ranklens.ingest import kineto, lifecycle
from ranklens.ingest._model import Batch, RankPart, Reader
from ranklens.ingest.errors import WorkerDied
from ranklens.ingest.sink import Sink


def _finish_file(
    sink: Sink, tid: int, prep: kineto.Prepared, rank: int, pieces: list[kineto.Piece]
) -> None:
    n = 0
    groups: list[dict[str, Any]] = []
    for pc in pieces:
        n += pc.rows
        sink.add_threads(rank, pc.threads)
        groups += pc.groups
    part = RankPart(rank, prep.info, groups=[*groups, *prep.groups])
    sink.finish_part(
        tid, prep.path, READER.name, part, rank, n, size=prep.size_bytes, sha=prep.sha256
    )


def _serial_file(sink: Sink, tid: int, prep: kineto.Prepared, rank: int) -> None:
    pieces = []
    i = 0
    while i < len(prep.pieces):
        pc = kineto.decode_piece(prep, i, rank, tid, serial=True)
        sink.add_events(pc.table, prep.path)
        pieces.append(pc)
        i += pc.consumed
    _finish_file(sink, tid, prep, rank, pieces)


def load(batch: Batch) -> None:
    """Read the batch's Kineto files: in this process, or in `batch.workers` processes."""
    if batch.workers <= 1:
        run_serial(batch)
    else:
        run_parallel(batch)


def run_serial(batch: Batch) -> None:
    sink = batch.sink
    for tid, f in batch.files:
        prep = None
        try:
            with sink.reading(tid, f):
                prep = kineto.prepare(f, tmp_root=batch.scratch)
                rank = sink.claim(tid, f, RankPart(prep.rank, prep.info))
                _serial_file(sink, tid, prep, rank)
        finally:
            if prep is not None:
                kineto.cleanup(prep)
        batch.file_done(f)


def run_parallel(batch: Batch) -> None:
    pool = lifecycle.worker_pool(batch.workers, "ranklens.ingest.kineto")
    try:
        _run_pool(batch, pool, _hash_while_starting(pool, batch))
    except BaseException as exc:
        pool.shutdown(wait=True, cancel_futures=True)  # only pieces already running finish
        if isinstance(exc, BrokenProcessPool):  # seen outside a file (submitting a preparation)
            raise WorkerDied(worked=lifecycle.worked(pool)) from None
        raise
    pool.shutdown(wait=True)


def _hash_while_starting(pool: ProcessPoolExecutor, batch: Batch) -> dict[str, str]:
    """Start the workers (a new interpreter importing the decoder: ~0.4 s in which this process
    would only wait) while hashing the first file here; its hash then need not compete with the
    decoding for the cores. Returns {path: sha256}."""
    starting = threading.Thread(target=lifecycle.start_workers, args=(pool, batch.workers))
    starting.start()
    shas: dict[str, str] = {}
    try:
        path = batch.files[0][1]
        with contextlib.suppress(OSError):  # unreadable: prepare() says so, naming the file
            if stat.S_ISREG(os.stat(path).st_mode):  # never a FIFO (it could block)
                shas[path] = kineto.file_sha256(path)
    finally:
        starting.join()
    return shas


def _run_pool(batch: Batch, pool: ProcessPoolExecutor, shas: dict[str, str]) -> None:
    sink, n, tmp_root = batch.sink, batch.workers, batch.scratch
    files = [f for _tid, f in batch.files]
    # Files are prepared (hashed, inflated to temp files) at most `n` ahead of the one being
    # decoded, so temp disk and memory stay bounded however many ranks the run has.
    preps: list[Future[kineto.Prepared]] = []

    def prepare_upto(i: int) -> None:
        while len(preps) < min(len(files), i + n + 1):
            preps.append(
                pool.submit(kineto.prepare, files[len(preps)], kineto.PIECE_BYTES, None, tmp_root)
            )

    # A file's rank is written (steps assigned, one INSERT) only after the next file's
    # first pieces are in flight, so that the workers decode while the main process writes.
    # A file of one piece is drained only once the next file's pieces are in flight too: with
    # one file in flight the workers took turns (a 1,024-rank job's main process waited 7 s
    # of 17 for them). A larger file is drained first, which bounds the pieces in flight.
    # Whatever a file's start raised, and its rank claim, come at its turn (`drain`), so
    # files are claimed, refused and reported in their order.
    deferred: Callable[[], None] | None = None
    started: list[_Started] = []

    def drain() -> None:
        nonlocal deferred
        st = started.pop(0)
        try:
            with sink.reading(st.tid, st.path):  # a dead worker is not the file's fault: it passes
                if st.error is not None:
                    raise st.error
                assert st.prep is not None and st.decoding is not None
                rank = sink.claim(st.tid, st.path, RankPart(st.prep.rank, st.prep.info))
                assert rank == st.rank, (rank, st.rank)
                if deferred is not None:
                    finish_last = deferred
                    deferred = None
                    finish_last()
                deferred = _drain(st.decoding)
        except BrokenProcessPool:
            raise WorkerDied(st.path, lifecycle.worked(pool)) from None
        finally:
            st.close()
        batch.file_done(st.path)

    try:
        for i, (tid, f) in enumerate(batch.files):
            if started and started[-1].pieces > 1:
                drain()
            prepare_upto(i)
            started.append(_start(sink, pool, preps[i], shas, tid, f, n))
            while len(started) > 1:
                drain()
        while started:
            drain()
        if deferred is not None:
            # Nothing is left to decode: the workers go (and the memory they hold, ~60-80 MB
            # each) before the last rank's write, the ingest's peak (run_parallel's own
            # shutdown is then a no-op).
            pool.shutdown(wait=True)
            deferred()
    finally:
        for st in started:  # an early exit: started files' inflated copies go too
            st.close()
        # On an early exit (error, interrupt) files prepared ahead still hold inflated .gz
        # copies: remove them as their preparation ends (the pool waits for it on exit).
        for fut in preps:
            fut.cancel()
            fut.add_done_callback(_cleanup_prepared)


@dataclass
class _Started:
    """A file whose first pieces are in flight (or what its start raised), not drained yet."""

    tid: int
    path: str
    prep: kineto.Prepared | None = None
    rank: int = -1
    decoding: Generator[None, None, Callable[[], None]] | None = None
    error: Exception | None = None

    @property
    def pieces(self) -> int:
        return len(self.prep.pieces) if self.prep is not None else 0

    def close(self) -> None:
        """Stop its decoding (pieces still running are left to finish) and remove its copy."""
        if self.decoding is not None:
            self.decoding.close()
        if self.prep is not None:
            kineto.cleanup(self.prep)


def _start(
    sink: Sink,
    pool: ProcessPoolExecutor,
    prepared: Future[kineto.Prepared],
    shas: dict[str, str],
    tid: int,
    path: str,
    n: int,
) -> _Started:
    """Submit a file's first pieces, with the rank it names (claimed at its turn); an error is
    kept for its turn."""
    st = _Started(tid, path)
    try:
        st.prep = prepared.result()
        st.prep.sha256 = st.prep.sha256 or shas.pop(path, "")
        st.rank = sink.rank_named(path, RankPart(st.prep.rank, st.prep.info))
        st.decoding = _parallel_file(sink, pool, tid, st.prep, st.rank, n)
        next(st.decoding)  # its first pieces are now in flight
    except Exception as exc:
        st.error = exc
    return st


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
            # one piece more than workers: a worker that finishes while this process packs
            # the piece before it starts the next at once (in-process 2.43 -> 2.32 s on the
            # 402 MB trace; one more decoded piece, ~16 MB of input, held at most)
            while nxt < len(prep.pieces) and len(pending) < n + 1:
                pending.append(pool.submit(kineto.decode_staged, prep, nxt, rank, tid))
                nxt += 1
            if first:
                first = False
                yield
            if not prep.sha256:  # while the workers decode (hashlib releases the GIL)
                prep.sha256 = kineto.file_sha256(prep.path)
            pc = pending.pop(0).result()
            if pc.staged is not None:
                sink.add_staged(rank, pc.staged)
                pc.staged = None
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


READER: Reader = Reader(
    name="kineto",
    title="Kineto",
    unit="trace",
    suffixes=(".json", ".json.gz"),
    load=load,
    carries_groups=True,  # distributedInfo.pg_config
)
