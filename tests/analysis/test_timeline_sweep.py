"""The timeline's exposed/idle sweep (analysis/timeline_sweep.py) against its definition,
written out plainly: cut each rank's time at every start and end; on each piece the active
classes are those with an interval covering it; a piece is `exposed` when no compute runs and
some communication does, `idle` when no compute, non-PP communication or memory runs; touching
pieces of one label merge.

Why: every exposed and idle overlay of the timeline, and the run's stored overview, comes from
it; it replaced SQL window functions (9-11 s on a one-step capture of 5 M kernels), and the
two gave equal rows on every bundled sample, public trace set and generated job.
"""

from __future__ import annotations

from itertools import pairwise
from unittest import mock

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ranklens.analysis import timeline_overlays as ovl
from ranklens.analysis import timeline_sweep as sweep

BITS = (1, 2, 4, 8)  # compute, comm, PP comm, memory


def _reference(rows: list[tuple[int, int, int, int]], min_ns: int) -> pl.DataFrame:
    out: list[tuple[int, str, int, int]] = []
    for rank in sorted({r for r, *_ in rows}):
        mine = [(s, e, b) for r, s, e, b in rows if r == rank and e > s]
        cuts = sorted({x for s, e, _ in mine for x in (s, e)})
        pieces: dict[str, list[list[int]]] = {"exposed": [], "idle": []}
        for a, b in pairwise(cuts):
            mask = 0
            for s, e, bit in mine:
                if s <= a < e:
                    mask |= bit
            labels = []
            if mask & 1 == 0 and mask & 6:
                labels.append("exposed")
            if mask & 11 == 0:
                labels.append("idle")
            for label in labels:
                runs = pieces[label]
                if runs and runs[-1][1] == a:
                    runs[-1][1] = b
                else:
                    runs.append([a, b])
        for label, runs in pieces.items():
            out += [(rank, label, s, e) for s, e in runs if e - s >= min_ns]
    out.sort(key=lambda t: (t[0], t[2], t[1]))
    return pl.DataFrame(out, schema=ovl.SCHEMA, orient="row")


def _iv(rows: list[tuple[int, int, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        rows, schema={"rank": pl.Int32, "s": pl.Int64, "e": pl.Int64, "bit": pl.Int32}, orient="row"
    )


interval = st.tuples(
    st.integers(-1, 3),  # rank (-1 included: not every rank id is positive)
    st.integers(0, 60),
    st.integers(0, 25),
    st.sampled_from(BITS),
).map(lambda t: (t[0], t[1], t[1] + t[2], t[3]))  # zero-length ones included


@settings(max_examples=300, deadline=None)
@given(st.lists(interval, max_size=40), st.sampled_from([0, 1, 5]))
def test_the_sweep_is_its_definition(rows: list[tuple[int, int, int, int]], min_ns: int) -> None:
    assert sweep.segments(_iv(rows), min_ns).equals(_reference(rows, min_ns))


EPOCH_NS = 1_795_305_795_916_600_275  # a job clock's stamps: packed after an offset


@pytest.mark.parametrize(("scale", "offset"), [(1, EPOCH_NS), (2**56, 0)])
@settings(max_examples=100, deadline=None)
@given(rows=st.lists(interval, max_size=40), min_ns=st.sampled_from([0, 1, 5]))
def test_the_sweep_is_its_definition_at_any_clock(
    rows: list[tuple[int, int, int, int]], min_ns: int, scale: int, offset: int
) -> None:
    """Stamps far from 0, or spans up to ~2^62 ns: sorted packed into one integer, or by
    np.lexsort where the packing would not fit; either way the definition's rows. A job
    clock's stamps over a short span never need lexsort."""
    moved = [(r, s * scale + offset, e * scale + offset, b) for r, s, e, b in rows]
    with mock.patch.object(np, "lexsort", wraps=np.lexsort) as spy:
        got = sweep.segments(_iv(moved), min_ns * scale)
    assert got.equals(_reference(moved, min_ns * scale))
    if scale == 1:
        assert not spy.called


def test_a_span_too_wide_to_pack_is_lexsorted() -> None:
    """A span of 2^63 ns cannot be packed beside its key: lexsort, with the same rows."""
    rows = [(0, -(2**62), 2**62, 2), (0, 0, 10, 1), (1, 5, 6, 8)]
    with mock.patch.object(np, "lexsort", wraps=np.lexsort) as spy:
        got = sweep.segments(_iv(rows))
    assert spy.called
    assert got.equals(_reference(rows, 0))
    assert got.rows()[:2] == [(0, "exposed", -(2**62), 0), (0, "exposed", 10, 2**62)]


def test_a_hand_made_case() -> None:
    """Rank 0: compute [0, 10), a DP all-reduce [5, 20), a PP send [25, 30), memory [40, 45).
    Exposed: [10, 20) (the all-reduce alone) and [25, 30) (the send); idle: [20, 40) (a PP
    transfer alone is a bubble) and nothing after 45."""
    rows = [(0, 0, 10, 1), (0, 5, 20, 2), (0, 25, 30, 4), (0, 40, 45, 8)]
    got = sweep.segments(_iv(rows)).rows()
    assert got == [(0, "exposed", 10, 20), (0, "idle", 20, 40), (0, "exposed", 25, 30)]


def test_packed_into_buckets() -> None:
    """Idle [20, 40) in buckets of 16 from 0: [20, 32) and [32, 40); exposed [10, 20) and
    [25, 30): [10, 16), [16, 20) + [25, 30) packed to [16, 25)."""
    rows = [(0, 0, 10, 1), (0, 5, 20, 2), (0, 25, 30, 4), (0, 40, 45, 8)]
    got = ovl.islands(sweep.packed(_iv(rows), 0, 48, 16)).rows()
    assert got == [(0, "exposed", 10, 25), (0, "idle", 20, 40)]


def test_nothing_to_sweep() -> None:
    assert sweep.segments(_iv([])).equals(ovl.empty())
    assert sweep.segments(_iv([(0, 5, 5, 1)])).equals(ovl.empty())
