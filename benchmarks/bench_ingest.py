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
import gzip
import json
import math
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
WORK = HERE / "_work"
DEFAULT_SOURCE = Path(
    "/work/shared/traces/public/hta-testdata/nccl_parser_config/nccl_data.json.gz"
)
MB = 1024 * 1024
ID_KEYS = ("correlation", "External id")
TARGET_MBPS = 150.0
TARGET_RSS_X = 1.5
TARGET_SPEEDUP = 10.0

RANKLENS_CHILD = """
import json, os, sys, time
from ranklens.ingest.lifecycle import skip_pandas_probe
skip_pandas_probe()  # as the `ranklens` console script does (cli/entry.py)
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


# ---------------------------------------------------------------- building the big trace


def _shift_event(ev: dict[str, Any], dt_us: int, id_shift: int, step_shift: int) -> dict[str, Any]:
    """One copy of an event: time moved by dt_us, ids and ProfilerStep number made unique."""
    out = dict(ev)
    if isinstance(out.get("ts"), (int, float)):
        out["ts"] = out["ts"] + dt_us
    if "id" in out and isinstance(out["id"], int):
        out["id"] = out["id"] + id_shift
    name = out.get("name")
    if isinstance(name, str) and name.startswith("ProfilerStep#"):
        out["name"] = f"ProfilerStep#{int(name.split('#', 1)[1]) + step_shift}"
    args = out.get("args")
    if isinstance(args, dict):
        args = dict(args)
        for key in ID_KEYS:
            if isinstance(args.get(key), int) and args[key] >= 0:
                args[key] = args[key] + id_shift
        out["args"] = args
    return out


def _copies(events: list[dict[str, Any]]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(copy number, event): metadata once, then endless copies of the timed events laid end to
    end in time (the caller stops at a copy boundary)."""
    timed = [e for e in events if e.get("ph") != "M"]
    starts = [e["ts"] for e in timed if isinstance(e.get("ts"), (int, float))]
    ends = [e["ts"] + e.get("dur", 0) for e in timed if isinstance(e.get("ts"), (int, float))]
    span_us = math.ceil(max(ends) - min(starts)) + 1000
    max_id = 0
    for e in timed:
        if isinstance(e.get("id"), int):
            max_id = max(max_id, e["id"])
        for key in ID_KEYS:
            v = (e.get("args") or {}).get(key)
            if isinstance(v, int):
                max_id = max(max_id, v)
    steps = [
        int(e["name"].split("#", 1)[1])
        for e in timed
        if str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    step_stride = (max(steps) - min(steps) + 1) if steps else 0
    yield from ((0, e) for e in events if e.get("ph") == "M")
    k = 0
    while True:
        for e in timed:
            yield k, _shift_event(e, k * span_us, k * (max_id + 1), k * step_stride)
        k += 1


def build_trace(source: Path, size_mb: int, rank: int | None = None) -> tuple[Path, int]:
    """Write (or reuse) a >= size_mb uncompressed Kineto JSON made from source; return path, events.

    Kineto's layout is kept (header keys in order, one event per line) because HTA finds the rank
    by grepping lines for `"rank": N`. `rank` rewrites distributedInfo.rank (multi-rank runs).
    """
    WORK.mkdir(parents=True, exist_ok=True)
    tag = "" if rank is None else f"_rank{rank}"
    dest = WORK / f"big_{source.name.split('.')[0]}_{size_mb}mb{tag}.json"
    sidecar = dest.with_suffix(".meta.json")
    if dest.exists() and sidecar.exists():
        meta = json.loads(sidecar.read_text())
        if meta.get("size") == dest.stat().st_size:
            return dest, int(meta["events"])
    opener = gzip.open if source.suffix == ".gz" else open
    with opener(source, "rb") as f:
        raw = f.read()
    doc = json.loads(raw)
    if rank is not None:
        doc["distributedInfo"] = {**(doc.get("distributedInfo") or {}), "rank": rank}
    events: list[dict[str, Any]] = doc["traceEvents"]
    n_events = n_copies = 0
    tmp = dest.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        out.write("{\n")
        keys = list(doc)
        for i, key in enumerate(keys):
            sep = ",\n" if i < len(keys) - 1 else "\n"
            if key != "traceEvents":
                out.write(f"  {json.dumps(key)}: {json.dumps(doc[key])}{sep}")
                continue
            out.write('  "traceEvents": [\n')
            first = True
            for k, ev in _copies(events):
                if k == n_copies:  # a copy just finished: stop once big enough
                    if out.tell() >= size_mb * MB:
                        break
                    n_copies += 1
                out.write(("  " if first else ",\n  ") + json.dumps(ev))
                first = False
                n_events += 1
            out.write(f"\n  ]{sep}")
        out.write("}\n")
    tmp.replace(dest)
    sidecar.write_text(
        json.dumps(
            {
                "size": dest.stat().st_size,
                "events": n_events,
                "copies": n_copies,
                "source": str(source),
            }
        )
    )
    return dest, n_events


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
