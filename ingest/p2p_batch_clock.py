"""Clock offsets between hosts that only batched send/recv without peers connect (a pipeline
whose stages sit on their own hosts, traced by torch before 2.5): found by the rendezvous rule.

Why not clock_p2p's densest window: a 1F1B pipeline exchanges in lockstep, so with every send x
recv (or every answering pair of batches) of adjacent stages as candidates, the ends one
schedule period apart line up as often as the true ones; on a generated two-host tp2 x pp4 x
dp2 job the densest offset was a period (1.1 ms) off.

How: each part (ranks whose clocks already agree: one host, or hosts a collective joins) is
moved onto the clock of the parts placed so far by the offset, among the densest windows of
its answering batches' end differences, under which the rendezvous rule (p2p_rendezvous)
names the most ops in the groups they share. A period off, its batches meet batches that talk
to a third part; those exchanges then do not close and are not named, so the true offset names
more (on the generator's pp8 job with a host per stage, placing each part against its
neighbour alone picked the period). A tie, or no op named across, leaves the part apart: its
batches then never meet another part's.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ranklens.ingest.p2p_rendezvous import Batch, by, in_flight_together, solve_all

CANDIDATES = 12  # offsets tried per part: the densest windows of the end differences

Groups = dict[str, tuple[int, list[int]]]  # group -> (size, ranks in stage order)


def place(batches: list[Batch], groups: Groups, ref: str, tol: int) -> list[Batch]:
    """The batches, each part that can be placed moved onto part `ref`'s clock (and named
    `ref`), breadth first from it through parts that hold adjacent stages of a group."""
    parts = by(batches, lambda b: b.part)
    if len(parts) < 2 or ref not in parts:
        return batches
    at: dict[tuple[str, int], set[str]] = defaultdict(set)
    for b in batches:
        at[b.group, b.pos].add(b.part)
    near: dict[str, set[str]] = defaultdict(set)
    for (g, pos), here in at.items():
        for p in here:
            near[p] |= (at.get((g, pos + 1), set()) | at.get((g, pos - 1), set())) - {p}
    done = {ref: parts[ref]}
    frontier = [ref]
    while frontier:
        q = frontier.pop(0)
        for p in sorted(near[q] - done.keys()):
            shift = _offset([b for bs in done.values() for b in bs], parts[p], groups, tol)
            if shift is not None:
                done[p] = [_moved(b, shift, ref) for b in parts[p]]
                frontier.append(p)
    apart = [b for p, bs in parts.items() if p not in done for b in bs]
    return [b for bs in done.values() for b in bs] + apart


def _offset(placed: list[Batch], other: list[Batch], groups: Groups, tol: int) -> int | None:
    """The shift of `other`'s clock onto `placed`'s (every part placed so far) under which the
    rule names the most ops in the groups they share (a tie, or none across: None). All of
    `placed` takes part: a shift a period off pairs `other`'s batches with batches that talk
    to a third part, whose own rendezvous then fail, so it names fewer."""
    # Only the stages near `other`'s can change: its neighbours and theirs (the third part).
    near = {(b.group, b.pos + d) for b in other for d in (-2, -1, 0, 1, 2)}
    placed = [b for b in placed if (b.group, b.pos) in near]
    shared = {b.group for b in placed}
    other = [b for b in other if b.group in shared]
    scores: list[tuple[int, int, int]] = []  # (named, named across, shift)
    for shift in _candidates(placed, other, tol):
        moved = [_moved(b, shift) for b in other]
        part_of = {op[0]: b.part for b in placed + moved for op in b.sends + b.recvs}
        named = across = 0
        for g, bs in by(placed + moved, lambda b: b.group).items():
            found = solve_all(bs, groups[g][1], tol)
            if in_flight_together(found, tol):
                named += len(found)
                across += sum(1 for _op, peer, b in found if part_of.get(peer) != b.part)
        scores.append((named, across, shift))
    scores.sort(reverse=True)
    best = scores[0] if scores else None
    if best is None or best[1] == 0 or (len(scores) > 1 and scores[1][0] == best[0]):
        return None
    return best[2]


def _candidates(placed: list[Batch], other: list[Batch], tol: int) -> list[int]:
    """Shifts that make a batch of `other` end with an answering batch (its sends the other's
    recvs) of an adjacent stage in `placed`: the middles of the densest windows, best first."""
    ends: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for b in placed:
        ends[b.group, b.pos, b.step, len(b.sends), len(b.recvs)].append(b.end)
    diffs: list[int] = []
    for b in other:
        for pos in (b.pos - 1, b.pos + 1):
            key = (b.group, pos, b.step, len(b.recvs), len(b.sends))
            diffs += [e - b.end for e in ends.get(key, [])]
    diffs.sort()
    windows: list[tuple[int, int]] = []
    lo = 0
    for hi, d in enumerate(diffs):
        while diffs[lo] < d - tol:
            lo += 1
        windows.append((hi - lo + 1, diffs[(lo + hi) // 2]))
    out: list[int] = []
    for _count, d in sorted(windows, reverse=True):
        if all(abs(d - o) > tol for o in out):
            out.append(d)
            if len(out) == CANDIDATES:
                break
    return out


def _moved(b: Batch, shift: int, part: str | None = None) -> Batch:
    """`b` on another clock (its op lists shared: nothing here changes them)."""
    return Batch(
        b.group,
        b.part if part is None else part,
        b.pos,
        b.start + shift,
        b.end + shift,
        b.step,
        b.sends,
        b.recvs,
        b.sizes,
    )
