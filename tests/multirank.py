"""Hand-built multi-rank NCCL jobs for matching, alignment, straggler and bandwidth tests.

`gpu_job(n)` gives one `KinetoTrace` per rank (one ProfilerStep [0, 100 ms), a world group
"0" and any extra groups in their pg_config), optionally with hosts and per-rank clock shifts:
a rank whose clock runs `shift_us` ahead stamps true time t as t + shift, so alignment must
recover offset = -shift. `collective(...)` adds one NCCL kernel per rank, with each rank's
start (arrival) and a common true end, written in each rank's own (shifted) clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kineto_builder import BASE_NS, KinetoTrace, PgConfig

_KERNEL = {
    "all_reduce": ("AllReduce", "allreduce"),
    "all_gather": ("AllGather", "allgather"),
    "reduce_scatter": ("ReduceScatter", "reducescatter"),
    "broadcast": ("Broadcast", "broadcast"),
    "all_to_all": ("SendRecv", "all_to_all"),
    "send": ("SendRecv", "send"),
    "recv": ("SendRecv", "recv"),
}


@dataclass
class Job:
    """Traces of a hand-built job and each rank's clock shift (µs)."""

    traces: list[KinetoTrace]
    shift_us: dict[int, float] = field(default_factory=dict)

    def collective(
        self,
        op: str,
        starts_us: Mapping[int, float],
        end_us: float,
        *,
        pg: str = "0",
        nelems: int | None = 1 << 20,
        out_nelems: int | None = None,
        dtype: str = "Float",
        stream: int = 20,
    ) -> None:
        """One collective: rank r's kernel runs [starts_us[r], end_us) in true time."""
        kname, coll = _KERNEL[op]
        for r, s in starts_us.items():
            t = self.traces[r]
            ev = t.nccl(
                kname,
                s,
                end_us - s,
                coll=coll,
                pg_name=pg,
                nelems=nelems,
                dtype=dtype,
                stream=stream,
                group_size=None,
            )
            if out_nelems is not None:
                ev["args"]["Out msg nelems"] = out_nelems


def gpu_job(
    n: int,
    *,
    hosts: list[str] | None = None,
    shift_us: dict[int, float] | None = None,
    groups: list[PgConfig] | None = None,
    step_us: float = 100_000,
) -> Job:
    """n GPU ranks with a world group "0" (plus `groups`), one step [0, step_us)."""
    shifts = shift_us or {}
    traces = []
    for r in range(n):
        pgs = [PgConfig("0", list(range(n)), "default_pg")]
        pgs += [g for g in groups or [] if r in g.ranks]
        extra = {"host_name": hosts[r]} if hosts else {}
        t = KinetoTrace(
            rank=r,
            world_size=n,
            pg_config=pgs,
            base_ns=BASE_NS + round(shifts.get(r, 0.0) * 1000),
            extra_header=extra,
            pid=1000 + r,
            tid=1000 + r,
        )
        t.step(1, 0, step_us)
        traces.append(t)
    return Job(traces, dict(shifts))
