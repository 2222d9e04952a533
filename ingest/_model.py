"""The reader protocol: what a format declares (`Reader`) and hands over (`RankPart`).

Readers (kineto*.py, nsys*.py) know formats; the loader (loader.py) and the writer (sink.py)
know the database. A reader returns one `RankPart` per rank found in a file, holding plain Arrow
tables whose columns are `EVENT_COLUMNS`, so the writer inserts them in bulk. Which reader reads
a file is decided once, by `readers.py`, from the `Reader` each format module declares.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
from ranklens.ingest.schema import TABLE_BY_NAME

if TYPE_CHECKING:
    from ranklens.ingest.sink import Sink

# Columns a reader fills; `step` is assigned by the loader from the step markers.
EVENT_COLUMNS: tuple[str, ...] = tuple(
    c for c in TABLE_BY_NAME["events"].column_names if c not in ("step",)
)
RANK_COLUMNS: tuple[str, ...] = TABLE_BY_NAME["ranks"].column_names
GROUP_COLUMNS: tuple[str, ...] = TABLE_BY_NAME["process_groups"].column_names


@dataclass
class RankPart:
    """Everything one file says about one rank.

    Attributes:
        rank: the global rank, or None when the file does not say (the loader then tries the
            file name, else raises a RankError).
        info: values for `ranks` columns (world_size, host, pid, backend, device_name, ...).
        events: Arrow tables with exactly EVENT_COLUMNS (rank/trace_id may be null: the loader
            fills them). The sink takes them out of the list as it stages them.
        groups: `process_groups` rows as dicts (pg_name, pg_desc, ranks, size, backend, source).
        threads: (pid, tid, name) labels; tid -1 names a process.
        warnings: things the user should know that did not stop the ingest.
    """

    rank: int | None
    info: dict[str, Any] = field(default_factory=dict)
    events: list[pa.Table] = field(default_factory=list)
    groups: list[dict[str, Any]] = field(default_factory=list)
    threads: list[tuple[int, int, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def n_events(self) -> int:
        return sum(t.num_rows for t in self.events)


def event_schema() -> pa.Schema:
    """Arrow schema of a reader's event table (kind as a plain string)."""
    types: dict[str, pa.DataType] = {
        "INTEGER": pa.int32(),
        "BIGINT": pa.int64(),
        "VARCHAR": pa.string(),
    }
    fields = []
    for col in TABLE_BY_NAME["events"].columns:
        if col.name == "step":
            continue
        fields.append(pa.field(col.name, types.get(col.type, pa.string())))
    return pa.schema(fields)


_RANK_IN_NAME_RE = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


def rank_from_name(path: str) -> int | None:
    """The rank a file name gives (`rank3.json.gz`, `trace_rank-3.sqlite`): the fallback of
    every format when the file itself does not say."""
    m = _RANK_IN_NAME_RE.search(Path(path).name)
    return int(m.group(1)) if m else None


class ReadFile(Protocol):
    """Read one file (its `trace_id` given) into the ranks it holds.

    Raises a RanklensError naming the file for bad input; the writer then records the file as
    skipped (--skip-bad) or stops. Any other exception from the file's bytes is wrapped the same
    way (sink.unreadable)."""

    def __call__(self, path: str, trace_id: int) -> Iterable[RankPart]: ...


@dataclass
class Batch:
    """One reader's files in a run, and what it may use to read them.

    Attributes:
        sink: the single writer (claim ranks, stage events, record skips).
        files: (trace_id, path) in ingest order.
        workers: worker processes the reader may use (1: read in this process).
        scratch: a private directory for temporary copies (removed after the ingest).
        file_done: called with each file's path once it is read (progress).
    """

    sink: Sink
    files: list[tuple[int, str]]
    workers: int
    scratch: str
    file_done: Callable[[str], None]


@dataclass(frozen=True)
class Reader:
    """A trace format, declared once in its module and listed once in `readers.READERS`.

    Attributes:
        name: `sources.format` of its files.
        title: the format in messages ("Kineto"); `unit`: what one file is ("trace").
        suffixes: file names it claims (in directory scans too).
        read: one file -> its RankParts, read in this process (most formats need only this).
        load: instead of `read`, the whole batch with its own scheduling (Kineto decodes pieces
            of files in worker processes); it hands its results to `batch.sink` the same way.
        sniff: the first bytes of a file (inflated if .gz) -> whether it is this format; asked
            when several readers claim a suffix, or none does (the first reader is the default).
        select: the reader's files -> (those to read, notes), for rules about a run's file list
            (an Nsight report beside its own export is read once).
        carries_groups: files hold process-group metadata; a run without any gets its
            communicators inferred from collective sequences instead.
    """

    name: str
    title: str
    unit: str
    suffixes: tuple[str, ...]
    read: ReadFile | None = None
    load: Callable[[Batch], None] | None = None
    sniff: Callable[[bytes], bool] | None = None
    select: Callable[[list[str]], tuple[list[str], list[str]]] | None = None
    carries_groups: bool = False

    def __post_init__(self) -> None:
        if (self.read is None) == (self.load is None):
            raise ValueError(f"reader {self.name}: give exactly one of read and load")
