"""The Kineto reader: its declaration (`READER`), and its files decoded into the writer,
serially for small runs, else in worker processes.

Why a `load` of its own rather than a per-file `read`: files, and ~16 MB pieces of large files,
decode independently; the main process stays the only DuckDB writer and keeps a bounded number
of files and pieces in flight, staging each piece as it arrives instead of a whole rank.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from ranklens.ingest import kineto, workpool
from ranklens.ingest._model import Batch, RankPart, Reader
from ranklens.ingest.errors import WorkerDied
from ranklens.ingest.file_hash import file_sha256
from ranklens.ingest.sink import Sink, file_size
from ranklens.ingest.threads import Helper


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
    pool = workpool.worker_pool(batch.workers, "ranklens.ingest.kineto")
    try:
        _run_pool(batch, pool, _first_while_starting(pool, batch))
    except BaseException as exc:
        pool.shutdown(wait=True, cancel_futures=True)  # only pieces already running finish
        if isinstance(exc, BrokenProcessPool):  # seen outside a file (submitting a preparation)
            raise WorkerDied(worked=workpool.worked(pool)) from None
        raise
    pool.shutdown(wait=True)


@dataclass
class _Head:
    """The first file, prepared here, and the pieces of it decoded here, as futures (done)."""

    prepared: Future[kineto.Prepared]
    pieces: list[Future[kineto.Piece]]


def _first_while_starting(pool: ProcessPoolExecutor, batch: Batch) -> _Head:
    """Start the workers (a new interpreter importing the decoder: ~0.3 s in which this process
    would only wait) while preparing the first file here and decoding its pieces until they are
    up. Why: the first write waits for the first file's pieces; decoded here they are ready
    as the workers start on the rest (8 x 60 MB ranks: first write at 0.32 s instead of 0.57).
    What raises is kept in the futures, for the file's turn, as a worker's would be."""
    starting = Helper(lambda: workpool.start_workers(pool, batch.workers), "ranklens-start")
    starting.start()
    head = _Head(Future(), [])
    prep = None
    try:
        tid, path = batch.files[0]
        prep = kineto.prepare(path, kineto.PIECE_BYTES, None, batch.scratch)
        rank = batch.sink.rank_named(path, RankPart(prep.rank, prep.info))
        while starting.running and len(head.pieces) < len(prep.pieces):
            head.pieces.append(Future())
            head.pieces[-1].set_result(kineto.decode_staged(prep, len(head.pieces) - 1, rank, tid))
    except Exception as exc:  # at the file's turn: from its preparation, its rank or a piece
        if prep is None:
            head.prepared.set_exception(exc)
        elif head.pieces:
            head.pieces[-1].set_exception(exc)
        # a refused rank: _start asks again, and keeps the error for the file's turn
    except BaseException:
        if prep is not None:
            kineto.cleanup(prep)
        raise
    finally:
        starting.wait()
    if prep is not None:
        head.prepared.set_result(prep)
    return head


def _run_pool(batch: Batch, pool: ProcessPoolExecutor, head: _Head) -> None:
    sink, n, tmp_root = batch.sink, batch.workers, batch.scratch
    files = [f for _tid, f in batch.files]
    # Files are prepared (hashed, inflated to temp files) n ahead of the one started last,
    # small ones as far as _within allows, so temp disk and memory stay bounded
    # however many ranks the run has.
    preps: list[Future[kineto.Prepared]] = [head.prepared]
    sizes = [file_size(f) for f in files]

    def prepare_upto(i: int) -> None:
        """The files past file i prepared or in preparation: the workers' queue must hold
        enough to decode while this process writes a batch of small ranks."""
        while len(preps) < len(files):
            j = len(preps)
            if j > i + n and not _within(j - i, sum(sizes[i + 1 : j + 1])):
                return
            # Prepared ahead while others decode, a later file is hashed by its worker too (the
            # main process, the one writer, took ~0.05 s a 60 MB rank for it in its own chain
            # of work); the first one's hash is a pool task (_parallel_file).
            preps.append(pool.submit(kineto.prepare, files[j], kineto.PIECE_BYTES, True, tmp_root))

    # A file's rank is written (steps assigned, one INSERT) only after the next file's
    # first pieces are in flight, so that the workers decode while the main process writes.
    # Files of one piece are drained only once the next ones are in flight too, as far as
    # _within allows: with one file in flight the workers took turns (a 1,024-rank job's main
    # process waited 7 s of 17 for them), and with two they idled while it wrote a batch of
    # small ranks (~0.6 s each; it then waited 4.5 s of 14). A larger file is drained first,
    # which bounds the pieces in flight.
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
            raise WorkerDied(st.path, workpool.worked(pool)) from None
        finally:
            st.close()
        batch.file_done(st.path)

    try:
        for i, (tid, f) in enumerate(batch.files):
            if started and started[-1].pieces > 1:
                drain()
            done = head.pieces if i == 0 else []
            started.append(_start(sink, pool, preps[i], tid, f, n, done))
            prepare_upto(i)  # after the file's pieces: a worker takes them first
            while len(started) > 1 and not _room(started):
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


# Small files in flight at most, by count and by input bytes (a one-piece file is at most
# PIECE_BYTES): their decoded pieces wait here packed, ~1/8 of their input. Enough to keep
# the workers decoding while the main process writes a batch of small ranks (sink.BATCH_ROWS:
# ~1.2 M events, ~2 s here; 64 files of a 1,024-rank job are ~240 k events, ~0.6 core-s).
AHEAD_FILES = 192
AHEAD_PIECES = 8


def _within(files: int, nbytes: int) -> bool:
    """Whether `files` small files of `nbytes` in all may be ahead of the oldest one."""
    return files <= AHEAD_FILES and nbytes <= AHEAD_PIECES * kineto.PIECE_BYTES


def _room(started: list[_Started]) -> bool:
    """Whether another file may start before the oldest started one is drained: only while
    every started file is of one piece, and few enough of them."""
    if any(st.pieces > 1 for st in started):
        return False
    return _within(len(started) + 1, sum(st.size for st in started))


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

    @property
    def size(self) -> int:
        return self.prep.raw_bytes if self.prep is not None else 0

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
    tid: int,
    path: str,
    n: int,
    done: list[Future[kineto.Piece]],
) -> _Started:
    """Submit a file's first pieces (after those `done` here), with the rank it names (claimed
    at its turn); an error is kept for its turn."""
    st = _Started(tid, path)
    try:
        st.prep = prepared.result()
        st.rank = sink.rank_named(path, RankPart(st.prep.rank, st.prep.info))
        st.decoding = _parallel_file(sink, pool, tid, st.prep, st.rank, n, done)
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
    sink: Sink,
    pool: ProcessPoolExecutor,
    tid: int,
    prep: kineto.Prepared,
    rank: int,
    n: int,
    done: list[Future[kineto.Piece]],
) -> Generator[None, None, Callable[[], None]]:
    """Decode a file's pieces in the pool, after its first ones `done` here (yields once its
    first pieces are submitted); returns what writes its rank."""
    pending: list[Future[kineto.Piece]] = list(done)
    pieces: list[kineto.Piece] = []
    ahead = 2 * (n + 1)
    nxt = len(done)
    first = True
    hashing: Future[str] | None = None
    try:
        while nxt < len(prep.pieces) or pending:
            # Twice as many pieces as workers, and one more each: the first ones decode while
            # this process writes the file before (a rank's write takes about as long as one
            # core decoding it); with one more than workers, a 60 MB rank's last pieces waited
            # for that write, the workers idle. Decoded pieces come back packed (~1/8 of their
            # input), so what waits here stays small.
            while nxt < len(prep.pieces) and len(pending) < ahead:
                pending.append(pool.submit(kineto.decode_staged, prep, nxt, rank, tid))
                nxt += 1
            if hashing is None and not prep.sha256:
                # by a worker, after the first pieces: this process, the one writer, has its
                # own chain of work (a 60 MB rank's hash here delayed every write by 0.05 s)
                hashing = pool.submit(file_sha256, prep.path)
            if first:
                first = False
                yield
            pc = pending.pop(0).result()
            if pc.staged is not None:
                sink.add_staged(rank, pc.staged)
                pc.staged = None
            pieces.append(pc)
        if hashing is not None:
            prep.sha256 = hashing.result()
    except kineto.BadCut:
        for f in pending:
            f.cancel()
        sink.drop_events(tid)
        if hashing is not None:
            prep.sha256 = hashing.result()
        _serial_file(sink, tid, prep, rank)  # now: the inflated copy of a .gz goes soon
        return lambda: None
    if first:  # no pieces at all
        prep.sha256 = prep.sha256 or file_sha256(prep.path)
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
