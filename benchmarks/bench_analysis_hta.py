"""Analysis speed against HTA on the same trace files: overlap and temporal breakdown.

Why: bench_analysis.py times ranklens alone on a database; this runs the reference tool on the
same input in the same run. It builds (or reuses, benchmarks/_work) RANKS Kineto files of
SIZE MB each, replicated from a real NCCL trace as bench_ingest.py does, then in fresh processes:

* ranklens: `load_traces` into a new DuckDB file, then `overlap.run` and `breakdown.run` (the
  analyses that answer HTA's two questions) on a read-only connection;
* HTA (traceinsight 0.6.x): `TraceAnalysis(trace_dir=...)`, then `get_comm_comp_overlap` and
  `get_temporal_breakdown`.

It prints wall and CPU seconds per stage and the process tree's peak PSS (bench_ingest's
sampler), and each tool's per-rank overlap beside the other's as a check that both measured
the same thing (compare_hta.py explains the differences of definition). Run it in the venv that
has HTA (benchmarks/README.md):

    benchmarks/_work/venv/bin/python benchmarks/bench_analysis_hta.py [--ranks 8] [--size-mb 12]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_ingest import measure  # noqa: E402
from big_trace import DEFAULT_SOURCE, WORK, build_trace  # noqa: E402

RANKLENS_CHILD = """
import json, sys, time
t = {}
t0 = time.perf_counter(); c0 = time.process_time()
from ranklens.ingest import load_traces
from ranklens.analysis import breakdown, overlap
from ranklens.analysis.sql_console import safe_connect
load_traces(sys.argv[2:], sys.argv[1])
t["load"] = time.perf_counter() - t0
con = safe_connect(sys.argv[1])
t1 = time.perf_counter()
ov = overlap.run(con)
t["overlap"] = time.perf_counter() - t1
t1 = time.perf_counter()
breakdown.run(con)
t["breakdown"] = time.perf_counter() - t1
r = ov.tables["by_rank"] if "by_rank" in ov.tables else ov.table
ratio = {int(x["rank"]): 100 * x["hidden_ns"] / x["comm_ns"]
         for x in r.iter_rows(named=True) if x["comm_ns"]}
print(json.dumps({"stages": t, "overlap_pct": ratio}))
"""

HTA_CHILD = """
import json, logging, sys, time
from hta.configs.config import logger
logger.setLevel(logging.ERROR)
from hta.trace_analysis import TraceAnalysis
t = {}
t0 = time.perf_counter()
ta = TraceAnalysis(trace_dir=sys.argv[1])
t["load"] = time.perf_counter() - t0
t1 = time.perf_counter()
ov = ta.get_comm_comp_overlap(visualize=False)
t["overlap"] = time.perf_counter() - t1
t1 = time.perf_counter()
ta.get_temporal_breakdown(visualize=False)
t["breakdown"] = time.perf_counter() - t1
ratio = {int(r): float(v) for r, v in zip(ov["rank"], ov["comp_comm_overlap_pctg"])}
print(json.dumps({"stages": t, "overlap_pct": ratio}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--size-mb", type=int, default=12, help="per rank file")
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="trace to replicate")
    args = ap.parse_args()
    files = [build_trace(args.source, args.size_mb, rank=r)[0] for r in range(args.ranks)]
    total_mb = sum(f.stat().st_size for f in files) / 2**20
    print(f"{args.ranks} rank files, {total_mb:.0f} MiB in all; load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(dir=WORK, prefix="bench_ah_") as d:
        db = Path(d) / "run.duckdb"
        rl = measure([sys.executable, "-c", RANKLENS_CHILD, str(db), *map(str, files)])
        for f in files:
            os.symlink(f, Path(d) / f.name)
        hta = measure([sys.executable, "-c", HTA_CHILD, d])
    res = {"ranklens": rl.result, "HTA": hta.result}
    print(
        f"{'tool':<9} {'load s':>8} {'overlap s':>10} {'breakdown s':>12} {'total s':>8} "
        f"{'CPU s':>7} {'peak PSS MB':>12}"
    )
    for (name, r), run in zip(res.items(), (rl, hta), strict=True):
        st = r["stages"]
        print(
            f"{name:<9} {st['load']:8.2f} {st['overlap']:10.2f} {st['breakdown']:12.2f} "
            f"{run.wall_s:8.2f} {run.cpu_s:7.1f} {run.peak_pss_mb:12.0f}"
        )
    a, b = res["ranklens"]["stages"], res["HTA"]["stages"]
    both = (a["overlap"] + a["breakdown"], b["overlap"] + b["breakdown"])
    print(
        f"analyses (overlap + breakdown): ranklens {both[0]:.2f} s, HTA {both[1]:.2f} s "
        f"({both[1] / max(both[0], 1e-9):.1f}x); end to end {hta.wall_s / rl.wall_s:.1f}x"
    )
    print("overlap % per rank (ranklens over all steps; HTA drops each rank's last step):")
    for rank in sorted(res["HTA"]["overlap_pct"], key=int):
        mine = res["ranklens"]["overlap_pct"].get(rank)
        print(
            f"  rank {rank}: ranklens {mine if mine is None else round(mine, 2)}, "
            f"HTA {round(res['HTA']['overlap_pct'][rank], 2)}"
        )


if __name__ == "__main__":
    main()
