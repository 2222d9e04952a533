"""The whole pipeline / straggler / contention path on a GPU-shaped job of many ranks.

Generates (once, cached in benchmarks/_work/) a Megatron-style job with the GPU job generator
(`ranklens.sample_traces.gpu_job`: tp x dp x pp ranks, 1F1B, NCCL kernels on their own
streams, per-host clock shifts, one injected straggler), then times what a user runs:
`ranklens ingest DIR -o DB` and `ranklens report DB` (the text report), each in its own
process (wall time and peak RSS of that process tree). Checks the results against the
generator's truth: share of send/recv matched, the ranks named as stragglers (only the
injected one), the largest bubble error as a share of the step, the largest clock error.

Default: tp8 x dp32 x pp4 = 1,024 ranks, m = 8, 4 steps (1.7 M events, 395 MB).
HolisticTraceAnalysis has no p2p matching, bubbles or cross-host alignment, so there is no
side-by-side figure here; bench_ingest.py and bench_analysis_hta.py compare with it on what
both do.

    python benchmarks/bench_gpu_job.py [--tp 8 --dp 32 --pp 4 --m 8 --steps 4] [--no-peers]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import job_shape
from job_shape import WORK
from machine import machine_line
from ranklens.analysis import pipeline, stragglers


def _timed(cmd: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (GB) of a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, max(peak, before) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    job_shape.add_flags(ap, m=8, steps=4)
    ap.add_argument("--no-peers", action="store_true", help="traces without Src/Dst Rank")
    ap.add_argument("--rebuild", action="store_true")
    a = ap.parse_args()
    print(machine_line(), flush=True)  # what today's figures are measured on
    job = job_shape.job(a, peers=not a.no_peers, rank_factor={a.tp * a.dp + 1: 1.3})
    tag = f"gpujob_{job_shape.tag(a)}" + ("_np" if a.no_peers else "")
    src, db = WORK / tag, WORK / f"{tag}.duckdb"
    t0 = time.perf_counter()
    if job_shape.traces(job, src, a.rebuild):
        print(f"generated {job.world} ranks in {time.perf_counter() - t0:.1f} s")
    truth = json.loads((src / "truth.json").read_text())
    size = sum(p.stat().st_size for p in src.glob("rank*.json"))
    db.unlink(missing_ok=True)
    exe = [str(Path(sys.executable).with_name("ranklens"))]
    t_in, rss_in = _timed([*exe, "ingest", str(src), "-o", str(db)])
    t_rep, rss_rep = _timed([*exe, "report", str(db)])  # the text report a user reads
    con = duckdb.connect(str(db), read_only=True)
    events = con.execute("SELECT count(*) FROM events").fetchone()[0]  # type: ignore[index]
    p2p = con.execute(
        """SELECT count(*) FILTER (status = 'matched'), count(*) FROM collectives
           WHERE op IN ('send', 'recv')"""
    ).fetchone()
    offs = dict(con.execute("SELECT rank, clock_offset_ns FROM ranks").fetchall())
    clock_err = max(abs(offs[int(r)] - v) for r, v in truth["clock_offset_ns"].items())
    named = sorted(
        {r for f in stragglers.run(con).findings if f.code == "STRAGGLER_RANK" for r in f.ranks}
    )
    want = {(t["rank"], t["step"]): t for t in truth["per_rank_step"]}
    bubble_err = max(
        abs(row["bubble_ns"] - want[(row["rank"], row["step"])]["bubble_ns"])
        / want[(row["rank"], row["step"])]["window_ns"]
        for row in pipeline.run(con).table.iter_rows(named=True)
    )
    con.close()
    print(
        f"job: {job.world} ranks (tp{a.tp} dp{a.dp} pp{a.pp}), m={a.m}, {a.steps} steps, "
        f"peers {'absent' if a.no_peers else 'in the trace'}"
    )
    print(
        f"input: {events:,} events, {size / 1e6:.0f} MB of JSON in {job.world} files; "
        f"{os.cpu_count()} cores"
    )
    print(
        f"ingest: {t_in:.1f} s ({size / 1e6 / t_in:.0f} MB/s, {events / t_in / 1e3:.0f} k "
        f"events/s), peak RSS {rss_in:.2f} GB"
    )
    print(f"report: {t_rep:.1f} s, peak RSS {rss_rep:.2f} GB; ingest + report {t_in + t_rep:.1f} s")
    print(f"p2p matched: {p2p[0]:,} of {p2p[1]:,}; clock error max {clock_err / 1e3:.1f} µs")  # type: ignore[index]
    print(f"bubble error max: {bubble_err:.4f} of the step")
    print(f"stragglers named: {named} (injected: {sorted(job.rank_factor)})")


if __name__ == "__main__":
    main()
