"""Errors the user can act on: a message naming the file, and a hint saying what to do.

Code raises these and never logs-and-continues; the CLI prints `error:` and `hint:` once.
"""

from __future__ import annotations


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


class ShardWriteFailed(RanklensError):
    """A rank's shard could not be written, or is not where the run's writer reads it: the
    storage's fault, not the file's, so the ingest stops whatever --skip-bad says (skipping
    would drop rank after rank, each for the same reason)."""


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
