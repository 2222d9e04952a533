"""Alignment and matching benchmark: error distribution of injected clock offsets, and speed.

1. Accuracy. Real multi-rank runs are ingested; their ranks are dealt to "hosts" at random,
   every host's clock is shifted by a known offset (1 µs to 50 ms, random sign), and the
   estimate is compared with the injection (tests/align_injection.py). Printed per run and
   ranks-per-host: median, p90, p99 and max absolute error. NCCL GPU runs (param-dlrm-kineto)
   must reach median <= 5 µs and p99 <= 20 µs; CPU gloo runs (sample_traces) are reported.
2. Speed. 1,024 ranks (128 hosts x 8) x 2,000 collectives each, built by replicating the 8
   real dlrm ranks: host h's rank 8h+r replays dlrm rank r's NCCL kernels 250 times with host
   h's clock offset; the 5 grouped send/recv go to a host-local group of 8 and the 3
   all-reduces to a cross-host group of the 128 ranks with the same local index. Timed:
   `match_collectives` + `align_clocks` (target < 30 s on the 2-core dev machine), and the
   offsets recovered there.

Usage: python benchmarks/bench_align.py [--trials 20] [--skip-speed] [--skip-accuracy]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from align_injection import errors_of, load_tables, random_trials  # noqa: E402
from ranklens.ingest import load_traces  # noqa: E402
from ranklens.ingest.clock import align_clocks  # noqa: E402
from ranklens.ingest.config import RunOptions  # noqa: E402
from ranklens.ingest.matching import match_collectives  # noqa: E402
from ranklens.ingest.schema import ddl  # noqa: E402

PUBLIC = Path("/work/shared/traces/public")
SAMPLES = HERE.parent / "sample_traces"
RUNS = {
    "param-dlrm (NCCL, 8x V100)": PUBLIC / "param-dlrm-kineto" / "extracted",
    "megatron_tp2_pp2_dp2 (gloo CPU)": SAMPLES / "megatron_tp2_pp2_dp2" / "raw",
    "unnamed_tp2_pp2_dp2 (gloo CPU)": SAMPLES / "unnamed_tp2_pp2_dp2" / "raw",
    "straggler_rank3 (gloo CPU)": SAMPLES / "straggler_rank3" / "raw",
}


def accuracy(trials: int) -> None:
    print("injected clock offsets: |recovered - injected| per non-reference host (µs)")
    print(f"{'run':34} {'ranks/host':>10} {'n':>5} {'median':>9} {'p90':>9} {'p99':>9} {'max':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in RUNS.items():
            if not path.exists():
                print(f"{name:34} (missing: {path})")
                continue
            db = Path(tmp) / f"{abs(hash(name))}.duckdb"
            load_traces([path], db, workers=1)
            con = load_tables(db)
            n = con.execute("SELECT count(*) FROM ranks").fetchall()[0][0]
            for rph in (1, 2, 4):
                if n // rph < 2:
                    continue
                e = np.array(errors_of(random_trials(con, rph, trials, seed=rph))) / 1e3
                q = np.percentile(e, [50, 90, 99])
                print(
                    f"{name:34} {rph:>10} {e.size:>5} {q[0]:>9.2f} {q[1]:>9.2f} {q[2]:>9.2f} "
                    f"{e.max():>9.2f}"
                )


def synthetic(
    n_hosts: int = 128, per_host: int = 8, reps: int = 250
) -> tuple[pa.Table, dict[str, Any]]:
    """Comm events of n_hosts x per_host ranks replaying the 8 real dlrm ranks."""
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "dlrm.duckdb"
        load_traces([PUBLIC / "param-dlrm-kineto" / "extracted"], db, workers=1)
        src = duckdb.connect(str(db), read_only=True)
        base = src.execute(
            """SELECT rank, coll_op, name, ts_ns, dur_ns FROM events WHERE kind = 'comm'
               ORDER BY rank, ts_ns"""
        ).fetchall()
        src.close()
    t0 = min(r[3] for r in base)
    span = max(r[3] + r[4] for r in base) - t0 + 1_000_000
    rng = np.random.default_rng(0)
    offsets = {h: int(rng.integers(-50_000_000, 50_000_000)) for h in range(n_hosts)}
    offsets[0] = 0
    cols: dict[str, list[Any]] = {k: [] for k in ("rank", "op", "name", "ts", "dur", "pg")}
    per_rank = [[r for r in base if r[0] == k] for k in range(per_host)]
    rep_shift = np.arange(reps, dtype=np.int64) * span
    for h in range(n_hosts):
        for r in range(per_host):
            ev = per_rank[r % len(per_rank)]
            ts = np.array([e[3] - t0 for e in ev], dtype=np.int64)
            n = len(ev)
            all_ts = (ts[None, :] + rep_shift[:, None]).ravel() + t0 + offsets[h]
            rank = h * per_host + r
            cols["rank"] += [rank] * (n * reps)
            cols["op"] += [e[1] for e in ev] * reps
            cols["name"] += [e[2] for e in ev] * reps
            cols["ts"].append(all_ts)
            cols["dur"] += [e[4] for e in ev] * reps
            cols["pg"] += [(f"dp:{r}" if e[1] == "all_reduce" else f"tp:{h}") for e in ev] * reps
    table = pa.table(
        {
            "rank": pa.array(cols["rank"], pa.int32()),
            "kind": pa.array(["comm"] * len(cols["rank"])),
            "coll_op": pa.array(cols["op"]),
            "name": pa.array(cols["name"]),
            "device": pa.array(np.zeros(len(cols["rank"]), dtype=np.int32)),
            "stream": pa.array(np.full(len(cols["rank"]), 7, dtype=np.int64)),
            "ts_ns": pa.array(np.concatenate(cols["ts"])),
            "dur_ns": pa.array(cols["dur"], pa.int64()),
            "pg_name": pa.array(cols["pg"]),
            "step": pa.array(np.zeros(len(cols["rank"]), dtype=np.int32)),
        }
    )
    return table, {"offsets": offsets, "n_hosts": n_hosts, "per_host": per_host}


def speed() -> None:
    table, info = synthetic()
    n_hosts, per_host = info["n_hosts"], info["per_host"]
    n_ranks = n_hosts * per_host
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    con.execute(ddl())
    con.register("_ev", table)
    cols = ", ".join(f'"{c}"' for c in table.column_names)
    con.execute(f"INSERT INTO events_rich ({cols}) SELECT {cols} FROM _ev")
    con.unregister("_ev")
    con.executemany(
        "INSERT INTO ranks (rank, world_size, host, has_gpu, clock_offset_ns, clock_method) "
        "VALUES (?, ?, ?, true, 0, 'none')",
        [[r, n_ranks, f"host{r // per_host}"] for r in range(n_ranks)],
    )
    groups = [[f"tp:{h}", list(range(h * per_host, (h + 1) * per_host))] for h in range(n_hosts)]
    groups += [[f"dp:{r}", list(range(r, n_ranks, per_host))] for r in range(per_host)]
    con.executemany(
        "INSERT INTO process_groups (pg_name, ranks, size, backend) VALUES (?, ?, ?, 'nccl')",
        [[g, rs, len(rs)] for g, rs in groups],
    )
    n_ev = table.num_rows
    print(f"\nspeed: {n_ranks} ranks x {n_ev // n_ranks} collectives = {n_ev:,} comm ops")
    t = time.perf_counter()
    counts = match_collectives(con)
    t_match = time.perf_counter() - t
    t = time.perf_counter()
    align_clocks(con, RunOptions())
    t_align = time.perf_counter() - t
    got = dict(con.execute("SELECT rank, clock_offset_ns FROM ranks").fetchall())
    err = np.array(
        [abs(got[h * per_host] + info["offsets"][h]) for h in range(n_hosts)], dtype=float
    )
    total = t_match + t_align
    verdict = "OK" if total < 30 else "TOO SLOW"
    print(
        f"  matching {t_match:.1f} s, alignment {t_align:.1f} s, total {total:.1f} s "
        f"(target < 30 s): {verdict}"
    )
    print(f"  statuses {counts}")
    print(f"  host offsets (±50 ms) recovered: max error {err.max() / 1e3:.3f} µs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--skip-accuracy", action="store_true")
    a = ap.parse_args()
    if not a.skip_accuracy:
        accuracy(a.trials)
    if not a.skip_speed:
        speed()


if __name__ == "__main__":
    main()
