"""A process killed at any moment of making its private directory leaves nothing a later sweep
keeps, and a sweep never removes a directory whose owner lives (CI flake: a worker killed
between `mkdtemp` and its lock left an empty `ranklens-task-*` directory forever)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from ranklens.ingest.tempfiles import private_dir, sweep_abandoned

# Runs `private_dir` with one step of its set-up replaced by the process killing itself.
_DIE_AT = """import fcntl, os, signal, sys, tempfile
from ranklens.ingest import tempfiles
where = sys.argv[1]
def die(): os.kill(os.getpid(), signal.SIGKILL)
real_mkdtemp, real_flock, real_rename = tempfile.mkdtemp, fcntl.flock, os.rename
flocks = []
def mkdtemp(*a, **k):
    path = real_mkdtemp(*a, **k)
    if where == "made":
        die()
    return path
def flock(fd, op):
    flocks.append(fd)
    if where == "dir-locked" and len(flocks) == 2:
        die()  # the directory is locked, its lock file made but not yet locked
    return real_flock(fd, op)
def rename(a, b):
    if where == "file-locked":
        die()
    return real_rename(a, b)
tempfile.mkdtemp, fcntl.flock, os.rename = mkdtemp, flock, rename
with tempfiles.private_dir("task") as p:
    print(p, flush=True)
    die()
"""

# Makes and uses many private directories while the test sweeps beside it.
_BUSY = """import sys, tempfile, time
from ranklens.ingest.tempfiles import private_dir
made = []
real_mkdtemp = tempfile.mkdtemp
def mkdtemp(*a, **k):
    made.append(1)
    return real_mkdtemp(*a, **k)
tempfile.mkdtemp = mkdtemp
for i in range(int(sys.argv[1])):
    with private_dir("task") as p:
        (p / "data").write_text(str(i))
        time.sleep(0.0005)
        assert (p / "data").read_text() == str(i), p
print(len(made))
"""


def _env(tmpdir: Path) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(tmpdir)}


def _left(tmpdir: Path) -> list[str]:
    return sorted(p.name for p in tmpdir.glob("ranklens-*"))


@pytest.mark.parametrize("where", ["made", "dir-locked", "file-locked", "in-use"])
def test_a_process_killed_while_making_its_directory_leaves_nothing(
    tmp_path: Path, where: str
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _DIE_AT, where], env=_env(tmp_path), capture_output=True, text=True
    )
    assert proc.returncode == -9, proc.stderr
    assert len(_left(tmp_path)) == 1, "the kill should leave its directory behind"
    removed = sweep_abandoned(tmp_path)
    assert len(removed) == 1 and _left(tmp_path) == []


def test_a_sweep_never_removes_a_live_directory(tmp_path: Path) -> None:
    """Two processes make and use directories while this one sweeps as fast as it can: each
    checks that its directory keeps its file, and none has to make one again (a sweep took a
    directory between its making and its lock: 20 in a row once, under load)."""
    n = 300
    cmd = [sys.executable, "-c", _BUSY, str(n)]
    kw: dict[str, Any] = {"env": _env(tmp_path), "stdout": subprocess.PIPE, "text": True}
    procs = [subprocess.Popen(cmd, stderr=subprocess.PIPE, **kw) for _ in range(2)]
    sweeps = 0
    while any(p.poll() is None for p in procs):
        sweep_abandoned(tmp_path)
        sweeps += 1
    for p in procs:
        out, err = p.communicate()
        assert p.returncode == 0, err
        assert out.split() == [str(n)], "a live directory was swept before its lock"
    assert sweeps > 10
    assert _left(tmp_path) == []


def test_a_directory_that_is_not_ours_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's own `ranklens-notes` (files, no lock) is not a run killed while setting up."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mine = tmp_path / "ranklens-notes"
    mine.mkdir()
    (mine / "todo.txt").write_text("keep me")
    with private_dir("run"):
        pass
    assert sweep_abandoned(tmp_path) == [] and _left(tmp_path) == ["ranklens-notes"]


def test_a_held_directory_survives_a_sweep_from_another_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code = "from ranklens.ingest.tempfiles import sweep_abandoned; print(sweep_abandoned())"
    with private_dir("run") as p:
        out = subprocess.run(
            [sys.executable, "-c", code], env=_env(tmp_path), capture_output=True, text=True
        )
        assert out.returncode == 0 and out.stdout.strip() == "[]", out
        assert p.exists()
    assert _left(tmp_path) == []


def test_an_older_versions_run_setting_up_is_kept(tmp_path: Path) -> None:
    """Older versions lock only the file inside (first under its staging name): held, kept."""
    import fcntl

    d = tmp_path / "ranklens-task-old"
    d.mkdir()
    fd = os.open(d / ".owner.lock.new", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert sweep_abandoned(tmp_path) == [] and d.exists()
    finally:
        os.close(fd)
    assert sweep_abandoned(tmp_path) == [str(d)]


def test_an_empty_directory_is_kept_while_its_maker_lives(tmp_path: Path) -> None:
    """Empty and unlocked: what a maker leaves between `mkdtemp` and its lock, or what one
    killed there left. Its name's PID tells the two apart; an older version's name, without
    a PID, is swept as before."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    live_d = tmp_path / f"ranklens-task-{os.getpid()}-abc"
    dead_d = tmp_path / f"ranklens-task-{dead.stdout.strip()}-abc"
    old_d = tmp_path / "ranklens-task-abc"
    for d in (live_d, dead_d, old_d):
        d.mkdir()
    assert sorted(sweep_abandoned(tmp_path)) == sorted([str(dead_d), str(old_d)])
    assert _left(tmp_path) == [live_d.name]
