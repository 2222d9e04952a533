"""The dashboard's SQL console is a sandbox: no files, no ATTACH, no extensions, bounded.

Queries go through the page's own code path (`pages.sql.execute`: a process of their own per
query, on the console's sandboxed connection), so this proves what a user of the console can
and cannot do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ranklens.analysis.sql_console import SqlError
from ranklens.analysis.sql_isolated import run_sql_isolated
from ranklens.dashboards.data import RunData
from ranklens.dashboards.pages import sql


@pytest.fixture(scope="module")
def data(sample_db: Callable[[str], Path]) -> Iterator[RunData]:
    run = RunData(sample_db("straggler_rank3"))
    yield run
    run.close()


@pytest.mark.parametrize(
    "query",
    [
        "COPY (SELECT 1 AS x) TO '{tmp}/out.csv'",
        "COPY events TO '{tmp}/events.parquet' (FORMAT parquet)",
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_text('/etc/passwd')",
        "ATTACH '{tmp}/other.duckdb' AS other",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "INSERT INTO events (rank) VALUES (99)",
        "INSERT INTO events_plain (rank) VALUES (99)",  # the tables behind the view
        "DELETE FROM events_rich",
        "CREATE TABLE stolen AS SELECT * FROM events",
    ],
)
def test_refused_with_a_message(data: RunData, tmp_path: Path, query: str) -> None:
    result, err = sql.execute(data, query.format(tmp=tmp_path))
    assert result is None
    assert err.startswith("error: "), err
    assert list(tmp_path.iterdir()) == []  # nothing was written


def test_returns_rows(data: RunData) -> None:
    df, err = sql.query_frame(
        data, "SELECT rank, count(*) AS n FROM events GROUP BY 1 ORDER BY 1", 100
    )
    assert err == "" and df is not None
    assert df["rank"].to_list() == [0, 1, 2, 3]
    cur = data.cursor()
    total = cur.execute("SELECT count(*) FROM events").fetchone()
    cur.close()
    assert total is not None and int(df["n"].sum()) == total[0]


def test_analysis_views_are_queryable(data: RunData) -> None:
    df, err = sql.query_frame(data, "SELECT * FROM stragglers_by_rank ORDER BY rank", 100)
    assert err == "" and df is not None and df.height == 4


def test_row_limit(data: RunData) -> None:
    out, err = sql.execute(data, f"SELECT range AS i FROM range({sql.MAX_ROWS + 5000})")
    assert err == ""
    note, grid = out.children
    assert f"{sql.MAX_ROWS:,} rows" in note.children and "the first" in note.children
    key = grid.id["key"]
    last = sql.rows_response(
        data, key, {"startRow": sql.MAX_ROWS - 10, "endRow": sql.MAX_ROWS + 10}
    )
    assert last["rowCount"] == sql.MAX_ROWS and len(last["rowData"]) == 10
    assert last["rowData"][-1]["c0"] == sql.MAX_ROWS - 1
    top = sql.rows_response(
        data, key, {"startRow": 0, "endRow": 3, "sortModel": [{"colId": "c0", "sort": "desc"}]}
    )
    assert [r["c0"] for r in top["rowData"]] == [
        sql.MAX_ROWS - 1,
        sql.MAX_ROWS - 2,
        sql.MAX_ROWS - 3,
    ]
    assert sql.rows_response(data, "no-such-key", {"startRow": 0, "endRow": 5})["rowCount"] == 0


def test_rows_are_json_safe(data: RunData) -> None:
    """Values JavaScript would round or cannot hold arrive as exact text."""
    out, err = sql.execute(
        data,
        "SELECT 1712345678901234567 AS ts, 7 AS small, [1, 2] AS l, DATE '2024-01-02' AS d, "
        "'nan'::DOUBLE AS f, {'a': 1} AS s, 'x.y' AS \"a.b\"",
    )
    assert err == ""
    grid = out.children[1]
    assert [c["headerName"] for c in grid.columnDefs] == ["ts", "small", "l", "d", "f", "s", "a.b"]
    row = sql.rows_response(data, grid.id["key"], {"startRow": 0, "endRow": 1})["rowData"][0]
    assert row["c0"] == "1712345678901234567" and row["c1"] == 7
    assert row["c2"] == "[1, 2]" and row["c3"] == "2024-01-02" and row["c4"] is None
    assert "a" in row["c5"] and row["c6"] == "x.y"


def test_page_time_limit(data: RunData, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sql, "TIMEOUT_S", 0.5)
    result, err = sql.execute(data, "SELECT count(*) FROM range(1000000000000) a, range(10) b")
    assert result is None and "stopped after" in err, err


def test_time_limit(data: RunData) -> None:
    with pytest.raises(SqlError, match="stopped after"):
        run_sql_isolated(
            data.db_path,
            "SELECT count(*) FROM range(1000000000000) a",
            max_rows=10,
            timeout_s=0.5,
            max_bytes=sql.MAX_BYTES,
        )


def test_syntax_error_is_a_message(data: RunData) -> None:
    result, err = sql.execute(data, "SELEC 1")
    assert result is None and err.startswith("error: ") and "syntax" in err.lower()
    assert sql.execute(data, "   ") == (None, "type a query")
