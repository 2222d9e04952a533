"""Loads an analysis' .sql file onto a connection (temp views and macros only)."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

import duckdb
import polars as pl

_HELD = "_ranklens_held_"  # prefix of the temp tables that hold a view's rows (materialized)
_APPLIED = "_ranklens_applied"  # temp table: the SQL files apply_sql ran on this connection


_REQUIRES = re.compile(r"\A-- requires: ([\w, ]+)\n")
_VIEW = re.compile(r"(CREATE\s+OR\s+REPLACE\s+(?:TEMP\s+)?VIEW\s+\w+)\s+AS\b", re.I)


@cache
def sql_text(name: str) -> str:
    """The text of analysis/sql/<name>.sql, shipped as package data."""
    return resources.files("ranklens.analysis").joinpath(f"sql/{name}.sql").read_text()


@cache
def _defers_binding() -> bool:
    """Whether this DuckDB creates a view without binding it (`WITH (DEFER_BINDING)`, an
    unbound view: DuckDB 1.5 and later). Probed over a table that does not exist, which only
    an unbound view survives."""
    con = duckdb.connect()
    try:
        con.execute("CREATE TEMP VIEW _probe WITH (DEFER_BINDING) AS SELECT * FROM _absent")
        return True
    except duckdb.Error:
        return False
    finally:
        con.close()


def unbound(sql: str) -> str:
    """`sql` with each view it creates left unbound until a query reads it, where DuckDB can.

    Why: creating a view binds it and every view under it, and a query reading it binds them
    all again; creating the analyses' ~60 views took 1.1 s of a small run's 3.4 s of stored
    results (pipeline_steps alone 0.4 s), for nothing a query would not redo. What a query
    reads is the same either way; a view that cannot bind says so when it is read."""
    return _VIEW.sub(r"\1 WITH (DEFER_BINDING) AS", sql) if _defers_binding() else sql


def requires(name: str) -> tuple[str, ...]:
    """The SQL files `name` builds on, from its first line `-- requires: a, b`."""
    m = _REQUIRES.match(sql_text(name))
    return tuple(r.strip() for r in m.group(1).split(",")) if m else ()


def with_requirements(names: tuple[str, ...] | list[str]) -> list[str]:
    """`names` and every file they require, each once, a file after those it requires.

    Why: a file says what it builds on in one place, so no caller lists (and keeps in order)
    the shared building blocks (intervals.sql, activity.sql) it happens to need."""
    out: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in path:
            raise ValueError(f"SQL files require each other: {' -> '.join((*path, name))}")
        if name not in out:
            for dep in requires(name):
                visit(dep, (*path, name))
            out.append(name)

    for name in names:
        visit(name, ())
    return out


def apply_sql(con: duckdb.DuckDBPyConnection, *names: str) -> None:
    """Create the temp views/macros of the named SQL files and the files they require
    (idempotent: CREATE OR REPLACE).

    A file of views and macros runs once per connection: its views are created unbound
    (`unbound`), but its table macros bind what they read, and an ingest's analyses apply the
    same files ~20 times. What ran is recorded in a temp table, so a rolled-back
    transaction forgets its views and its record together. A file that builds a table
    (critical_path numbers the events) runs every time. Nor does a file run whose views the
    run stores as this code wrote them (views.store_views): a temp view would be their twin.

    Views held by an enclosing HeldViews block keep reading their temp table. ASOF joins
    stay ASOF joins: DuckDB turns one whose left side it *estimates* small into a nested loop
    (asof_loop_join_threshold), and its estimate of a materialized CTE can be far too small
    (the pipeline blocks of 1,024 ranks: 35 s as a loop, 0.7 s as an ASOF join)."""
    done = _applied(con)
    todo = [n for n in with_requirements(names) if n not in done]
    if not todo:
        return
    for name in todo:
        con.execute(unbound(sql_text(name)))
    once = [(n,) for n in todo if not builds_table(n)]
    if once:
        con.executemany(f"INSERT INTO temp.{_APPLIED} VALUES (?)", once)
    _redirect(con, held_views(con))


def _applied(con: duckdb.DuckDBPyConnection) -> set[str]:
    """The SQL files apply_sql need not run on `con` (its docstring says which)."""
    new = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE temporary AND table_name = ?", [_APPLIED]
    ).fetchone() == (0,)
    if new:
        from ranklens.analysis import views  # views builds on this module

        keep_asof_joins(con)  # on every connection, whether or not a file runs
        con.execute(f"CREATE TEMP TABLE {_APPLIED} (name VARCHAR)")
        if views.stored_views_current(con):
            stored = [(n,) for n in views.view_files() if not builds_table(n)]
            con.executemany(f"INSERT INTO temp.{_APPLIED} VALUES (?)", stored)
    return {str(r[0]) for r in con.execute(f"SELECT name FROM temp.{_APPLIED}").fetchall()}


@cache
def builds_table(name: str) -> bool:
    """Whether the SQL file creates a table (data of the moment, so it runs at every apply)."""
    return re.search(r"\bTEMP\s+TABLE\b", sql_text(name), re.IGNORECASE) is not None


@cache
def definition(name: str, view: str) -> str:
    """The statement of SQL file `name` (or of a file it requires) that creates `view`."""
    pattern = re.compile(rf"CREATE\s+OR\s+REPLACE\s+TEMP\s+VIEW\s+{view}\s+AS\b", re.I)
    for file in with_requirements([name]):
        for stmt in _statements(file):
            if pattern.search(stmt):
                return stmt
    raise KeyError(f"no view {view} in {name}.sql or the files it requires")


@cache
def _statements(name: str) -> tuple[str, ...]:
    return tuple(s.query for s in duckdb.extract_statements(sql_text(name)))


def keep_asof_joins(con: duckdb.DuckDBPyConnection) -> None:
    """ASOF joins stay ASOF joins on `con` (apply_sql's docstring says why); a sandboxed
    connection (sql_console.safe_connect) has it from its config, locked."""
    if con.execute("SELECT current_setting('asof_loop_join_threshold')").fetchone() != (0,):
        con.execute("SET asof_loop_join_threshold = 0")


def held_views(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The views whose rows a HeldViews block holds on `con` right now."""
    rows = con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE temporary AND starts_with(table_name, ?)",
        [_HELD],
    ).fetchall()
    return [str(r[0])[len(_HELD) :] for r in rows]


def _redirect(con: duckdb.DuckDBPyConnection, views: list[str]) -> None:
    for view in views:
        con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS SELECT * FROM temp.{_HELD}{view}")


class HeldViews:
    """The rows of some views of one SQL file, held in temp tables for one `with` block.

    Why: a view is recomputed by every query that reads it, and an analysis reads its interval
    unions from several queries (the report from several analyses), each a sort of every event.
    Lifetime: entering applies `sql_file` and fills a temp table per view (in the given order:
    each may read the ones before it, already held) and points the view at it; every
    apply_sql meanwhile keeps it pointed there; leaving drops the tables and restores each view
    from its own statement.
    The state lives in the database (temp tables named _ranklens_held_<view>), so a nested
    block over a view an outer one holds leaves it to the outer one. Only for a block during
    which the database does not change."""

    def __init__(self, con: duckdb.DuckDBPyConnection, sql_file: str, *views: str) -> None:
        self.con, self.sql_file, self.views = con, sql_file, views
        self.mine: list[str] = []  # the views this block holds (not an enclosing one)

    def __enter__(self) -> HeldViews:
        apply_sql(self.con, self.sql_file)
        outer = set(held_views(self.con))
        try:
            for view in self.views:
                if view in outer:
                    continue
                self.mine.append(view)
                self.con.execute(
                    f"CREATE OR REPLACE TEMP TABLE {_HELD}{view} AS SELECT * FROM {view}"
                )
                _redirect(self.con, [view])
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Drop this block's tables and restore its views (idempotent)."""
        for view in self.mine:
            self.con.execute(f"DROP TABLE IF EXISTS temp.{_HELD}{view}")
            self.con.execute(unbound(definition(self.sql_file, view)))
        self.mine = []


def query_pl(
    con: duckdb.DuckDBPyConnection, sql: str, params: list[object] | None = None
) -> pl.DataFrame:
    """Run a query and return every row as a polars DataFrame (the result is fully consumed)."""
    table = (
        con.sql(sql, params=params).to_arrow_table() if params else con.sql(sql).to_arrow_table()
    )
    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    return df
