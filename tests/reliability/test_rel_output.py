"""Issue 14 items 1, 6 and 8 (output): the output is checked before any work (never an input,
a directory, a non-database file, or in a directory that cannot be written), written whole
(views included) before one rename, and a second writer is refused."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import duckdb
import pytest

from reliability.conftest import write_run
from reliability.harness import can_drop_privileges, clear_error, ok, run, snapshot, unchanged


@pytest.mark.parametrize("how", ["same-path", "dot-slash", "symlink", "hardlink", "in-dir-run"])
def test_output_that_is_an_input_is_refused(tmp_path: Path, how: str) -> None:
    runs = write_run(tmp_path)
    target = runs / "rank0.json"
    inputs: list[str] = [str(runs)]
    out = target
    if how == "dot-slash":
        out, inputs = Path("run/./rank0.json"), ["run/rank0.json", "run/rank1.json"]
    elif how == "symlink":
        out = tmp_path / "link.duckdb"
        out.symlink_to(target)
    elif how == "hardlink":
        out = tmp_path / "hard.duckdb"
        os.link(target, out)
    elif how == "in-dir-run":
        inputs = [str(target), str(runs / "rank1.json")]
    before = snapshot(tmp_path)
    res = run(["ingest", *inputs, "-o", out], tmp_path)
    clear_error(res, "the output is one of the inputs", "rank0.json")
    unchanged(before, snapshot(tmp_path))


def _fifo(p: Path) -> Path:
    os.mkfifo(p)
    return p


@pytest.mark.parametrize(
    "case,fragment",
    [
        ("missing-dir", "does not exist"),
        ("parent-is-file", "is not a directory"),
        ("is-directory", "is a directory"),
        ("not-a-database", "not a DuckDB database"),
        ("fifo", "not a regular file"),
        ("trace-name", "named like a trace"),
    ],
)
def test_bad_output_path_is_refused_before_any_work(
    tmp_path: Path, case: str, fragment: str
) -> None:
    runs = write_run(tmp_path)
    out = {
        "missing-dir": tmp_path / "nope" / "o.duckdb",
        "parent-is-file": runs / "rank1.json" / "o.duckdb",
        "is-directory": tmp_path / "adir.duckdb",
        "not-a-database": tmp_path / "notes.txt",
        "fifo": tmp_path / "pipe.duckdb",
        "trace-name": tmp_path / "new.json",
    }[case]
    if case == "is-directory":
        out.mkdir()
    elif case == "not-a-database":
        out.write_text("my notes\n")
    elif case == "fifo":
        _fifo(out)
    before = snapshot(tmp_path)
    res = run(["ingest", runs, "-o", out], tmp_path, timeout=60)
    clear_error(res, str(out), fragment)
    unchanged(before, snapshot(tmp_path))


@pytest.mark.skipif(not can_drop_privileges(), reason="cannot make file modes bind")
def test_read_only_output_directory(tmp_path: Path) -> None:
    runs = write_run(tmp_path)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    before = snapshot(tmp_path)
    try:
        res = run(["ingest", runs, "-o", ro / "o.duckdb"], tmp_path, unprivileged=True)
    finally:
        ro.chmod(0o755)
    clear_error(res, "cannot write in", str(ro))
    unchanged(before, snapshot(tmp_path))


def test_failed_ingest_keeps_the_previous_output(tmp_path: Path) -> None:
    runs = write_run(tmp_path)
    db = tmp_path / "o.duckdb"
    ok(run(["ingest", runs, "-o", db], tmp_path))
    (runs / "rank1.json").write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1')
    before = snapshot(tmp_path)
    clear_error(run(["ingest", runs, "-o", db], tmp_path), "truncated")
    unchanged(before, snapshot(tmp_path))
    ok(run(["report", db], tmp_path))  # still the old, whole database


def test_second_writer_is_refused(tmp_path: Path) -> None:
    runs = write_run(tmp_path)
    db = tmp_path / "o.duckdb"
    ok(run(["ingest", runs, "-o", db], tmp_path))
    lock = tmp_path / ".o.duckdb.lock"
    fd = os.open(lock, os.O_CREAT | os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running ingest holds it
        os.write(fd, b"4242\n")
        before = snapshot(tmp_path)
        res = run(["ingest", runs, "-o", db], tmp_path)
        clear_error(res, str(db), "another ranklens ingest (pid 4242) is writing it")
        unchanged(before, snapshot(tmp_path))
    finally:
        os.close(fd)
        lock.unlink()
    ok(run(["ingest", runs, "-o", db], tmp_path))  # free again once the writer is gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.duckdb", "run"]


def test_views_are_in_the_file_before_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI's ingest, in-process, with os.replace watched: what is renamed into place
    already holds every view (they used to be added by reopening the final path after it)."""
    from ranklens.cli.main import app
    from typer.testing import CliRunner

    runs = write_run(tmp_path)
    db = tmp_path / "o.duckdb"
    seen: list[int] = []
    real = os.replace

    def watched(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if str(dst) == str(db):
            seen.append(_views(Path(src)))
        real(src, dst)

    monkeypatch.setattr(os, "replace", watched)
    res = CliRunner().invoke(app, ["ingest", str(runs), "-o", str(db), "--workers", "1"])
    assert res.exit_code == 0, res.output
    final = _views(db)
    assert seen == [final] and final > 20, (seen, final)


def _views(path: Path) -> int:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return int(
            con.execute("SELECT count(*) FROM duckdb_views() WHERE NOT internal").fetchall()[0][0]
        )
    finally:
        con.close()


def test_leftovers_of_a_killed_ingest_are_removed(tmp_path: Path) -> None:
    runs = write_run(tmp_path)
    db = tmp_path / "o.duckdb"
    ok(run(["ingest", runs, "-o", db], tmp_path))
    dead = tmp_path / ".o.duckdb.tmp-999999999"
    dead.write_bytes(b"half a database")
    Path(str(dead) + ".wal").write_bytes(b"wal")
    (tmp_path / ".o.duckdb.tmp-999999999.tmp").mkdir()
    (tmp_path / ".o.duckdb.tmp-999999999.tmp" / "spill.block").write_bytes(b"x" * 1000)
    ok(run(["ingest", runs, "-o", db], tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.duckdb", "run"]
