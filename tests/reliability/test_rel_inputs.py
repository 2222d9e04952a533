"""Issue 14 items 8 and 10 (inputs): odd files and directories get a message that says what
they are (never "no such file", never a traceback, never a rank silently dropped), a non-trace
JSON beside the traces is left out with a note, and messages name files once and keep their
brackets."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from reliability.conftest import write_run
from reliability.harness import (
    can_drop_privileges,
    clear_error,
    line_with,
    ok,
    run,
    snapshot,
    unchanged,
)

needs_modes = pytest.mark.skipif(not can_drop_privileges(), reason="cannot make modes bind")


@pytest.mark.parametrize("content", ['{"lr": 0.1, "steps": 10}', "[1, 2, 3]"])
def test_non_trace_json_in_a_directory_is_a_note(tmp_path: Path, content: str) -> None:
    runs = write_run(tmp_path)
    cfg = runs / "config.json"
    cfg.write_text(content)
    before = snapshot(tmp_path)
    res = run(["ingest", runs, "-o", "o.duckdb"], tmp_path)
    ok(res)
    assert "ingested 2 rank(s)" in res.out
    note = line_with(res.err, "warning:")
    assert str(cfg) in note and "left out" in note, res.err
    unchanged(before, snapshot(tmp_path), new_ok=["o.duckdb"])
    # named explicitly it is an error
    clear_error(run(["report", cfg, runs / "rank0.json"], tmp_path), str(cfg), "not a Kineto")


def test_damaged_trace_in_a_directory_is_still_an_error(tmp_path: Path) -> None:
    runs = write_run(tmp_path)
    (runs / "rank1.json").write_text('{"traceEvents": [{"ph": "X", "name": "a"')
    clear_error(run(["report", runs], tmp_path), str(runs / "rank1.json"))


@pytest.mark.parametrize(
    "kind,fragment",
    [
        ("loop", "symbolic link loop"),
        ("broken", "broken symbolic link"),
        ("fifo", "not a regular file (a FIFO)"),
        ("directory", "the directory holds no trace file"),
        ("missing", "no such file"),
    ],
)
def test_odd_files_say_what_they_are(tmp_path: Path, kind: str, fragment: str) -> None:
    runs = write_run(tmp_path)
    odd = tmp_path / "rank5.json"
    if kind == "loop":
        (tmp_path / "other.json").symlink_to(odd)
        odd.symlink_to(tmp_path / "other.json")
    elif kind == "broken":
        odd.symlink_to(tmp_path / "gone.json")
    elif kind == "fifo":
        os.mkfifo(odd)
    elif kind == "directory":
        odd.mkdir()
    before = snapshot(tmp_path)
    res = run(["ingest", runs / "rank0.json", odd, "-o", "o.duckdb"], tmp_path, timeout=60)
    clear_error(res, str(odd), fragment)
    unchanged(before, snapshot(tmp_path))


@needs_modes
def test_unreadable_file(tmp_path: Path) -> None:
    runs = write_run(tmp_path)
    bad = runs / "rank1.json"
    bad.chmod(0o000)
    before = snapshot(tmp_path)
    try:
        res = run(["ingest", runs, "-o", "o.duckdb"], tmp_path, unprivileged=True)
        clear_error(res, str(bad), "cannot read the file (Permission denied)")
        unchanged(before, snapshot(tmp_path))
        skip = run(["ingest", runs, "-o", "o.duckdb", "--skip-bad"], tmp_path, unprivileged=True)
    finally:
        bad.chmod(0o644)
    ok(skip)
    assert "ingested 1 rank(s)" in skip.out and str(bad) in line_with(skip.err, "skipped:")


@needs_modes
def test_unreadable_subdirectory_is_not_a_silent_drop(tmp_path: Path) -> None:
    runs = write_run(tmp_path)
    sub = runs / "node1"
    sub.mkdir()
    (runs / "rank1.json").rename(sub / "rank1.json")
    sub.chmod(0o000)
    try:
        res = run(["ingest", runs, "-o", "o.duckdb"], tmp_path, unprivileged=True)
        skip = run(["ingest", runs, "-o", "o.duckdb", "--skip-bad"], tmp_path, unprivileged=True)
    finally:
        sub.chmod(0o755)
    clear_error(res, str(sub), "cannot read the directory")
    ok(skip)
    assert "ingested 1 rank(s)" in skip.out
    assert str(sub) in line_with(skip.err, "warning:"), skip.err


def test_skipped_line_names_the_file_once(tmp_path: Path) -> None:
    runs = write_run(tmp_path)
    bad = runs / "rank9.json"
    bad.write_text("not json")
    for cmd in (["ingest", runs, "-o", "o.duckdb", "--skip-bad"], ["report", "o.duckdb"]):
        res = run(cmd, tmp_path)
        ok(res)
        line = line_with(res.err, "skipped:") or line_with(res.out, "skipped:")
        assert line.count(str(bad)) == 1, res.text


def test_garbage_database_is_not_read_as_json(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.duckdb"
    garbage.write_bytes(os.urandom(5000))
    empty = tmp_path / "empty.duckdb"
    empty.touch()
    before = snapshot(tmp_path)
    for db, fragment in ((garbage, "not a DuckDB database"), (empty, "is empty")):
        res = run(["report", db], tmp_path)
        clear_error(res, str(db), fragment)
        assert "JSON" not in res.err and "another process" not in res.err
    unchanged(before, snapshot(tmp_path))


def test_locked_database_hint_names_the_lock(tmp_path: Path) -> None:
    runs = write_run(tmp_path)
    ok(run(["ingest", runs, "-o", "o.duckdb"], tmp_path))
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, time; c = duckdb.connect('o.duckdb'); "
         "print('held', flush=True); time.sleep(60)"],
        cwd=tmp_path, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        res = run(["report", "o.duckdb"], tmp_path)
    finally:
        holder.kill()
        holder.communicate()
    clear_error(res, "o.duckdb", "cannot open the database", "another process holds it")


def test_help_keeps_brackets() -> None:
    res = run(["ingest", "--help"], Path.cwd())
    assert "[tool.ranklens] layout" in " ".join(res.out.split())
    res = run(["check", "--help"], Path.cwd())
    text = " ".join(res.out.split())
    assert "[tool.ranklens.check]" in text and "[check] table" in text


@pytest.mark.parametrize("value", ["1e400", "-1e400", "1e19"])
def test_offsets_out_of_range(tmp_path: Path, value: str) -> None:
    runs = write_run(tmp_path)
    offsets = tmp_path / "offsets.json"
    offsets.write_text('{"0": 0, "1": ' + value + "}")
    res = run(["ingest", runs, "-o", "o.duckdb", "--offsets", offsets], tmp_path)
    clear_error(res, str(offsets), "out of range")


@pytest.mark.parametrize(
    "query",
    [
        "SELECT INTERVAL 3 DAY AS v",
        "SELECT 'ab'::BLOB AS v",
        "SELECT union_value(a := 1) AS v",
        "SELECT '101'::BIT AS v",
    ],
)
@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_sql_odd_types(tmp_path: Path, query: str, fmt: str, sql_db: Path) -> None:
    res = run(["sql", sql_db, query, "-f", fmt], tmp_path)
    assert "Traceback" not in res.text and res.rc in (0, 1), res.text
    if res.rc:
        clear_error(res)


@pytest.fixture(scope="module")
def sql_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sql")
    runs = write_run(root)
    ok(run(["ingest", runs, "-o", "o.duckdb"], root))
    return root / "o.duckdb"


def test_debug_still_shows_tracebacks(tmp_path: Path) -> None:
    runs = write_run(tmp_path)
    (runs / "rank1.json").write_text("not json")
    res = run(["--debug", "report", runs], tmp_path)
    assert res.rc != 0 and "Traceback" in res.err


def _nsys(path: Path, *, end: int = 80, start: int = 40) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ingest"))
    from nsys_fixtures import NsysDB

    db = NsysDB(path).meta(env={"RANK": "0", "WORLD_SIZE": "1"}, normalized=True)
    db.process(100)
    db.gpu(0)
    db.runtime(100, 10, 20, "cudaLaunchKernel_v7000", 1)
    db.kernel(100, start, end, "void gemm<float>(float*)", corr=1)
    db.save()
    return path


@pytest.mark.parametrize(
    "case,fragment",
    [
        ("end-int64-max", "out of range"),
        ("start-very-negative", "overflow"),
        ("column-renamed", "no such column"),
        ("column-wrong-type", "'abc'"),
    ],
)
def test_nsight_damage(tmp_path: Path, case: str, fragment: str) -> None:
    p = tmp_path / "rank0.sqlite"
    if case == "end-int64-max":
        _nsys(p, start=1_700_000_000_000_000_000, end=2**63 - 1)
    elif case == "start-very-negative":
        _nsys(p, start=-(2**62), end=2**63 - 1)
    else:
        _nsys(p)
        con = sqlite3.connect(p)
        sql = (
            "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME COLUMN start TO startNs"
            if case == "column-renamed"
            else "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'abc'"
        )
        con.execute(sql)
        con.commit()
        con.close()
    before = snapshot(tmp_path)
    clear_error(run(["ingest", p, "-o", "o.duckdb"], tmp_path), str(p), fragment)
    unchanged(before, snapshot(tmp_path))
