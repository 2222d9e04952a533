"""Issue 14, item 5: one console user's query never changes what the next one sees.

Before: the dashboard reused pooled connections, so a temp view named `events` replaced the
table for every later user, `BEGIN` + a failing query broke every later query, and `/sql?q=`
pages were cached with whatever answer the poisoned connection gave. Both faces are checked:
the page's code path, the server over HTTP (several users at once), and `ranklens sql`.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from ranklens.cli.main import app
from ranklens.dashboards.data import RunData
from ranklens.dashboards.pages import sql
from typer.testing import CliRunner

from .sqlenv import Server, cells, error_text, make_db

COUNT = "SELECT count(*) AS n FROM events"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_db(tmp_path_factory.mktemp("sql-isolation"))


@pytest.fixture(scope="module")
def server(db: Path) -> Iterator[Server]:
    srv = Server(db)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def data(server: Server) -> RunData:
    return server.data


@pytest.fixture(scope="module")
def truth(data: RunData) -> dict[str, int]:
    cur = data.cursor()
    try:
        events = cur.execute("SELECT count(*) FROM events").fetchone()
        steps = cur.execute("SELECT count(*) FROM steps").fetchone()
    finally:
        cur.close()
    assert events is not None and steps is not None
    return {"events": int(events[0]), "steps": int(steps[0])}


def _count(data: RunData, query: str = COUNT) -> int:
    df, err = sql.query_frame(data, query, 10)
    assert err == "" and df is not None, err
    return int(df.item())


def test_temp_view_is_refused_and_changes_nothing(data: RunData, truth: dict[str, int]) -> None:
    result, err = sql.execute(data, "CREATE OR REPLACE TEMP VIEW events AS SELECT 42 AS rank")
    assert result is None and err.startswith("error: ") and "refused" in err, err
    assert "hint:" in err
    assert _count(data) == truth["events"]


def test_failed_transaction_does_not_reach_the_next_query(
    data: RunData, truth: dict[str, int]
) -> None:
    for q in ("BEGIN TRANSACTION", "SELECT CAST('x' AS INTEGER)"):
        result, err = sql.execute(data, q)
        assert result is None and err.startswith("error: "), (q, err)
    assert _count(data) == truth["events"]
    assert sql.execute(data, "ROLLBACK")[1].startswith("error: ")  # nothing to roll back


@pytest.mark.parametrize(
    ("statement", "probe", "want"),
    [
        ("SET VARIABLE leak = 42", "SELECT getvariable('leak') IS NULL AS n", True),
        ("CREATE TEMP TABLE steps AS SELECT 42 AS step", "SELECT count(*) FROM steps", "steps"),
        (
            "CREATE TEMP MACRO leak() AS 42",
            "SELECT count(*) FROM duckdb_functions() WHERE function_name = 'leak'",
            0,
        ),
        ("CREATE TEMP SEQUENCE leak", "SELECT count(*) FROM duckdb_sequences()", 0),
        ("PREPARE leak AS SELECT 42", "SELECT count(*) FROM duckdb_prepared_statements()", 0),
        ("USE system", COUNT, "events"),
        ("CREATE TEMP VIEW events AS SELECT 42 AS rank; SELECT * FROM events", COUNT, "events"),
        (
            "PIVOT events ON kind USING count(*)",
            "SELECT count(*) FROM duckdb_types() WHERE NOT internal AND schema_name = 'main'",
            0,
        ),
    ],
)
def test_no_statement_leaves_state(
    data: RunData, truth: dict[str, int], statement: str, probe: str, want: object
) -> None:
    result, err = sql.execute(data, statement)
    assert result is None and err.startswith("error: ") and "hint:" in err, err
    df, perr = sql.query_frame(data, probe, 10)
    assert perr == "" and df is not None, perr
    assert df.item() == (truth[want] if isinstance(want, str) else want)


def test_users_over_http_do_not_see_each_other(server: Server, truth: dict[str, int]) -> None:
    for poison in (
        "CREATE OR REPLACE TEMP VIEW events AS SELECT 42 AS rank",
        "BEGIN TRANSACTION",
        "SELECT CAST('x' AS INTEGER)",
    ):
        status, result, err = server.run(poison)
        assert status == 200 and result is None and err.startswith("error: "), (poison, err)
    status, page = server.link(COUNT)
    assert status == 200 and error_text(page) == ""
    assert cells(page) == [{"n": str(truth["events"])}]

    def one(i: int) -> list[dict[str, str]]:
        status, result, err = server.run(f"SELECT {i} AS who, count(*) AS n FROM events")
        assert status == 200 and err == "", err
        return cells(result)

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(one, range(4)))
    assert [a[0]["who"] for a in answers] == ["0", "1", "2", "3"]
    assert len({a[0]["n"] for a in answers}) == 1


def test_sql_link_pages_are_not_kept(server: Server) -> None:
    """A `/sql?q=` page shows its query's answer now, not the answer of the first visit."""
    got = set()
    for _ in range(2):
        status, page = server.link("SELECT random() AS r")
        assert status == 200 and error_text(page) == ""
        got.add(cells(page)[0]["r"])
    assert len(got) == 2


def test_cli_refuses_statements_that_keep_state(db: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.duckdb"  # the server above holds `db` in this process
    shutil.copy(db, copy)
    runner = CliRunner()
    for q in (
        "CREATE TEMP VIEW events AS SELECT 42 AS rank; SELECT * FROM events",
        "BEGIN TRANSACTION",
        "SET VARIABLE x = 1",
    ):
        res = runner.invoke(app, ["sql", str(copy), q])
        assert res.exit_code == 1, (q, res.output)
        assert "error:" in res.output and "hint:" in res.output and "42" not in res.output
        assert res.exception is None or isinstance(res.exception, SystemExit)
