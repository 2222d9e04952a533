"""Inflating a .gz input to a private temporary file, with its size checked as it streams.

Why: traces are decoded from memory-mapped bytes, so a .gz is inflated to disk first; a file
that inflates without bound (a gzip bomb, or a damaged stream) must stop at a limit rather
than fill $TMPDIR, and the copy must never land beside the user's file.
"""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
import zlib

from ranklens.ingest.errors import StorageFull, no_room
from ranklens.ingest.kineto_events import _fail


def uncompressed(path: str, tmp_root: str | None) -> tuple[str, str | None]:
    """Path of the uncompressed bytes; .gz is inflated to a private temp file (never beside
    the user's file), under `tmp_root` (the run's own temporary directory) when given."""
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic != b"\x1f\x8b":
        return path, None
    tmp = tempfile.mkdtemp(prefix="gz-" if tmp_root else "ranklens-", dir=tmp_root)
    out = os.path.join(tmp, "trace.json")
    try:
        _inflate(path, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out, tmp


# A Kineto trace compresses 10-25x; past 100x (and 64 MiB) it is a gzip bomb, not a trace.
MAX_INFLATE_RATIO = 100
_INFLATE_FLOOR = 64 * 1024 * 1024
_DISK_MARGIN = 256 * 1024 * 1024


def _inflate(path: str, out: str) -> None:
    """Stream-inflate `path` into `out`, checking the size as it grows: a bomb stops at its
    limit, and a full disk is an error before it is full."""
    limit = max(_INFLATE_FLOOR, MAX_INFLATE_RATIO * os.path.getsize(path))
    written = 0
    try:
        with gzip.open(path, "rb") as src, open(out, "wb") as dst:
            while chunk := src.read(8 * 1024 * 1024):
                written += len(chunk)
                if written > limit:
                    raise _fail(
                        path,
                        f"inflates beyond {limit // 2**20} MiB, over {MAX_INFLATE_RATIO}x its "
                        "size: not a profiler trace (a gzip bomb?)",
                        "if it really is a trace, gunzip it yourself and give the .json",
                    )
                if shutil.disk_usage(os.path.dirname(out)).free < _DISK_MARGIN:
                    raise StorageFull(
                        f"{path}: not enough space in {os.path.dirname(os.path.dirname(out))} "
                        f"to inflate it ({written // 2**20} MiB so far)",
                        "free space there, or point TMPDIR at a larger disk",
                    )
                dst.write(chunk)
    except (OSError, EOFError, zlib.error) as exc:
        if no_room(exc):  # the copy's disk (full, a quota): not the trace's
            raise StorageFull(
                f"{path}: cannot inflate it into {os.path.dirname(os.path.dirname(out))} "
                f"({exc.strerror if isinstance(exc, OSError) and exc.strerror else exc})",
                "free space there (or raise the limit), or point TMPDIR at a larger disk",
            ) from exc
        raise _fail(
            path, f"corrupt gzip data ({exc})", "re-copy the file; gzip -t FILE checks it"
        ) from None
