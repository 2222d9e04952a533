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
    out, err = sql.execute(data, "SELECT * FROM range(5000)")
    assert err == ""
    rows = out.children[1].children[0].children[1].children
    assert len(rows) == sql.MAX_ROWS
    assert f"first {sql.MAX_ROWS} rows shown" in out.children[0].children


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
