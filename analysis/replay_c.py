"""The replay's vertex loop, its path walk and the graph's Kahn order in C (`_replay.c`), with
the Python ones as fallback.

Why: a deep, narrow graph (a capture without step marks: one step, lanes of millions of
kernels) cannot be replayed a topological level at a time; its vertex loop in Python took
4.5-7 s a replay on 5 M kernels. The C loop is exact (int64, overflow checked: on overflow the
caller runs the Python loop, which is exact in any case) and checks every index it reads.
RANKLENS_PURE_PYTHON=1 turns it off, as it does the C scanner.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]

_c: Any
try:
    _c = importlib.import_module("ranklens.analysis._replay")
except ImportError:  # built without a C compiler: the Python loops do the work
    _c = None


def available() -> bool:
    """Whether the C loop is built and not turned off."""
    return _c is not None and os.environ.get("RANKLENS_PURE_PYTHON", "") in ("", "0")


def _i64(a: npt.ArrayLike) -> I64:
    return np.ascontiguousarray(a, dtype=np.int64)


def loop(
    order: I64, ptr: I64, src: I64, lag: I64, base: I64, add: I64, track: bool
) -> tuple[I64, I64 | None] | None:
    """(value, binding edge or None) per vertex, as graph_replay.replay_loop computes them;
    None when a sum leaves int64 (the caller's exact loop then decides)."""
    val = np.zeros(len(base), dtype=np.int64)
    arg = np.full(len(base), -1, dtype=np.int64) if track else None
    ok = _c.loop(_i64(order), _i64(ptr), _i64(src), _i64(lag), _i64(base), _i64(add), val, arg)
    return (val, arg) if ok else None


def chain(v: int, arg: I64, src: I64) -> I64:
    """The vertices from v back along the binding in-edges (arg) to a start, v first."""
    out = np.empty(len(arg), dtype=np.int64)
    return out[: int(_c.chain(int(v), _i64(arg), _i64(src), out))]


def kahn(optr: I64, succ: I64, indeg: I64, pos: I64) -> I64:
    """The vertices Kahn's algorithm places, lowest `pos` first among those ready, as
    graph_units._kahn's Python loop places them (optr/succ: kept out-edges as CSR; indeg:
    kept in-degrees; pos: a permutation)."""
    n = len(pos)
    out = np.empty(n, dtype=np.int64)
    work = (np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64))
    got = _c.kahn(_i64(optr), _i64(succ), np.array(indeg, dtype=np.int64), _i64(pos), *work, out)
    return out[: int(got)]
