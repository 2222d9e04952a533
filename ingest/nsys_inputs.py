"""The Nsight Systems reader's declaration, and its rule about a run's file list.

Why here and not in the loader: these are Nsight-specific facts about files.
* `nsys stats`, `nsys recipe` and users write `X.sqlite` beside `X.nsys-rep`: the two are one
  rank, so the export is read and the report left alone (else the rank is claimed twice, or
  ingest fails for want of `nsys` although the export is right there).
* Reports hold no process-group metadata (communicators are inferred for a Nsight-only run).
Mixing it with another format in one run is refused by `readers.route` (unless allowed).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ranklens.ingest._model import RankPart, Reader
from ranklens.ingest.errors import MixedFormatsError

__all__ = ["NSYS_SUFFIXES", "READER", "MixedFormatsError", "drop_twins"]

NSYS_SUFFIXES = (".sqlite", ".nsys-rep")


def drop_twins(files: list[str]) -> tuple[list[str], list[str]]:
    """(files to read, notes): a report with its export beside it is left out."""
    exports = {f[: -len(".sqlite")] for f in files if f.endswith(".sqlite")}
    twins = [f for f in files if f.endswith(".nsys-rep") and f[: -len(".nsys-rep")] in exports]
    notes = (
        [
            f"{len(twins)} .nsys-rep report(s) have their .sqlite export beside them (e.g. "
            f"{twins[0]}); the exports were read"
        ]
        if twins
        else []
    )
    return [f for f in files if f not in set(twins)], notes


def read(path: str, trace_id: int) -> Iterable[RankPart]:
    """Each rank of one report (nsys.py, imported on first use: its SQLite driver is only
    needed when there are reports)."""
    from ranklens.ingest.nsys import read_nsys

    return read_nsys(Path(path), trace_id)


READER: Reader = Reader(
    name="nsys",
    title="Nsight",
    unit="report",
    suffixes=NSYS_SUFFIXES,
    read=read,
    select=drop_twins,
)
