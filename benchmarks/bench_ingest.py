"""Ingest benchmark: ranklens `load_traces` vs HTA `TraceAnalysis` on one big Kineto trace.

Why: ranklens promises to ingest multi-hundred-MB traces fast and in bounded memory. Real traces
that big are not in the repo, so this builds one (cached under benchmarks/_work) by replicating a
real trace's events with shifted timestamps and renumbered ids, then times each tool in a fresh
subprocess twice: once with nothing else running for the time, once while the parent samples
the memory of the whole process tree (workers included) every 0.1 s, since each sample costs the
measured tool CPU on a 2-core machine.

--ranks N splits the same size over N rank files (the usual case: the main process writes one
rank while the workers decode the next); --pure-python also times the reference decoder alone
(the C scanner turned off).
Targets: >= 150 MB/s, peak memory <= 1.5x file size, >= 10x faster than HTA.
Memory is the peak over time of the tree's summed PSS (proportional set size: pages shared by
several processes, e.g. one mmap'd trace, count once); the summed RSS (which counts a shared page
once per process) and the largest single-process ru_maxrss are printed beside it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from big_trace import DEFAULT_SOURCE, MB, WORK, build_trace
from machine import machine_line

TARGET_MBPS = 150.0
TARGET_RSS_X = 1.5
TARGET_SPEEDUP = 10.0

RANKLENS_CHILD = """
import json, os, sys, time
from ranklens.ingest.lifecycle import settle_allocators, skip_pandas_probe
settle_allocators()  # as the `ranklens` console script does (cli/entry.py)
skip_pandas_probe()
from ranklens.ingest import load_traces
for old in (sys.argv[2], sys.argv[2] + ".wal"):  # each run starts from no database
    if os.path.exists(old):
        os.remove(old)
t0 = time.perf_counter()
rep = load_traces([sys.argv[1]], sys.argv[2], workers=(int(sys.argv[3]) or None))
dt = time.perf_counter() - t0
import duckdb
con = duckdb.connect(sys.argv[2], read_only=True)
n = con.execute("SELECT count(*) FROM events").fetchone()[0]
print(json.dumps({"inner_s": dt, "events": n}))
"""

HTA_CHILD = """
import json, logging, sys, time
from hta.configs.config import logger
logger.setLevel(logging.ERROR)
from hta.trace_analysis import TraceAnalysis
t0 = time.perf_counter()
ta = TraceAnalysis(trace_dir=sys.argv[1])
dt = time.perf_counter() - t0
print(json.dumps({"inner_s": dt, "events": int(sum(len(d) for d in ta.t.traces.values()))}))
"""


@dataclass
class Run:
    """What one measured subprocess did."""

    wall_s: float
    peak_pss_mb: float
    peak_main_pss_mb: float
    peak_rss_sum_mb: float
    ru_maxrss_mb: float
    cpu_s: float
    result: dict[str, Any]
    sampled_wall_s: float | None = None  # the wall time of the run whose memory was sampled


# ---------------------------------------------------------------- measuring


def _tree_memory(proc: psutil.Process, cpu: dict[int, float]) -> tuple[float, float, float]:
    """(summed PSS, summed RSS, proc's own PSS) in MB of proc and all its descendants; also
    records each member's CPU seconds so far in cpu (workers that are never reaped by the
    measured child would be missing from its rusage)."""
    pss = rss = main = 0.0
    try:
        members = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0.0, 0.0, 0.0
    for p in members:
        try:
            full = p.memory_full_info()
            times = p.cpu_times()
        except psutil.Error:  # exited between listing and reading
            continue
        cpu[p.pid] = times.user + times.system
        pss += getattr(full, "pss", full.rss) / MB
        rss += full.rss / MB
        if p.pid == proc.pid:
            main = getattr(full, "pss", full.rss) / MB
    return pss, rss, main


def measure(
    cmd: list[str],
    env: dict[str, str] | None = None,
    interval_s: float = 0.1,
    sample: bool = True,
) -> Run:
    """Run cmd in a fresh process; wall time, peak tree PSS/RSS and the child's ru_maxrss.
    The wall time ends when the child exits (a pidfd wakes the wait), not at the next sample;
    `sample=False` reads no memory (timed_and_sampled: why)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env)
        exited = os.pidfd_open(proc.pid)
        ps = psutil.Process(proc.pid)
        peak_pss = peak_rss = peak_main = 0.0
        cpu: dict[int, float] = {}
        try:
            while not select.select([exited], [], [], interval_s if sample else None)[0]:
                pss, rss, main = _tree_memory(ps, cpu)
                peak_pss, peak_rss = max(peak_pss, pss), max(peak_rss, rss)
                peak_main = max(peak_main, main)
            wall = time.perf_counter() - t0
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            os.close(exited)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        sys.stderr.write(stderr[-4000:])
        raise SystemExit(f"benchmark child failed ({proc.returncode}): {cmd[-1]}")
    last = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    result = json.loads(last[-1]) if last else {"stdout": stdout[-2000:]}
    own = usage.ru_utime + usage.ru_stime  # the child and the descendants it reaped
    cpu_s = max(own, sum(cpu.values()))
    return Run(wall, peak_pss, peak_main, peak_rss, usage.ru_maxrss / 1024, cpu_s, result)


def timed_and_sampled(cmd: list[str], env: dict[str, str] | None = None) -> Run:
    """Two runs of cmd: the memory and CPU from one sampled every 0.1 s, then the wall time
    from one that nothing samples. Why: reading a large process tree's memory (smaps) takes
    ~10 ms a sample, CPU taken from the measured tool on a 2-core machine (0.24 s of a 2.7 s
    ingest). CPU comes from the samples: workers a forkserver started are not in the child's
    rusage. Every tool gets the same two runs in the same order (the first warms the cache)."""
    mem = measure(cmd, env)
    timed = measure(cmd, env, sample=False)
    return dataclasses.replace(mem, wall_s=timed.wall_s, sampled_wall_s=mem.wall_s)


def run_ranklens(trace: Path, workers: int, pure_python: bool = False) -> Run:
    """ranklens load_traces (a file, or a directory of rank files) into a fresh DuckDB file, in
    its own process; `pure_python` turns the C scanner off (the reference decoder alone)."""
    db = WORK / "bench_ingest.duckdb"
    for p in (db, Path(str(db) + ".wal")):
        p.unlink(missing_ok=True)
    env = {**os.environ, "RANKLENS_PURE_PYTHON": "1" if pure_python else "0"}
    cmd = [sys.executable, "-c", RANKLENS_CHILD, str(trace), str(db), str(workers)]
    run = timed_and_sampled(cmd, env)
    db.unlink(missing_ok=True)
    return run


def run_cli(trace: Path) -> Run:
    """`ranklens ingest TRACE -o DB` as a user runs it: load_traces, then every analysis'
    results stored in the run (what report, check and the dashboard reuse)."""
    db = WORK / "bench_ingest_cli.duckdb"
    db.unlink(missing_ok=True)
    cli = Path(sys.executable).with_name("ranklens")
    run = timed_and_sampled([str(cli), "ingest", str(trace), "-o", str(db)])
    db.unlink(missing_ok=True)
    return run


def print_cli(cli: Run, size_mb: float) -> None:
    """The CLI run's figures, with the split `ranklens ingest` prints itself."""
    pat = r"in [\d.]+ s \(traces ([\d.]+) s, stored results ([\d.]+) s\)"
    split = re.search(pat, str(cli.result.get("stdout", "")))
    own = f"; its own split: traces {split[1]} s, stored results {split[2]} s" if split else ""
    print(
        f"ranklens ingest (CLI, with the stored results): {cli.wall_s:.2f} s wall, "
        f"{size_mb / cli.wall_s:.1f} MB/s, peak PSS {cli.peak_pss_mb:.0f} MB "
        f"({cli.peak_pss_mb / size_mb:.2f}x file){own}"
    )


def run_hta(traces: list[Path]) -> Run:
    """HTA TraceAnalysis(trace_dir=...) over a directory holding only links to the traces."""
    with tempfile.TemporaryDirectory(dir=WORK, prefix="hta_dir_") as d:
        for trace in traces:
            os.symlink(trace, Path(d) / trace.name)
        return timed_and_sampled([sys.executable, "-c", HTA_CHILD, d])


def rank_dir(traces: list[Path]) -> Path:
    """A directory of links to the rank files (what a user points ranklens at)."""
    d = WORK / f"ranks_{len(traces)}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    for t in traces:
        os.symlink(t, d / t.name)
    return d


# ---------------------------------------------------------------- report


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def report(size_mb: float, n_events: int, rl: Run, hta: Run | None) -> bool:
    """Print the figures and targets; True if every checked target passed."""
    mbps = size_mb / rl.wall_s
    x_mem = rl.peak_pss_mb / size_mb
    print(
        f"trace: {size_mb:.1f} MB uncompressed, {n_events:,} events in file, "
        f"{rl.result.get('events', '?'):,} rows in ranklens events table"
    )
    print(
        f"{'tool':<10}{'wall s':>9}{'CPU s':>8}{'MB/s':>9}{'sampled s':>11}{'peak PSS MB':>13}"
        f"{'x file':>8}{'main PSS':>10}{'RSS-sum MB':>12}{'maxrss MB':>11}"
    )
    runs = [("ranklens", rl)] + ([("HTA", hta)] if hta else [])
    for name, r in runs:
        print(
            f"{name:<10}{r.wall_s:>9.2f}{r.cpu_s:>8.1f}{size_mb / r.wall_s:>9.1f}"
            f"{r.sampled_wall_s or float('nan'):>11.2f}"
            f"{r.peak_pss_mb:>13.0f}{r.peak_pss_mb / size_mb:>8.2f}{r.peak_main_pss_mb:>10.0f}"
            f"{r.peak_rss_sum_mb:>12.0f}{r.ru_maxrss_mb:>11.0f}"
        )
    print(
        "wall s: a run nothing samples; sampled s: the wall time of the run before it, whose "
        "CPU and memory (the columns after it) were read every 0.1 s"
    )
    ok = mbps >= TARGET_MBPS and x_mem <= TARGET_RSS_X
    print(f"[{_verdict(mbps >= TARGET_MBPS)}] throughput {mbps:.1f} MB/s (target >= {TARGET_MBPS})")
    print(
        f"[{_verdict(x_mem <= TARGET_RSS_X)}] peak memory {x_mem:.2f}x file "
        f"(target <= {TARGET_RSS_X}x)"
    )
    if hta:
        speedup = hta.wall_s / rl.wall_s
        ok = ok and speedup >= TARGET_SPEEDUP
        print(
            f"[{_verdict(speedup >= TARGET_SPEEDUP)}] speedup vs HTA {speedup:.1f}x "
            f"(target >= {TARGET_SPEEDUP}x)"
        )
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=400, help="minimum uncompressed size")
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="trace to replicate")
    ap.add_argument("--skip-hta", action="store_true", help="only run ranklens")
    ap.add_argument("--workers", type=int, default=0, help="ranklens workers (0: its default)")
    ap.add_argument("--ranks", type=int, default=1, help="split the size over this many rank files")
    ap.add_argument(
        "--pure-python", action="store_true", help="also time the reference decoder alone"
    )
    ap.add_argument(
        "--cli", action="store_true", help="also time `ranklens ingest` (with stored results)"
    )
    args = ap.parse_args(argv)
    print(machine_line(), flush=True)  # what today's figures are measured on
    t0 = time.perf_counter()
    if args.ranks == 1:
        built = [build_trace(args.source, args.size_mb)]
    else:
        per = max(1, args.size_mb // args.ranks)
        built = [build_trace(args.source, per, rank=r) for r in range(args.ranks)]
    traces = [t for t, _ in built]
    n_events = sum(n for _, n in built)
    size_mb = sum(t.stat().st_size for t in traces) / MB
    target = traces[0] if len(traces) == 1 else rank_dir(traces)
    print(
        f"built/reused {len(traces)} file(s) in {time.perf_counter() - t0:.1f}s; load average "
        f"now {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (timings share the machine)"
    )
    rl = run_ranklens(target, args.workers)
    if args.pure_python:
        ref = run_ranklens(target, args.workers, pure_python=True)
        print(
            f"reference decoder alone (RANKLENS_PURE_PYTHON=1): {ref.wall_s:.2f} s wall, "
            f"{size_mb / ref.wall_s:.1f} MB/s, peak PSS {ref.peak_pss_mb:.0f} MB"
        )
    hta = None if args.skip_hta else run_hta(traces)
    ok = report(size_mb, n_events, rl, hta)
    if args.cli:
        print_cli(run_cli(target), size_mb)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
