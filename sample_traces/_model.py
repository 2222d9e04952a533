"""Per-rank worker for ``generate.py``: a tiny Megatron-style TP/PP/DP model on gloo, profiled.

Kept apart from ``generate.py`` because it imports torch at module level; ``generate.py`` loads it
only when it really launches a job, so its CLI and layout helpers work without torch.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule

SLOW_MATMUL_N = 192  # size of the square matmul repeated to burn the injected time

Work = Any  # torch.distributed Work handle (untyped in torch's stubs)


class _CopyToTP(torch.autograd.Function):  # type: ignore[misc, unused-ignore]
    """Megatron's ``f``: identity in forward, all-reduce of the input gradient in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):  # type: ignore[misc, unused-ignore]
    """Megatron's ``g``: all-reduce of the row-parallel output in forward, identity in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class ParallelMLP(nn.Module):  # type: ignore[misc, unused-ignore]
    """Column-parallel then row-parallel Linear with a residual, as in a Megatron MLP block."""

    def __init__(self, hidden: int, tp_size: int, tp_group: Any) -> None:
        super().__init__()
        self.tp_size = tp_size
        self.tp_group = tp_group
        ffn = 4 * hidden
        self.fc1 = nn.Linear(hidden, ffn // tp_size)  # column parallel
        self.fc2 = nn.Linear(ffn // tp_size, hidden, bias=False)  # row parallel
        self.bias2 = nn.Parameter(torch.zeros(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        if self.tp_size > 1:
            h = _CopyToTP.apply(x, self.tp_group)  # type: ignore[no-untyped-call, unused-ignore]
        h = nn.functional.gelu(self.fc1(h))
        y: torch.Tensor = self.fc2(h)
        if self.tp_size > 1:
            y = _ReduceFromTP.apply(y, self.tp_group)  # type: ignore[no-untyped-call, unused-ignore]
        return x + y + self.bias2


@dataclass
class StepTruth:
    """What one rank measured in one training step (ns from ``time.perf_counter_ns``)."""

    step: int
    profiled: bool
    start_epoch_ns: int
    end_epoch_ns: int
    wall_ns: int = 0
    forward_ns: list[int] = field(default_factory=list)
    backward_ns: list[int] = field(default_factory=list)
    slow_ns: list[int] = field(default_factory=list)
    p2p_recv_wait_ns: int = 0
    dp_allreduce_ns: int = 0


def busy_compute(ms: float) -> int:
    """Burn ``ms`` of real matmul work (not sleep, so it shows as compute); return ns spent."""
    a = torch.ones(SLOW_MATMUL_N, SLOW_MATMUL_N)
    t0 = time.perf_counter_ns()
    deadline = t0 + int(ms * 1e6)
    while time.perf_counter_ns() < deadline:
        a = torch.mm(a, a).clamp_(-1.0, 1.0)
    return time.perf_counter_ns() - t0


def schedule_order(sched: str, pp: int, stage: int, m: int) -> list[tuple[str, int]]:
    """Order of forward ("F") and backward ("B") micro-batch passes on one pipeline stage."""
    if sched == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warmup = min(pp - stage - 1, m)
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", i) for i in range(m - warmup, m)]
    return order


@dataclass
class Ctx:
    """Everything one rank needs to run its part of a step."""

    rank: int
    cfg: dict[str, Any]
    stage: int
    dp_idx: int
    groups: dict[str, Any]  # kind -> ProcessGroup containing this rank
    prev_rank: int | None
    next_rank: int | None
    model: nn.Module
    optim: torch.optim.Optimizer
    pending: list[tuple[Work, torch.Tensor]] = field(default_factory=list)


def _recv(ctx: Ctx, src: int, truth: StepTruth) -> torch.Tensor:
    buf = torch.empty(int(ctx.cfg["mb_size"]), int(ctx.cfg["hidden"]))
    t0 = time.perf_counter_ns()
    dist.recv(buf, src=src, group=ctx.groups["PP"])
    truth.p2p_recv_wait_ns += time.perf_counter_ns() - t0
    return buf


def _send(ctx: Ctx, t: torch.Tensor, dst: int) -> None:
    work = dist.isend(t, dst=dst, group=ctx.groups["PP"])
    ctx.pending.append((work, t))


def run_step(ctx: Ctx, step: int, profiled: bool) -> StepTruth:
    """One training step: pipelined micro-batches, then DP gradient all-reduce and SGD."""
    cfg = ctx.cfg
    m, pp = int(cfg["microbatches"]), int(cfg["pp"])
    slow = cfg["slow_rank"] == ctx.rank and float(cfg["slow_ms"]) > 0
    offcpu_s = float(cfg["offcpu_ms"]) / 1000
    truth = StepTruth(step, profiled, time.time_ns(), 0)
    truth.forward_ns = [0] * m
    truth.backward_ns = [0] * m
    truth.slow_ns = [0] * m
    t_step = time.perf_counter_ns()
    gen = torch.Generator().manual_seed(1000 * step + ctx.dp_idx)
    shape = (int(cfg["mb_size"]), int(cfg["hidden"]))
    inputs = [torch.randn(*shape, generator=gen) for _ in range(m)]
    saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for kind, i in schedule_order(str(cfg["schedule"]), pp, ctx.stage, m):
        if kind == "F":
            if ctx.prev_rank is None:
                x = inputs[i]
            else:
                x = _recv(ctx, ctx.prev_rank, truth).requires_grad_()
            t0 = time.perf_counter_ns()
            with record_function(f"forward_mb{i}"):
                y = ctx.model(x)
                if ctx.next_rank is None:
                    y = (y * y).mean()
                if slow:
                    truth.slow_ns[i] = busy_compute(float(cfg["slow_ms"]))
                if offcpu_s:
                    time.sleep(offcpu_s)
            truth.forward_ns[i] = time.perf_counter_ns() - t0
            saved[i] = (x, y)
            if ctx.next_rank is not None:
                _send(ctx, y.detach(), ctx.next_rank)
        else:
            x, y = saved.pop(i)
            grad = None if ctx.next_rank is None else _recv(ctx, ctx.next_rank, truth)
            t0 = time.perf_counter_ns()
            with record_function(f"backward_mb{i}"):
                torch.autograd.backward(y, grad)
            truth.backward_ns[i] = time.perf_counter_ns() - t0
            if ctx.prev_rank is not None:
                assert x.grad is not None
                _send(ctx, x.grad, ctx.prev_rank)
    for work, _t in ctx.pending:
        work.wait()
    ctx.pending.clear()
    if int(cfg["dp"]) > 1:
        t0 = time.perf_counter_ns()
        grads = [p.grad for p in ctx.model.parameters() if p.grad is not None]
        flat = torch.cat([g.flatten() for g in grads])
        dist.all_reduce(flat, group=ctx.groups["DP"])
        flat /= int(cfg["dp"])
        off = 0
        for g in grads:
            g.copy_(flat[off : off + g.numel()].view_as(g))
            off += g.numel()
        truth.dp_allreduce_ns = time.perf_counter_ns() - t0
    ctx.optim.step()
    ctx.optim.zero_grad(set_to_none=True)
    truth.wall_ns = time.perf_counter_ns() - t_step
    truth.end_epoch_ns = time.time_ns()
    return truth


def _export(path: str) -> Callable[[profile], None]:
    """on_trace_ready handler: export this rank's Chrome trace and gzip it reproducibly."""

    def handler(prof: profile) -> None:
        prof.export_chrome_trace(path)
        with (
            open(path, "rb") as src,
            open(path + ".gz", "wb") as raw,
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz,
        ):
            shutil.copyfileobj(src, gz)
        os.remove(path)

    return handler


def build_ctx(rank: int, cfg: dict[str, Any], layout: list[dict[str, Any]]) -> Ctx:
    """After init_process_group: create every group (same order on all ranks), the stage's
    model and optimizer."""
    tp, pp, dp = int(cfg["tp"]), int(cfg["pp"]), int(cfg["dp"])
    groups: dict[str, Any] = {}
    for spec in layout:  # every rank creates every group, in the same order
        desc = None if cfg["unnamed"] else spec["description"]
        pg = dist.new_group(spec["ranks"], group_desc=desc)
        if rank in spec["ranks"] and spec["kind"] in ("TP", "DP", "PP"):
            groups[spec["kind"]] = pg
    dp_idx, stage = (rank // tp) % dp, rank // (tp * dp)
    stride = tp * dp
    hidden = int(cfg["hidden"])
    blocks = [ParallelMLP(hidden, tp, groups["TP"]) for _ in range(int(cfg["layers"]))]
    model = nn.Sequential(*blocks)
    return Ctx(
        rank=rank,
        cfg=cfg,
        stage=stage,
        dp_idx=dp_idx,
        groups=groups,
        prev_rank=rank - stride if stage > 0 else None,
        next_rank=rank + stride if stage < pp - 1 else None,
        model=model,
        optim=torch.optim.SGD(model.parameters(), lr=1e-3),
    )


def worker(
    rank: int, cfg: dict[str, Any], layout: list[dict[str, Any]], port: int, out: str
) -> None:
    """Entry point of one spawned rank: init gloo, build groups, train, profile, write truth."""
    tp, pp, dp = int(cfg["tp"]), int(cfg["pp"]), int(cfg["dp"])
    world = tp * pp * dp
    torch.set_num_threads(1)  # many ranks share few cores: avoid oversubscription
    torch.manual_seed(rank)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=300),
    )
    ctx = build_ctx(rank, cfg, layout)
    tp_idx, dp_idx, stage = rank % tp, (rank // tp) % dp, rank // (tp * dp)
    steps = int(cfg["steps"])
    truths: list[StepTruth] = []
    dist.barrier()
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=steps, repeat=1),
        record_shapes=True,
        on_trace_ready=_export(os.path.join(out, f"rank{rank}.json")),
    ) as prof:
        for step in range(steps + 2):
            truths.append(run_step(ctx, step, profiled=step >= 2))
            prof.step()
    part = {
        "rank": rank,
        "tp_idx": tp_idx,
        "dp_idx": dp_idx,
        "pp_stage": stage,
        "schedule_order": [
            f"{k}{i}"
            for k, i in schedule_order(str(cfg["schedule"]), pp, stage, int(cfg["microbatches"]))
        ],
        "steps": [vars(t) for t in truths],
    }
    with open(os.path.join(out, f"_truth_rank{rank}.json"), "w") as f:
        json.dump(part, f)
    dist.barrier()
    dist.destroy_process_group()
