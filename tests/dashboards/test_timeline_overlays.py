"""Aggregated timeline windows keep the exposed-communication and idle overlays.

The run is built so its answers are known by construction (µs from the trace origin):
rank 0: compute [100, 2100), an all-reduce alone [2100, 5100) (exposed), nothing
[5100, 7100) (idle), compute [7100, 10100); rank 1: one all-reduce over [100, 10100) under
3 µs kernels every 5 µs, so 2 µs of it is exposed every 5 µs (2000 short stretches).
Either rank has over 4000 events, so its step is drawn aggregated. Rank 0's overlays must be
its two stretches exactly; rank 1's must hold its exposed time in each bucket (to one base
bucket when re-bucketed from the run's overview), never more than a bucket off.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from kineto_builder import KinetoTrace, PgConfig, ns
from ranklens.analysis import timeline as tl
from ranklens.dashboards import timeline_view as tv
from ranklens.dashboards.data import RunData
from ranklens.dashboards.timeline_layers import OVERLAYS, lane_map, layers
from ranklens.ingest import load_traces

US = 1000
EXPOSED_0 = (ns(2100), ns(5100))
IDLE_0 = (ns(5100), ns(7100))


def write_overlay_run(root: Path) -> Path:
    """The two-rank run above, ingested; returns the database. Each all-reduce is in a group
    of its rank alone, so no collective aligns the two clocks."""
    for rank in (0, 1):
        pg = PgConfig(f"1{rank}", [rank])
        t = KinetoTrace(rank=rank, world_size=2, pg_config=[pg])
        t.step(1, 0, 10200)
        one = {"pg_name": pg.pg_name, "pg_ranks": pg.ranks}
        if rank == 0:
            for i in range(1000):
                t.kernel("gemm_a", 100 + 2 * i, 2, stream=7)
            t.nccl("AllReduce", 2100, 3000, stream=20, **one)
            for i in range(1500):
                t.kernel("gemm_b", 7100 + 2 * i, 2, stream=7)
        else:
            t.nccl("AllReduce", 100, 10000, stream=20, **one)
            for i in range(2000):
                t.kernel("gemm_c", 100 + 5 * i, 3, stream=7)
        t.write(root / "raw" / f"rank{rank}.json")
    db = root / "run.duckdb"
    load_traces([str(root / "raw")], db, workers=1)
    return db


def exposed_1() -> list[tuple[int, int]]:
    """Rank 1's exposed stretches: the 2 µs after each 3 µs kernel."""
    return [(ns(100 + 5 * i + 3), ns(100 + 5 * i + 5)) for i in range(2000)]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunData]:
    data = RunData(write_overlay_run(tmp_path_factory.mktemp("overlays")))
    yield data
    data.close()


def spans(seg: pl.DataFrame, rank: int, label: str) -> list[tuple[int, int]]:
    part = seg.filter((pl.col("rank") == rank) & (pl.col("label") == label)).sort("s")
    return [(int(s), int(e)) for s, e in part.select("s", "e").iter_rows()]


def per_bucket(iv: list[tuple[int, int]], start: int, w: int, n: int) -> np.ndarray:
    """Time of intervals `iv` in each of `n` buckets of `w` ns from `start`."""
    out = np.zeros(n, dtype=np.int64)
    for s, e in iv:
        for b in range(max(0, (s - start) // w), min(n, (e - 1 - start) // w + 1)):
            lo, hi = start + b * w, start + (b + 1) * w
            out[b] += max(0, min(e, hi) - max(s, lo))
    return out


@pytest.mark.parametrize("from_base", [True, False])
def test_aggregated_window_has_the_known_overlays(run: RunData, from_base: bool) -> None:
    ext = run.extent()
    assert ext.t0_ns == ns(100) and ext.t1_ns == ns(10100)
    base = run.timeline_base() if from_base else None
    cur = run.cursor()
    try:
        win = tl.window(cur, ext, ext.t0_ns, ext.t1_ns, base=base, min_segment_frac=0)
    finally:
        cur.close()
    assert win.mode == "buckets" and win.bucket_ns == 25 * US
    # Rank 0: its stretches exactly (an isolated stretch is packed where it lies).
    assert spans(win.segments, 0, "exposed") == [EXPOSED_0]
    assert spans(win.segments, 0, "idle") == [IDLE_0]
    # Rank 1: its exposed time per bucket, exact from raw events; from the overview each
    # bucket to two base buckets (its two edges), and the total exact either way.
    got, want = spans(win.segments, 1, "exposed"), exposed_1()
    n, w = 400, win.bucket_ns
    drawn, true = per_bucket(got, ext.t0_ns, w, n), per_bucket(want, ext.t0_ns, w, n)
    tol = 2 * base.bucket_ns if base is not None else 0
    assert drawn.sum() == true.sum() == 4000 * US
    assert np.abs(drawn - true).max() <= tol
    # No drawn piece lies farther than a bucket from exposed time.
    for s, e in got:
        assert true[max(0, (s - ext.t0_ns) // w - 1) : (e - 1 - ext.t0_ns) // w + 2].sum() > 0
    assert spans(win.segments, 1, "idle") == []  # the all-reduce covers every gap


def test_the_aggregated_figure_draws_them_across_the_ranks_lanes(run: RunData) -> None:
    t0 = run.extent().t0_ns
    start, end = tv.resolve(run, [0], 1, None, None)
    assert (start, end) == (ns(100), ns(10100))
    fig, label, _ = tv.render(run, [0], start, end)
    assert "aggregated" in label
    names = [t["name"] for t in fig["data"]]
    assert OVERLAYS["exposed"][0] in names and OVERLAYS["idle"][0] in names
    # The layers behind the figure: one rectangle each, over rank 0's device lanes.
    cur = run.cursor()
    try:
        win = tl.window(cur, run.extent(), start, end, [0], base=run.timeline_base())
    finally:
        cur.close()
    lm = lane_map(run.timeline_lanes(), [0])
    by = {ly.name: ly for ly in layers(win, lm, t0)}
    for key, (s, e) in (("exposed", EXPOSED_0), ("idle", IDLE_0)):
        ly = by[OVERLAYS[key][0]]
        assert ly.x0.tolist() == pytest.approx([(s - t0) / 1e6])
        assert ly.x1.tolist() == pytest.approx([(e - t0) / 1e6])
        device = [i for i, a in enumerate(lm.activity) if a]
        assert ly.y0[0] < lm.top[device[0]] and ly.y1[0] > lm.top[device[-1]]
