"""The single DuckDB writer of an ingest, and what it records (ranks, skipped files).

Why apart from loader.py: readers' results from any format pass through one object that owns
the connection, claims ranks (a rank never comes from two files) and turns a bad file into a
recorded skip or a raised error.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa
from ranklens.ingest import event_store, lifecycle, shards, staging
from ranklens.ingest._model import RankPart, ReadFile, rank_from_name
from ranklens.ingest.errors import (
    MachineError,
    NotATraceError,
    RankError,
    RanklensError,
    TraceFormatError,
    no_room,
)
from ranklens.ingest.event_store import insert_events
from ranklens.ingest.held_rows import HeldRows
from ranklens.ingest.sanity import check_rank, check_times
from ranklens.ingest.steps import insert_windows, write_rank, write_ranks

if TYPE_CHECKING:
    from ranklens.ingest.rank_task import RankResult

Progress = Callable[[int, int], None]  # (bytes done, bytes total)
# A rank of fewer events is written together with others (steps.write_ranks), at most about
# BATCH_ROWS at a time: its own INSERTs and commit would cost more than its rows. DuckDB's
# commit of a few hundred thousand rows into each of events_plain and events_rich cost ~2 us
# a row, of a million ~1.3 (its row groups hold 122,880 rows: a small commit leaves one
# half-filled for the next to finish); at 400 k the 1,024-rank job's main process, the one
# writer, spent 18.3-19.2 CPU-s on its traces, at 1.2 M 15.2-16.0 (+100 MB of peak).
SMALL_RANK_ROWS = 100_000
BATCH_ROWS = 1_200_000


@dataclass
class Skipped:
    """A file that was not ingested, and why."""

    path: str
    reason: str

    @property
    def message(self) -> str:
        """One line naming the file once (reasons usually start with the path already)."""
        return self.reason if self.path in self.reason else f"{self.path}: {self.reason}"


@dataclass
class IngestReport:
    """What an ingest did: ranks loaded, events, files skipped (never silently)."""

    db_path: str
    ranks: list[int] = field(default_factory=list)
    n_events: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # Wall seconds per stage ("traces": decode and write the ranks and the cross-rank stage;
    # "results": what `finalize` stored; "total"), so a user sees where an ingest's time went.
    seconds: dict[str, float] = field(default_factory=dict)


def file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


class Sink:
    """The single writer: files' results go into the database through here."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        report: IngestReport,
        on_error: str,
        found: set[str] | None = None,
        run_dir: str | None = None,
    ):
        self.con = con
        self.run_dir = run_dir  # a sharded run being built: files' shards are under it
        self.report = report
        self.on_error = on_error
        self.found = found or set()  # files a directory scan or glob found (not named)
        self.rank_of: dict[tuple[int, str], int] = {}  # (trace_id, path) -> rank
        self.path_of_rank: dict[int, str] = {}
        self.groups: list[dict[str, Any]] = []
        self.threads: set[tuple[int, int, int, str]] = set()
        # A rank's event pieces wait here until the rank is complete (add_rank): its steps are
        # assigned on them and they are written once (steps.write_rank). Packed: staging.py.
        self._staged: dict[int, list[staging.Piece]] = {}
        # Complete small ranks, still staged, written together (steps.write_ranks) once they
        # hold BATCH_ROWS, before a large rank, and at the end of the reading (flush).
        self._small: list[tuple[int, bool, list[staging.Piece]]] = []
        self._small_rows = 0
        self._rows = HeldRows()  # their sources, ranks and threads rows, written with them
        self._failed: set[int] = set()  # trace ids of files a sharded ingest refused

    def fail(self, trace_id: int, path: str, err: RanklensError, size: int = 0) -> None:
        if isinstance(err, NotATraceError) and path in self.found:
            # Found beside the traces, not named: a note, not a failed rank.
            self.report.warnings.append(f"{err.message}; left out (found in a directory)")
            return
        if self.on_error == "raise":
            raise err
        ranks = [self.rank_of.pop(k) for k in [k for k in self.rank_of if k[0] == trace_id]]
        for rank in ranks:
            self.path_of_rank.pop(rank, None)
            self.con.execute("DELETE FROM steps WHERE rank = ?", [rank])
        self.drop_events(trace_id)
        if self.run_dir is not None:
            shards.remove_parts(self.run_dir, trace_id)
        for table in ("ranks", "sources"):
            self.con.execute(f"DELETE FROM {table} WHERE trace_id = ?", [trace_id])
            self._rows.drop(table, "trace_id", [trace_id])
        self.report.skipped.append(Skipped(path, err.message))
        self._rows.add(
            "sources", [(trace_id, path, "unknown", size, None, None, 0, "skipped", err.message)]
        )

    def claim_rank(
        self, trace_id: int, path: str, rank: int | None, info: dict[str, Any] | None = None
    ) -> int:
        rank = require_rank(path, rank)
        check_rank(path, rank, info or {})
        if rank in self.path_of_rank:
            raise RankError(
                f"{path}: rank {rank} is already claimed by {self.path_of_rank[rank]}",
                "each rank must come from exactly one file; remove the duplicate",
            )
        self.path_of_rank[rank] = path
        self.rank_of[(trace_id, f"{path}#{len(self.rank_of)}")] = rank
        return rank

    def add_events(self, table: pa.Table, path: str, *, pack: bool = True) -> None:
        """Stage a piece of a rank's events (all its rows carry one rank), once every time in
        it is known to fit (sanity.check_times: an error naming the event otherwise); `pack`:
        staging.pack's `compress`."""
        check_times(path, table)
        if table.num_rows:
            self.add_staged(table["rank"][0].as_py(), staging.pack(table, compress=pack))

    def add_staged(self, rank: int, piece: staging.Piece) -> None:
        """Stage a piece a worker checked and packed (kineto.decode_staged)."""
        self._staged.setdefault(rank, []).append(piece)

    def drop_events(self, trace_id: int) -> None:
        """Forget a file's events, staged, waiting to be written or written (its file turned
        out bad)."""
        for rank in list(self._staged):
            self._staged[rank] = [p for p in self._staged[rank] if p.trace_id != trace_id]
        kept = [(r, g, [p for p in ps if p.trace_id != trace_id]) for r, g, ps in self._small]
        self._small = [(r, g, ps) for r, g, ps in kept if ps]
        self._small_rows = sum(p.rows for _r, _g, ps in self._small for p in ps)
        event_store.delete_trace(self.con, trace_id)

    def _write_rank(self, rank: int, has_gpu: bool) -> None:
        pieces = self._staged.pop(rank, [])
        n = sum(p.rows for p in pieces)
        if n >= SMALL_RANK_ROWS:
            self.flush()  # the ranks before it first: rows stay in the order ranks came
            write_rank(self.con, rank, has_gpu, pieces)
        elif pieces:
            self._small.append((rank, has_gpu, pieces))
            self._small_rows += n
            if self._small_rows >= BATCH_ROWS:
                self.flush()

    def flush(self) -> None:
        """Write the small ranks that wait (before anything reads `events` or `steps`). This
        runs while some file is being read, but a failure is not that file's: it stops the
        ingest (WriteFailed), so no file whose rows were lost is recorded as read."""
        small, self._small, self._small_rows = self._small, [], 0
        try:
            self._rows.write(self.con)
            write_ranks(self.con, small)
        except Exception as exc:
            if not is_file_error(exc):
                raise  # the machine's (memory, disk, a full one: load_traces names it)
            ranks = [r for r, _g, _p in small]
            named = f"{ranks[:8]}" + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
            raise WriteFailed(
                f"writing the events of ranks {named} failed ({type(exc).__name__}: "
                f"{(str(exc).splitlines() or [''])[0][:200]})",
                "nothing was kept; run again with --debug and report it",
            ) from exc

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
        self._rows.add("sources", [(trace_id, path, fmt, size, sha, rank, n_events, "ok", None)])
        self._rows.add(
            "ranks",
            [
                (
                    rank,
                    info.get("world_size"),
                    trace_id,
                    info.get("host"),
                    info.get("pid"),
                    info.get("backend"),
                    info.get("device_name"),
                    info.get("num_sms"),
                    bool(info.get("has_gpu")),
                    0,
                    "none",
                    None,
                )
            ],
        )
        self._write_rank(rank, bool(info.get("has_gpu")))

    def add_threads(self, rank: int, threads: Iterable[tuple[int, int, str]]) -> None:
        rows = {(rank, p, t, n) for p, t, n in threads}
        self._rows.add("threads", sorted(rows))

    def rank_named(self, path: str, part: RankPart) -> int:
        """The rank `claim` would give `part` of `path`, checked but not claimed (a reader
        decoding ahead claims it at the file's turn)."""
        rank = require_rank(path, part.rank if part.rank is not None else rank_from_name(path))
        check_rank(path, rank, part.info)
        return rank

    def claim(self, trace_id: int, path: str, part: RankPart) -> int:
        """Claim the rank `part` is of for `path` (the file name's rank when the part does not
        say); a RankError when neither tells, or another file has it."""
        rank = part.rank if part.rank is not None else rank_from_name(path)
        return self.claim_rank(trace_id, path, rank, part.info)

    def add_part(
        self, trace_id: int, path: str, fmt: str, part: RankPart, *, size: int, sha: str | None
    ) -> None:
        """One rank of a file, whole: claimed, its events staged, then written."""
        rank = self.claim(trace_id, path, part)
        n = sum(t.num_rows for t in part.events)
        pack = n < SMALL_RANK_ROWS  # a large rank is written at once (_write_rank): no packing
        while part.events:  # each table let go once staged (staging.py)
            t = with_rank(part.events.pop(0), rank, trace_id)
            self.add_events(t, path, pack=pack)
            del t
        self.finish_part(trace_id, path, fmt, part, rank, n, size=size, sha=sha)

    def finish_part(
        self,
        trace_id: int,
        path: str,
        fmt: str,
        part: RankPart,
        rank: int,
        n_events: int,
        *,
        size: int,
        sha: str | None,
    ) -> None:
        """Write a claimed rank whose events are staged (by add_part, or piece by piece by a
        reader that schedules its own decoding), with its threads, groups and warnings."""
        self.add_rank(trace_id, path, fmt, size, sha, rank, part.info, n_events)
        self.add_threads(rank, part.threads)
        self.groups += part.groups
        self.report.warnings += [f"{path}: {w}" for w in part.warnings]

    def add_result(self, res: RankResult) -> None:
        """One rank a per-rank task wrote as shards (rank_task.py): claimed, its communication
        rows, steps, source and threads recorded; a bad file recorded or raised (fail)."""
        if res.trace_id in self._failed:  # an earlier rank of the same file was refused
            return
        try:
            if res.error is not None:
                raise res.error
            rank = self.claim_rank(res.trace_id, res.path, res.rank, res.info)
        except RanklensError as err:
            self._failed.add(res.trace_id)
            self.fail(res.trace_id, res.path, err, res.size)
            return
        assert self.run_dir is not None  # a sharded ingest's
        shards.check_parts(self.run_dir, rank, res.parts)  # raised: not this file's fault
        if res.comm is not None and res.comm.num_rows:
            with event_store.transaction(self.con):
                insert_events(self.con, res.comm)
        insert_windows(self.con, [(rank, res.windows)])
        part = RankPart(rank, res.info, groups=res.groups, threads=res.threads)
        part.warnings = res.warnings
        self.finish_part(
            res.trace_id, res.path, res.fmt, part, rank, res.n_events, size=res.size, sha=res.sha
        )

    def read_file(self, trace_id: int, path: str, fmt: str, read: ReadFile) -> None:
        """Read one file with a per-file reader (it may hold several ranks); a bad file is
        recorded or raised (fail)."""
        with self.reading(trace_id, path):
            for part in read(path, trace_id):
                self.add_part(trace_id, path, fmt, part, size=file_size(path), sha=None)

    @contextmanager
    def reading(self, trace_id: int, path: str) -> Iterator[None]:
        """Around the reading of one file: its error (a RanklensError, or one of the file's
        own that is turned into one naming it) is recorded or raised by `fail`; the machine's
        errors (is_file_error) pass through."""
        try:
            yield
        except WriteFailed:
            raise  # the ranks written with others, not this file (flush)
        except Exception as exc:
            self.fail(trace_id, path, file_error(path, exc), file_size(path))


class WriteFailed(RanklensError):
    """Ranks already read could not be written together (Sink.flush): the ingest stops."""


def require_rank(path: str, rank: int | None) -> int:
    """The rank a file's events are of; a RankError when neither the file nor its name says."""
    if rank is None:
        raise RankError(
            f"{path}: cannot tell which rank wrote this trace (no distributedInfo.rank, "
            "no rank number in the file name)",
            "rename the file to include its rank, e.g. rank3.json.gz",
        )
    return rank


def is_file_error(exc: Exception) -> bool:
    """Whether an unexpected exception while reading a file is that file's fault (its bytes or
    layout) rather than the machine's (memory, disk, a decoding worker process that died) or
    a stop's (Ctrl+C or SIGTERM, which DuckDB may hand back as its own error): only the former
    may skip the file."""
    if lifecycle.was_stopped():
        return False
    if isinstance(exc, MachineError) or no_room(exc):
        return False  # a full disk is not the trace's fault either
    return not isinstance(
        exc, MemoryError | duckdb.IOException | duckdb.OutOfMemoryException | BrokenProcessPool
    )


def file_error(path: str, exc: Exception) -> RanklensError:
    """`exc`, raised while reading `path`, as that file's error: a RanklensError as it is, one
    of the file's own (is_file_error) turned into one naming it; the machine's is raised."""
    if isinstance(exc, RanklensError) and not isinstance(exc, MachineError):
        return exc
    if not is_file_error(exc):
        raise exc
    return unreadable(path, exc)


def unreadable(path: str, exc: BaseException) -> RanklensError:
    """An error the reader did not foresee, turned into one naming the file (the original is
    chained for --debug)."""
    if isinstance(exc, OSError) and exc.strerror:
        err = TraceFormatError(f"{path}: cannot read the file ({exc.strerror})", _OS_HINT)
    else:
        what = (str(exc).splitlines() or [""])[0][:200]
        err = TraceFormatError(
            f"{path}: cannot read the file ({type(exc).__name__}: {what})",
            "the file is damaged or of a layout ranklens does not know; --skip-bad ingests "
            "the other ranks, --debug shows where it failed",
        )
    err.__cause__ = exc
    return err


_OS_HINT = "check that the file exists and is readable (permissions); --skip-bad ingests the rest"


def with_rank(t: pa.Table, rank: int, trace_id: int) -> pa.Table:
    n = t.num_rows
    for name, val in (("rank", rank), ("trace_id", trace_id)):
        col = pa.repeat(pa.scalar(val, pa.int32()), n)
        t = (
            t.set_column(t.column_names.index(name), name, col)
            if name in t.column_names
            else t.append_column(name, col)
        )
    return t
