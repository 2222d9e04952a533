"""Speed of the pipeline and contention analyses on 64 ranks x 200k kernels each.

Builds (once, cached in benchmarks/_work/) a ranklens database of a synthetic GPU job written
straight into the normalized schema: PP = 8 stages x DP = 8, 1F1B with m = 8 micro-batches,
10 steps, stage 3 20% slower. Per rank: ~200k compute kernels back to back inside the F/B
blocks (20 kernel names x 4 launch shapes), device-side forward_mb/backward_mb ranges, NCCL
SendRecv kernels on their own stream (a 10 µs send after each block, a recv spinning over every
wait), a DP all-reduce per step beside the last backward blocks, and a few H2D copies. Then
times `pipeline.run` and `contention.run`, each on a fresh read-only connection: wall time and
the process's CPU seconds (DuckDB threads included), because the 2 shared cores of this
machine are often busy with other work: cpu / 2 is the wall time on 2 idle cores at best.

    python benchmarks/bench_pipeline.py [--ranks 64] [--kernels 200000] [--rebuild]
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
from ranklens.analysis import contention, pipeline
from ranklens.ingest.schema import ddl
from ranklens.sample_traces.gpu_sim import stage_order

WORK = Path(__file__).resolve().parent / "_work"
PP, M, STEPS = 8, 8, 10
BASE = 1_700_000_000_000_000_000


def schedule_1f1b(p: int, m: int, tf: list[float], tb: list[float]) -> dict[int, list[tuple]]:
    """Block times (phase, mb, start, end) per stage of one 1F1B step, zero p2p latency."""
    order = {s: [(ph, i) for ph, _, i in stage_order("1f1b", p, m, 1, s)] for s in range(p)}
    end: dict[tuple[int, str, int], float] = {}
    free = [0.0] * p
    pos = [0] * p
    out: dict[int, list[tuple]] = {s: [] for s in range(p)}
    while any(pos[s] < len(order[s]) for s in range(p)):
        for s in range(p):
            while pos[s] < len(order[s]):
                ph, i = order[s][pos[s]]
                dep = (s - 1, "F", i) if ph == "F" else (s + 1, "B", i)
                if (ph == "F" and s == 0) or (ph == "B" and s == p - 1):
                    dep = (s, "F", i) if ph == "B" else None
                if dep is not None and dep not in end:
                    break
                start = max(free[s], end[dep] + 10_000 if dep else 0.0)
                d = tf[s] if ph == "F" else tb[s]
                end[(s, ph, i)] = free[s] = start + d
                out[s].append((ph, i, start, start + d))
                pos[s] += 1
    return out


def build(path: Path, ranks: int, kernels: int) -> None:
    dp = ranks // PP
    per_block = kernels // (STEPS * 2 * M)
    tf = [2_000_000.0 * (1.2 if s == 3 else 1.0) for s in range(PP)]
    blocks = schedule_1f1b(PP, M, tf, [2 * x for x in tf])
    span = max(b[3] for bs in blocks.values() for b in bs)
    period = int(span + 3_000_000)  # DP all-reduce + optimizer after the flush
    con = duckdb.connect(str(path))
    con.execute(ddl())
    names = np.array([f"sm90_gemm_kernel_{i}" for i in range(20)], dtype=object)
    shapes = np.array([f"grid=[{g}, 1, 1] block=[256, 1, 1]" for g in (64, 128, 132, 264)])
    for rank in range(ranks):
        stage = rank // dp
        cols: dict[str, list[np.ndarray]] = {
            k: [] for k in ("kind", "name", "stream", "ts", "dur", "step", "coll", "pg", "launch")
        }

        def add(
            kind: str,
            name: object,
            stream: int,
            ts: np.ndarray,
            dur: np.ndarray,
            step: np.ndarray,
            coll: object = None,
            pg: object = None,
            launch: object = None,
            cols: dict[str, list[np.ndarray]] = cols,
        ) -> None:
            n = len(ts)
            cols["kind"].append(np.full(n, kind, dtype=object))
            cols["name"].append(name if isinstance(name, np.ndarray) else np.full(n, name, object))
            cols["stream"].append(np.full(n, stream))
            cols["ts"].append(ts.astype(np.int64))
            cols["dur"].append(dur.astype(np.int64))
            cols["step"].append(step.astype(np.int32))
            cols["coll"].append(np.full(n, coll, dtype=object))
            cols["pg"].append(np.full(n, pg, dtype=object))
            cols["launch"].append(
                launch if isinstance(launch, np.ndarray) else np.full(n, launch, dtype=object)
            )

        bl = blocks[stage]
        starts = np.array([b[2] for b in bl])
        ends = np.array([b[3] for b in bl])
        steps = np.arange(STEPS)
        off = (BASE + steps * period)[:, None]
        bs, be = (off + starts).ravel(), (off + ends).ravel()
        bstep = np.repeat(steps, len(bl))
        width = (be - bs) / per_block
        j = np.tile(np.arange(per_block), len(bs))
        ks = np.repeat(bs, per_block) + j * np.repeat(width, per_block)
        kd = np.repeat(width, per_block) - 1000
        idx = np.arange(len(ks))
        add(
            "compute",
            names[idx % 20],
            7,
            ks,
            kd,
            np.repeat(bstep, per_block),
            launch=shapes[(idx // 20) % 4],
        )
        labels = np.array(
            [f"{'forward' if b[0] == 'F' else 'backward'}_mb{b[1]}" for b in bl] * STEPS,
            dtype=object,
        )
        add("annotation", labels, 7, bs, be - bs, bstep)
        # p2p: a 10 µs send after every block, a recv spinning over each wait before a block
        pg = f"pp{rank % dp}"
        add("comm", "ncclDevKernel_SendRecv", 20, be, np.full(len(be), 10_000), bstep, "send", pg)
        prev_end = np.concatenate([[BASE], be[:-1] + 10_000])
        gap = bs - prev_end
        w = gap > 20_000
        add(
            "comm",
            "ncclDevKernel_SendRecv",
            20,
            prev_end[w] + 10_000,
            gap[w] - 10_000,
            bstep[w],
            "recv",
            pg,
        )
        # DP all-reduce beside the last two backward blocks, then the optimizer
        last = be.reshape(STEPS, -1)[:, -1]
        add(
            "comm",
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
            21,
            last - 2 * tf[stage] * 2,
            np.full(STEPS, 2 * tf[stage] * 2 + 500_000),
            steps,
            "all_reduce",
            f"dp{stage}",
        )
        add(
            "compute",
            "multi_tensor_apply_kernel",
            7,
            last + 600_000,
            np.full(STEPS, 1_000_000),
            steps,
            launch="grid=[320, 1, 1] block=[512, 1, 1]",
        )
        add(
            "memcpy",
            "Memcpy HtoD (Pinned -> Device)",
            22,
            off.ravel() + starts[0],
            np.full(STEPS, 300_000),
            steps,
        )
        t = {k: np.concatenate(v) for k, v in cols.items()}
        n = len(t["ts"])
        table = pa.table(
            {
                "rank": pa.array(np.full(n, rank, np.int32)),
                "kind": pa.array(t["kind"]),
                "name": pa.array(t["name"]),
                "device": pa.array(np.zeros(n, np.int32)),
                "stream": pa.array(t["stream"]),
                "ts_ns": pa.array(t["ts"]),
                "dur_ns": pa.array(t["dur"]),
                "step": pa.array(t["step"]),
                "coll_op": pa.array(t["coll"], pa.string()),
                "pg_name": pa.array(t["pg"], pa.string()),
                "launch": pa.array(t["launch"], pa.string()),
            }
        )
        con.register("_chunk", table)
        con.execute(
            "INSERT INTO events_rich (rank, trace_id, kind, cat, name, device, stream, ts_ns, "
            "dur_ns, step, coll_op, pg_name, launch) SELECT rank, rank, kind, "
            "CASE kind WHEN 'annotation' THEN 'gpu_user_annotation' ELSE 'kernel' END, name, "
            "device, stream, ts_ns, dur_ns, step, coll_op, pg_name, launch FROM _chunk "
            "ORDER BY ts_ns"
        )
        con.unregister("_chunk")
        con.execute(
            "INSERT INTO steps SELECT rank, step, min(ts_ns), max(ts_ns + dur_ns), min(ts_ns), "
            "max(ts_ns + dur_ns), 'profiler_step' FROM events WHERE rank = ? GROUP BY ALL",
            [rank],
        )
        con.execute(
            "INSERT INTO ranks (rank, world_size, trace_id, has_gpu, clock_offset_ns) "
            "VALUES (?, ?, ?, true, 0)",
            [rank, ranks, rank],
        )
    for g in range(dp):
        con.execute(
            "INSERT INTO process_groups (pg_name, ranks, size, parallelism) VALUES (?, ?, ?, 'PP')",
            [f"pp{g}", [g + dp * s for s in range(PP)], PP],
        )
    for s in range(PP):
        con.execute(
            "INSERT INTO process_groups (pg_name, ranks, size, parallelism) VALUES (?, ?, ?, 'DP')",
            [f"dp{s}", [s * dp + i for i in range(dp)], dp],
        )
    con.execute("CHECKPOINT")
    con.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--kernels", type=int, default=200_000)
    ap.add_argument("--rebuild", action="store_true")
    a = ap.parse_args()
    WORK.mkdir(exist_ok=True)
    db = WORK / f"bench_pipeline_{a.ranks}x{a.kernels}.duckdb"
    if a.rebuild or not db.exists():
        db.unlink(missing_ok=True)
        t0 = time.perf_counter()
        build(db, a.ranks, a.kernels)
        print(f"built {db.name} in {time.perf_counter() - t0:.1f} s")
    con = duckdb.connect(str(db), read_only=True)
    n = con.execute("SELECT count(*) FILTER (WHERE kind = 'compute'), count(*) FROM events")
    kernels, events = n.fetchall()[0]
    con.close()
    print(f"{a.ranks} ranks, {kernels:,} compute kernels, {events:,} events")
    with open("/proc/loadavg") as fh:
        print(f"load average before: {fh.read().split()[0]} on {os.cpu_count()} CPUs")
    for mod in (pipeline, contention):
        con = duckdb.connect(str(db), read_only=True)
        t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        res = mod.run(con)
        wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
        con.close()
        print(
            f"{mod.NAME:<11} wall {wall:6.2f} s  cpu {cpu:6.2f} s  rows {res.table.height:>6}"
            f"  findings {[f.code for f in res.findings]}"
        )


if __name__ == "__main__":
    main()
