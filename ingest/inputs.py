"""Which files a run's inputs name, and why a named file cannot be read.

Why here: directories are searched, globs expanded and files taken as given, and each way
decides differently what a surprise means. A file the user named must be a trace (or an error
says why not); a file a directory scan or a glob found may be something else that lives beside
traces (a config.json), which is noted and left out rather than failing the run. Directories
that cannot be read, links that loop and FIFOs get their own message, never "no such file" and
never a rank that silently goes missing.
"""

from __future__ import annotations

import errno
import glob
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field

from ranklens.ingest.errors import NoTracesError, TraceFormatError

# Files a run directory may hold beside its traces (capture's manifest, a generator's truth).
NOT_TRACES = frozenset({"manifest.json", "truth.json"})


@dataclass
class Inputs:
    """The trace files of a run, those found by searching, and directories that could not be
    searched or held nothing (each `path: reason`)."""

    files: list[str]
    found: set[str] = field(default_factory=set)
    unreadable_dirs: list[str] = field(default_factory=list)


def scan_inputs(inputs: Sequence[str | os.PathLike[str]], suffixes: tuple[str, ...]) -> Inputs:
    """Expand directories, globs and files into a sorted list of trace files (a directory's:
    those with one of `suffixes`, the readers' (readers.trace_suffixes))."""
    files: list[str] = []
    found: set[str] = set()
    bad_dirs: list[str] = []
    for item in inputs:
        s = str(item)
        if os.path.isdir(s):
            hits = _walk(s, suffixes, bad_dirs)
            if not hits and len(inputs) > 1:  # (alone, "no trace files in DIR" below)
                bad_dirs.append(f"{s}: the directory holds no trace file")
        elif any(ch in s for ch in "*?[") and not os.path.lexists(s):
            hits = [p for p in glob.glob(s, recursive=True) if os.path.isfile(p)]
        else:
            files.append(s)
            continue
        files += hits
        found.update(hits)
    if not files and not bad_dirs:
        names = ", ".join(str(i) for i in inputs) or "(nothing)"
        raise NoTracesError(
            f"no trace files in {names}",
            "give a directory holding one *.json / *.json.gz (Kineto), *.sqlite (Nsight) or "
            "jax.profiler profile per rank, a glob, or the files themselves",
        )
    files = sorted(dict.fromkeys(files))
    return Inputs(files, found - {f for f in map(str, inputs)}, bad_dirs)


def _walk(top: str, suffixes: tuple[str, ...], bad_dirs: list[str]) -> list[str]:
    def onerror(exc: OSError) -> None:
        bad_dirs.append(f"{exc.filename}: cannot read the directory ({exc.strerror})")

    out: list[str] = []
    for root, _dirs, names in os.walk(top, onerror=onerror):
        out += [
            os.path.join(root, f) for f in names if f.endswith(suffixes) and f not in NOT_TRACES
        ]
    return out


def check_readable(path: str) -> int:
    """The size of `path` if it is a regular file that can be read; else an error that says
    what it is (missing, a broken or looping link, a FIFO, unreadable)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise TraceFormatError(f"{path}: {_stat_problem(path, exc)}", _PATH_HINT) from None
    if stat.S_ISDIR(st.st_mode):
        raise TraceFormatError(f"{path}: is a directory", _PATH_HINT)
    if not stat.S_ISREG(st.st_mode):
        raise TraceFormatError(
            f"{path}: is not a regular file ({_kind(st.st_mode)})",
            "give the trace file itself (ranklens reads files, not pipes or devices)",
        )
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise TraceFormatError(
            f"{path}: cannot read the file ({exc.strerror})",
            "check its permissions; --skip-bad ingests the other ranks",
        ) from None
    return st.st_size


_PATH_HINT = "check the path"


def _stat_problem(path: str, exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "is a symbolic link loop"
    if exc.errno == errno.ENOENT and os.path.islink(path):
        return f"is a broken symbolic link (to {os.readlink(path)})"
    if exc.errno == errno.ENOENT:
        return "no such file"
    return f"cannot read the file ({exc.strerror})"


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a plain file"
