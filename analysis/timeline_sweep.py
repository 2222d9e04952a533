"""timeline_sweep: the exposed and idle segments of a timeline window, from its device activity.

Why not SQL: there the sweep was five window functions partitioned by rank, and a one-step
Nsight capture (5 M kernels on one rank) took 9-11 s for the run's overview. Here it is two
sorts of nearly sorted timestamps and two running sums (numpy): the whole overview in 4.0 s
against 10.0 (the sweep itself 1.2-2.5 s). tests/analysis/test_timeline_sweep.py checks it
against a plain Python sweep on random intervals; the SQL it replaced gave equal rows on every
bundled sample, public trace set and generated job (session 26).

Algorithm: per rank and class (`bit`: 1 compute, 2 comm, 4 PP comm, 8 memory), +1/-1 at each
start/end; a class is active while its running count is > 0; its 0 <-> active transitions
add/remove its bit; the running sum of those is the set of active classes (mask) on
[x, next x). A segment is `exposed` when no compute runs and some communication does, `idle`
when no compute, non-PP communication or memory runs (a PP transfer alone is idle: a bubble).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import polars as pl
from ranklens.analysis import timeline_overlays as ovl

I64 = npt.NDArray[np.int64]


def labelled(iv: pl.DataFrame) -> pl.DataFrame:
    """(rank, label, s, e) of the exposed and idle stretches of `iv` (rank, s, e, bit:
    intervals already clipped to the window), touching ones of a rank and label merged."""
    iv = iv.filter(pl.col("e") > pl.col("s"))
    if iv.is_empty():
        return ovl.empty()
    rank = iv["rank"].cast(pl.Int64).to_numpy()
    bit = iv["bit"].cast(pl.Int64).to_numpy()
    key = np.concatenate([(rank << 4) | bit] * 2)  # (rank, class); bits are below 16
    x = np.concatenate([iv["s"].cast(pl.Int64).to_numpy(), iv["e"].cast(pl.Int64).to_numpy()])
    d = np.repeat(np.array([1, -1], dtype=np.int64), len(iv))
    # Each (rank, class) adds up to 0, so one running sum over all of them sorted is each
    # one's own running count: a class is active while it is > 0.
    key, x, d = _summed(key, x, d)
    cnt = np.cumsum(d)
    prev = cnt - d
    bits = key & 15
    flip = np.where((prev == 0) & (cnt > 0), bits, np.where((prev > 0) & (cnt == 0), -bits, 0))
    on = flip != 0
    # The same per rank over the transitions of all its classes: the mask of active classes on
    # [x, the rank's next x).
    rk, x, flip = _summed(key[on] >> 4, x[on], flip[on])
    mask = np.cumsum(flip)
    more = rk[:-1] == rk[1:]  # a next x on the same rank ends the stretch
    rk, s, e, mask = rk[:-1][more], x[:-1][more], x[1:][more], mask[:-1][more]
    exposed = ((mask & 1) == 0) & ((mask & 6) != 0)
    idle = (mask & 11) == 0
    parts = (("exposed", exposed), ("idle", idle))
    return pl.concat([_frame(label, *_merged(rk[m], s[m], e[m])) for label, m in parts])


def _merged(rk: I64, s: I64, e: I64) -> tuple[I64, I64, I64]:
    """Stretches of one label, sorted by (rank, s), with touching ones of a rank merged: what
    timeline_overlays.islands does for any frame, here on arrays already in order (islands'
    polars sort took 3.1 s on the 4.5 M stretches of a one-step 5 M-kernel capture)."""
    if not len(rk):
        return rk, s, e
    new = np.concatenate([[True], (rk[1:] != rk[:-1]) | (s[1:] != e[:-1])])
    first = np.flatnonzero(new)
    last = np.concatenate([first[1:], [len(rk)]]) - 1
    return rk[first], s[first], e[last]


def _frame(label: str, rk: I64, s: I64, e: I64) -> pl.DataFrame:
    return pl.DataFrame({"rank": rk, "s": s, "e": e}).select(
        pl.col("rank").cast(pl.Int64), pl.lit(label, pl.String).alias("label"), "s", "e"
    )


def _summed(key: I64, x: I64, d: I64) -> tuple[I64, I64, I64]:
    """Sorted by (key, x), with d summed over equal (key, x).

    How: each (key, x, d), offset to start at 0, packed into one int64 (key above x above d)
    and sorted as plain integers: the same order in about half np.lexsort's time (2 x 9.8 M
    stamps of a 64-rank x 10 M-event run: 3.8-4.5 s -> 1.7-2.2 s). lexsort where the three do
    not fit in 63 bits: stamps spanning over ~26 days on 64 ranks, ~2.4 hours on 10,000."""
    if not len(key):
        return key, x, d
    lo = [int(a.min()) for a in (key, x, d)]
    bits = [(int(a.max()) - m).bit_length() for a, m in zip((key, x, d), lo, strict=True)]
    if sum(bits) > 63:
        o = np.lexsort((x, key))
        key, x, d = key[o], x[o], d[o]
        first = _firsts((key[1:] != key[:-1]) | (x[1:] != x[:-1]))
        return key[first], x[first], np.add.reduceat(d, first)
    bx, bd = bits[1], bits[2]
    p = key - lo[0]
    p <<= bx + bd
    p |= (x - lo[1]) << bd
    p |= d - lo[2]
    p.sort(kind="stable")  # radix/timsort: nearly sorted runs of stamps
    kx = p >> bd
    first = _firsts(kx[1:] != kx[:-1])
    dd = p & ((1 << bd) - 1)
    dd += lo[2]
    kx = kx[first]
    return (kx >> bx) + lo[0], (kx & ((1 << bx) - 1)) + lo[1], np.add.reduceat(dd, first)


def _firsts(changed: npt.NDArray[np.bool_]) -> npt.NDArray[np.intp]:
    """Where each run of equal sorted rows starts, given where a row differs from the last."""
    return np.flatnonzero(np.concatenate([[True], changed]))


def segments(iv: pl.DataFrame, min_ns: int = 0) -> pl.DataFrame:
    """The window's exposed and idle segments (rank, label, s, e): touching ones of a rank and
    label merged, those shorter than `min_ns` left out, sorted by rank, start and label."""
    seg = labelled(iv)
    return seg.filter(pl.col("e") - pl.col("s") >= min_ns).sort("rank", "s", "label")


def packed(iv: pl.DataFrame, start: int, end: int, width: int) -> pl.DataFrame:
    """The segments packed per bucket of `width` ns from `start` (timeline_overlays), in no
    order (rebucket groups them: sorting 3.6 M segments of a 10 M-event run first took ~1 s)."""
    return ovl.rebucket(labelled(iv), start, end, width)
