"""Critical path and what-if at scale: graph build, critical path and five replays.

Generates (once, cached in benchmarks/_work/) a GPU-shaped job with the job generator
(`ranklens.sample_traces.gpu_job`, one injected straggler), ingests it, then times in one
process what `ranklens whatif` does: build the cross-rank dependency graph, replay it unchanged
(critical path) and replay five scenarios (straggler, stage-balance, contention, overlap:dp,
scale-comm:tp=2). Prints the figures (time, events/s, peak RSS) and checks them against the
generator: the unchanged replay's error and the straggler fix against the same job generated
without the straggler. HolisticTraceAnalysis' critical path covers one rank and has no replay,
so there is no side-by-side figure.

    python benchmarks/bench_whatif.py                      # 1,024 ranks (tp8 dp32 pp4, m=16)
    python benchmarks/bench_whatif.py --tp 2 --dp 8 --pp 4 --m 16 --kernels 400   # 64 x ~10 M
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import job_shape
import numpy as np
from job_shape import WORK
from ranklens.analysis import critical_path as cp
from ranklens.analysis import graph_replay as gr
from ranklens.analysis import whatif as wi
from ranklens.sample_traces.gpu_job import run_job, write_job

SCENARIOS = ("straggler", "stage-balance", "contention", "overlap:dp", "scale-comm:tp=2")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    job_shape.add_flags(ap, m=16, steps=4)
    ap.add_argument("--kernels", type=int, default=6, help="kernels per micro-batch block")
    ap.add_argument("--rebuild", action="store_true")
    a = ap.parse_args()
    slow = a.tp * a.dp + 1
    job = job_shape.job(a, kernels_per_block=a.kernels, rank_factor={slow: 1.3})
    tag = f"whatif_{job_shape.tag(a)}_k{a.kernels}"
    src, db = WORK / tag, WORK / f"{tag}.duckdb"
    if a.rebuild or not db.exists():
        shutil.rmtree(src, ignore_errors=True)
        db.unlink(missing_ok=True)
        write_job(job, src)
        exe = str(Path(sys.executable).with_name("ranklens"))
        subprocess.run([exe, "ingest", str(src), "-o", str(db)], check=True)
        shutil.rmtree(src)  # the database is what the benchmark reads
    truth_ns = (
        max(e - s for _, s, e in run_job(job_shape.job(a, kernels_per_block=a.kernels)).windows)
        * 1000
    )
    con = duckdb.connect(str(db), read_only=True)
    events = con.execute("SELECT count(*) FROM events").fetchall()[0][0]
    t0 = time.perf_counter()
    m = cp.model(con)
    t_model = time.perf_counter() - t0
    t1 = time.perf_counter()
    outs = wi.run_scenarios(m.graph, [wi.parse(s) for s in SCENARIOS], m.ctx)
    t_replays = time.perf_counter() - t1
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    measured = gr.measured_step_times(m.graph)
    replayed = gr.step_times(m.graph, m.base)
    g = m.graph
    print(f"job: {job.world} ranks (tp{a.tp} dp{a.dp} pp{a.pp}), m={a.m}, {a.steps} steps, "
          f"{events:,} events; {os.cpu_count()} cores")  # fmt: skip
    print(f"graph: {len(g.n_start):,} nodes, {len(g.v_kind):,} vertices, {len(g.e_src):,} "
          f"edges ({events / max(len(g.n_start), 1):.1f} events per node)")  # fmt: skip
    print(f"build + critical path: {t_model:.1f} s ({events / t_model / 1e6:.2f} M events/s); "
          f"five replays: {t_replays:.1f} s; total {t_model + t_replays:.1f} s; "
          f"peak RSS {peak:.2f} GB")  # fmt: skip
    print(f"replay error max: {np.max(np.abs(replayed / measured - 1)):.5f}")
    for o in outs:
        pred = float(np.mean(o.predicted)) if o.predicted is not None else float("nan")
        extra = ""
        if o.scenario.name == "straggler":
            extra = (
                f"; job without the straggler: {truth_ns / 1e6:.3f} ms ({pred / truth_ns - 1:+.2%})"
            )
        print(f"  {o.scenario.name:16s} predicted {pred / 1e6:9.3f} ms/step "
              f"(replayed {np.mean(replayed) / 1e6:.3f}){extra} {o.note}")  # fmt: skip


if __name__ == "__main__":
    main()
