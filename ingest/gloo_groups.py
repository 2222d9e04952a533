"""Process groups of CPU (gloo) communication, which torch records without any group metadata.

Why: in CPU traces a collective executes as a `gloo:<op>` span on one of its group's
`pt_gloo_runloop` worker threads, and a p2p wait as `gloo:send`/`gloo:recv` on the main thread;
no event names its process group. Without a group there is no matching, no parallelism and no
straggler analysis, so the group is inferred here and written to `events.pg_name`.

Worker threads: each thread belongs to exactly one group. A thread of group g on rank r runs
the same ops as g's other members, and every execution of a collective overlaps in time on all
members (no rank can finish before every rank has contributed), while on one host the clocks
agree. So for each thread and each candidate group (the groups `pg_config` says the rank is
in), the score is the share of the thread's spans that have a distinct, time-overlapping span
of the same op and shape on every other member (one-to-one, greedy in time order); the best
group wins, a larger group on a near-tie (a group's collectives also overlap on any subset of
its members). A group chosen on only some of its members is then withdrawn on those ranks and
they take their next candidate, until the choice is consistent.

P2P: `c10d::send`/`c10d::recv_` carry the peer as a group-local rank (`Concrete Inputs`) but not
the group; the group is the one in which the peer's reverse ops (recv from / send to this
rank's local index) exist in the same number. The k-th issue op of a rank pairs with its k-th
`gloo:send`/`gloo:recv` wait span. Ambiguities are written into `process_groups.evidence`.
"""

from __future__ import annotations

import bisect
import json
from collections import defaultdict
from dataclasses import dataclass

import duckdb
import pyarrow as pa
from ranklens.ingest.database import registered
from ranklens.ingest.groups import label_from_description

_MIN_SCORE = 0.5  # a thread whose best group explains less than half its spans stays unknown
_NEAR_TIE = 0.1
_MAX_OP_NS = 60_000_000_000
# Members of one group finish a collective together; unrelated groups that merely overlap in
# time finish independently. A larger group is preferred only if its members are about as
# tightly coupled as the best candidate's (its gap is a max over more members).
_GAP_FACTOR = 2.0
_GAP_SLACK_NS = 50_000


@dataclass(frozen=True)
class _Group:
    name: str
    desc: str | None
    ranks: tuple[int, ...]


def attribute_gloo(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Set `pg_name` (and `peer`, `group_size`) on gloo comm events; returns counts for meta."""
    groups = [
        _Group(n, d, tuple(int(x) for x in r))
        for n, d, r in con.execute(
            "SELECT pg_name, pg_desc, ranks FROM process_groups WHERE size >= 2 "
            "AND ranks IS NOT NULL ORDER BY length(pg_name), pg_name"
        ).fetchall()
    ]
    if not groups:
        return {}
    threads = _worker_threads(con, groups)
    p2p = _p2p(con, groups)
    rows: dict[str, list[object]] = {
        k: [] for k in ("rank", "tid", "ts", "name", "pg", "peer", "gs")
    }
    size = {g.name: len(g.ranks) for g in groups}
    for (rank, tid), pg in threads.items():
        _append(rows, rank, tid, None, None, pg, None, size[pg])
    for rank, ts, name, pg, peer in p2p:
        _append(rows, rank, None, ts, name, pg, peer, size[pg])
    if not rows["rank"]:
        return {"gloo_threads": 0, "gloo_p2p": 0}
    with registered(
        con,
        "_gloo_map",
        pa.table(
            {
                "rank": pa.array(rows["rank"], pa.int32()),
                "tid": pa.array(rows["tid"], pa.int64()),
                "ts": pa.array(rows["ts"], pa.int64()),
                "name": pa.array(rows["name"], pa.string()),
                "pg": pa.array(rows["pg"], pa.string()),
                "peer": pa.array(rows["peer"], pa.int32()),
                "gs": pa.array(rows["gs"], pa.int32()),
            }
        ),
    ):
        con.execute(
            """UPDATE events_rich AS e SET pg_name = m.pg, group_size = m.gs FROM _gloo_map m
               WHERE m.tid IS NOT NULL AND e.kind = 'comm' AND e.device = -1
                 AND e.pg_name IS NULL AND e.rank = m.rank AND e.tid = m.tid
                 AND e.name LIKE 'gloo:%'"""
        )
        con.execute(
            """UPDATE events_rich AS e SET pg_name = m.pg, peer = m.peer, group_size = m.gs
               FROM _gloo_map m
               WHERE m.tid IS NULL AND e.kind = 'comm' AND e.device = -1
                 AND e.pg_name IS NULL AND e.rank = m.rank
                 AND e.ts_ns = m.ts AND e.name = m.name"""
        )
    return {"gloo_threads": len(threads), "gloo_p2p": len(p2p)}


def _append(rows: dict[str, list[object]], *vals: object) -> None:
    for key, v in zip(rows, vals, strict=True):
        rows[key].append(v)


# -- worker threads ----------------------------------------------------------------------------
_Spans = tuple[list[int], list[int]]  # starts, ends (sorted by start)


def _worker_threads(
    con: duckdb.DuckDBPyConnection, groups: list[_Group]
) -> dict[tuple[int, int], str]:
    """(rank, tid) -> pg_name for gloo worker threads."""
    data = con.execute(
        """SELECT rank, tid, name, coalesce(shapes, ''), ts_ns, ts_ns + dur_ns FROM events
           WHERE kind = 'comm' AND device = -1 AND pg_name IS NULL AND name LIKE 'gloo:%'
             AND name NOT IN ('gloo:send', 'gloo:recv')
           ORDER BY rank, tid, ts_ns"""
    ).fetchall()
    if not data:
        return {}
    by_thread: dict[tuple[int, int], list[tuple[str, int, int]]] = defaultdict(list)
    by_key: dict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)
    for rank, tid, name, shape, s, e in data:
        key = f"{name}|{shape}"
        by_thread[(int(rank), int(tid))].append((key, int(s), int(e)))
        by_key[(int(rank), key)].append((int(s), int(e)))
    index: dict[tuple[int, str], _Spans] = {}
    for k, v in by_key.items():
        v.sort()
        index[k] = ([s for s, _ in v], [e for _, e in v])
    present = {r for r, _ in by_thread}
    scores: dict[tuple[int, int], list[tuple[tuple[float, float], _Group]]] = {}
    for (rank, tid), spans in by_thread.items():
        cands = [g for g in groups if rank in g.ranks]
        scored = [(_score(rank, spans, g, index, present), g) for g in cands]
        scores[(rank, tid)] = scored
    keys = {t: {k for k, _s, _e in spans} for t, spans in by_thread.items()}
    return _consistent_choice(scores, keys, present)


def _score(
    rank: int,
    spans: list[tuple[str, int, int]],
    g: _Group,
    index: dict[tuple[int, str], _Spans],
    present: set[int],
) -> tuple[float, float]:
    """(share of `spans` with a distinct overlapping same-op span on every other member,
    median over those spans of the largest end gap to the partners)."""
    others = [q for q in g.ranks if q != rank and q in present]
    if not others:
        return 0.0, float("inf")
    gaps = [0.0] * len(spans)
    ok = [True] * len(spans)
    for q in others:
        used: dict[str, set[int]] = defaultdict(set)
        for i, (key, s, e) in enumerate(spans):
            starts, ends = index.get((q, key), ([], []))
            hi = bisect.bisect_right(starts, e)
            best: tuple[int, int] | None = None
            for j in range(hi - 1, -1, -1):
                if starts[j] < s - _MAX_OP_NS:
                    break  # nothing older can overlap a real op
                if ends[j] >= s and j not in used[key]:
                    gap = abs(ends[j] - e)
                    if best is None or gap < best[0]:
                        best = (gap, j)
            if best is None:
                ok[i] = False
            else:
                used[key].add(best[1])
                gaps[i] = max(gaps[i], float(best[0]))
    hit = sorted(gap for gap, good in zip(gaps, ok, strict=True) if good)
    if not hit:
        return 0.0, float("inf")
    return len(hit) / len(spans), hit[len(hit) // 2]


def _pick(scored: list[tuple[tuple[float, float], _Group]]) -> _Group | None:
    """Best-explained group; among those as tightly coupled as the best, the largest."""
    if not scored:
        return None
    best = max(share for (share, _gap), _g in scored)
    if best < _MIN_SCORE:
        return None
    near = [(gap, g) for (share, gap), g in scored if share >= best - _NEAR_TIE]
    tight = min(gap for gap, _g in near)
    coupled = [g for gap, g in near if gap <= _GAP_FACTOR * tight + _GAP_SLACK_NS]
    coupled.sort(key=lambda g: (-len(g.ranks), g.desc == "default_pg", len(g.name), g.name))
    return coupled[0]


def _consistent_choice(
    scores: dict[tuple[int, int], list[tuple[tuple[float, float], _Group]]],
    keys: dict[tuple[int, int], set[str]],
    present: set[int],
) -> dict[tuple[int, int], str]:
    """Pick per thread; withdraw a group from threads whose ops it then runs on only part of
    its members, and repeat until every (group, op) runs on all present members."""
    banned: dict[tuple[int, int], set[str]] = defaultdict(set)
    choice: dict[tuple[int, int], _Group] = {}
    for _ in range(len(scores) + 1):
        choice = {}
        for key, scored in scores.items():
            g = _pick([(sc, g) for sc, g in scored if g.name not in banned[key]])
            if g is not None:
                choice[key] = g
        on: dict[tuple[str, str], set[int]] = defaultdict(set)
        for (rank, tid), g in choice.items():
            for op in keys[(rank, tid)]:
                on[(g.name, op)].add(rank)
        changed = False
        for key, g in choice.items():
            members = {q for q in g.ranks if q in present}
            if any(on[(g.name, op)] != members for op in keys[key]):
                banned[key].add(g.name)
                changed = True
        if not changed:
            break
    return {k: g.name for k, g in choice.items()}


# -- point-to-point ----------------------------------------------------------------------------
def _local_peer(concrete: str | None) -> int | None:
    """Group-local peer of `c10d::send`/`c10d::recv_`: Concrete Inputs ["", "", peer, tag]."""
    try:
        vals = json.loads(concrete or "")
        return int(vals[2])
    except (ValueError, TypeError, IndexError):
        return None


def _p2p(
    con: duckdb.DuckDBPyConnection, groups: list[_Group]
) -> list[tuple[int, int, str, str, int]]:
    """(rank, ts_ns, span name, pg_name, global peer) for gloo:send/gloo:recv wait spans."""
    issues = con.execute(
        """SELECT rank, CASE WHEN name = 'c10d::send' THEN 'send' ELSE 'recv' END, concrete
           FROM events WHERE device = -1 AND name IN ('c10d::send', 'c10d::recv_')
           ORDER BY rank, ts_ns"""
    ).fetchall()
    waits = con.execute(
        """SELECT rank, CASE WHEN name = 'gloo:send' THEN 'send' ELSE 'recv' END, ts_ns, name
           FROM events WHERE kind = 'comm' AND device = -1 AND pg_name IS NULL
             AND name IN ('gloo:send', 'gloo:recv') ORDER BY rank, ts_ns"""
    ).fetchall()
    if not issues or not waits:
        return []
    peers: dict[tuple[int, str], list[int | None]] = defaultdict(list)
    for rank, d, conc in issues:
        peers[(int(rank), d)].append(_local_peer(conc))
    spans: dict[tuple[int, str], list[tuple[int, str]]] = defaultdict(list)
    for rank, d, ts, name in waits:
        spans[(int(rank), d)].append((int(ts), name))
    count: dict[tuple[int, str, int], int] = defaultdict(int)
    for (rank, d), lst in peers.items():
        for lp in lst:
            if lp is not None:
                count[(rank, d, lp)] += 1
    resolved: dict[tuple[int, str, int], tuple[str, int]] = {}
    for rank, d, lp in count:
        opp = "recv" if d == "send" else "send"
        cands = []
        for g in groups:
            if rank not in g.ranks or lp >= len(g.ranks) or g.ranks[lp] == rank:
                continue
            q = g.ranks[lp]
            back = count.get((q, opp, g.ranks.index(rank)), 0)
            if back:
                # Same counts first; among groups of identical members, the one named for
                # pipeline traffic, then any not the default group.
                pp = label_from_description(g.desc, None, None)[0] == "PP"
                cands.append(
                    (
                        (abs(back - count[(rank, d, lp)]), not pp, g.desc == "default_pg"),
                        len(g.ranks),
                        g.name,
                        q,
                    )
                )
        if cands:
            cands.sort()
            resolved[(rank, d, lp)] = (cands[0][2], cands[0][3])
    out: list[tuple[int, int, str, str, int]] = []
    for key, waits_of in spans.items():
        lps = peers.get(key, [])
        if len(lps) != len(waits_of):
            continue  # issue ops and waits do not pair one-to-one: leave them unknown
        for (ts, name), lp in zip(waits_of, lps, strict=True):
            hit = resolved.get((key[0], key[1], lp)) if lp is not None else None
            if hit is not None:
                out.append((key[0], ts, name, hit[0], hit[1]))
    return out
