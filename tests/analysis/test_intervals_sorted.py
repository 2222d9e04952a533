"""Property tests of the large-input interval SQL against a per-nanosecond brute force.

Covers the macros that the analyses use on whole runs (intervals.sql: interval_union_sorted,
interval_coverage_sorted, interval_prefix, interval_inside) and activity.sql's inlined union
and per-key coverage. Why: they rely on the order of a sorted input and on packed integers, so
a wrong offset or a lost ordering would give plausible but wrong numbers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from itertools import pairwise

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ranklens.analysis._sql import apply_sql
from ranklens.ingest.schema import ddl

_LO, _HI = -25, 25  # negative times too: the packed end carries an offset

_spans = st.tuples(st.integers(_LO, _HI - 8), st.integers(0, 8)).map(lambda r: (r[0], r[0] + r[1]))


def _covered(spans: list[tuple[int, int]]) -> set[int]:
    return {t for s, e in spans for t in range(s, e)}


def _values(rows: list[tuple[object, ...]]) -> str:
    return ", ".join(
        "("
        + ", ".join("NULL" if v is None else f"'{v}'" if isinstance(v, str) else str(v) for v in r)
        + ")"
        for r in rows
    )


def _table(con: duckdb.DuckDBPyConnection, name: str, cols: str, rows: list[tuple]) -> None:  # type: ignore[type-arg]
    con.execute(f"CREATE OR REPLACE TEMP TABLE {name} ({cols})")
    if rows:
        con.execute(f"INSERT INTO {name} VALUES {_values(rows)}")


@pytest.fixture(scope="module")
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    """The real schema (empty) with the analysis SQL applied; tests replace its inputs."""
    c = duckdb.connect()
    c.execute(ddl())
    apply_sql(c, "intervals", "activity")
    yield c
    c.close()


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 2), _spans), max_size=30))
def test_union_sorted(
    con: duckdb.DuckDBPyConnection, rows: list[tuple[int, tuple[int, int]]]
) -> None:
    _table(con, "t", "k BIGINT, s BIGINT, e BIGINT", [(k, s, e) for k, (s, e) in rows])
    got = con.sql("SELECT k, s, e FROM interval_union_sorted('t') ORDER BY k, s").fetchall()
    for k in {k for k, _ in rows}:
        mine = [(s, e) for kk, s, e in got if kk == k]
        assert _covered(mine) == _covered([sp for kk, sp in rows if kk == k])
        # apart and never touching (a lone zero-length interval stays an island)
        assert all(a[1] < b[0] for a, b in pairwise(mine))


@settings(max_examples=80, deadline=None)
@given(
    c_rows=st.lists(st.tuples(st.integers(0, 2), _spans), max_size=20),
    x_rows=st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 2)), _spans), max_size=12),
)
def test_inside_is_the_measure_of_the_intersection(
    con: duckdb.DuckDBPyConnection,
    c_rows: list[tuple[int, tuple[int, int]]],
    x_rows: list[tuple[int | None, tuple[int, int]]],
) -> None:
    _table(con, "c0", "k BIGINT, s BIGINT, e BIGINT", [(k, s, e) for k, (s, e) in c_rows])
    con.execute("CREATE OR REPLACE TEMP TABLE c1 AS SELECT * FROM interval_union_sorted('c0')")
    con.execute("CREATE OR REPLACE TEMP TABLE c AS SELECT * FROM interval_prefix('c1')")
    x = [(i, k, s, e) for i, (k, (s, e)) in enumerate(x_rows)]
    _table(con, "x", "i INTEGER, k BIGINT, s BIGINT, e BIGINT", x)
    got = dict(con.sql("SELECT i, inside FROM interval_inside('x', 'c')").fetchall())
    for i, k, s, e in x:
        cover = _covered([sp for kk, sp in c_rows if kk == k]) if k is not None else set()
        assert got[i] == len(cover & set(range(s, e))), (i, k, s, e)


_EVENT = st.tuples(
    st.integers(0, 1),  # rank
    st.integers(0, 1),  # device
    st.sampled_from(["compute", "comm", "memcpy"]),
    st.sampled_from(["pgA", "pgB"]),
    _spans,
)


@settings(max_examples=60, deadline=None)
@given(events=st.lists(_EVENT, max_size=30))
def test_activity_coverage_and_key_coverage(
    con: duckdb.DuckDBPyConnection, events: list[tuple[int, int, str, str, tuple[int, int]]]
) -> None:
    rows = [
        (r, 0, d, kind, s, e, pg if kind == "comm" else None) for r, d, kind, pg, (s, e) in events
    ]
    _table(
        con,
        "ev",
        "rank INTEGER, step INTEGER, device INTEGER, kind VARCHAR, s BIGINT, e BIGINT, "
        "pg_name VARCHAR",
        rows,
    )
    con.execute(
        "CREATE OR REPLACE TEMP VIEW _activity_events AS SELECT rank, step, device, kind, s, e, "
        "pg_name, NULL::VARCHAR AS coll_op, NULL::BIGINT AS in_nelems, NULL::BIGINT AS out_nelems "
        "FROM ev"
    )
    cls = {"compute": 0, "comm": 1, "memcpy": 2}
    # _activity_cov: per (rank, device), ns during which exactly the classes of `mask` ran
    want: Counter[tuple[int, int, int]] = Counter()
    for r, d in {(r, d) for r, d, *_ in events}:
        for t in range(_LO, _HI):
            on = {cls[k] for rr, dd, k, _, (s, e) in events if (rr, dd) == (r, d) and s <= t < e}
            if on:
                want[(r, d, sum(1 << c for c in on))] += 1
    got = con.sql("SELECT rank, device, mask, dur FROM _activity_cov").fetchall()
    assert {
        (r, d, m): dur for r, _, d, m, dur in [(g[0], 0, g[1], g[2], g[3]) for g in got]
    } == dict(want)
    # _activity_key_cov: one key's communication M against its device's compute C
    _table(
        con,
        "kt",
        "rank INTEGER, step INTEGER, device INTEGER, key VARCHAR, s BIGINT, e BIGINT",
        [(r, 0, d, pg, s, e) for r, d, k, pg, (s, e) in events if k == "comm"],
    )
    got_k = {
        (r, d, key, m): dur
        for r, _, d, key, m, dur in con.sql("SELECT * FROM _activity_key_cov('kt')").fetchall()
    }
    want_k: dict[tuple[int, int, str, int], int] = {}
    for r, d, pg in {(r, d, pg) for r, d, k, pg, _ in events if k == "comm"}:
        m = _covered([sp for rr, dd, k, p, sp in events if (rr, dd, k, p) == (r, d, "comm", pg)])
        c = _covered([sp for rr, dd, k, _, sp in events if (rr, dd, k) == (r, d, "compute")])
        for mask, n in ((1, len(c - m)), (2, len(m - c)), (3, len(m & c))):
            if n:
                want_k[(r, d, pg, mask)] = n
    assert got_k == want_k
