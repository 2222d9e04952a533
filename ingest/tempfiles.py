"""Private temporary directories that a later run can tell are abandoned.

Why: a run killed with SIGKILL (the OOM killer, a CI timeout) runs no cleanup, so its unpacked
.gz copies and temporary databases would stay in $TMPDIR forever (hundreds of MB each time).
Every directory made here holds a lock file that its owner keeps locked (flock) while it lives;
the kernel drops the lock when the process dies, so any later run can remove what nobody holds,
whatever its PID namespace, and never touches a live run's files.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PREFIX = "ranklens-"
_LOCK = ".owner.lock"


@contextmanager
def private_dir(kind: str) -> Iterator[Path]:
    """A fresh directory under $TMPDIR, removed on exit (and by a later run if this one dies).
    Abandoned directories of dead runs are removed first."""
    sweep_abandoned()
    path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-"))
    fd = -1
    try:
        # Lock first under another name, then rename: a sweeper never sees the lock unheld.
        staging = path / (_LOCK + ".new")
        fd = os.open(staging, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(staging, path / _LOCK)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        if fd >= 0:
            os.close(fd)


def sweep_abandoned(root: str | os.PathLike[str] | None = None) -> list[str]:
    """Remove ranklens temporary directories whose owner is gone; returns what was removed."""
    base = Path(root or tempfile.gettempdir())
    removed: list[str] = []
    try:
        candidates = [p for p in base.glob(PREFIX + "*") if p.is_dir() and not p.is_symlink()]
    except OSError:
        return removed
    for d in candidates:
        try:
            fd = os.open(d / _LOCK, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue  # no lock: not made here, or still being set up
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # its owner is alive
        try:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(str(d))
        finally:
            os.close(fd)
    return removed
