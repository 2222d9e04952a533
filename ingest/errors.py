"""Errors the user can act on: a message naming the file, and a hint saying what to do.

Code raises these and never logs-and-continues; the CLI prints `error:` and `hint:` once.
"""

from __future__ import annotations

import errno
import json
import re


class RanklensError(Exception):
    """Base of every error ranklens reports to a user (printed without a traceback)."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class TraceFormatError(RanklensError):
    """A file is not a trace ranklens can read, or is damaged."""


class NotATraceError(TraceFormatError):
    """The file is valid but holds no trace at all (e.g. a config.json beside the traces)."""


class RankError(RanklensError):
    """A rank cannot be determined, or two files claim the same rank."""


class NoTracesError(RanklensError):
    """The inputs name no trace file."""


class DatabaseError(RanklensError):
    """The DuckDB file is missing, locked, or of another schema version."""


class MixedFormatsError(RanklensError):
    """One run holds files of several formats (Kineto traces and Nsight reports)."""


class MachineError(RanklensError):
    """The machine's or the storage's fault, not a trace's: the ingest stops whatever --skip-bad
    says (skipping would drop file after file, each for the same reason), and nothing of the
    run is kept."""


class ShardWriteFailed(MachineError):
    """A rank's shard could not be written, or is not where the run's writer reads it."""


class StorageFull(MachineError):
    """A file system ranklens writes to (the run, its temporary files) is full, over a quota
    or a size limit, or read-only."""


# What the OS says of a write that no retry or other file will fix; DuckDB reports the same
# failures as its own error types, with the OS's words in the text.
_NO_ROOM = {
    errno.ENOSPC: "No space left on device",
    errno.EDQUOT: "Disk quota exceeded",
    errno.EFBIG: "File too large",
    errno.EROFS: "Read-only file system",
}
_NO_ROOM_HINT = (
    "free space there (or raise the limit), or write elsewhere; temporary files go to TMPDIR"
)
# DuckDB's asynchronous writes report the OS's failure as JSON inside their message
_DUCKDB_JSON = re.compile(r'"exception_message":"((?:[^"\\]|\\.)*)"')


def storage_error(exc: BaseException) -> StorageFull | None:
    """`exc` as a StorageFull when it says a file system is full or read-only (no_room); else
    None. A RanklensError is left as it is: it says what to do already."""
    if isinstance(exc, RanklensError):
        return exc if isinstance(exc, StorageFull) else None
    seen = _no_room_in(exc)
    if seen is None:
        return None
    first = (str(seen).splitlines() or [""])[0]
    if (inner := _DUCKDB_JSON.search(first)) is not None:
        first = json.loads(f'"{inner.group(1)}"')
    return StorageFull(f"cannot write: {first[:300]}", _NO_ROOM_HINT)


def no_room(exc: BaseException) -> bool:
    """Whether `exc` (not a RanklensError), or an error it was raised from, says a file system
    is full or read-only: an OSError's errno, or those words in DuckDB's error."""
    return not isinstance(exc, RanklensError) and _no_room_in(exc) is not None


def _no_room_in(exc: BaseException) -> BaseException | None:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _NO_ROOM:
            return seen
        if any(words in str(seen) for words in _NO_ROOM.values()):
            return seen
        seen = seen.__cause__
    return None


class WorkerDied(RanklensError):
    """A worker process died (killed: out of memory, most likely); its pool is unusable."""

    def __init__(self, path: str | None = None, worked: bool = True) -> None:
        where = f"{path}: " if path else ""
        retry = "retry with fewer --workers (1 reads in-process)"
        if worked:
            what = "while reading it" if path else "while reading the traces"
            super().__init__(f"{where}a worker process died {what} (out of memory?)", retry)
            return
        # Before any task finished: most often a script that starts the ingest at import.
        super().__init__(
            f"{where}a worker process died before it finished any task",
            "if your own script starts the ingest, start it under "
            '`if __name__ == "__main__":` (worker processes import the main script) or use '
            f"one worker; else it ran out of memory: {retry}",
        )
