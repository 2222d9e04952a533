"""SQL unit tests of the interval macros in analysis/sql/intervals.sql.

`interval_union(t)`: disjoint islands per (k, cls) of half-open intervals [s, e).
`interval_coverage(t)`: over islands already unioned per (k, cls), the time during which exactly
the classes in bit-mask `mask` were active.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from itertools import pairwise

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ranklens.analysis._sql import sql_text

Row = tuple[int, int, int, int]  # (k, cls, s, e)


@pytest.fixture
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    c = duckdb.connect()
    c.execute(sql_text("intervals"))
    yield c
    c.close()


def _load(con: duckdb.DuckDBPyConnection, rows: list[Row]) -> None:
    """Raw intervals into table `t`, their union into view `u`."""
    con.execute("CREATE OR REPLACE TEMP TABLE t (k INTEGER, cls INTEGER, s BIGINT, e BIGINT)")
    if rows:  # a literal VALUES list: executemany inserts row by row and is ~50 ms
        values = ", ".join(f"({int(k)}, {int(c)}, {int(s)}, {int(e)})" for k, c, s, e in rows)
        con.execute(f"INSERT INTO t VALUES {values}")
    con.execute("CREATE OR REPLACE TEMP VIEW u AS SELECT * FROM interval_union('t')")


def union(con: duckdb.DuckDBPyConnection, rows: list[Row]) -> list[Row]:
    _load(con, rows)
    return sorted(con.sql("SELECT k, cls, s, e FROM u").fetchall())


def coverage(con: duckdb.DuckDBPyConnection, rows: list[Row]) -> dict[tuple[int, int], int]:
    """{(k, mask): dur} of the union of `rows`."""
    _load(con, rows)
    got = con.sql("SELECT k, mask, dur FROM interval_coverage('u')").fetchall()
    return {(k, m): d for k, m, d in got}


# -- interval_union ---------------------------------------------------------------------------
def test_union_touching_intervals_merge(con: duckdb.DuckDBPyConnection) -> None:
    # [0,10) and [10,20) share the point 10: one island [0,20).
    assert union(con, [(1, 0, 0, 10), (1, 0, 10, 20)]) == [(1, 0, 0, 20)]


def test_union_gap_of_one_keeps_two_islands(con: duckdb.DuckDBPyConnection) -> None:
    # [0,10) and [11,20): the gap [10,11) is not covered.
    assert union(con, [(1, 0, 11, 20), (1, 0, 0, 10)]) == [(1, 0, 0, 10), (1, 0, 11, 20)]


def test_union_nested(con: duckdb.DuckDBPyConnection) -> None:
    # [10,20) and [30,40) lie inside [0,100): the island is [0,100).
    assert union(con, [(1, 0, 0, 100), (1, 0, 10, 20), (1, 0, 30, 40)]) == [(1, 0, 0, 100)]


def test_union_reach_is_the_furthest_end_not_the_previous_one(
    con: duckdb.DuckDBPyConnection,
) -> None:
    # [10,20) ends before [0,50) does; [30,40) and [45,60) still start inside [0,50), so all
    # four are one island [0,60). Comparing with the previous interval's end (20) would split.
    rows = [(1, 0, 0, 50), (1, 0, 10, 20), (1, 0, 30, 40), (1, 0, 45, 60)]
    assert union(con, rows) == [(1, 0, 0, 60)]


def test_union_duplicates(con: duckdb.DuckDBPyConnection) -> None:
    # three copies of [5,9) are one island [5,9), not three.
    assert union(con, [(1, 0, 5, 9)] * 3) == [(1, 0, 5, 9)]


def test_union_zero_length(con: duckdb.DuckDBPyConnection) -> None:
    # [4,4) inside [0,10) merges; [3,3) alone (key 2) stays a zero-length island; [10,10)
    # touches [0,10) and merges.
    rows = [(1, 0, 0, 10), (1, 0, 4, 4), (1, 0, 10, 10), (2, 0, 3, 3)]
    assert union(con, rows) == [(1, 0, 0, 10), (2, 0, 3, 3)]


def test_union_single_interval_key_and_classes_apart(con: duckdb.DuckDBPyConnection) -> None:
    # key 2 has one interval; classes 0 and 1 of key 1 overlap but are never merged together.
    rows = [(2, 0, 7, 8), (1, 0, 0, 10), (1, 1, 5, 15)]
    assert union(con, rows) == [(1, 0, 0, 10), (1, 1, 5, 15), (2, 0, 7, 8)]


def test_union_struct_keys(con: duckdb.DuckDBPyConnection) -> None:
    # the analyses key on structs {'rank', 'step', ...}; equal structs are one key.
    con.execute(
        """CREATE TEMP TABLE ts AS SELECT * FROM (VALUES
             ({'rank': 0, 'step': 1}, 0, 0, 10), ({'rank': 0, 'step': 1}, 0, 5, 12),
             ({'rank': 0, 'step': 2}, 0, 5, 12)) v(k, cls, s, e)"""
    )
    got = con.sql("SELECT k.step, s, e FROM interval_union('ts') ORDER BY ALL").fetchall()
    # step 1: [0,10) ∪ [5,12) = [0,12); step 2 alone: [5,12).
    assert got == [(1, 0, 12), (2, 5, 12)]


# -- interval_coverage ------------------------------------------------------------------------
def test_coverage_concurrent_classes(con: duckdb.DuckDBPyConnection) -> None:
    # cls0 [0,10), cls1 [5,15), cls2 [8,20); endpoints 0,5,8,10,15,20:
    #   [0,5)   {0}     mask 1 -> 5
    #   [5,8)   {0,1}   mask 3 -> 3
    #   [8,10)  {0,1,2} mask 7 -> 2
    #   [10,15) {1,2}   mask 6 -> 5
    #   [15,20) {2}     mask 4 -> 5     (sum 20 = the hull [0,20))
    got = coverage(con, [(1, 0, 0, 10), (1, 1, 5, 15), (1, 2, 8, 20)])
    assert got == {(1, 1): 5, (1, 3): 3, (1, 7): 2, (1, 6): 5, (1, 4): 5}


def test_coverage_gap_is_not_reported(con: duckdb.DuckDBPyConnection) -> None:
    # cls0 [0,10) and [20,30): mask 1 for 10 + 10 = 20; the gap [10,20) has mask 0 (dropped).
    assert coverage(con, [(1, 0, 0, 10), (1, 0, 20, 30)]) == {(1, 1): 20}


def test_coverage_touching_classes_do_not_overlap(con: duckdb.DuckDBPyConnection) -> None:
    # cls0 [0,10) then cls1 [10,20): 10 each, never both (no mask 3).
    assert coverage(con, [(1, 0, 0, 10), (1, 1, 10, 20)]) == {(1, 1): 10, (1, 2): 10}


def test_coverage_zero_length_adds_nothing(con: duckdb.DuckDBPyConnection) -> None:
    # a zero-length cls1 interval alone (key 4) and one inside cls0 (key 1) cover no time.
    got = coverage(con, [(4, 1, 5, 5), (1, 0, 0, 10), (1, 1, 3, 3)])
    assert got == {(1, 1): 10}


def test_coverage_of_union_counts_duplicates_once(con: duckdb.DuckDBPyConnection) -> None:
    # cls0: [0,10) twice and [5,12) -> island [0,12); cls1 [8,9).
    #   mask 1: [0,8) + [9,12) = 8 + 3 = 11;  mask 3: [8,9) = 1.
    rows = [(1, 0, 0, 10), (1, 0, 0, 10), (1, 0, 5, 12), (1, 1, 8, 9)]
    assert coverage(con, rows) == {(1, 1): 11, (1, 3): 1}


def test_coverage_high_class_bit_and_single_interval_keys(
    con: duckdb.DuckDBPyConnection,
) -> None:
    # key 1: cls 40 alone on [0,3) -> mask 2^40 for 3; key 2: cls 0 on [0,1) -> mask 1 for 1.
    got = coverage(con, [(1, 40, 0, 3), (2, 0, 0, 1)])
    assert got == {(1, 1 << 40): 3, (2, 1): 1}


# -- property: against a per-nanosecond brute force -------------------------------------------
_HORIZON = 40

_intervals = st.lists(
    st.tuples(
        st.integers(0, 2),  # k
        st.integers(0, 3),  # cls
        st.integers(0, 30),  # s
        st.integers(0, 8),  # length (0 = zero-length)
    ).map(lambda r: (r[0], r[1], r[2], r[2] + r[3])),
    max_size=25,
)


def _brute(rows: list[Row]) -> tuple[Counter[tuple[int, int]], Counter[tuple[int, int]]]:
    """(per (k, mask) ns with exactly those classes active, per (k, cls) ns covered)."""
    by_mask: Counter[tuple[int, int]] = Counter()
    by_cls: Counter[tuple[int, int]] = Counter()
    for k in {r[0] for r in rows}:
        for t in range(_HORIZON):
            active = {c for kk, c, s, e in rows if kk == k and s <= t < e}
            mask = sum(1 << c for c in active)
            if mask:
                by_mask[(k, mask)] += 1
            for c in active:
                by_cls[(k, c)] += 1
    return by_mask, by_cls


@pytest.fixture(scope="module")
def shared_con() -> Iterator[duckdb.DuckDBPyConnection]:
    """One connection for all hypothesis examples (connecting costs more than a query)."""
    c = duckdb.connect()
    c.execute(sql_text("intervals"))
    yield c
    c.close()


@settings(max_examples=100, deadline=None)
@given(rows=_intervals)
def test_coverage_matches_brute_force(
    shared_con: duckdb.DuckDBPyConnection, rows: list[Row]
) -> None:
    want_mask, want_cls = _brute(rows)
    assert coverage(shared_con, rows) == dict(want_mask)
    islands = union(shared_con, rows)
    got_cls: Counter[tuple[int, int]] = Counter()
    for k, cls, s, e in islands:
        got_cls[(k, cls)] += e - s
    assert +got_cls == want_cls
    # islands of one (k, cls) are disjoint and never touch
    by_key: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for k, cls, s, e in islands:
        by_key.setdefault((k, cls), []).append((s, e))
    for spans in by_key.values():
        spans.sort()
        assert all(a[1] < b[0] for a, b in pairwise(spans))
