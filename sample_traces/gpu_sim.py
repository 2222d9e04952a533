"""Lockstep simulator behind the GPU-shaped job generator (`gpu_job.py`).

Why a simulator: a pipeline's timing is made by its dependencies (a recv ends when its send
was posted, a collective when its last member arrived), so faults injected into one rank
(a slow stage, a straggler) must move every other rank exactly as a real job would. Each rank
runs a list of items in order; communication items complete only when their partners reach
them. The result is exact truth: every kernel's true start and end.

Items: `Compute` (kernels back to back), `P2P` (a group of isend/irecv posted together, waited
together; each op runs on the stream of its peer pair, ops on one stream serialize; a batched
group is one kernel that ends when its last op does), `Coll`
(a blocking collective: ends at the last arrival + transfer; `overlapped`: on its own stream,
the rank goes on), `WaitAsync` (the rank waits for an overlapped one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Compute:
    """Kernels (relative weights) of one block; `meta` names the block (phase, chunk, mb)."""

    dur_us: float
    weights: list[float]
    meta: dict[str, Any]
    slow_beside_async: float = 1.0  # kernels starting while an overlapped Coll of this rank runs


@dataclass
class P2POp:
    op: str  # "send" | "recv"
    peer: int
    tag: tuple[Any, ...]  # the same tag on both sides identifies one message
    transfer_us: float
    nelems: int
    eager: bool = False  # a send that completes without waiting for its recv (buffered)


@dataclass
class P2P:
    ops: list[P2POp]
    batched: bool = False  # one NCCL group (batch_isend_irecv): one kernel for all its ops


@dataclass
class Coll:
    key: tuple[Any, ...]
    members: int
    transfer_us: float
    meta: dict[str, Any]
    overlapped: bool = False  # on its own stream: the rank goes on (WaitAsync waits for it)


@dataclass
class WaitAsync:
    key: tuple[Any, ...]


Item = Compute | P2P | Coll | WaitAsync


@dataclass
class Timed:
    """One device interval in true time (µs) on a rank."""

    kind: str  # compute | p2p | coll
    start: float
    end: float
    stream: str
    meta: dict[str, Any] = field(default_factory=dict)


class Deadlock(RuntimeError):
    """The items cannot complete: an issue order no real job could run."""


@dataclass
class _Rank:
    items: list[Item]
    cur: float
    idx: int = 0
    streams: dict[str, float] = field(default_factory=dict)
    group: list[dict[str, Any]] | None = None  # ops of the P2P item in progress
    out: list[Timed] = field(default_factory=list)
    async_end: dict[tuple[Any, ...], float] = field(default_factory=dict)
    async_window: tuple[float, float] | None = None


def simulate(
    items: dict[int, list[Item]], start_us: float, gap_us: float
) -> dict[int, list[Timed]]:
    """Run every rank's items from `start_us`; returns each rank's device intervals."""
    ranks = {r: _Rank(lst, start_us) for r, lst in items.items()}
    world = _World()
    for lst in items.values():
        for it in lst:
            if isinstance(it, Coll) and it.overlapped:
                world.info[it.key] = (it.members, it.transfer_us)
    while True:
        progress = False
        pending = False
        for r, st in ranks.items():
            while st.idx < len(st.items):
                if not _advance(r, st, world, gap_us):
                    break
                progress = True
            if st.idx < len(st.items):
                pending = True
        if not pending:
            break
        if not progress:
            stuck = sorted(r for r, st in ranks.items() if st.idx < len(st.items))[:8]
            raise Deadlock(f"ranks {stuck} wait forever")
    return {r: st.out for r, st in ranks.items()}


@dataclass
class _World:
    """What ranks tell each other: p2p posts by tag, collective arrivals and ends."""

    posts: dict[tuple[Any, ...], dict[str, float]] = field(default_factory=dict)
    arrivals: dict[tuple[Any, ...], dict[int, float]] = field(default_factory=dict)
    done: dict[tuple[Any, ...], float] = field(default_factory=dict)
    info: dict[tuple[Any, ...], tuple[int, float]] = field(default_factory=dict)


def _advance(r: int, st: _Rank, world: _World, gap: float) -> bool:
    """Complete the rank's current item if its partners allow; True when it advanced."""
    item = st.items[st.idx]
    arrivals, done_coll = world.arrivals, world.done
    if isinstance(item, Compute):
        t = st.cur + gap
        total = sum(item.weights)
        for i, w in enumerate(item.weights):
            d = item.dur_us * w / total
            win = st.async_window
            if item.slow_beside_async != 1.0 and win is not None and win[0] <= t < win[1]:
                d *= item.slow_beside_async
            base = item.dur_us * w / total
            st.out.append(
                Timed("compute", t, t + d, "compute", {**item.meta, "k": i, "base_us": base})
            )
            t += d
        st.cur = t
    elif isinstance(item, P2P):
        if not _p2p(r, st, item, world.posts, gap):
            return False
    elif isinstance(item, Coll) and not item.overlapped:
        arr = arrivals.setdefault(item.key, {})
        if r not in arr:
            arr[r] = st.cur + gap
        if len(arr) < item.members:
            return False
        end = done_coll.setdefault(item.key, max(arr.values()) + item.transfer_us)
        st.out.append(Timed("coll", arr[r], end, "coll", dict(item.meta)))
        st.cur = end
    elif isinstance(item, Coll):
        arr = arrivals.setdefault(item.key, {})
        t = st.cur + gap
        arr[r] = t
        # The rank goes on at once; the kernel's end is settled when every member arrived
        # (see finish_async). Contention windows assume symmetric members: t + transfer.
        st.async_window = (t, t + item.transfer_us)
        st.async_end[item.key] = t
        st.out.append(Timed("coll", t, t, "async", {**item.meta, "key": item.key}))
        st.cur = t
    else:
        arr = arrivals.get(item.key, {})
        members, transfer = world.info[item.key]
        if len(arr) < members:
            return False
        end = max(arr.values()) + transfer
        for tm in st.out:
            if tm.stream == "async" and tm.meta.get("key") == item.key:
                tm.end = end
        st.cur = max(st.cur, end)
        st.async_window = None
    st.idx += 1
    return True


def _p2p(
    r: int, st: _Rank, item: P2P, posts: dict[tuple[Any, ...], dict[str, float]], gap: float
) -> bool:
    """Post the group's ops (each on its peer pair's stream, in issue order) and finish the
    ones whose partner has posted; the group completes when all ops ended."""
    if st.group is None:
        fresh: list[dict[str, Any]] = [{"op": o, "start": None, "end": None} for o in item.ops]
        st.group = fresh
    issue = st.cur + gap
    changed = True
    while changed:
        changed = False
        for k, g in enumerate(st.group):
            o: P2POp = g["op"]
            stream = _BATCH if item.batched else _stream(r, o)
            if g["start"] is None:
                prev = [h for h in st.group[:k] if _stream(r, h["op"]) == stream]
                if any(h["end"] is None for h in prev):
                    continue
                # a batch posts every op at once (ncclGroupEnd launches one kernel)
                began = max(issue + (0 if item.batched else 0.5 * k), st.streams.get(stream, issue))
                g["start"] = began
                posts.setdefault(o.tag, {})[o.op] = began
                changed = True
            if g["end"] is None:
                other: float | None = posts.get(o.tag, {}).get("recv" if o.op == "send" else "send")
                if o.eager and o.op == "send":
                    other = g["start"]
                if other is None:
                    continue
                ended = max(g["start"], other) + o.transfer_us
                g["end"] = ended
                st.streams[stream] = ended
                changed = True
    if any(g["end"] is None for g in st.group):
        return False
    if item.batched:
        end = max(g["end"] for g in st.group)
        ops = [
            {"op": g["op"].op, "peer": g["op"].peer, "tag": g["op"].tag, "nelems": g["op"].nelems}
            for g in st.group
        ]
        start = min(g["start"] for g in st.group)
        st.out.append(Timed("p2p", start, end, _BATCH, {"op": "batch", "ops": ops}))
        st.streams[_BATCH] = end
        st.cur = end
        st.group = None
        return True
    for g in st.group:
        o = g["op"]
        meta = {"op": o.op, "peer": o.peer, "tag": o.tag, "nelems": o.nelems}
        st.out.append(Timed("p2p", g["start"], g["end"], _stream(r, o), meta))
    st.cur = max(g["end"] for g in st.group)
    st.group = None
    return True


_BATCH = "p2p:batch"


def _stream(r: int, o: P2POp) -> str:
    return f"p2p:{min(r, o.peer)}-{max(r, o.peer)}"


def stage_order(schedule: str, p: int, m: int, v: int, s: int) -> list[tuple[str, int, int]]:
    """Megatron's compute order on stage s: (phase F/B, model chunk, micro-batch)."""
    if schedule == "gpipe":
        return [("F", 0, i) for i in range(m)] + [("B", 0, i) for i in range(m)]
    if schedule == "1f1b":
        warm = min(p - s - 1, m)
        seq = [("F", 0, i) for i in range(warm)]
        for i in range(m - warm):
            seq += [("F", 0, warm + i), ("B", 0, i)]
        return seq + [("B", 0, i) for i in range(m - warm, m)]
    if schedule != "interleaved":
        raise ValueError(f"unknown schedule {schedule!r}")
    if m % p:
        raise ValueError("interleaved 1F1B needs m divisible by p (as Megatron does)")
    total = m * v

    def fwd(k: int) -> tuple[str, int, int]:
        return ("F", (k // p) % v, (k // (p * v)) * p + k % p)

    def bwd(k: int) -> tuple[str, int, int]:
        return ("B", v - 1 - (k // p) % v, (k // (p * v)) * p + k % p)

    warm = min((p - s - 1) * 2 + (v - 1) * p, total)
    seq = [fwd(k) for k in range(warm)]
    for k in range(total - warm):
        seq += [fwd(warm + k), bwd(k)]
    return seq + [bwd(k) for k in range(total - warm, total)]
