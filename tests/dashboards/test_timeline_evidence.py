"""A finding's evidence outlined on the timeline: exposed-only codes outline exposed comm only,
whether the window is drawn event by event or aggregated into buckets.

The run is built so its answers are known by construction (µs from the trace origin), the
same on ranks 0 and 1 except where said:
  H1 all-reduce [1000, 4000) under gemm [900, 4100)       hidden (rank 1: no gemm, exposed 3000)
  H2 all-reduce [5000, 8000) under [4990, 6000) + [6000, 7000) (stream 7) + [6500, 8010)
     (stream 8): hidden by their union, by no single kernel
  X1 all-reduce [9000, 9500) alone                        exposed 500
  X2 all-reduce [10000, 11000), compute [10000, 10600) and [10700, 10800)   exposed 300
  X3 all-reduce [12000, 12200), X4 all-gather [12100, 12250) on another stream: 200 and 150
  2100 1 µs kernels from 14000 (with their launches, over 4000 events: a step is aggregated).
The hidden ones are the longest comm events, so outlining "the longest" shows the wrong ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import polars as pl
import pytest
from kineto_builder import KinetoTrace, PgConfig, ns
from ranklens.analysis import timeline as tl
from ranklens.dashboards import data as dd
from ranklens.dashboards import timeline_view as tv
from ranklens.dashboards.data import RunData, evidence
from ranklens.dashboards.figures import MS
from ranklens.dashboards.pages import findings
from ranklens.ingest import load_traces
from ranklens.sample_traces.gpu_job import GpuJob

from .conftest import job_db

CODES = ("OVERLAP_EXPOSED_COMM", "STRAGGLER_EXPOSED_WAIT")
# (rank, start µs, end µs, exposed µs) of every exposed comm event, by construction
EXPOSED = [
    (1, 1000, 4000, 3000),
    *[(r, 9000, 9500, 500) for r in (0, 1)],
    *[(r, 10000, 11000, 300) for r in (0, 1)],
    *[(r, 12000, 12200, 200) for r in (0, 1)],
    *[(r, 12100, 12250, 150) for r in (0, 1)],
]
HIDDEN = [(0, 1000, 4000), *[(r, 5000, 8000) for r in (0, 1)]]


def write_run(root: Path) -> Path:
    """The two-rank run above, ingested; each rank's collectives in a group of its own."""
    for rank in (0, 1):
        pg = PgConfig(f"1{rank}", [rank])
        t = KinetoTrace(rank=rank, world_size=2, pg_config=[pg])
        t.step(1, 0, 20000)
        one: dict[str, Any] = {"pg_name": pg.pg_name, "pg_ranks": pg.ranks}
        if rank == 0:
            t.kernel("gemm_h1", 900, 3200, stream=7)
        t.nccl("AllReduce", 1000, 3000, stream=20, **one)
        t.kernel("gemm_a", 4990, 1010, stream=7)
        t.kernel("gemm_b", 6000, 1000, stream=7)
        t.kernel("gemm_c", 6500, 1510, stream=8)
        t.nccl("AllReduce", 5000, 3000, stream=20, **one)
        t.nccl("AllReduce", 9000, 500, stream=20, **one)
        t.kernel("gemm_d", 10000, 600, stream=7)
        t.kernel("gemm_e", 10700, 100, stream=7)
        t.nccl("AllReduce", 10000, 1000, stream=20, **one)
        t.nccl("AllReduce", 12000, 200, stream=20, **one)
        t.nccl("AllGather", 12100, 150, stream=21, **one)
        for i in range(2100):
            t.kernel("tiny", 14000 + 2 * i, 1, stream=7)
        t.write(root / "raw" / f"rank{rank}.json")
    db = root / "run.duckdb"
    load_traces([str(root / "raw")], db, workers=1)
    return db


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunData]:
    data = RunData(write_run(tmp_path_factory.mktemp("evidence")))
    yield data
    data.close()


def offsets(data: RunData) -> dict[int, int]:
    cur = data.cursor()
    try:
        rows = cur.execute("SELECT rank, coalesce(clock_offset_ns, 0) FROM ranks").fetchall()
    finally:
        cur.close()
    return {int(r): int(o) for r, o in rows}


def truth(data: RunData, ranks: tuple[int, ...] = (0, 1)) -> list[tuple[int, int, int]]:
    """(rank, start, end) on the job clock of the exposed comm events, the most exposed first."""
    off = offsets(data)
    rows = sorted((r for r in EXPOSED if r[0] in ranks), key=lambda r: (-r[3], r[0]))
    return [(r, ns(s) + off[r], ns(e) + off[r]) for r, s, e, _ in rows]


def outlined(df: pl.DataFrame | None) -> list[tuple[int, int, int]]:
    assert df is not None
    return [(int(r), int(s), int(e)) for r, s, e in df.select("rank", "start_ns", "end_ns").rows()]


def evidence_in(
    data: RunData, start: int, end: int, ranks: list[int] | None, **kw: Any
) -> tuple[tl.Window, dict[str, pl.DataFrame | None]]:
    cur = data.cursor()
    try:
        win = tl.window(cur, data.extent(), start, end, ranks, **kw)
        return win, {c: evidence(cur, win, c, ranks, data.extent()) for c in CODES}
    finally:
        cur.close()


@pytest.mark.parametrize("ranks", [None, [1]])
def test_both_modes_outline_exactly_the_exposed_comm(run: RunData, ranks: list[int] | None) -> None:
    off = min(offsets(run).values())
    start, end = ns(800) + off, ns(13000) + off
    want = truth(run, tuple(ranks or (0, 1)))
    for max_events, mode in ((4000, "events"), (10, "buckets")):
        win, got = evidence_in(run, start, end, ranks, max_events=max_events)
        assert win.mode == mode
        for code in CODES:
            rows = outlined(got[code])
            assert sorted(rows) == sorted(want), (mode, code)
            if mode == "buckets":
                assert rows == want  # the most exposed first
            hidden = {(r, ns(s), ns(e)) for r, s, e in HIDDEN}
            assert not hidden & {(r, s - offsets(run)[r], e - offsets(run)[r]) for r, s, e in rows}


def test_a_window_with_only_hidden_comm_outlines_nothing(run: RunData) -> None:
    """Rank 0's H1 under its gemm: no exposed (nor idle) time in view, so no evidence in
    either mode (the raw mode once outlined every comm event when a window had no segment)."""
    off = offsets(run)[0]
    start, end = ns(950) + off, ns(4050) + off
    for max_events in (4000, 1):
        win, got = evidence_in(run, start, end, [0], max_events=max_events)
        assert win.segments.is_empty() or "exposed" not in win.segments["label"].to_list()
        for code in CODES:
            assert outlined(got[code]) == [], (win.mode, code)


def test_a_clipped_window_counts_only_its_own_exposed_time(run: RunData) -> None:
    off = offsets(run)
    # [9400, 10650): X1's last 100 µs are exposed; X2's first 600 µs are under gemm_d, then
    # 50 µs exposed; H1..H2 are outside. Rank 0 only; aggregated.
    start, end = ns(9400) + off[0], ns(10650) + off[0]
    win, got = evidence_in(run, start, end, [0], max_events=1)
    assert win.mode == "buckets"
    cur = run.cursor()
    try:
        hit = tl.exposed_events(cur, run.extent(), start, end, [0])
    finally:
        cur.close()
    assert hit.select("start_ns", "exposed_ns").rows() == [
        (ns(9000) + off[0], 100 * 1000),
        (ns(10000) + off[0], 50 * 1000),
    ]
    assert len(outlined(got[CODES[0]])) == 2


def test_the_aggregated_step_outlines_the_exposed_and_says_how_many(
    run: RunData, monkeypatch: pytest.MonkeyPatch
) -> None:
    ext = run.extent()
    s, e = tv.resolve(run, None, None, None, None)
    _, label, _ = tv.render(run, None, s, e, hl=CODES[0])
    assert "aggregated" in label
    assert f"evidence of {CODES[0]}: {len(EXPOSED)} events outlined" in label
    win, got = evidence_in(run, s, e, None)
    assert win.mode == "buckets"
    assert outlined(got[CODES[0]]) == truth(run)
    monkeypatch.setattr(dd, "MAX_OUTLINES", 2)  # at most that many: the most exposed
    cur = run.cursor()
    try:
        two = evidence(cur, win, CODES[0], None, ext)
    finally:
        cur.close()
    assert outlined(two) == truth(run)[:2]
    # Codes that are not exposed-only still outline the longest comm, hidden or not.
    cur = run.cursor()
    try:
        longest = evidence(cur, win, "COLLECTIVE_SLOW", None, ext)
    finally:
        cur.close()
    assert longest is not None and int(longest["end_ns"][0] - longest["start_ns"][0]) == 3000 * 1000


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunData]:
    data = RunData(
        job_db(tmp_path_factory.mktemp("evidence-job"), GpuJob(tp=2, dp=2, pp=2, m=2, steps=2))
    )
    yield data
    data.close()


def test_exposure_agrees_with_the_windows_exposed_segments(job: RunData) -> None:
    """On a generated job: the events the aggregated query finds exposed are exactly the comm
    events that meet the window's exposed segments (min_segment_frac=0: every sliver)."""
    ext = job.extent()
    s, e = tv.resolve(job, None, None, None, None)
    n = 0
    for ranks in ([0, 1], [2, 5], [7]):
        for a, b in ((s, e), (s + (e - s) // 3, s + (e - s) // 2)):
            win, raw = evidence_in(job, a, b, ranks, max_events=100_000, min_segment_frac=0)
            assert win.mode == "events"
            cur = job.cursor()
            try:
                hit = tl.exposed_events(cur, ext, a, b, ranks, limit=100_000)
            finally:
                cur.close()
            assert sorted(outlined(hit)) == sorted(outlined(raw[CODES[0]])), (ranks, a, b)
            n += hit.height
    assert n > 0


def test_a_copy_finding_outlines_copies_not_memsets(tmp_path: Path) -> None:
    """CONTENTION_MEMCPY_EXPOSED is about H2D/D2H copies: its evidence is the copy [100, 400),
    not the memset [500, 900) beside it (longer, so outlining 'the longest' memory event
    would have shown it first)."""
    t = KinetoTrace(rank=0, world_size=1)
    t.step(1, 0, 1000)
    t.memcpy(100, 300, nbytes=1 << 20, direction="HtoD (Pinned -> Device)", stream=11)
    t.memset(500, 400, stream=7)
    t.write(tmp_path / "raw" / "rank0.json")
    load_traces([str(tmp_path / "raw")], tmp_path / "run.duckdb", workers=1)
    data = RunData(tmp_path / "run.duckdb")
    try:
        off = offsets(data)[0]
        cur = data.cursor()
        try:
            ext = data.extent()
            win = tl.window(cur, ext, ext.t0_ns, ext.t1_ns, None)
            got = evidence(cur, win, "CONTENTION_MEMCPY_EXPOSED", None, ext)
        finally:
            cur.close()
    finally:
        data.close()
    assert win.mode == "events"
    assert outlined(got) == [(0, ns(100) + off, ns(400) + off)]


def test_the_slow_collective_link_lands_on_its_worst_instance(
    sample_db: Callable[[str], Path],
) -> None:
    """On the demo run the worst slow collective is not in the finding's first step (the old
    link showed step 2 only): the link opens a window around it that outlines it on its ranks
    (the instance is read from the collectives table, not from the finding)."""
    data = RunData(sample_db("megatron_tp2_pp2_dp2"))
    try:
        f = next(f for f in data.report().findings if f.code == "COLLECTIVE_SLOW")
        res = data.result("collectives")
        assert res is not None
        worst = (
            res.tables["by_instance"]
            .filter(pl.col("slow") & pl.col("skew_free"))
            .with_columns(x=pl.col("time_ns") - pl.col("time_ns") / pl.col("time_vs_median"))
            .sort("x", descending=True)
            .row(0, named=True)
        )
        assert f"seq {worst['seq']}," in f.message
        q = parse_qs(urlparse(findings.timeline_link(data, f)).query)
        ext = data.extent()
        start, end = (ext.t0_ns + round(float(q[k][0]) * MS) for k in ("start", "end"))
        ranks = [int(r) for r in q["rank"][0].split(",")]
        cur = data.cursor()
        try:
            want = cur.execute(
                """SELECT c.rank, c.ts_ns + coalesce(r.clock_offset_ns, 0),
                          c.end_ns + coalesce(r.clock_offset_ns, 0)
                   FROM collectives c JOIN ranks r USING (rank) WHERE instance_id = ?""",
                [worst["instance_id"]],
            ).fetchall()
            win = tl.window(cur, ext, start, end, ranks)
            got = outlined(evidence(cur, win, f.code, ranks, ext))
        finally:
            cur.close()
    finally:
        data.close()
    assert len(want) == 2 and start < min(w[1] for w in want) < max(w[2] for w in want) < end
    assert {tuple(w) for w in want} <= set(got), (want, got[:5])
