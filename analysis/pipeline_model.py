"""Schedule replay for the pipeline analysis: why the measured bubble exceeds the closed form.

Why a replay: the closed forms assume every stage and every micro-batch takes the same time and
transfers are free. Replaying the blocks the stages really ran (same order per stage, same
dependencies) while changing one assumption at a time splits the excess exactly:

  measured mean bubble - closed-form bubble
    = order       (textbook-uniform durations, observed order   - closed form)
    + imbalance   (per-stage mean durations                     - uniform durations)
    + variance    (measured durations                           - per-stage means)
    + p2p         (measured durations + measured p2p latency    - zero latency)
    + unexplained (measured mean bubble                         - that last replay)

Replay bubble of a stage = makespan - its busy time, so the mean bubble is makespan - mean busy.
Dependencies: F(s, i) after F(s-1, i); B(s, i) after B(s+1, i) (last stage: its own F(s, i));
W(s, i) after B(s, i); each stage runs one block at a time in its observed order.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

Key = tuple[int, str, int]  # (stage, phase, micro-batch)


@dataclass(frozen=True)
class Block:
    """One F/B/W block on the job clock."""

    stage: int
    phase: str
    mb: int
    start: int
    end: int

    @property
    def key(self) -> Key:
        return (self.stage, self.phase, self.mb)


@dataclass(frozen=True)
class Decomposition:
    """The excess bubble split into its causes (ns per stage and step, means over stages)."""

    work_ns: float
    closed_bubble_ns: float
    order_ns: float
    imbalance_ns: float
    variance_ns: float
    p2p_ns: float
    unexplained_ns: float
    latency_ns: float
    slow_blocks: tuple[tuple[int, str, int, int, float], ...]  # stage, phase, mb, dur, median


def dependency(key: Key, p: int) -> tuple[Key | None, bool]:
    """The block `key` waits for, and whether that edge crosses stages (a p2p transfer)."""
    s, ph, i = key
    if ph == "F":
        return ((s - 1, "F", i), True) if s > 0 else (None, False)
    if ph == "B":
        return ((s + 1, "B", i), True) if s < p - 1 else ((s, "F", i), False)
    return (s, "B", i), False


def replay(
    p: int, order: dict[int, list[Key]], dur: dict[Key, float], latency: float = 0.0
) -> float | None:
    """Makespan of the schedule with these durations; None if the order deadlocks."""
    nxt = {s: 0 for s in order}
    free = {s: 0.0 for s in order}
    end: dict[Key, float] = {}
    remaining = sum(len(v) for v in order.values())
    while remaining:
        progressed = False
        for s, seq in order.items():
            while nxt[s] < len(seq):
                key = seq[nxt[s]]
                dep, cross = dependency(key, p)
                if dep is not None and dep not in end:
                    if dep not in dur:  # a dependency that never ran: treat as free
                        dep = None
                    else:
                        break
                ready = 0.0 if dep is None else end[dep] + (latency if cross else 0.0)
                start = max(free[s], ready)
                end[key] = free[s] = start + dur[key]
                nxt[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            return None
    return max(end.values()) if end else 0.0


def _latency(blocks: dict[Key, Block], order: dict[int, list[Key]], p: int) -> float:
    """Median p2p lag over edges where the consumer was waiting for its input."""
    lags: list[int] = []
    for seq in order.values():
        prev_end: int | None = None
        for key in seq:
            b = blocks[key]
            dep, cross = dependency(key, p)
            if cross and dep in blocks:
                d = blocks[dep]
                if prev_end is None or prev_end < d.end:
                    lags.append(max(b.start - d.end, 0))
            prev_end = b.end
    return float(statistics.median(lags)) if lags else 0.0


def validate(blocks: Iterable[Block], p: int, m: int) -> tuple[dict[Key, Block], str]:
    """Blocks by key, and 'ok' or why the replay cannot be done."""
    by_key: dict[Key, Block] = {}
    for b in blocks:
        if b.phase not in ("F", "B", "W"):
            return {}, "fused blocks (inferred from p2p order): annotate micro-batches"
        if b.key in by_key:
            return {}, "a micro-batch block appears twice (interleaved chunks?)"
        by_key[b.key] = b
    for s in range(p):
        for ph in ("F", "B"):
            if {i for (st, q, i) in by_key if st == s and q == ph} != set(range(m)):
                return {}, f"stage {s} lacks some {ph} blocks of micro-batches 0..{m - 1}"
    return by_key, "ok"


def decompose(
    blocks: list[Block], p: int, m: int, closed_ideal: float, mean_bubble_ns: float
) -> tuple[Decomposition | None, str]:
    """Split mean_bubble_ns - closed-form bubble; (None, reason) when the blocks do not allow."""
    by_key, why = validate(blocks, p, m)
    if why != "ok":
        return None, why
    order: dict[int, list[Key]] = {s: [] for s in range(p)}
    for b in sorted(by_key.values(), key=lambda b: (b.start, b.end)):
        order[b.stage].append(b.key)
    dur = {k: float(b.end - b.start) for k, b in by_key.items()}
    work = statistics.fmean(sum(d for k, d in dur.items() if k[0] == s) for s in range(p))
    phases = {k[1] for k in dur}
    uniform_mean = {ph: statistics.fmean(d for k, d in dur.items() if k[1] == ph) for ph in phases}
    stage_mean = {
        (s, ph): statistics.fmean(d for k, d in dur.items() if k[0] == s and k[1] == ph)
        for s in range(p)
        for ph in phases
        if any(k[0] == s and k[1] == ph for k in dur)
    }
    t_uniform = replay(p, order, {k: uniform_mean[k[1]] for k in dur})
    t_stage = replay(p, order, {k: stage_mean[(k[0], k[1])] for k in dur})
    t_actual = replay(p, order, dur)
    lat = _latency(by_key, order, p)
    t_lat = replay(p, order, dur, lat)
    if t_uniform is None or t_stage is None or t_actual is None or t_lat is None:
        return None, "the observed block order deadlocks under the schedule's dependencies"
    closed = closed_ideal * work
    slow = []
    for (s, ph), mean in sorted(stage_mean.items()):
        durs = [d for k, d in dur.items() if k[0] == s and k[1] == ph]
        med = statistics.median(durs)
        for k, d in dur.items():
            if k[0] == s and k[1] == ph and d > 1.25 * med and d - med > 0.02 * mean * m:
                slow.append((s, ph, k[2], int(d), float(med)))
    slow.sort(key=lambda x: x[3] - x[4], reverse=True)
    return (
        Decomposition(
            work_ns=work,
            closed_bubble_ns=closed,
            order_ns=t_uniform - work - closed,
            imbalance_ns=t_stage - t_uniform,
            variance_ns=t_actual - t_stage,
            p2p_ns=t_lat - t_actual,
            unexplained_ns=mean_bubble_ns - (t_lat - work),
            latency_ns=lat,
            slow_blocks=tuple(slow[:5]),
        ),
        "ok",
    )
