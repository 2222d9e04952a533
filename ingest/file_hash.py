"""A trace file's SHA-256, stored in `sources` (re-ingest detection).

Why a module of its own: the Kineto reader hashes a file of one piece in the worker that
decodes it, and a larger one on a worker beside its pieces (kineto_schedule); either way the
hash is one pass over the file's bytes, done here the same way.
"""

from __future__ import annotations

import hashlib
import mmap
import os

_HASH_WINDOW = 16 << 20  # a multiple of mmap.ALLOCATIONGRANULARITY


def file_sha256(path: str) -> str:
    """The file's SHA-256, hashed from read-only mappings of 16 MB at a time: no copy of each
    chunk out of the page cache (0.41 -> 0.34 CPU-s for 400 MB, time the decoding workers
    share), and no more of the file mapped at once (a mapping of the whole file counted its
    400 MB in the ingest's PSS); read in chunks where it cannot be mapped (empty, not a
    regular file)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        try:
            size, at = os.fstat(f.fileno()).st_size, 0
            while at < size:
                n = min(_HASH_WINDOW, size - at)
                with mmap.mmap(f.fileno(), n, access=mmap.ACCESS_READ, offset=at) as mm:
                    h.update(mm)
                at += n
            if size:
                return h.hexdigest()
        except (ValueError, OSError):
            h = hashlib.sha256()
            f.seek(0)
        while chunk := f.read(8 * 1024 * 1024):
            h.update(chunk)
    return h.hexdigest()
