"""The trace formats ranklens reads, and which one reads a given file.

Why one registry: routing by hard-coded suffix checks in several modules meant a new format
touched the input scan, the loader, the writer and the mixed-run rule. Now a format is one
module declaring a `Reader` (`_model.py`: a per-file `read` returning `RankPart`s, or a `load`
that schedules its own decoding) and one line in `READERS`; the directory scan, the routing,
the mixed-run rule, communicator inference and the output-name check derive from it.

Routing: the readers claiming a file's suffix read it; when several do, or none does (a file
named explicitly), the first whose `sniff` accepts its first bytes; else the first claimant, or
the first reader (Kineto: its errors say why a file is not a trace).
"""

from __future__ import annotations

import os
import stat
import zlib

from ranklens.ingest import jax_trace, kineto_schedule, nsys_inputs
from ranklens.ingest._model import Batch, Reader
from ranklens.ingest.errors import MixedFormatsError

READERS: tuple[Reader, ...] = (
    kineto_schedule.READER,
    nsys_inputs.READER,
    jax_trace.READER,
)

HEAD_BYTES = 4096


def trace_suffixes() -> tuple[str, ...]:
    """Every suffix a reader claims: what a directory scan picks up."""
    return tuple(dict.fromkeys(s for r in READERS for s in r.suffixes))


def reader_for(path: str) -> Reader:
    """The reader of one file (see the module docstring)."""
    claim = [r for r in READERS if path.endswith(r.suffixes)]
    if len(claim) == 1:
        return claim[0]
    sniffers = [r for r in claim or READERS if r.sniff is not None]
    if sniffers:
        data = head(path)
        for r in sniffers:
            if r.sniff is not None and r.sniff(data):
                return r
    return claim[0] if claim else READERS[0]


def head(path: str, n: int = HEAD_BYTES) -> bytes:
    """The first `n` bytes of a regular file, inflated if it is gzip; b"" if it cannot be read
    (the chosen reader then says why). Never opens a FIFO or device (it could block)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return b""
        with open(path, "rb") as f:
            raw = f.read(max(n, 65536))
    except OSError:
        return b""
    if raw[:2] != b"\x1f\x8b":
        return raw[:n]
    try:
        return zlib.decompressobj(wbits=31).decompress(raw, n)
    except zlib.error:
        return b""


def route(
    files: list[str], *, allow_mixed: bool
) -> tuple[list[tuple[Reader, list[str]]], list[str]]:
    """(each reader with its files, in READERS order; notes): the readers' own file rules
    applied, and a run mixing formats refused unless allow_mixed.

    Raises:
        MixedFormatsError: files of several formats and allow_mixed is False.
    """
    by_name: dict[str, list[str]] = {r.name: [] for r in READERS}
    for f in files:
        by_name[reader_for(f).name].append(f)
    routed: list[tuple[Reader, list[str]]] = []
    notes: list[str] = []
    for r in READERS:
        mine = by_name[r.name]
        if mine and r.select is not None:
            mine, more = r.select(mine)
            notes += more
        if mine:
            routed.append((r, mine))
    if len(routed) > 1:
        notes.append(_mixed(routed, allow_mixed))
    return routed, notes


def _mixed(routed: list[tuple[Reader, list[str]]], allow_mixed: bool) -> str:
    """Formats differ in what they record (process groups, sequence numbers, CPU operators,
    clock base), so cross-rank numbers would silently compare unlike things: refused, or a
    note when the user says they know."""
    if not allow_mixed:
        raise MixedFormatsError(
            "the run mixes "
            + " and ".join(f"{len(fs)} {r.title} {r.unit}(s) (e.g. {fs[0]})" for r, fs in routed),
            "give the files of one profiler per run (profile every rank the same way); to "
            "ingest them together anyway pass --allow-mixed (load_traces(allow_mixed=True))",
        )
    bare = [r.title for r, _ in routed if not r.carries_groups]
    why = ""
    if bare:
        why = f"the {' and '.join(bare)} ranks' collectives get no inferred communicator and "
    return (
        f"mixed run allowed: {' and '.join(f'{len(fs)} {r.title}' for r, fs in routed)} "
        f"file(s); {why}clocks come from different sources, so cross-rank matching and "
        "alignment may leave them out"
    )


def infers_communicators(routed: list[tuple[Reader, list[str]]]) -> bool:
    """No file of the run carries process groups: infer communicators from collectives.
    (Kineto runs carry pg_config/args; CPU gloo runs need per-thread attribution instead.)"""
    return not any(r.carries_groups for r, _ in routed)


def read_batch(reader: Reader, batch: Batch) -> None:
    """Read one reader's files into `batch.sink`."""
    if reader.load is not None:
        reader.load(batch)
        return
    assert reader.read is not None  # (Reader checks it has one of the two)
    for tid, path in batch.files:
        batch.sink.read_file(tid, path, reader.name, reader.read)
        batch.file_done(path)
