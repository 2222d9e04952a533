"""ranklens overlap against Nsight's `nccl_gpu_overlap_trace` definition, computed by hand.

The recipe (docs/nsys-recipes.md, R4 lib/overlap.py): kernels whose shortName starts with `nccl`
are communication, all others compute; per (report, PID, device) the compute kernels are
consolidated (union), and each NCCL kernel gets `Compute Overlap` = its time under that union
and `Communication Overlap` = its time under the other NCCL kernels. Here that is recomputed
with sqlite3 and plain Python from the export (no ranklens code), on a window of rank 0's
trace, and compared with ranklens's interval algebra restricted to the same window by SQL over
the ranklens database. Where the two definitions differ (summed per kernel vs union) is shown on
a hand-built export.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lookups import sqlite_rows
from nsys_fixtures import NsysDB, shared_dir
from ranklens.analysis.views import apply_all_views
from ranklens.ingest import load_traces

Interval = tuple[int, int]


def _consolidate(iv: list[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _covered(k: Interval, ranges: list[Interval]) -> int:
    return sum(max(0, min(k[1], e) - max(k[0], s)) for s, e in ranges)


def _kernels(path: Path, pid: int, window: Interval) -> list[tuple[int, int, int, bool]]:
    """(device, start, end, is_nccl) of the process's kernels, clipped to the window."""
    rows = sqlite_rows(
        path,
        "SELECT k.deviceId, k.start, k.\"end\", s.value LIKE 'nccl%' "
        "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
        f"WHERE (k.globalPid >> 24) & 16777215 = {pid} "
        f'AND k."end" > {window[0]} AND k.start < {window[1]}',
    )
    return [(d, max(s, window[0]), min(e, window[1]), bool(n)) for d, s, e, n in rows]


def overlap_trace(path: Path, pid: int, window: Interval) -> list[dict[str, int]]:
    """nccl_gpu_overlap_trace rows of one process, by hand: one row per NCCL kernel."""
    clip = _kernels(path, pid, window)
    out = []
    for dev in sorted({r[0] for r in clip}):
        compute = _consolidate([(s, e) for d, s, e, n in clip if d == dev and not n])
        nccl = [(s, e) for d, s, e, n in clip if d == dev and n]
        for i, k in enumerate(nccl):
            others = _consolidate(nccl[:i] + nccl[i + 1 :])
            out.append(
                {
                    "device": dev,
                    "duration": k[1] - k[0],
                    "compute_overlap": _covered(k, compute),
                    "comm_overlap": _covered(k, others),
                }
            )
    return out


_WINDOW_SQL = """
CREATE OR REPLACE TEMP VIEW _w_iv AS
SELECT {{'device': device}} AS k, CASE kind WHEN 'compute' THEN 0 ELSE 1 END AS cls,
       greatest(ts_ns, {lo}) AS s, least(ts_ns + dur_ns, {hi}) AS e
FROM events WHERE rank = {rank} AND device >= 0 AND kind IN ('compute', 'comm')
  AND ts_ns < {hi} AND ts_ns + dur_ns > {lo};
CREATE OR REPLACE TEMP VIEW _w_union AS SELECT * FROM interval_union('_w_iv');
"""


def ranklens_window(con: duckdb.DuckDBPyConnection, rank: int, window: Interval) -> dict[str, int]:
    """|M|, |M ∩ C|, |C| of one rank on a window, with ranklens's own interval macros."""
    apply_all_views(con)
    con.execute(_WINDOW_SQL.format(rank=rank, lo=window[0], hi=window[1]))
    cov = con.execute("SELECT mask, sum(dur) FROM interval_coverage('_w_union') GROUP BY 1")
    by_mask = {int(m): int(d) for m, d in cov.fetchall()}
    n = con.execute("SELECT count(*) FROM _w_iv WHERE cls = 1").fetchall()[0][0]
    return {
        "n_comm": int(n),
        "comm": by_mask.get(2, 0) + by_mask.get(3, 0),
        "hidden": by_mask.get(3, 0),
        "compute": by_mask.get(1, 0) + by_mask.get(3, 0),
    }


def _idle_point(path: Path, pid: int, near: float) -> int:
    """A time (raw clock) inside a gap of the process's kernels, nearest `near` of its span,
    so that no kernel straddles the window edge and any edge rule gives the same answer."""
    iv = sqlite_rows(
        path,
        'SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL '
        f"WHERE (globalPid >> 24) & 16777215 = {pid}",
    )
    merged = _consolidate([(int(s), int(e)) for s, e in iv])
    lo, hi = merged[0][0], merged[-1][1]
    target = lo + near * (hi - lo)
    gaps = [(a[1], b[0]) for a, b in itertools.pairwise(merged)]
    g = min(gaps, key=lambda g: abs((g[0] + g[1]) / 2 - target))
    return (g[0] + g[1]) // 2


def test_nsys_ai_overlap_matches_the_recipe_definition(tmp_path: Path) -> None:
    src = shared_dir("nsys-ai", "mfu_2gpu_before.sqlite")
    utc, sys_clock = sqlite_rows(
        src, "SELECT utcEpochNs, systemClockNs FROM TARGET_INFO_SESSION_START_TIME"
    )[0]
    shift = int(utc) - int(sys_clock)  # the reader's rule for this (not UTC-normalised) export
    db = tmp_path / "ai.duckdb"
    load_traces([str(src)], db, workers=1)
    con = duckdb.connect(str(db), read_only=True)
    try:
        for rank, pid in ((0, 144), (1, 145)):
            window = (_idle_point(src, pid, 1 / 3), _idle_point(src, pid, 2 / 3))
            for t in window:  # in a gap: no kernel straddles an edge, whatever the edge rule
                assert not sqlite_rows(
                    src,
                    "SELECT 1 FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE (globalPid >> 24) & 16777215"
                    f' = {pid} AND start < {t} AND "end" > {t}',
                )
            recipe = overlap_trace(src, pid, window)
            ours = ranklens_window(con, rank, (window[0] + shift, window[1] + shift))
            assert len(recipe) == ours["n_comm"] >= 10  # ~a third of the 33 SendRecv kernels
            # NCCL kernels never overlap each other here (one stream), so the recipe's per-kernel
            # sums equal ranklens's unions
            assert all(r["comm_overlap"] == 0 for r in recipe)
            assert sum(r["duration"] for r in recipe) == ours["comm"]
            assert sum(r["compute_overlap"] for r in recipe) == ours["hidden"] == 0
            compute = _consolidate([(s, e) for _d, s, e, n in _kernels(src, pid, window) if not n])
            assert sum(e - s for s, e in compute) == ours["compute"]
            # and the whole-trace numbers of the overlap analysis agree with the recipe too
            whole = overlap_trace(src, pid, (0, 2**62))
            (comm, hidden) = con.execute(
                "SELECT comm_ns, hidden_ns FROM overlap_by_rank WHERE rank = ?", [rank]
            ).fetchall()[0]
            assert (comm, hidden) == (sum(r["duration"] for r in whole), 0)
    finally:
        con.close()


def test_where_the_recipe_and_ranklens_differ(tmp_path: Path) -> None:
    """Two NCCL kernels overlapping each other and a compute kernel: the recipe sums per kernel,
    ranklens takes the union of communication (design: unions per device, never sums)."""
    db = NsysDB(tmp_path / "r.sqlite").meta(normalized=True, env={"RANK": "0"})
    db.kernel(7, 0, 100, "void gemm()", stream=7)
    db.kernel(7, 50, 150, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(Args)", stream=20)
    db.kernel(7, 80, 200, "ncclDevKernel_AllGather_RING_LL(Args)", stream=21)
    path = db.save()
    recipe = overlap_trace(path, 7, (0, 1000))
    assert [(r["duration"], r["compute_overlap"], r["comm_overlap"]) for r in recipe] == [
        (100, 50, 70),
        (120, 20, 70),
    ]
    out = tmp_path / "r.duckdb"
    load_traces([str(path)], out, workers=1)
    con = duckdb.connect(str(out), read_only=True)
    try:
        ours = ranklens_window(con, 0, (0, 1000))
    finally:
        con.close()
    # recipe: sum(duration) = 220, sum(compute overlap) = 70 (the 80-100 stretch counted twice)
    # ranklens: |M| = 150 (50-200), |M ∩ C| = 50 (50-100)
    assert (ours["comm"], ours["hidden"]) == (150, 50)
    assert sum(r["compute_overlap"] for r in recipe) == 70 != ours["hidden"]
