"""Which neighbour each op of a batched send/recv talked to, from when the batches ended: the
rendezvous rule p2p_batch_peers applies (pure functions over batches on one clock).

Why apart: the clock placement (p2p_batch_clock) scores candidate clock offsets by how many
ops this rule names under each, and the peer inference applies it once the clocks agree.

The rule: in Megatron's 1F1B each call batches the ops it has with one neighbour
(send_forward, recv_backward, send_forward_recv_backward, ...), and a batch ends with its
partner's (one NCCL group). The batches of one pipeline group whose ends lie within a
tolerance form a rendezvous, in which the stages present form runs of adjacent stages. A
stage's sends go to the stage before or after it, and how many go each way follows from the
run's first stage (none before it) onward:
    right(i) = sends(i) - left(i),   left(i+1) = the recvs of i not from its left
The counts are unique, so they are the true ones when the rendezvous holds both ends of its
messages. Nothing is named for a rendezvous with two batches of one stage, ops of more than
one size, counts that go negative or do not close, or a batch sent both ways (two partners:
not a 1F1B call); and the caller drops a group's names unless, on every (sender, receiver)
pair, the k-th send and the k-th recv were in flight together (in_flight_together).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

Op = tuple[Any, ...]  # (rank, ts_ns, stream, op, k): the key of a peer hint
Named = tuple[Op, int, "Batch"]  # an op, the peer rank named, its batch

RING_RATIO = 0.6  # end stage's ops / a middle stage's: 1/2 straight, (2v-1)/2v interleaved


@dataclass
class Batch:
    """One batched kernel's unknown-peer ops, with its group, stage (1-based position in the
    group), clock part and times."""

    group: str
    part: str
    pos: int
    start: int
    end: int
    step: Any
    sends: list[Op] = field(default_factory=list)
    recvs: list[Op] = field(default_factory=list)
    sizes: set[Any] = field(default_factory=set)


def by(batches: list[Batch], key: Callable[[Batch], Hashable]) -> dict[Any, list[Batch]]:
    out: dict[Any, list[Batch]] = defaultdict(list)
    for b in batches:
        out[key(b)].append(b)
    return out


def ring(batches: list[Batch], n: int) -> bool:
    """Whether the end stages carry nearly as many ops as the middle ones (interleaved)."""
    count: dict[int, int] = defaultdict(int)
    for b in batches:
        count[b.pos] += len(b.sends) + len(b.recvs)
    middle = sorted(count[p] for p in range(2, n))
    if not middle or not middle[len(middle) // 2]:
        return True  # nothing to compare with: do not guess
    return max(count[1], count[n]) > RING_RATIO * middle[len(middle) // 2]


def solve_all(batches: list[Batch], ranks: list[int], tol: int) -> list[Named]:
    """Every op of the batches' (one group's) solved rendezvous, with the peer named."""
    named: list[Named] = []
    for meet in _rendezvous(sorted(batches, key=lambda b: (b.end, b.pos)), tol):
        if len(meet) > 1:  # a batch alone has no partner to close with
            named += _named(meet, _solve(meet), ranks)
    return named


def _rendezvous(batches: list[Batch], tol: int) -> list[list[Batch]]:
    """Batches (by end) split where consecutive ends are more than `tol` apart."""
    meets: list[list[Batch]] = []
    for b in batches:
        if meets and b.end - meets[-1][-1].end <= tol:
            meets[-1].append(b)
        else:
            meets.append([b])
    return meets


def _solve(meet: list[Batch]) -> dict[int, tuple[int, int]] | None:
    """pos -> (sends, recvs) to the stage before it (the rest go after), or None."""
    at = {b.pos: b for b in meet}
    if len(at) < len(meet) or len({s for b in meet for s in b.sizes}) > 1:
        return None  # a stage twice, or sizes that would make the split a guess
    left: dict[int, tuple[int, int]] = {}
    carry = (0, 0)  # what the stage before sent right and received from the right
    for pos in sorted(at):
        if pos - 1 not in at and carry != (0, 0):
            return None  # the previous run's last stage would talk to an absent stage
        b = at[pos]
        s_left, r_left = carry[1], carry[0]  # its left messages are its neighbour's right ones
        s_right, r_right = len(b.sends) - s_left, len(b.recvs) - r_left
        if min(s_right, r_right) < 0 or (s_left + r_left and s_right + r_right):
            return None  # too few ops, or a batch with both neighbours (not one 1F1B call)
        left[pos] = (s_left, r_left)
        carry = (s_right, r_right)
    return left if carry == (0, 0) else None


def _named(
    meet: list[Batch], left: dict[int, tuple[int, int]] | None, ranks: list[int]
) -> list[Named]:
    """(op, peer, batch) for each op of a solved rendezvous (a batch's ops of one kind are
    alike: one kernel, one size, one neighbour)."""
    if left is None:
        return []
    out: list[Named] = []
    for b in meet:
        s_left, r_left = left[b.pos]
        before, after = ranks[b.pos - 2] if b.pos > 1 else -1, ranks[b.pos % len(ranks)]
        out += [(op, before if s_left else after, b) for op in b.sends]
        out += [(op, before if r_left else after, b) for op in b.recvs]
    return out


def in_flight_together(named: list[Named], tol: int) -> bool:
    """On every (sender, receiver) pair and step, as many sends as recvs, and the k-th send's
    kernel and the k-th recv's ran at once (a message moves while both run): rendezvous that
    each closed can still, together, pair a send with the wrong exchange's recv."""
    chans: dict[tuple[Any, ...], tuple[list[Batch], list[Batch]]] = defaultdict(lambda: ([], []))
    for op, peer, b in named:
        if op[3] == "send":
            chans[op[0], peer, b.step][0].append(b)
        else:
            chans[peer, op[0], b.step][1].append(b)
    for sends, recvs in chans.values():
        if len(sends) != len(recvs):
            return False
        sends.sort(key=lambda b: b.end)
        recvs.sort(key=lambda b: b.end)
        for s, r in zip(sends, recvs, strict=True):
            if s.start > r.end + tol or r.start > s.end + tol:
                return False
    return True
