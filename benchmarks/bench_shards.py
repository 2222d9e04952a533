"""Sharded ingest (issue 15): one DuckDB file vs per-rank Parquet shards, 1 and 2 local workers,
and local Ray with 1 and 2 CPUs, on the same many-rank GPU-shaped job; then the report of each
run.

Generates (once, cached in benchmarks/_work/) a job with the GPU job generator (default tp8 x
dp32 x pp4 = 1,024 ranks), then times what a user runs, each in its own process: `ranklens
ingest SRC -o OUT [--storage shards] [--workers N] [--engine ray]` (the stored analysis results
included: `ingest` computes them before its rename) and `ranklens report OUT`. Prints wall time,
throughput, peak RSS (the largest process of the tree), how 2 workers scale over 1 (the whole
ingest, and its traces stage, which ingest times itself: the stored results are DuckDB queries
that use every core whatever --workers says), and checks
that every run holds the same events, collectives and report.

HolisticTraceAnalysis loads one rank per call into pandas and has no storage of its own to
compare with; bench_ingest.py compares single files with it.

`--ray-cluster` also ingests into shards on a Ray cluster started beforehand (`ray start
--head` on this machine with 1, then 2 CPUs), as a user's `--ray-address` reaches a running
cluster: the local Ray run above starts its instance inside the ingest (~3-4 s of its traces
stage), which a cluster has paid before the job. On each cluster it then times the rank tasks
alone, submitted as `--engine ray` does: once on workers the job boots (what every ingest
pays: ~1 s on 2 cores), once more on the same workers booted (the throughput of a long run).

    python benchmarks/bench_shards.py [--tp 8 --dp 32 --pp 4 --m 8 --steps 2] [--kernels 6]
        [--no-ray] [--ray-cluster] [--results later] [--no-report] [--no-one-file]

A local Ray instance's start (ray.init, then its workers' boot: ~3-4 s here) is paid by every
`--engine ray` ingest, so Ray's scaling shows on a job whose rank tasks outweigh it: e.g.
`--tp 2 --dp 4 --pp 4 --m 16 --steps 4 --kernels 2050 --results later --no-report --no-one-file`
(32 ranks, 4.8 GB of JSON; generated once, ~5 min). `--results later` leaves out the stored
analyses (the same work whatever the executor, and minutes on 25 M events); `--no-report`
skips the report, and each run's output is removed once its tables are fingerprinted.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import job_shape
from job_shape import WORK
from machine import machine_line
from ranklens.ingest.database import connect

EXE = [str(Path(sys.executable).with_name("ranklens"))]


def _timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float, bytes]:
    """Wall seconds, peak RSS (GB) of the largest process so far, and stdout."""
    t0 = time.perf_counter()
    res = subprocess.run(cmd, check=True, capture_output=True, env=env)
    wall = time.perf_counter() - t0
    return wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e6, res.stdout


def _fingerprint(run: Path) -> tuple[int, int, str]:
    """(events, collectives, digest of the events' columns that analyses read)."""
    con = connect(run)
    try:
        n_ev, n_coll = con.execute(
            "SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM collectives)"
        ).fetchone() or (0, 0)
        digest = con.execute(
            # kind as text: the ENUM in one file, VARCHAR on shards (shards._view_sql)
            "SELECT sum(hash(rank, kind::VARCHAR, ts_ns, dur_ns, step, pg_name, peer)) FROM events"
        ).fetchone()
    finally:
        con.close()
    return int(n_ev), int(n_coll), hashlib.sha1(str(digest).encode()).hexdigest()[:12]


_RAY = str(Path(sys.executable).with_name("ray"))
# The benchmark's own cluster, on this machine alone, without Ray's token authentication: a
# token left in ~/.ray by an earlier local instance is not always the one `ray start` takes.
_RAY_ENV = {**os.environ, "RAY_AUTH_MODE": "disabled"}


def _ray_head(cpus: int) -> str:
    """Start a Ray head on this machine with `cpus` CPUs; its address for --ray-address."""
    temp = Path("/tmp") / f"rbench{os.getpid()}"  # Ray's socket paths must stay short
    res = subprocess.run(
        [_RAY, "start", "--head", f"--num-cpus={cpus}", "--include-dashboard=false",
         "--disable-usage-stats", f"--temp-dir={temp}"],
        check=True, capture_output=True, text=True, env=_RAY_ENV,
    )  # fmt: skip
    found = re.search(r"--address='([^']+)'", res.stdout)
    if found is None:
        raise SystemExit(f"ray start printed no address: {res.stdout[-2000:]}")
    return found.group(1)


def _tasks_alone(address: str, files: list[Path], out: Path) -> tuple[float, float]:
    """The rank tasks alone on the cluster at `address`, as `--engine ray` submits them: (wall
    of all of them on workers this job boots, then again on the same workers, booted). The
    first is what each ingest pays; the second is the throughput a long run sees."""
    import ray
    from ranklens.ingest.rank_task import read_file

    before = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = _RAY_ENV["RAY_AUTH_MODE"]  # as the cluster was started
    ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(read_file)
        walls = []
        for attempt in range(2):
            run = out / f"alone{attempt}"
            shutil.rmtree(run, ignore_errors=True)
            run.mkdir(parents=True)
            t0 = time.perf_counter()
            ray.get([remote.remote("kineto", str(f), i, str(run)) for i, f in enumerate(files)])
            walls.append(time.perf_counter() - t0)
            shutil.rmtree(run, ignore_errors=True)
        return walls[0], walls[1]
    finally:
        ray.shutdown()
        if before is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    job_shape.add_flags(ap, m=8, steps=2)
    ap.add_argument("--kernels", type=int, default=6, help="kernels per block (rank size)")
    ap.add_argument("--no-ray", action="store_true", help="skip the local Ray runs")
    ap.add_argument(
        "--ray-cluster", action="store_true", help="also on a running Ray with 1 and 2 CPUs"
    )
    ap.add_argument(
        "--results",
        choices=("now", "later"),
        default="now",
        help="ingest's --results: later times the traces and views alone (a large job's "
        "analyses would take minutes per run, the same whatever the executor)",
    )
    ap.add_argument("--no-report", action="store_true", help="skip `ranklens report` per run")
    ap.add_argument("--no-one-file", action="store_true", help="shards and Ray runs only")
    a = ap.parse_args()
    print(machine_line(), flush=True)  # what today's figures are measured on
    job = job_shape.job(a, kernels_per_block=a.kernels, rank_factor={a.tp + 1: 1.3})
    tag = f"gpujob_{job_shape.tag(a)}"
    tag += f"_k{a.kernels}" if a.kernels != 6 else ""
    src = WORK / tag
    job_shape.traces(job, src)
    size = sum(p.stat().st_size for p in src.glob("rank*.json"))
    out = WORK / f"shards_{tag}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    runs = [
        ("shards, 1 worker", out / "s1", ["--storage", "shards", "--workers", "1"]),
        ("shards, 2 workers", out / "s2", ["--storage", "shards", "--workers", "2"]),
    ]
    if not a.no_one_file:
        runs[:0] = [
            ("one DuckDB file, 1 worker", out / "one1.duckdb", ["--workers", "1"]),
            ("one DuckDB file, 2 workers", out / "one.duckdb", ["--workers", "2"]),
        ]
    if not a.no_ray:  # the same start (ray.init, the workers' boot) paid on 1 and 2 CPUs
        runs += [
            ("shards, local Ray (1 CPU)", out / "ray1", ["--engine", "ray", "--workers", "1"]),
            ("shards, local Ray (2 CPUs)", out / "ray", ["--engine", "ray", "--workers", "2"]),
        ]
    print(
        f"job: {job.world} ranks (tp{a.tp} dp{a.dp} pp{a.pp}), m={a.m}, {a.steps} steps; "
        f"{size / 1e6:.0f} MB of JSON in {job.world} files; {os.cpu_count()} cores"
    )
    if a.ray_cluster:
        for cpus in (1, 2):
            label = f"shards, Ray cluster ({cpus} CPU{'s' * (cpus > 1)})"
            runs.append(
                (label, out / f"rayc{cpus}", ["--engine", "ray", "--ray-address", str(cpus)])
            )
    walls: dict[str, float] = {}
    stage: dict[str, float] = {}
    alone: dict[int, tuple[float, float]] = {}  # Ray cluster CPUs: the tasks cold, warm
    prints: set[tuple[int, int, str]] = set()
    reports: set[bytes] = set()
    for label, dest, flags in runs:
        cluster = None
        if "--ray-address" in flags:  # a running cluster of that many CPUs, started here
            at = flags.index("--ray-address") + 1
            cluster, flags = _ray_head(int(flags[at])), [*flags]
            flags[at] = cluster
        try:
            env = _RAY_ENV if cluster is not None else None
            cmd = [*EXE, "ingest", str(src), "-o", str(dest), "--results", a.results, *flags]
            t_in, rss_in, said = _timed(cmd, env)
            if cluster is not None:
                files = sorted(src.glob("rank*.json"))
                alone[len(alone) + 1] = _tasks_alone(cluster, files, out)
        finally:
            if cluster is not None:
                subprocess.run([_RAY, "stop", "--force"], check=False, capture_output=True)
        traces = re.search(rb"traces ([0-9.]+) s", said)  # ingest's own stage timing
        stage[label] = float(traces.group(1)) if traces else float("nan")
        reported = "report skipped"
        if not a.no_report:
            t_rep, rss_rep, text = _timed([*EXE, "report", str(dest), "--format", "json"])
            reports.add(text)
            reported = f"report {t_rep:5.1f} s (peak so far {rss_rep:.2f} GB)"
        fp = _fingerprint(dest)
        prints.add(fp)
        walls[label] = t_in
        print(
            f"{label:28s} ingest {t_in:6.1f} s ({size / 1e6 / t_in:5.1f} MB/s, "
            f"{fp[0] / t_in / 1e3:5.0f} k events/s; traces {stage[label]:.1f} s, "
            f"{size / 1e6 / stage[label]:5.1f} MB/s; peak RSS so far {rss_in:.2f} GB)  "
            f"{reported}",
            flush=True,
        )
        if a.no_report and dest.is_dir():  # a large job's shards: one run's on disk at a time
            shutil.rmtree(dest, ignore_errors=True)
        elif a.no_report:
            dest.unlink()
    if a.ray_cluster:
        r1, r2 = stage["shards, Ray cluster (1 CPU)"], stage["shards, Ray cluster (2 CPUs)"]
        print(f"Ray cluster, 2 CPUs over 1: {r1 / r2:.2f}x its traces stage")
        (c1, w1), (c2, w2) = alone[1], alone[2]
        print(
            f"Ray cluster, the rank tasks alone: 1 CPU {c1:.1f} s on workers the job boots, "
            f"{w1:.1f} s booted; 2 CPUs {c2:.1f} / {w2:.1f} s: {c1 / c2:.2f}x booting, "
            f"{w1 / w2:.2f}x booted"
        )
    s1, s2 = walls["shards, 1 worker"], walls["shards, 2 workers"]
    print(f"2 workers over 1 (shards): {s1 / s2:.2f}x the whole ingest, ", end="")
    one, two = stage["shards, 1 worker"], stage["shards, 2 workers"]
    print(f"{one / two:.2f}x its traces stage (decode, write, cross-rank; before stored results)")
    if not a.no_ray:
        r, t = walls["shards, local Ray (2 CPUs)"], stage["shards, local Ray (2 CPUs)"]
        print(f"local Ray (2 CPUs) over 1 local worker (shards): {s1 / r:.2f}x the whole ", end="")
        print(f"ingest, {one / t:.2f}x its traces stage")
        r1, t1 = walls["shards, local Ray (1 CPU)"], stage["shards, local Ray (1 CPU)"]
        print(f"local Ray, 2 CPUs over 1: {r1 / r:.2f}x the whole ingest, {t1 / t:.2f}x traces")
    if not a.no_one_file:
        f1, f2 = walls["one DuckDB file, 1 worker"], walls["one DuckDB file, 2 workers"]
        g1, g2 = stage["one DuckDB file, 1 worker"], stage["one DuckDB file, 2 workers"]
        print(
            f"2 workers over 1 (one file): {f1 / f2:.2f}x the whole ingest, {g1 / g2:.2f}x traces"
        )
    print(f"events {sorted(prints)[0][0]:,}; runs identical: {len(prints) == 1}, ", end="")
    print("reports not made" if a.no_report else f"reports identical: {len(reports) == 1}")


if __name__ == "__main__":
    main()
