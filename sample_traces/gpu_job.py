"""GPU-shaped multi-rank Kineto traces with exact truth (no GPU, no torch needed).

Why: what users cannot check by hand (p2p peers in pipelines of 3+ stages, micro-batch blocks,
bubbles, stragglers, contention) must be tested against a truth that could fail. A `GpuJob`
describes a Megatron-style job (tp x dp x pp ranks in Megatron's order, 1F1B / GPipe /
interleaved 1F1B with Megatron's issue order: isend/irecv posted together in parity order, odd
stages receive first); `gpu_sim` runs it in lockstep (a recv ends when its send was posted, a
collective when its last member arrived), and `write_job` writes one Kineto JSON per rank the
way torch does for NCCL: kernels on their own streams with `correlation`/`External id`,
`record_param_comms` host ops carrying the group args and, optionally, `Dst Rank`/`Src Rank`,
per-host clock shifts, plus `truth.json`: bubble/idle/PP-wait per rank and step (design.md's
definition, computed here from the generated intervals), p, m, v, schedule, the heavy stage,
stragglers, contention time lost.

    python -m ranklens.sample_traces.gpu_job OUT_DIR [--tp 2 --pp 4 --dp 2 --m 8 ...]
"""

from __future__ import annotations

import argparse
import gzip
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from ranklens.sample_traces import gpu_trace
from ranklens.sample_traces.gpu_sim import (
    P2P,
    Coll,
    Compute,
    Item,
    P2POp,
    Timed,
    WaitAsync,
    simulate,
    stage_order,
)
from ranklens.sample_traces.gpu_truth import truth_of

BASE_NS = 1_700_000_000_000_000_000


@dataclass(frozen=True)
class GpuJob:
    """A Megatron-style job; times in µs. Faults: `stage_factor` (a slow stage),
    `rank_factor` (a straggler rank's compute), `contention` (compute beside the overlapped
    DP reduce-scatter runs this much longer)."""

    tp: int = 1
    pp: int = 4
    dp: int = 1
    m: int = 8
    v: int = 1
    schedule: str = "1f1b"
    steps: int = 2
    t_fwd_us: float = 1000.0
    bwd_factor: float = 2.0
    kernels_per_block: int = 6
    stage_factor: dict[int, float] = field(default_factory=dict)
    rank_factor: dict[int, float] = field(default_factory=dict)
    contention: float = 1.0
    dp_overlap: bool = False
    dp_us: float = 600.0
    tp_us: float = 40.0
    p2p_us: float = 25.0
    opt_us: float = 300.0
    gap_us: float = 2.0
    peers: bool = True
    batched: bool = False  # Megatron's batch_p2p_comm: each P2P group one NCCL kernel
    ranks_per_host: int = 8
    host_shift_us: dict[int, float] | None = None
    first_step: int = 3

    @property
    def world(self) -> int:
        return self.tp * self.dp * self.pp

    def rank(self, t: int, d: int, s: int) -> int:
        """Megatron's order: tp fastest, then dp, then pp."""
        return t + self.tp * (d + self.dp * s)

    def coords(self, rank: int) -> tuple[int, int, int]:
        return rank % self.tp, (rank // self.tp) % self.dp, rank // (self.tp * self.dp)

    def shift_us(self, rank: int) -> float:
        """This rank's clock runs this far ahead of true time (alignment recovers -shift)."""
        host = rank // self.ranks_per_host
        if self.host_shift_us is not None:
            return self.host_shift_us.get(host, 0.0)
        return 0.0 if host == 0 else ((host * 7919) % 2000 - 1000) * 1.5


@dataclass
class JobRun:
    """Simulated timings (true µs) and the truth derived from them."""

    job: GpuJob
    timed: dict[int, list[Timed]]  # all steps
    windows: list[tuple[int, float, float]]  # (step, start, end), the same on every rank
    truth: dict[str, Any]


def run_job(job: GpuJob) -> JobRun:
    """Simulate every step; the next step starts when every rank finished the last one."""
    timed: dict[int, list[Timed]] = {r: [] for r in range(job.world)}
    windows = []
    t0 = 0.0
    for k in range(job.steps):
        step = job.first_step + k
        out = simulate({r: _items(job, r, step) for r in range(job.world)}, t0, job.gap_us)
        end = max(tm.end for lst in out.values() for tm in lst) + 50.0
        for r, lst in out.items():
            for tm in lst:
                tm.meta["step"] = step
            timed[r].extend(lst)
        windows.append((step, t0, end))
        t0 = end
    return JobRun(job, timed, windows, truth_of(job, timed, windows))


def _items(job: GpuJob, rank: int, step: int) -> list[Item]:
    """One rank's items for one step: Megatron's compute order with its p2p in parity order."""
    t, d, s = job.coords(rank)
    p, v = job.pp, job.v
    order = stage_order(job.schedule, p, job.m, v, s)
    nel = 4096 * 1024
    # Megatron's interleaved order needs sends that complete before their recv is posted
    # (NCCL buffers them); 1F1B and GPipe sends wait for their recv (the spinning send kernel).
    eager = job.schedule == "interleaved"

    def neighbour(stage: int) -> int:
        return job.rank(t, d, stage % p)

    def recv_of(ph: str, c: int, mb: int) -> P2POp | None:
        if ph == "F" and (s > 0 or c > 0):
            return P2POp("recv", neighbour(s - 1), ("F", step, t, d, c, mb, s), job.p2p_us, nel)
        if ph == "B" and (s < p - 1 or c < v - 1):
            return P2POp("recv", neighbour(s + 1), ("B", step, t, d, c, mb, s), job.p2p_us, nel)
        return None

    def send_of(ph: str, c: int, mb: int) -> P2POp | None:
        if ph == "F" and (s < p - 1 or c < v - 1):
            dst_s, dst_c = (s + 1, c) if s < p - 1 else (0, c + 1)
            tag = ("F", step, t, d, dst_c, mb, dst_s)
            return P2POp("send", neighbour(s + 1), tag, job.p2p_us, nel, eager)
        if ph == "B" and (s > 0 or c > 0):
            dst_s, dst_c = (s - 1, c) if s > 0 else (p - 1, c - 1)
            tag = ("B", step, t, d, dst_c, mb, dst_s)
            return P2POp("send", neighbour(s - 1), tag, job.p2p_us, nel, eager)
        return None

    items: list[Item] = []
    last_b = max(i for i, a in enumerate(order) if a[0] == "B")
    factor = job.stage_factor.get(s, 1.0) * job.rank_factor.get(rank, 1.0)
    dp_key = ("dp", step, t, s)
    prev: tuple[str, int, int] | None = None
    for i, (ph, c, mb) in enumerate(order):
        ops = [o for o in (send_of(*prev) if prev else None, recv_of(ph, c, mb)) if o]
        if job.batched and not eager and len(ops) == 2 and ops[0].tag[0] == ops[1].tag[0]:
            # Megatron's 1F1B batches one call's ops: send_forward and the next recv_forward
            # (warm-up), or send_backward and recv_backward (cool-down), are two calls, two
            # kernels; F then B (or B then F) is one call with one neighbour.
            items += [P2P([o], True) for o in ops]
        elif ops:
            items.append(P2P(_parity(ops, rank, neighbour(s + 1), s), job.batched))
        if i == last_b and job.dp > 1 and job.dp_overlap:
            items.append(Coll(dp_key, job.dp, job.dp_us, {"op": "reduce_scatter"}, True))
        items.extend(_block(job, rank, step, ph, c, mb, factor))
        prev = (ph, c, mb)
    last = send_of(*prev) if prev else None
    if last:
        items.append(P2P([last], job.batched))
    if job.dp > 1:
        if job.dp_overlap:
            items.append(WaitAsync(dp_key))
        else:
            items.append(Coll(dp_key, job.dp, job.dp_us, {"op": "all_reduce", "group": "dp"}))
    items.append(Compute(job.opt_us, [1.0], {"phase": "O"}))
    return items


def _parity(ops: list[P2POp], rank: int, next_rank: int, stage: int) -> list[P2POp]:
    """Megatron's unbatched issue order: even stages send next, recv prev, send prev, recv
    next; odd stages recv prev, send next, recv next, send prev."""

    def slot(o: P2POp) -> int:
        to_next = o.peer == next_rank and o.tag[0] == ("F" if o.op == "send" else "B")
        name = ("send_" if o.op == "send" else "recv_") + ("next" if to_next else "prev")
        even = ["send_next", "recv_prev", "send_prev", "recv_next"]
        odd = ["recv_prev", "send_next", "recv_next", "send_prev"]
        return (even if stage % 2 == 0 else odd).index(name)

    return sorted(ops, key=slot)


def _block(
    job: GpuJob, rank: int, step: int, ph: str, c: int, mb: int, factor: float
) -> list[Item]:
    """A micro-batch block: compute, then (tp > 1) a TP all-reduce and more compute."""
    base = job.t_fwd_us / job.v * (job.bwd_factor if ph == "B" else 1.0) * factor
    k = job.kernels_per_block
    weights = [(1.0, 2.0, 4.0)[i % 3] for i in range(k)]
    meta = {"phase": ph, "chunk": c, "mb": mb}
    slow = job.contention if ph == "B" else 1.0
    if job.tp == 1:
        return [Compute(base, weights, meta, slow)]
    half = max(k // 2, 1)
    w1, w2 = weights[:half], weights[half:] or [1.0]
    _t, d, s = job.coords(rank)
    key = ("tp", step, d, s, ph, c, mb)
    return [
        Compute(base * sum(w1) / sum(weights), w1, meta, slow),
        Coll(key, job.tp, job.tp_us, {"op": "all_reduce", "group": "tp", **meta}),
        Compute(base * sum(w2) / sum(weights), w2, meta, slow),
    ]


def write_job(job: GpuJob, out: str | Path, *, gz: bool = False) -> JobRun:
    """Write `rank{r}.json[.gz]` for every rank and `truth.json`; returns the run."""
    run = run_job(job)
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    enc = msgspec.json.Encoder()
    groups = gpu_trace.groups_of(job)
    for r in range(job.world):
        doc = gpu_trace.rank_doc(job, r, run.timed[r], run.windows, groups, BASE_NS)
        data = enc.encode(doc)
        name = f"rank{r}.json" + (".gz" if gz else "")
        (root / name).write_bytes(gzip.compress(data, 1, mtime=0) if gz else data)
    truth = dict(run.truth, job=_spec(job))
    (root / "truth.json").write_bytes(msgspec.json.format(enc.encode(truth)))
    return run


def _spec(job: GpuJob) -> dict[str, Any]:
    d = asdict(job)
    for k in ("stage_factor", "rank_factor", "host_shift_us"):
        if d[k] is not None:
            d[k] = {str(a): b for a, b in d[k].items()}
    return d


def main(argv: list[str] | None = None) -> None:
    """Command line: write a job's rank files and truth.json."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    for name in ("tp", "pp", "dp", "m", "v", "steps", "kernels_per_block"):
        ap.add_argument(f"--{name.replace('_', '-')}", type=int, default=None)
    ap.add_argument("--schedule", choices=["1f1b", "gpipe", "interleaved"], default=None)
    ap.add_argument("--no-peers", action="store_true", help="omit Src/Dst Rank (older torch)")
    ap.add_argument("--slow-stage", type=str, default=None, help="STAGE=FACTOR")
    ap.add_argument("--straggler", type=str, default=None, help="RANK=FACTOR")
    ap.add_argument("--contention", type=float, default=None)
    ap.add_argument("--dp-overlap", action="store_true")
    ap.add_argument("--batched", action="store_true", help="batched isend/irecv (one kernel)")
    ap.add_argument("--gz", action="store_true")
    a = ap.parse_args(argv)
    kw: dict[str, Any] = {
        k: getattr(a, k)
        for k in ("tp", "pp", "dp", "m", "v", "steps", "kernels_per_block", "schedule")
        if getattr(a, k) is not None
    }
    if a.slow_stage:
        st, f = a.slow_stage.split("=")
        kw["stage_factor"] = {int(st): float(f)}
    if a.straggler:
        rk, f = a.straggler.split("=")
        kw["rank_factor"] = {int(rk): float(f)}
    if a.contention is not None:
        kw["contention"] = a.contention
    job = GpuJob(peers=not a.no_peers, dp_overlap=a.dp_overlap, batched=a.batched, **kw)
    run = write_job(job, a.out, gz=a.gz)
    print(
        f"wrote {job.world} ranks to {a.out} (truth.json: {len(run.truth['per_rank_step'])} rows)"
    )


if __name__ == "__main__":
    main()
