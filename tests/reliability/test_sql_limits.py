"""Issue 14, item 9 (SQL limits, the temp-directory gap, server paths) and item 8's SQL part
(INTERVAL and BLOB results), in both faces.

Before: csv/json/parquet output had no limit (`range(2e8)` reached 7.4 GB), a dashboard query
could take the server to 7 GB, the console could read and write `<db>.tmp/`, errors showed the
server's paths, and INTERVAL/BLOB results were a traceback (CLI) or an HTTP 500 (dashboard).
The CLI runs in a process of its own with bounded memory and time, so a regression fails here
instead of taking the machine.
"""

from __future__ import annotations

import resource
import shutil
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from ranklens.analysis.sql_console import MEMORY_LIMIT, MIB, RESULT_BYTES
from ranklens.dashboards.pages import sql

from .sqlenv import Server, cells, cli, make_db

MEMORY_MSG = f"{MEMORY_LIMIT // MIB:,} MiB of memory"
HUNGRY = "SELECT count(*) FROM (SELECT DISTINCT range FROM range(150000000))"  # ~3 GiB in DuckDB
TYPES = "SELECT INTERVAL 3 DAY AS i, 'a\\x00b'::BLOB AS b, [INTERVAL 1 HOUR] AS l, 7 AS n"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run in a folder of its own, with a `<db>.tmp/` as a spill would have left it."""
    db = make_db(tmp_path_factory.mktemp("sql-limits"))
    spill = Path(f"{db}.tmp")
    spill.mkdir()
    (spill / "secret.csv").write_text("secret\n42\n")
    return db


@pytest.fixture(scope="module")
def cli_db(db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy for the CLI: its own folder, and not the file the server holds."""
    copy = tmp_path_factory.mktemp("sql-limits-cli") / "run.duckdb"
    shutil.copy(db, copy)
    shutil.copytree(f"{db}.tmp", f"{copy}.tmp")
    return copy


@pytest.fixture(scope="module")
def server(db: Path) -> Iterator[Server]:
    srv = Server(db)
    yield srv
    srv.stop()


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet"])
def test_cli_result_limit(cli_db: Path, tmp_path: Path, fmt: str) -> None:
    out = tmp_path / f"out.{fmt}"
    res = cli("sql", str(cli_db), "SELECT * FROM range(20000000)", "-f", fmt, "-o", str(out))
    assert res.returncode == 1, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert f"error: the result is larger than the console's limit of {RESULT_BYTES // MIB}" in (
        res.stderr
    )
    assert "hint: narrow the query" in res.stderr
    assert not out.exists()


def test_cli_memory_limit(cli_db: Path) -> None:
    res = cli("sql", str(cli_db), HUNGRY, "-f", "csv", mem_gib=5)
    assert res.returncode == 1, res.stderr[-2000:]
    assert MEMORY_MSG in res.stderr and "hint: narrow the query" in res.stderr
    assert "Traceback" not in res.stderr


def test_cli_renders_interval_and_blob(cli_db: Path, tmp_path: Path) -> None:
    for fmt in ("table", "csv", "json", "markdown"):
        res = cli("sql", str(cli_db), TYPES, "-f", fmt)
        assert res.returncode == 0, (fmt, res.stderr[-2000:])
        assert "3 days" in res.stdout and "01:00:00" in res.stdout, (fmt, res.stdout)
        assert "a\\x00b" in res.stdout.replace("\\\\", "\\"), (fmt, res.stdout)
    out = tmp_path / "types.parquet"
    res = cli("sql", str(cli_db), TYPES, "-f", "parquet", "-o", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    assert pl.read_parquet(out).row(0) == ("3 days", "a\\x00b", "['01:00:00']", 7)


def test_cli_cannot_reach_the_temp_directory_nor_name_paths(cli_db: Path) -> None:
    where = cli_db.parent
    for q in (
        f"SELECT * FROM read_csv('{cli_db}.tmp/secret.csv')",
        f"SELECT * FROM glob('{cli_db}.tmp/*')",
        f"SELECT * FROM read_text('{where}/run.duckdb')",
    ):
        res = cli("sql", str(cli_db), q, "-f", "csv")
        assert res.returncode == 1 and "error:" in res.stderr, (q, res.stdout)
        assert "secret" not in res.stdout and str(where) not in res.stderr, (q, res.stderr)
    res = cli("sql", str(cli_db), "SELECT current_setting('temp_directory') AS t", "-f", "csv")
    assert res.returncode == 0 and res.stdout.split() == ["t", '""'], res.stdout


def test_dashboard_result_limit(server: Server) -> None:
    status, result, err = server.run("SELECT repeat('x', 100000) AS s FROM range(1000)")
    assert status == 200 and result is None
    assert f"limit of {sql.MAX_BYTES // MIB} MiB" in err and "hint: narrow the query" in err


def test_dashboard_queries_leave_the_server_memory_alone(server: Server) -> None:
    """A query that needs gigabytes fails with a message, in its own process: the server's
    peak memory does not move."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for q in (HUNGRY, "SELECT repeat('x', 5000000 + range % 2) AS s FROM range(300)"):
        status, result, err = server.run(q)
        assert status == 200 and result is None, (q, err)
        assert err.startswith("error: ") and "hint: narrow the query" in err, (q, err)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 300, grown_mib


def test_dashboard_renders_interval_and_blob(server: Server) -> None:
    status, result, err = server.run(TYPES)
    assert status == 200 and err == "", err
    assert cells(result) == [{"i": "3 days", "b": "a\\x00b", "l": "['01:00:00']", "n": "7"}]


def test_dashboard_cannot_reach_the_temp_directory_nor_name_paths(server: Server, db: Path) -> None:
    where = db.parent
    for q in (
        f"SELECT * FROM read_csv('{db}.tmp/secret.csv')",
        f"SELECT * FROM glob('{db}.tmp/*')",
        f"SELECT * FROM read_text('{where}/run.duckdb')",
    ):
        status, result, err = server.run(q)
        assert status == 200 and result is None and err.startswith("error: "), (q, err)
        assert str(where) not in err, err
    status, result, err = server.run("SELECT current_setting('temp_directory') AS t")
    assert status == 200 and cells(result) == [{"t": ""}], err
