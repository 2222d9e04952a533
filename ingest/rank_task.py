"""One trace file in, its ranks' shards out: the per-rank task of a sharded ingest.

Why a pure function of (file, trace id, run directory): it is what any executor runs (the local
process pool, a Ray task on another machine), so the tables are the same whichever ran it. It
decodes the file, assigns each event its step (step_assign, a function of the rank's own events),
writes the rank's events as Parquet shards beside the catalog and returns only what the
cross-rank stage and the catalog need: the rank's communication rows (a few hundred per rank),
its step windows, threads, groups and file facts. The main process never sees the other rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from ranklens.ingest import kineto, shards, staging, step_assign
from ranklens.ingest._model import rank_from_name
from ranklens.ingest.errors import MachineError, RanklensError
from ranklens.ingest.sanity import check_times
from ranklens.ingest.sink import file_error, file_size, require_rank, with_rank
from ranklens.ingest.tempfiles import private_dir


@dataclass
class RankResult:
    """What one rank of a file left for the catalog (or why the file was not read)."""

    trace_id: int
    path: str
    fmt: str
    size: int
    sha: str | None = None
    rank: int | None = None
    info: dict[str, Any] = field(default_factory=dict)
    threads: list[tuple[int, int, str]] = field(default_factory=list)
    groups: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    windows: list[step_assign.Window] = field(default_factory=list)
    comm: pa.Table | None = None  # the rank's communication rows, with their steps
    parts: list[tuple[str, int]] = field(default_factory=list)  # its shards: path, bytes
    n_events: int = 0
    error: RanklensError | None = None


def read_file(fmt: str, path: str, trace_id: int, run_dir: str) -> list[RankResult]:
    """Every rank of one file, its shards written under `run_dir`; a bad file gives one result
    holding the error (and no shard). Errors of the machine (memory, disk) and of the storage
    (MachineError) are raised."""
    # A private directory: a worker killed mid-task (SIGKILL) leaves it unlocked, and the
    # ingest that saw the worker die, or any later run, removes it.
    with private_dir("task") as scratch:
        try:
            return list(_read(fmt, path, trace_id, run_dir, str(scratch)))
        except Exception as exc:
            shards.remove_parts(run_dir, trace_id)
            if isinstance(exc, MachineError):  # the storage's (ShardWriteFailed, StorageFull)
                raise
            return [RankResult(trace_id, path, fmt, file_size(path), error=file_error(path, exc))]


def _read(fmt: str, path: str, tid: int, run_dir: str, scratch: str) -> Iterator[RankResult]:
    if fmt == "kineto":
        yield _kineto(path, tid, run_dir, scratch)
        return
    from ranklens.ingest.readers import READERS

    reader = next(r for r in READERS if r.name == fmt)
    assert reader.read is not None  # only Kineto schedules its own decoding
    for part in reader.read(path, tid):
        rank = _rank_of(path, part.rank)
        res = RankResult(tid, path, fmt, file_size(path), None, rank, part.info)
        res.threads, res.groups, res.warnings = part.threads, part.groups, part.warnings
        tables = (with_rank(part.events.pop(0), rank, tid) for _ in range(len(part.events)))
        _write(res, tables, run_dir)
        yield res


def _kineto(path: str, tid: int, run_dir: str, scratch: str) -> RankResult:
    prep = kineto.prepare(path, kineto.PIECE_BYTES, True, scratch)
    try:
        rank = _rank_of(path, prep.rank)
        res = RankResult(tid, path, "kineto", prep.size_bytes, prep.sha256, rank, prep.info)

        def pieces() -> Iterator[pa.Table]:
            i = 0
            while i < len(prep.pieces):
                piece = kineto.decode_piece(prep, i, rank, tid, serial=True)
                res.threads += piece.threads
                res.groups += piece.groups
                i += piece.consumed
                yield piece.table

        _write(res, pieces(), run_dir)
        res.groups += prep.groups  # after the pieces' own, the order ingest keeps
        return res
    finally:
        kineto.cleanup(prep)


def _rank_of(path: str, rank: int | None) -> int:
    return require_rank(path, rank if rank is not None else rank_from_name(path))


def _write(res: RankResult, tables: Iterator[pa.Table], run_dir: str) -> None:
    """Stage the rank's pieces, assign steps, then write each piece's shard and keep its
    communication rows (steps.write_rank's order, so the rows are the same)."""
    staged: list[staging.Piece] = []
    corr: list[np.ndarray] = []
    ext: list[np.ndarray] = []
    for t in tables:
        check_times(res.path, t)
        if t.num_rows:
            c, e = shards.comm_keys(t)
            corr.append(c)
            ext.append(e)
            staged.append(staging.pack(t))
        res.n_events += t.num_rows
        del t
    assert res.rank is not None
    if not staged:  # a rank with no events still has a (empty) shard: the view needs one
        res.parts.append(shards.write_part(run_dir, res.rank, res.trace_id, 0, pa.table({})))
        return
    step, res.windows = step_assign.assign(
        staging.step_table(staged), bool(res.info.get("has_gpu"))
    )
    all_corr, all_ext = shards.unique_keys(corr), shards.unique_keys(ext)
    del corr, ext
    comm: list[pa.Table] = []
    at = 0
    for i, piece in enumerate(staging.unpack_all(staged)):
        piece = piece.append_column("step", step.slice(at, piece.num_rows))
        at += piece.num_rows
        mask = shards.comm_mask(piece, all_corr, all_ext)
        comm.append(piece.filter(mask))
        rows = piece.filter(pc.invert(mask))
        res.parts.append(shards.write_part(run_dir, res.rank, res.trace_id, i, rows))
        del piece
    res.comm = pa.concat_tables(staging.same_types(comm), promote_options="permissive")
