"""The database file an ingest writes: checked before any work, locked, replaced in one rename.

Why: the output is the one file ingest may change, so it is the one place where a mistake can
destroy data. It is refused up front when it is an input (or resolves to one), a directory, a
non-database file, or in a directory that cannot be written, so that nothing fails after the
whole ingest; one writer at a time holds a lock beside it; and since the lock proves no other
ingest is writing it, leftovers of a killed run (`.NAME.tmp-PID`, its `.wal` and spill dir)
are removed by the next one.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import os
import shutil
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from ranklens.ingest import readers
from ranklens.ingest.database import is_database
from ranklens.ingest.errors import RanklensError
from ranklens.ingest.shards import CATALOG, is_sharded_run
from ranklens.ingest.tempfiles import remove_tree


class OutputError(RanklensError):
    """The output path cannot be written, or is busy."""


def temp_path(out: Path) -> Path:
    """Where the database is built before the rename (same directory: same filesystem)."""
    return out.with_name(f".{out.name}.tmp-{os.getpid()}")


def check_output(out: Path, inputs: Sequence[str], *, sharded: bool = False) -> None:
    """Refuse an output path that cannot (or must not) be replaced, before any work is done.
    A sharded run is a directory: it may replace an earlier sharded run or an empty directory."""
    parent = out.absolute().parent
    check_parent(out, parent)
    if os.path.lexists(out):
        _check_existing(out, inputs, sharded)
    if _named_like_trace(out):
        raise OutputError(
            f"{out}: an output named like a trace would be read as one later",
            "name the database *.duckdb (e.g. -o run.duckdb)",
        )
    check_writable(out, parent)


def _named_like_trace(out: Path) -> bool:
    """A name some reader would take for a trace (compressed or not): a later ingest of the
    directory would read the file as one."""
    return out.name.endswith((*readers.trace_suffixes(), ".gz"))


def check_parent(out: Path, parent: Path) -> None:
    """Refuse an output whose directory (`parent`) does not exist or is not a directory."""
    if not parent.exists():
        raise OutputError(
            f"{out}: the directory {parent} does not exist",
            f"create it first (mkdir -p {parent}) or write elsewhere",
        )
    if not parent.is_dir():
        raise OutputError(f"{out}: {parent} is not a directory", "choose another output path")


def check_writable(out: Path, parent: Path) -> None:
    """Refuse an output in a directory (`parent`) this user cannot write in."""
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{out}: cannot write in {parent} (permission denied)", _PERM_HINT)


def _check_existing(out: Path, inputs: Sequence[str], sharded: bool) -> None:
    try:
        st = os.stat(out)
    except OSError:
        return  # a dangling link: the rename replaces the link itself
    for f in inputs:
        try:
            same = os.path.samefile(out, f)
        except OSError:
            continue
        if same:
            raise OutputError(
                f"{out}: the output is one of the inputs ({f}); writing it would destroy it",
                "write the database to another file, e.g. -o run.duckdb",
            )
    if sharded:
        _check_run_dir(out, st, inputs)
        return
    if stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{out}: is a directory", "give a file name, e.g. -o run.duckdb")
    if not stat.S_ISREG(st.st_mode):
        raise OutputError(f"{out}: is not a regular file", "give a file name, e.g. -o run.duckdb")
    if st.st_size and not is_database(out):
        raise OutputError(
            f"{out}: exists and is not a DuckDB database; ingest would overwrite it",
            "remove it yourself if it is not needed, or write to another file",
        )


def _check_run_dir(out: Path, st: os.stat_result, inputs: Sequence[str]) -> None:
    """A sharded run replaces only an earlier sharded run or an empty directory, and never one
    holding an input."""
    if not stat.S_ISDIR(st.st_mode) or out.is_symlink():
        raise OutputError(
            f"{out}: exists and is not a directory; a sharded run is a directory",
            "give a new directory name (e.g. -o run/), or remove the file yourself",
        )
    inside = [f for f in inputs if Path(f).resolve().is_relative_to(out.resolve())]
    if inside:
        raise OutputError(
            f"{out}: holds an input ({inside[0]}); writing the run there would destroy it",
            "write the run to another directory, e.g. -o run/",
        )
    if not is_sharded_run(out) and any(out.iterdir()):
        raise OutputError(
            f"{out}: is a directory that is not empty and not a ranklens run",
            "give a new or empty directory, or an earlier sharded run to replace",
        )


_PERM_HINT = "write to a directory you can write to, or fix its permissions"


@contextmanager
def output_lock(out: Path, what: str = "ingest") -> Iterator[None]:
    """Hold `.NAME.lock` beside `out` while `what` (ingest, export) writes it; a second writer
    gets a clear error."""
    path = out.with_name(f".{out.name}.lock")
    fd = _acquire(out, path, what)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        with suppress(OSError):
            os.unlink(path)
        os.close(fd)


def _acquire(out: Path, path: Path, what: str) -> int:
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            what = f"cannot write in {out.absolute().parent} ({exc.strerror})"
            raise OutputError(f"{out}: {what}", _PERM_HINT) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                os.close(fd)
                raise
            pid = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise OutputError(
                f"{out}: another ranklens {what} (pid {pid}) is writing it",
                "wait for it to finish, or write to another file",
            ) from None
        # The previous holder unlinks the lock when done: ours must still be the one named.
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def sweep_leftovers(out: Path) -> list[str]:
    """Remove what killed ingests to `out` left beside it (call with the lock held)."""
    removed: list[str] = []
    for p in out.parent.glob(f".{_glob_escape(out.name)}.old-*"):
        if not os.path.lexists(out):  # killed between commit_dir's two renames: put it back
            os.rename(p, out)
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(str(p))
    for p in out.parent.glob(f".{_glob_escape(out.name)}.tmp-*"):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(str(p))
    return removed


def _glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


@contextmanager
def replacing(out: Path) -> Iterator[Path]:
    """The way to write `out`: under its lock, leftovers swept, yield the temporary path to
    build the database at; put it in place when the block ends normally, and always remove what
    is left of it (DuckDB's `.wal` and spill directory too), so a failure keeps the old file."""
    with output_lock(out):
        sweep_leftovers(out)
        tmp = temp_path(out)
        try:
            yield tmp
            commit(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
            Path(str(tmp) + ".wal").unlink(missing_ok=True)
            remove_tree(str(tmp) + ".tmp")  # DuckDB's spill directory


def commit(tmp: Path, out: Path) -> None:
    """Put the finished database in place in one rename (readers see the old or the new file,
    never a part); a stale `.wal` of the old file goes first so it cannot apply to the new."""
    Path(str(out) + ".wal").unlink(missing_ok=True)
    os.replace(tmp, out)


@contextmanager
def replacing_dir(out: Path) -> Iterator[Path]:
    """`replacing` for a sharded run: the run is built in a temporary directory beside `out`
    and put in place when the block ends normally; a failure removes it and keeps the old run."""
    with output_lock(out):
        sweep_leftovers(out)
        tmp = temp_path(out)
        tmp.mkdir()
        try:
            yield tmp
            commit_dir(tmp, out)
        finally:
            remove_tree(tmp)


def commit_dir(tmp: Path, out: Path) -> None:
    """Put a finished run directory in place. A directory cannot replace a non-empty one in one
    rename, so an earlier run is first renamed aside (`.NAME.old-PID`) and removed after; if
    the ingest dies between the two renames the next one under the lock puts it back."""
    for leftover in (tmp / (CATALOG + ".wal"), tmp / (CATALOG + ".tmp")):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
    if is_sharded_run(out):
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)  # new, or an empty directory


def check_result_file(out: Path, inputs: Sequence[str]) -> None:
    """Refuse a query result's file (`ranklens sql -o`) that is an input (or a file a glob
    input matches), a directory, a ranklens run or a trace, before the query runs: rows
    written over those would destroy what the user gave."""
    if os.path.lexists(out):
        for f in inputs:
            for match in [f, *glob.glob(f)] if glob.has_magic(f) else [f]:
                with suppress(OSError):
                    if os.path.samefile(out, match):
                        raise OutputError(
                            f"{out}: the output is one of the inputs ({match}); writing the "
                            "result there would destroy it",
                            _RESULT_ELSEWHERE,
                        )
        if out.is_dir():
            raise OutputError(f"{out}: is a directory", _RESULT_ELSEWHERE)
        if is_database(out):
            raise OutputError(
                f"{out}: is a DuckDB database; writing the result there would destroy it",
                _RESULT_ELSEWHERE,
            )
        if _named_like_trace(out):
            raise OutputError(
                f"{out}: is named like a trace; writing the result there would destroy it",
                _RESULT_ELSEWHERE,
            )
    parent = out.absolute().parent
    check_parent(out, parent)
    check_writable(out, parent)


_RESULT_ELSEWHERE = "write the result to a new file, e.g. -o result.csv"


@contextmanager
def replacing_file(out: Path) -> Iterator[Path]:
    """The temporary path to write a result at (beside `out`): renamed over `out` when the
    block ends normally and removed otherwise, so an interrupted write keeps the old file."""
    tmp = temp_path(out)
    try:
        yield tmp
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
