"""Private temporary directories that a later run can tell are abandoned.

Why: a run killed with SIGKILL (the OOM killer, a CI timeout) runs no cleanup, so its unpacked
.gz copies and temporary databases would stay in $TMPDIR forever (hundreds of MB each time).
Every directory made here is locked (flock) by its owner while it lives, the directory itself
and a lock file inside it (what older versions look at); the kernel drops a lock when its
process dies, so any later run can remove what nobody holds, whatever its PID namespace, and
never touches a live run's files.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ranklens.ingest.lifecycle import process_gone
from ranklens.ingest.threads import through_stops

PREFIX = "ranklens-"
_LOCK = ".owner.lock"
_STAGING = _LOCK + ".new"
_TRIES = 20


def remove_tree(path: str | os.PathLike[str]) -> None:
    """`shutil.rmtree(path, ignore_errors=True)` that a second Ctrl+C (or SIGTERM) cannot cut
    short: a sharded run's temporary directory holds thousands of shards, and a stop landing
    in its removal left it behind on an exit that reported the cleanup done (3 of 14 double
    Ctrl+C on a 1,024-rank sharded ingest). The stop is raised once the tree is gone."""

    def removed() -> bool:
        try:
            shutil.rmtree(path, ignore_errors=True)  # only a stop raises
        except OSError as exc:
            stop = _stop_behind(exc)
            if stop is None:
                raise
            raise stop from None  # held by through_stops, which removes the rest
        return True

    through_stops(removed)


def _stop_behind(exc: BaseException) -> KeyboardInterrupt | None:
    """The stop that an OSError replaced, if any. Why: a stop landing in rmtree between its
    `os.close(dirfd)` and the flag saying so makes its `finally` close the descriptor again
    (EBADF), and that OSError, not the stop, leaves rmtree (CI, session 35): the tree was
    left behind and the user saw an internal error instead of "interrupted"."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return seen
        seen = seen.__context__
    return None


@contextmanager
def private_dir(kind: str) -> Iterator[Path]:
    """A fresh directory under $TMPDIR, removed on exit (and by a later run if this one dies).
    Abandoned directories of dead runs are removed first."""
    sweep_abandoned()
    path, fds = _make(kind)
    try:
        yield path
    finally:
        try:
            remove_tree(path)
        finally:
            for fd in fds:
                os.close(fd)


def _make(kind: str) -> tuple[Path, list[int]]:
    """Make and lock a directory. The directory's own flock is the owner's mark: a process
    killed between `mkdtemp` and its lock leaves an empty unlocked directory, which a sweep
    removes, so no moment exists where an abandoned directory is kept. A sweep can remove a
    live one before its lock is taken (its maker in another PID namespace): then make another.
    The maker's PID in the name keeps the directory from sweeps of its own namespace meanwhile:
    a sweep running beside many makers took 20 in a row from one of them (a test under load)."""
    for _ in range(_TRIES):
        path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-{os.getpid()}-"))
        fds: list[int] = []
        try:
            fds.append(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
            fcntl.flock(fds[0], fcntl.LOCK_EX)
            if os.fstat(fds[0]).st_nlink == 0 or os.stat(path).st_ino != os.fstat(fds[0]).st_ino:
                raise FileNotFoundError(path)  # swept before the lock was ours
            # The lock file too, for older sweepers: lock it under another name, then rename.
            staging = path / _STAGING
            fds.append(os.open(staging, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600))
            fcntl.flock(fds[1], fcntl.LOCK_EX)
            os.rename(staging, path / _LOCK)
            return path, fds
        except BaseException as exc:
            for fd in fds:
                os.close(fd)
            if not isinstance(exc, FileNotFoundError):  # swept: make another
                shutil.rmtree(path, ignore_errors=True)
                raise
    raise OSError(f"could not make a temporary directory under {tempfile.gettempdir()}")


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
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _abandoned(d):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(str(d))
        except OSError:
            continue  # its owner is alive
        finally:
            os.close(fd)
    return removed


def _abandoned(d: Path) -> bool:
    """Called with `d`'s own lock held: nobody of this version owns it. Its lock file says
    whether an older version's run does (one still setting up holds the staging name, then
    renames it); with neither, only an empty directory (killed while being set up) is ours,
    once the process its name says made it is gone."""
    names = {p.name for p in d.iterdir()}
    if _LOCK in names:
        return not _held(d / _LOCK)
    if names == {_STAGING}:
        return not _held(d / _STAGING) and not _held(d / _LOCK)
    return not names and not _maker_alive(d.name)


def _maker_alive(name: str) -> bool:
    """Whether the process `ranklens-<kind>-<pid>-...` names runs, a zombie being gone (in this
    PID namespace: one of another, or a PID reused, is taken for gone or alive; a wrong "gone"
    has its maker make another directory, a wrong "alive" keeps an empty one until that
    process ends)."""
    parts = name[len(PREFIX) :].split("-")
    if len(parts) < 3 or not parts[1].isdigit() or int(parts[1]) > 2**31:
        return False  # an older version's name: no PID
    return not process_gone(int(parts[1]))


def _held(path: Path) -> bool:
    """Whether a live process holds `path`'s flock (missing: nobody)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)
