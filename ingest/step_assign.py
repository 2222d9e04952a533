"""Step of every event of one rank, and the rank's step windows: a pure function of its events.

Why numpy, not SQL: the rules are a few sorted searches per rank, and a job of 1,024 small
rank files paid ~45 ms of SQL statement overhead per rank (half a minute per ingest) for work
that takes well under a millisecond here. Rules (unchanged):

- host events take the ProfilerStep span that contains their start (the span with the latest
  start at or before it, if it has not ended);
- device events take the step of the host launch (runtime/sync event) with the same correlation;
- a step's window W is its device work's hull on a GPU rank (else its host span, extended to the
  end of its host events);
- device events with no launch take the window (latest start at or before them, not ended)
  that contains their start, and widen it to hold them;
- a rank without any ProfilerStep span gets one pseudo-step (-1) covering the whole trace.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from ranklens.ingest.classify import STEP_RE

_WORK = ("compute", "comm", "memcpy", "memset")
_TRACE_KINDS = (*_WORK, "cpu_op", "runtime", "sync")
_COLUMNS = {
    "name": pa.string(),
    "kind": pa.string(),
    "device": pa.int32(),
    "ts_ns": pa.int64(),
    "dur_ns": pa.int64(),
    "correlation": pa.int64(),
}
_BIG = np.iinfo(np.int64).max
_SMALL = np.iinfo(np.int64).min


@dataclass
class Window:
    """One row of the `steps` table (without the rank)."""

    step: int
    cpu_start_ns: int
    cpu_end_ns: int | None  # None: its ProfilerStep spans carry no duration
    start_ns: int | None
    end_ns: int | None

    @property
    def source(self) -> str:
        return "trace" if self.step == -1 else "profiler_step"


def assign(ev: pa.Table, has_gpu: bool) -> tuple[pa.Array, list[Window]]:
    """(step of each row, NULL where none; the rank's windows that have a start, by step)."""
    n = ev.num_rows
    for name, typ in _COLUMNS.items():  # a reader may stage fewer columns (all NULL)
        if name not in ev.column_names:
            ev = ev.append_column(name, pa.nulls(n, typ))
    kind = _Kinds(ev["kind"])
    devv = _ints(ev["device"], -2, np.int32)
    host, gpu = devv == -1, devv >= 0
    ts = _ints(ev["ts_ns"], 0)
    dur = ev["dur_ns"]
    has_end = (
        dur.is_valid().to_numpy(zero_copy_only=False) if dur.null_count else np.ones(n, np.bool_)
    )
    end = ts + _ints(dur, 0)
    step = np.zeros(n, np.int32)
    known = np.zeros(n, np.bool_)
    cpu = _cpu_steps(ev["name"], kind.among(("annotation",)), host, ts, end, has_end)
    if cpu is None:
        pseudo = _pseudo(kind.among(_TRACE_KINDS), gpu, ts, end, has_end, has_gpu)
        if pseudo is None:
            return pa.array(step, mask=~known), []
        step[:], known[:] = -1, True
        return pa.array(step), [pseudo] if pseudo.start_ns is not None else []
    nums, c_start, c_end = cpu
    idx = np.full(n, -1, np.int64)  # per event: index into nums, by the rule that decided
    rows, k = _asof(c_start, c_end, np.flatnonzero(host), ts)
    host_idx = idx.copy()
    host_idx[rows] = k
    dev_idx = _by_launch(ev["correlation"], kind.among(("runtime", "sync")), host_idx, gpu)
    work = kind.among(_WORK)
    ws, we = _windows(c_start, c_end, dev_idx, host_idx, work, ts, end, has_end, has_gpu)
    # Device events with no launch: the window whose span holds their start, widened for them.
    lo = np.minimum(ws, c_start)
    order = np.argsort(lo, kind="stable")
    rows, k = _asof(lo[order], we[order], np.flatnonzero(gpu & (dev_idx < 0)), ts)
    late_idx = idx.copy()
    late_idx[rows] = order[k]
    sel = work[rows]
    if sel.any():
        np.minimum.at(ws, order[k][sel], ts[rows][sel])
        sel_end = sel & has_end[rows]
        np.maximum.at(we, order[k][sel_end], end[rows][sel_end])
    for which in (late_idx, dev_idx, host_idx):  # lowest precedence first
        got = which >= 0
        step[got] = nums[which[got]]
        known |= got
    wins = [
        Window(int(s), int(a), None if b == _SMALL else int(b), int(x), int(y))
        for s, a, b, x, y in zip(nums, c_start, c_end, ws, we, strict=True)
    ]
    return pa.array(step, mask=~known), wins


class _Kinds:
    """A text column as small integer codes: tested against a few names by looking each
    distinct value up once (5 M rows: a comparison of codes, not of 5 M Python strings)."""

    def __init__(self, col: pa.ChunkedArray) -> None:
        chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
        index: dict[str | None, int] = {}
        parts = []
        for ch in chunks:  # each chunk's own dictionary mapped into one vocabulary
            if not pa.types.is_dictionary(ch.type):
                ch = pc.dictionary_encode(ch)
            remap = np.array(
                [index.setdefault(v, len(index)) for v in ch.dictionary.to_pylist()] + [-1],
                dtype=np.int32,
            )
            codes = ch.indices.cast(pa.int32()).fill_null(len(remap) - 1)
            codes = codes.to_numpy(zero_copy_only=False)
            parts.append(remap[codes])
        self.values = list(index)
        # -1 (a null row) reads the table's last entry, which matches nothing
        self.codes = np.concatenate(parts) if parts else np.empty(0, np.int32)

    def among(self, names: tuple[str, ...]) -> np.ndarray:
        table = np.array([v in names for v in self.values] + [False], dtype=np.bool_)
        return table[self.codes]


def _ints(col: pa.ChunkedArray, fill: int, dtype: type = np.int64) -> np.ndarray:
    """An integer column as `dtype`, nulls as `fill` (no copy where there is nothing to fill)."""
    if col.null_count:
        col = col.fill_null(fill)
    return np.asarray(col.to_numpy(), dtype=dtype)


def _cpu_steps(
    names: pa.ChunkedArray,
    is_ann: np.ndarray,
    host: np.ndarray,
    ts: np.ndarray,
    end: np.ndarray,
    has_end: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """ProfilerStep#N spans on the host: (N sorted, first start, last end) per N."""
    rows = np.flatnonzero(is_ann & host)
    if not len(rows):
        return None
    cand = pc.cast(names.take(pa.array(rows)), pa.string()).to_pylist()
    spans: dict[int, list[int]] = {}
    for r, name in zip(rows.tolist(), cand, strict=True):
        m = STEP_RE.match(name or "")
        if m is None:
            continue
        s = spans.setdefault(int(m.group(1)), [_BIG, _SMALL])
        s[0] = min(s[0], int(ts[r]))
        if has_end[r]:
            s[1] = max(s[1], int(end[r]))
    if not spans:
        return None
    nums = np.array(sorted(spans), dtype=np.int64)
    return (
        nums,
        np.array([spans[s][0] for s in nums], dtype=np.int64),
        np.array([spans[s][1] for s in nums], dtype=np.int64),
    )


def _asof(
    starts: np.ndarray, ends: np.ndarray, rows: np.ndarray, ts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For `rows`, the span (index into sorted `starts`) with the latest start at or before
    their start, kept when they start before its end: (rows kept, span index)."""
    k = np.searchsorted(starts, ts[rows], side="right") - 1
    ok = k >= 0
    ok[ok] = ts[rows[ok]] < ends[k[ok]]
    return rows[ok], k[ok]


def _by_launch(
    corr_col: pa.ChunkedArray, is_launch: np.ndarray, host_idx: np.ndarray, gpu: np.ndarray
) -> np.ndarray:
    """Per event: the step index of the launch with its correlation id (device events)."""
    valid = corr_col.is_valid().to_numpy(zero_copy_only=False)
    corr = _ints(corr_col, 0)
    out = np.full(len(corr), -1, np.int64)
    launch = np.flatnonzero(is_launch & valid & (host_idx >= 0))
    dev = np.flatnonzero(gpu & valid)
    if not len(launch) or not len(dev):
        return out
    order = np.argsort(corr[launch], kind="stable")
    keys, vals = corr[launch][order], host_idx[launch][order]
    pos = np.minimum(np.searchsorted(keys, corr[dev]), len(keys) - 1)
    hit = keys[pos] == corr[dev]
    out[dev[hit]] = vals[pos[hit]]
    return out


def _windows(
    c_start: np.ndarray,
    c_end: np.ndarray,
    dev_idx: np.ndarray,
    host_idx: np.ndarray,
    work: np.ndarray,
    ts: np.ndarray,
    end: np.ndarray,
    has_end: np.ndarray,
    has_gpu: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Each step's W: the hull of its device work (GPU rank), else its host span extended to
    the end of its host events."""
    k = len(c_start)
    d_lo, d_hi = np.full(k, _BIG), np.full(k, _SMALL)
    h_hi = np.full(k, _SMALL)
    rows = np.flatnonzero((dev_idx >= 0) & work)
    np.minimum.at(d_lo, dev_idx[rows], ts[rows])
    rows = rows[has_end[rows]]
    np.maximum.at(d_hi, dev_idx[rows], end[rows])
    rows = np.flatnonzero((host_idx >= 0) & has_end)
    np.maximum.at(h_hi, host_idx[rows], end[rows])
    if has_gpu:
        start = np.where(d_lo != _BIG, d_lo, c_start)
        stop = np.where(
            d_hi != _SMALL, d_hi, np.maximum(c_end, np.where(h_hi != _SMALL, h_hi, c_end))
        )
    else:
        start = c_start.copy()
        stop = np.maximum(c_end, np.where(h_hi != _SMALL, h_hi, c_end))
    return start, stop


def _pseudo(
    traced: np.ndarray,
    gpu: np.ndarray,
    ts: np.ndarray,
    end: np.ndarray,
    has_end: np.ndarray,
    has_gpu: bool,
) -> Window | None:
    """The whole trace as step -1 (a rank without ProfilerStep spans); None: nothing timed."""
    if not traced.any():
        return None
    ended = traced & has_end
    mine = traced & gpu if has_gpu else traced
    mine_ended = mine & has_end

    def lo(where: np.ndarray) -> int | None:  # reduced in place: no copy of 5 M rows
        return int(np.min(ts, where=where, initial=_BIG)) if where.any() else None

    def hi(where: np.ndarray) -> int | None:
        return int(np.max(end, where=where, initial=_SMALL)) if where.any() else None

    first = lo(traced)
    assert first is not None  # traced.any()
    return Window(-1, first, hi(ended), lo(mine), hi(mine_ended))
