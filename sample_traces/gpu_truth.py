"""The truth of a simulated job, computed from its intervals with its own (plain Python) code.

Why separate from ranklens' SQL: a test compares two independent computations of design.md's
definitions. Per rank and step, W is the hull of the rank's device work in the step (as the
ingest defines a GPU rank's step window); C the union of compute kernels, PP of pipeline
send/recv kernels, O of other communication kernels:
  idle = |W \\ (C ∪ PP ∪ O)|, pp_wait = |PP \\ C|, bubble = idle + pp_wait,
  filled = |(PP \\ C) ∩ O| (the part of the bubble other communication already uses),
  work = the micro-batch blocks' extents (first kernel start to last kernel end).
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from ranklens.sample_traces.gpu_sim import Timed

if TYPE_CHECKING:
    from ranklens.sample_traces.gpu_job import GpuJob

Iv = list[tuple[float, float]]


def union(iv: Iv) -> Iv:
    """Sorted, merged intervals."""
    out: Iv = []
    for s, e in sorted(iv):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def length(iv: Iv) -> float:
    return sum(e - s for s, e in iv)


def intersect(a: Iv, b: Iv) -> Iv:
    """Intersection of two merged lists."""
    out: Iv = []
    i = j = 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def minus(a: Iv, b: Iv) -> Iv:
    """a \\ b for merged lists."""
    out: Iv = []
    j = 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def truth_of(
    job: GpuJob, timed: dict[int, list[Timed]], windows: list[tuple[int, float, float]]
) -> dict[str, Any]:
    """Per rank/step bubble figures and the job-level facts a report must find."""
    rows: list[dict[str, Any]] = []
    blocks: list[dict[str, Any]] = []
    stage_work: dict[int, list[float]] = defaultdict(list)
    lost = 0.0
    slowed = 0
    for r, lst in timed.items():
        _t, _d, stage = job.coords(r)
        per_step: dict[int, list[Timed]] = defaultdict(list)
        for tm in lst:
            per_step[int(tm.meta["step"])].append(tm)
            if tm.kind == "compute" and tm.end - tm.start > tm.meta["base_us"] * 1.000001:
                lost += tm.end - tm.start - tm.meta["base_us"]
                slowed += 1
        for step, evs in sorted(per_step.items()):
            w = (min(t.start for t in evs), max(t.end for t in evs))
            comp = union([(t.start, t.end) for t in evs if t.kind == "compute"])
            pp = union([(t.start, t.end) for t in evs if t.kind == "p2p"])
            other = union([(t.start, t.end) for t in evs if t.kind == "coll"])
            busy = union(comp + pp + other)
            pp_wait = minus(pp, comp)
            ext: dict[tuple[str, int, int], list[float]] = {}
            for t in evs:
                if t.kind == "compute" and t.meta["phase"] in ("F", "B"):
                    key = (t.meta["phase"], t.meta["chunk"], t.meta["mb"])
                    cur = ext.setdefault(key, [t.start, t.end])
                    cur[0], cur[1] = min(cur[0], t.start), max(cur[1], t.end)
            work = sum(e - s for s, e in ext.values())
            stage_work[stage].append(work)
            idle = (w[1] - w[0]) - length(busy)
            rows.append(
                {
                    "rank": r,
                    "step": step,
                    "stage": stage,
                    "window_ns": _ns(w[1] - w[0]),
                    "bubble_ns": _ns(idle + length(pp_wait)),
                    "idle_ns": _ns(idle),
                    "pp_wait_ns": _ns(length(pp_wait)),
                    "filled_ns": _ns(length(intersect(pp_wait, other))),
                    "work_ns": _ns(work),
                    "compute_ns": _ns(length(comp)),
                }
            )
            if job.world <= 128:
                for (ph, c, mb), (s, e) in sorted(ext.items(), key=lambda kv: kv[1][0]):
                    blocks.append(
                        {
                            "rank": r,
                            "step": step,
                            "phase": ph,
                            "chunk": c,
                            "mb": mb,
                            "start_ns": _ns(s),
                            "end_ns": _ns(e),
                        }
                    )
    means = {s: sum(v) / len(v) for s, v in stage_work.items()}
    sends = sum(
        1
        for lst in timed.values()
        for t in lst
        if t.kind == "p2p"
        for o in t.meta.get("ops", [t.meta])
        if o["op"] == "send"
    )
    return {
        "p": job.pp,
        "m": job.m,
        "v": job.v,
        "schedule": job.schedule,
        "heavy_stage": _heavy(means),
        "stage_work_ns": {str(s): _ns(v) for s, v in sorted(means.items())},
        "straggler_ranks": sorted(job.rank_factor),
        "slow_stages": sorted(job.stage_factor),
        "clock_offset_ns": {str(r): -_ns(job.shift_us(r)) for r in range(job.world)},
        "p2p_messages": sends,
        "contention": {
            "slowdown": job.contention - 1.0,
            "time_lost_ns": _ns(lost),
            "slowed_kernels": slowed,
        },
        "steps": [{"step": s, "start_ns": _ns(a), "end_ns": _ns(b)} for s, a, b in windows],
        "per_rank_step": rows,
        "blocks": blocks,
    }


def _heavy(means: dict[int, float]) -> int | None:
    """The stage with the most micro-batch work; None when no stage is 1% above the rest."""
    if len(means) < 2:
        return None
    top = max(means, key=lambda s: (means[s], -s))
    rest = max(v for s, v in means.items() if s != top)
    return top if means[top] > rest * 1.01 else None


def _ns(us: float) -> int:
    return round(us * 1000)
