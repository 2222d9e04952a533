"""PyTorch profiler (Kineto) JSON reader.

Why it is built this way: per-rank traces reach gigabytes, so the file is never decoded as one
Python object tree. A first pass finds the `traceEvents` array and reads the header around it
(with the C scanner: from the array's last piece only; without it: a msgspec pass that skips the
events); the array is then cut into ~16 MB pieces at event boundaries and each piece is decoded
straight into Arrow columns, by the C scanner (kineto_fast) or, for anything it refuses, by typed
msgspec structs (kineto_events, the reference). Pieces decode in parallel worker processes;
memory stays bounded by pieces in flight and one rank's staged columns.

Time: absolute ns = `baseTimeNanoseconds` (0 in the old absolute-epoch flavour) + ts·1000, with
the integer µs part converted exactly; sub-µs digits carry float64 precision (exact for relative
timestamps; ~0.25 µs for absolute-epoch µs with decimals, which old traces do not write).
"""

from __future__ import annotations

import codecs
import mmap
import os
import re
import shutil
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pyarrow as pa
from ranklens.ingest import kineto_fast, staging, step_assign
from ranklens.ingest._model import rank_from_name
from ranklens.ingest.errors import NotATraceError, TraceFormatError
from ranklens.ingest.file_hash import file_sha256
from ranklens.ingest.gz import uncompressed
from ranklens.ingest.inputs import check_readable
from ranklens.ingest.kineto_events import _Event, _fail, _parse_ranks, columns
from ranklens.ingest.sanity import NS_LIMIT, check_times

PIECE_BYTES = 16 * 1024 * 1024
_BOUNDARY_RE = re.compile(rb"\}\s*,\s*\{")
_HAS_DEVICE_RE = re.compile(rb'"cat"\s*:\s*"(?:kernel|gpu_memcpy|gpu_memset)"')
_TRACE_EVENTS_RE = re.compile(rb'"traceEvents"\s*:\s*\[')


class _PgConfig(msgspec.Struct):
    pg_name: str | int | None = None
    pg_desc: str | None = None
    backend_config: str | None = None
    pg_size: int | None = None
    ranks: list[int] | str | None = None


class _DistInfo(msgspec.Struct):
    backend: str | None = None
    rank: int | None = None
    world_size: int | None = None
    pg_config: list[_PgConfig] | dict[str, _PgConfig] | None = None


class _DevProp(msgspec.Struct):
    id: int | None = None
    name: str | None = None
    numSms: int | None = None


class _Header(msgspec.Struct):
    traceEvents: msgspec.Raw = msgspec.Raw(b"")
    distributedInfo: _DistInfo | None = None
    deviceProperties: list[_DevProp] | None = None
    baseTimeNanoseconds: int | None = None
    host_name: str | None = None
    hostname: str | None = None


@dataclass
class Prepared:
    """Result of the first pass over one file: header facts and the pieces to decode."""

    path: str  # the user's file
    data_path: str  # uncompressed bytes (the file itself, or a temp copy for .gz)
    temp_dir: str | None
    size_bytes: int
    sha256: str
    base_ns: int
    has_device: bool
    rank: int | None
    info: dict[str, Any]
    groups: list[dict[str, Any]]
    pieces: list[tuple[int, int]] = field(default_factory=list)
    raw_bytes: int = 0


def prepare(
    path: str,
    piece_bytes: int | None = None,
    with_hash: bool | None = True,
    tmp_root: str | None = None,
) -> Prepared:
    """First pass: hash, inflate, read the header, locate the events and plan the pieces.

    `piece_bytes` (default PIECE_BYTES) is passed explicitly by the parallel loader: this runs
    in a worker process, where the parent's PIECE_BYTES setting would not be seen. That loader
    hashes a file of several pieces itself while the workers decode them, off the critical
    path, and a file of one piece here (`with_hash=None`): its one piece leaves nothing to
    overlap with, and the main process, the one writer, is what many small ranks wait on.
    """
    size = check_readable(path)
    one_piece = with_hash is None and size <= (piece_bytes or PIECE_BYTES)
    sha = file_sha256(path) if with_hash or one_piece else ""
    data_path, tmp = uncompressed(path, tmp_root)
    try:
        return _prepare_data(path, data_path, tmp, size, sha, piece_bytes or PIECE_BYTES)
    except BaseException:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def _prepare_data(
    path: str, data_path: str, tmp: str | None, size: int, sha: str, piece_bytes: int
) -> Prepared:
    raw_size = os.path.getsize(data_path)
    if raw_size == 0:
        raise _fail(path, "the file is empty")
    with open(data_path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        located = _locate_fast(mm, piece_bytes) or _locate_checked(path, mm, piece_bytes)
        hdr, start, end, pieces = located
        has_device = _HAS_DEVICE_RE.search(mm, start, end) is not None
    dist = hdr.distributedInfo or _DistInfo()
    rank = dist.rank if dist.rank is not None else rank_from_name(path)
    if not abs(hdr.baseTimeNanoseconds or 0) < NS_LIMIT:
        raise _fail(path, f"baseTimeNanoseconds {hdr.baseTimeNanoseconds} is out of range")
    dev = hdr.deviceProperties[0] if hdr.deviceProperties else None
    info: dict[str, Any] = {
        "world_size": dist.world_size,
        "backend": dist.backend,
        "host": hdr.host_name or hdr.hostname,
        "device_name": dev.name if dev else None,
        "num_sms": dev.numSms if dev else None,
        "has_gpu": has_device,
    }
    return Prepared(
        path=path,
        data_path=data_path,
        temp_dir=tmp,
        size_bytes=size,
        sha256=sha,
        base_ns=hdr.baseTimeNanoseconds or 0,
        has_device=has_device,
        rank=rank,
        info=info,
        groups=_groups(dist),
        pieces=pieces,
        raw_bytes=raw_size,
    )


Located = tuple[_Header, int, int, list[tuple[int, int]]]


def _locate_checked(path: str, mm: mmap.mmap, piece_bytes: int) -> Located:
    """Header and events array through a full decode of the file (which also validates it)."""
    try:
        hdr = msgspec.json.decode(mm, type=_Header)
    except msgspec.ValidationError as exc:  # (a DecodeError subclass: test it first)
        if mm.find(b'"traceEvents"') < 0:  # valid JSON, and no trace in it at all
            raise _not_a_trace(path, f"not a Kineto trace: {exc}") from None
        raise _fail(path, f"not a Kineto trace: {exc}") from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        if (bad := _invalid_utf8(mm, exc)) is not None:
            raise _fail(path, f"invalid UTF-8 at byte {bad}") from None
        raise _fail(path, f"not valid JSON: {exc}") from None
    except RecursionError:
        raise _fail(path, "JSON nested too deeply to read (thousands of levels)") from None
    events_len = len(hdr.traceEvents)
    hdr.traceEvents = msgspec.Raw(b"")  # drop the view into the mmap before closing it
    if events_len == 0:
        raise _not_a_trace(path, "no `traceEvents` array: this is not a Kineto trace")
    m = _TRACE_EVENTS_RE.search(mm)
    if m is None:
        raise _fail(path, "could not locate the `traceEvents` array")
    start = m.end() - 1
    end = start + events_len
    if mm[end - 1 : end] != b"]":
        raise _fail(path, "could not delimit the `traceEvents` array")
    return hdr, start, end, _plan_pieces(mm, start + 1, end - 1, piece_bytes)


def _locate_fast(mm: mmap.mmap, piece_bytes: int) -> Located | None:
    """The same without reading the events twice (needs the C scanner): cut from the array's
    start to the end of the file, find the array's end from the last cut, and decode the
    header around it. A cut inside a nested value or any oddity gives a header that does not
    decode, or pieces that do not scan; then the checked path above decides."""
    if not kineto_fast.available():
        return None
    m = _TRACE_EVENTS_RE.search(mm)
    if m is None:
        return None
    start = m.end() - 1
    pieces = _plan_pieces(mm, start + 1, len(mm), piece_bytes)
    try:
        end = kineto_fast.skip_events(mm, pieces[-1][0])
        hdr = msgspec.json.decode(mm[:start] + b"[]" + mm[end:], type=_Header)
    except (ValueError, msgspec.DecodeError, UnicodeDecodeError):
        return None
    if bytes(hdr.traceEvents) != b"[]":
        return None
    hdr.traceEvents = msgspec.Raw(b"")
    pieces[-1] = (pieces[-1][0], end - 1)
    return hdr, start, end, pieces


def _groups(dist: _DistInfo) -> list[dict[str, Any]]:
    cfg = dist.pg_config
    if cfg is None:
        return []
    items = list(cfg.values()) if isinstance(cfg, dict) else list(cfg)
    out = []
    for pg in items:
        if pg.pg_name is None:
            continue
        ranks = _parse_ranks(pg.ranks)
        backend = pg.backend_config.split(":")[-1] if pg.backend_config else dist.backend
        desc = None if pg.pg_desc in (None, "undefined") else pg.pg_desc
        out.append(
            {
                "pg_name": str(pg.pg_name),
                "pg_desc": desc,
                "ranks": ranks,
                "size": pg.pg_size if pg.pg_size is not None else (len(ranks) if ranks else None),
                "backend": backend,
                "source": "pg_config",
            }
        )
    return out


def _plan_pieces(mm: mmap.mmap, lo: int, hi: int, piece_bytes: int) -> list[tuple[int, int]]:
    """Cut [lo, hi) at event boundaries roughly every `piece_bytes`. A cut that lands inside a
    nested value is harmless: decoding that piece fails and it is merged with the next."""
    pieces = []
    pos = lo
    while hi - pos > piece_bytes:
        m = _BOUNDARY_RE.search(mm, pos + piece_bytes, hi)
        if m is None:
            break
        cut = m.start() + 1  # just after the '}'
        pieces.append((pos, cut))
        pos = m.end() - 1  # at the '{'
    pieces.append((pos, hi))
    return pieces


@dataclass
class Piece:
    """Decoded events of one piece of a file, ready for the database: as a table, or, from a
    worker (decode_staged), already staged."""

    table: pa.Table
    threads: list[tuple[int, int, str]]
    groups: list[dict[str, Any]]
    consumed: int
    rows: int = 0
    staged: staging.Piece | None = None


class BadCut(Exception):
    """A planned cut fell inside a nested value; the file is decoded serially instead."""


def decode_piece(
    prep: Prepared, index: int, rank: int, trace_id: int, serial: bool = False
) -> Piece:
    """Decode one planned piece. A piece that does not decode raises BadCut in parallel mode
    (the caller redoes the file serially); in serial mode it is merged with the next pieces."""
    lo, hi = prep.pieces[index]
    consumed = 1
    with open(prep.data_path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        fast = kineto_fast.columns(
            mm, lo, hi, prep.has_device, prep.info.get("backend"), prep.base_ns, rank, trace_id
        )
        if fast is not None:
            return Piece(fast[0], fast[1], fast[2], consumed, fast[0].num_rows)
        while True:
            try:
                events = msgspec.json.decode(b"[" + mm[lo:hi] + b"]", type=list[_Event])
                break
            except RecursionError:
                raise _fail(
                    prep.path, f"an event nested too deeply to read (piece at byte {lo})"
                ) from None
            except (msgspec.DecodeError, UnicodeDecodeError, msgspec.ValidationError) as exc:
                if not serial and len(prep.pieces) > 1:
                    raise BadCut(str(exc)) from None
                # The header pass checked the array's JSON syntax, so a syntax error here is a
                # cut inside a nested value: merging always ends it (the last piece ends at the
                # array's end). Other errors are real once a few merges did not help.
                syntax = type(exc) is msgspec.DecodeError
                if index + consumed < len(prep.pieces) and (consumed < 4 or syntax):
                    hi = prep.pieces[index + consumed][1]
                    consumed += 1
                    continue
                raise _decode_error(prep.path, exc, lo, _invalid_utf8(mm, exc, lo, hi)) from None
    table, threads, groups = columns(
        prep.path, prep.has_device, prep.info.get("backend"), prep.base_ns, events, rank, trace_id
    )
    return Piece(table, threads, groups, consumed, table.num_rows)


def decode_staged(prep: Prepared, index: int, rank: int, trace_id: int) -> Piece:
    """decode_piece in a worker, its events checked and staged there (sanity.check_times,
    staging.pack). Why: packing is ~1 us a row of the main process' time, and the main
    process, the one writer, is what a many-rank ingest waits on; the packed piece is also a
    few times smaller to send back."""
    pc = decode_piece(prep, index, rank, trace_id)
    check_times(prep.path, pc.table)
    if pc.table.num_rows:
        staged = pc.staged = staging.pack(pc.table)
        if len(prep.pieces) == 1:  # the whole rank: its steps too, off the one writer's time
            staged.assigned = step_assign.assign(staging.step_table([staged]), prep.has_device)
    pc.table = pa.table({})
    return pc


_UTF8_CHUNK = 16 << 20


def _invalid_utf8(buf: mmap.mmap, exc: Exception, lo: int = 0, hi: int = -1) -> int | None:
    """File offset of the first byte of buf[lo:hi] that is not UTF-8, when msgspec's error
    `exc` says the text is not; else None. Why found here: msgspec 0.23 says "Invalid UTF-8
    encoded string" with no position, and up to 0.22 raised UnicodeDecodeError with one
    counted from the string it decoded, not the file. The error path only, 16 MB at a time
    (a whole file decoded at once would be a str of its size)."""
    if not isinstance(exc, UnicodeDecodeError) and "utf-8" not in str(exc).lower():
        return None
    end = len(buf) if hi < 0 else hi
    dec = codecs.getincrementaldecoder("utf-8")()
    pos = lo
    while pos < end:
        chunk = buf[pos : min(pos + _UTF8_CHUNK, end)]
        pending = len(dec.getstate()[0])  # a character cut by the previous chunk
        try:
            dec.decode(chunk, final=pos + len(chunk) >= end)
        except UnicodeDecodeError as err:
            return pos - pending + err.start
        pos += len(chunk)
    return None


def _decode_error(path: str, exc: Exception, offset: int, bad_byte: int | None) -> TraceFormatError:
    if bad_byte is not None:
        return _fail(
            path,
            f"invalid UTF-8 at byte {bad_byte}",
            "the file is damaged; --skip-bad ingests the other ranks",
        )
    msg = str(exc)
    if "truncated" in msg:
        return _fail(
            path,
            "the JSON ends early (truncated file?)",
            "the profiler may have been killed while writing; re-export the trace",
        )
    m = re.search(r"\$\[(\d+)\]", msg)
    where = (
        f" (event {m.group(1)} of the piece at byte {offset})" if m else f" (near byte {offset})"
    )
    return _fail(path, f"malformed event: {msg}{where}")


def _not_a_trace(path: str, what: str) -> NotATraceError:
    return NotATraceError(
        f"{path}: {what}",
        "check that the file is a complete PyTorch profiler (Kineto) JSON trace",
    )


def cleanup(prep: Prepared) -> None:
    """Remove the private inflated copy of a .gz input."""
    if prep.temp_dir:
        shutil.rmtree(prep.temp_dir, ignore_errors=True)
