"""Opening a run, the one way every command does it: a database, or traces ingested on the fly.

Why one function: `report`, `analyze`, `check`, `sql` and `dashboard` all take either a ranklens
database or trace inputs, with the same options (skip bad files, workers, mixed formats, clock
alignment, offsets, layout) resolved the same way (flag > `[tool.ranklens]` of ./pyproject.toml
> default). When each face opened runs itself the flags drifted: `check` ignored the layout the
report used and the dashboard had its own temporary ingest.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
from ranklens.ingest.config import ConfigError, RunOptions, pyproject_section, resolve_options
from ranklens.ingest.database import connect, is_database, looks_like_database
from ranklens.ingest.errors import DatabaseError
from ranklens.ingest.loader import IngestReport, Progress, load_traces
from ranklens.ingest.tempfiles import private_dir

Finalize = Callable[[duckdb.DuckDBPyConnection], None]


@dataclass(frozen=True)
class OpenOptions:
    """How trace inputs are ingested (a database keeps what it was ingested with).

    Attributes:
        cross: clock alignment, user offsets and the parallel layout (cross-rank work).
        on_error: "raise" stops at the first bad file; "skip" records it and goes on.
        workers: decoding processes (None: CPU count, at most 8; 1: in-process).
        allow_mixed: ingest Kineto traces and Nsight reports together.
    """

    cross: RunOptions = field(default_factory=RunOptions)
    on_error: str = "raise"
    workers: int | None = None
    allow_mixed: bool = False

    @property
    def sources(self) -> dict[str, str]:
        return self.cross.sources


def resolve_open_options(
    *,
    skip_bad: bool = False,
    workers: int | None = None,
    allow_mixed: bool = False,
    no_align: bool = False,
    offsets: str | os.PathLike[str] | None = None,
    layout: str | None = None,
    section: dict[str, Any] | None = None,
) -> OpenOptions:
    """Flags over `[tool.ranklens]` (`section`, default: ./pyproject.toml) over defaults.

    Raises:
        ConfigError: a malformed layout or offsets file, or workers below 1.
    """
    sec = pyproject_section() if section is None else section
    cross = resolve_options(no_align=no_align, offsets_file=offsets, layout=layout, section=sec)
    sources = dict(cross.sources)
    if workers is None and "workers" in sec:
        workers, sources["workers"] = sec["workers"], "pyproject"
    elif workers is not None:
        sources["workers"] = "flag"
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)):
        raise ConfigError(f"workers must be a whole number, not {workers!r}", _WORKERS_HINT)
    if workers is not None and workers < 1:
        raise ConfigError(f"workers must be at least 1, not {workers}", _WORKERS_HINT)
    skip = skip_bad or bool(sec.get("skip_bad", False))
    mixed = allow_mixed or bool(sec.get("allow_mixed", False))
    return OpenOptions(
        cross=RunOptions(cross.align, cross.offsets, cross.layout, sources),
        on_error="skip" if skip else "raise",
        workers=workers,
        allow_mixed=mixed,
    )


_WORKERS_HINT = "give --workers N with N >= 1 (1 decodes in-process), or leave it out"


def ingest_traces(
    inputs: list[str] | list[str | os.PathLike[str]],
    db_path: str | os.PathLike[str],
    options: OpenOptions | None = None,
    *,
    progress: Progress | None = None,
    finalize: Finalize | None = None,
    storage: str = "file",
    engine: str = "local",
    ray_address: str | None = None,
) -> IngestReport:
    """Ingest trace inputs into `db_path` with `options` (see loader.load_traces)."""
    o = options or OpenOptions()
    return load_traces(
        inputs,
        db_path,
        on_error=o.on_error,
        workers=o.workers,
        progress=progress,
        options=o.cross,
        allow_mixed=o.allow_mixed,
        finalize=finalize,
        storage=storage,
        engine=engine,
        ray_address=ray_address,
    )


@dataclass
class Run:
    """An open run: its database file, and what the ingest did when traces were given.

    `con` is opened on first use (read-only); faces that open their own sandboxed connections
    (sql, dashboard) use `db_path` only, since DuckDB refuses two configurations of one file.
    """

    db_path: str
    report: IngestReport | None
    _con: duckdb.DuckDBPyConnection | None = None

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        if self._con is None:
            self._con = connect(self.db_path)
        return self._con

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None


@contextmanager
def open_run(
    source: str | os.PathLike[str] | list[str],
    options: OpenOptions | None = None,
    *,
    progress: Progress | None = None,
    for_baseline: bool = False,
) -> Iterator[Run]:
    """The run `source` names: a ranklens database as it is, or trace inputs ingested into a
    private temporary database (removed on exit, and by a later run if this one is killed).

    Alignment, offsets and layout given as flags apply when traces are ingested; with a
    database they are an error (it keeps what it was ingested with), except for a baseline,
    which is compared as it was recorded.
    """
    o = options or OpenOptions()
    inputs = [str(s) for s in source] if isinstance(source, list) else [str(source)]
    if len(inputs) == 1 and _is_database_arg(inputs[0]):
        flags = {"align": "--no-align", "offsets": "--offsets", "layout": "--layout"}
        given = [flags[k] for k, v in o.sources.items() if v == "flag" and k in flags]
        if given and not for_baseline:
            raise ConfigError(
                f"{inputs[0]} is a database; {', '.join(given)} apply when traces are ingested",
                f"change them in the database with: ranklens realign {inputs[0]} "
                f"{' '.join(given)} ...; or give the trace directory instead of the database",
            )
        run = Run(inputs[0], None)
        try:
            connect(inputs[0]).close()  # a clear error now for a foreign or locked file
            yield run
        finally:
            run.close()
        return
    with private_dir("run") as tmp:
        db = str(tmp / "run.duckdb")
        report = ingest_traces(list(inputs), db, o, progress=progress)
        run = Run(db, report)
        try:
            yield run
        finally:
            run.close()


def _is_database_arg(path: str) -> bool:
    """A DuckDB file by its header, or a file named like one that is not (refused, not read as
    a trace: `report garbage.duckdb` must not say "not valid JSON")."""
    if is_database(path):
        return True
    if looks_like_database(path):
        p = Path(path)
        what = "is empty" if p.is_file() and p.stat().st_size == 0 else "is not a DuckDB database"
        raise DatabaseError(
            f"{path}: {what} (no DuckDB header)",
            "give a database written by `ranklens ingest`, or the trace files themselves",
        )
    return False
