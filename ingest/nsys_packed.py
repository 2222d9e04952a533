"""The packed integer expressions the Nsight reader selects, each with its numpy twin.

Why packed: through SQLite every value crossing into Arrow costs about as much as the SQL that
makes it, so two or three small integers travel as one. Why twins: the page scanner
(sqlite_pages.py) reads the raw columns instead and must give the very same integers, NULLs
included; each twin below follows SQLite's rules for its expression (NULL in an operand makes
the result NULL, a NULL condition is not true). Tests compare both paths on every export.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from ranklens.ingest.nsys_tables import U24
from ranklens.ingest.sqlite_pages import Col, Expr

# CUDA limits (grid y/z <= 65535, block x/y/z <= 1024) let six dims ride in two integers;
# anything outside them reads as -1 and gets no launch string rather than a wrong one.
_GRID = (
    "CASE WHEN gridX BETWEEN 0 AND 2147483647 AND gridY BETWEEN 0 AND 65535 AND gridZ "
    "BETWEEN 0 AND 65535 THEN gridX | (gridY << 31) | (gridZ << 47) ELSE -1 END"
)
_BLOCK = (
    "CASE WHEN blockX BETWEEN 0 AND 2097151 AND blockY BETWEEN 0 AND 2097151 AND blockZ "
    "BETWEEN 0 AND 2097151 THEN blockX | (blockY << 21) | (blockZ << 42) ELSE -1 END"
)


def _dims(limits: tuple[int, int, int], shifts: tuple[int, int]) -> Callable[..., Col]:
    def fn(x: Col, y: Col, z: Col) -> Col:
        ok = np.ones(len(x[0]), np.bool_)
        for (v, valid), hi in zip((x, y, z), limits, strict=True):
            ok &= valid & (v >= 0) & (v <= hi)
        packed = x[0] | (y[0] << shifts[0]) | (z[0] << shifts[1])
        return np.where(ok, packed, -1), np.ones(len(ok), np.bool_)

    return fn


GRID = Expr(_GRID, ("gridX", "gridY", "gridZ"), _dims((2147483647, 65535, 65535), (31, 47)))
BLOCK = Expr(_BLOCK, ("blockX", "blockY", "blockZ"), _dims((2097151,) * 3, (21, 42)))


def pid_device(gpid: str) -> Expr:
    """The OS pid (24 bits of globalPid; all ones = NULL, which no Linux pid reaches) and
    deviceId as one integer: exact for any deviceId in +-2**39, i.e. any CUDA ordinal. `gpid`:
    the globalPid column, or the constant 0 where the export has none."""
    sql = f"ifnull(({gpid} >> 24) & {U24}, {U24}) | (deviceId << 24)"
    if gpid == "0":
        return Expr(sql, ("deviceId",), lambda dev: (dev[0] << 24, dev[1]))

    def fn(dev: Col, g: Col) -> Col:
        pid = np.where(g[1], (g[0] >> 24) & U24, U24)
        return pid | (dev[0] << 24), dev[1]

    return Expr(sql, ("deviceId", gpid.strip('"')), fn)


def stream_and_name(name: str) -> Expr | str:
    """streamId (CUPTI: uint32) and the name's StringIds id (exact for |id| < 2**31) as one
    integer; `name`: the name column, or NULL where the export has none."""
    if name == "NULL":
        return "NULL"  # NULL | anything is NULL

    def fn(stream: Col, n: Col) -> Col:
        return (stream[0] & 0xFFFFFFFF) | (n[0] << 32), stream[1] & n[1]

    return Expr(f"(streamId & 4294967295) | ({name} << 32)", ("streamId", name.strip('"')), fn)


def event_class_in(values: tuple[int, ...]) -> Expr:
    """`eventClass IN (values)`: 1 or 0, NULL where eventClass is."""
    sql = f'"eventClass" IN ({", ".join(map(str, values))})'
    return Expr(sql, ("eventClass",), lambda c: (np.isin(c[0], values).astype(np.int64), c[1]))
