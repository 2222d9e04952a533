"""Infer communicators (process groups) for communication events that name none.

Why: Nsight exports carry no process-group metadata (NCCL's NVTX payload, when present, is used
at ingest), yet matching collectives across ranks needs to know which ranks took part. The
ranks of one communicator run the same collectives, with the same sizes, in the same order.

How: every communication event without `pg_name` gets a *type* = (op, size), with op =
`coll_op` (else the event name) and size = `bytes` (else `in_nelems`; NULL when unknown). The
set of ranks that ran a type is its candidate membership; types with identical memberships are
one communicator (a TP pair that all-reduces and all-gathers is one group). Streams are not part
of the key because CUDA stream ids differ between processes (one rank's NCCL stream is 7, the
other's 15 in a real two-rank export). Evidence records the types, per-rank counts, whether the
members ran them in the same order, and any disagreement with a `group_size` the events report.

Limits (stated in each group's evidence when they apply): communicators of identical shape
(e.g. four TP groups all-reducing the same tensor sizes) are indistinguishable by this and
merge into one group; so do a sub-group's and a larger group's collectives of the same op and
size on the same ranks. When sizes are unknown, the op alone is the type.
"""

from __future__ import annotations

from collections import defaultdict

import duckdb
import pyarrow as pa
from ranklens.ingest.database import registered

SOURCE = "inferred_sequence"
_MAX_TYPES_SHOWN = 4


def _fmt_type(op: str, size: int | None) -> str:
    return f"{op}({size} B)" if size is not None else op


def infer_communicators(con: duckdb.DuckDBPyConnection) -> int:
    """Create `process_groups` rows for comm events with pg_name NULL and label the events.

    Returns the number of groups created.
    """
    rows = con.execute(
        """SELECT rank, coalesce(coll_op, name) AS op, coalesce(bytes, in_nelems) AS size,
                  count(*) AS n, max(group_size) AS gs
           FROM events WHERE kind = 'comm' AND pg_name IS NULL AND rank IS NOT NULL
           GROUP BY ALL"""
    ).fetchall()
    if not rows:
        return 0
    members: dict[tuple[str, int | None], dict[int, tuple[int, int | None]]] = defaultdict(dict)
    for rank, op, size, n, gs in rows:
        members[(op, size)][int(rank)] = (int(n), gs)
    groups: dict[tuple[int, ...], list[tuple[str, int | None]]] = defaultdict(list)
    for typ, per_rank in members.items():
        groups[tuple(sorted(per_rank))].append(typ)
    # time-ordered types per rank: only to compare members' orders (a capture of one rank's
    # 250 k NCCL kernels spent 0.18 s fetching them for nothing)
    order = _orders(con) if any(len(r) > 1 for r in groups) else {}
    taken = {r[0] for r in con.execute("SELECT pg_name FROM process_groups").fetchall()}
    backends = dict(con.execute("SELECT rank, backend FROM ranks").fetchall())
    mapping: dict[str, list[object]] = {"op": [], "size": [], "rank": [], "pg": [], "gs": []}
    made = 0
    index = 0
    for ranks, types in sorted(groups.items(), key=lambda kv: (len(kv[0]), kv[0])):
        while f"inferred:{index}" in taken:
            index += 1
        name = f"inferred:{index}"
        taken.add(name)
        types.sort(key=lambda t: (t[0], -1 if t[1] is None else t[1]))
        evidence = _evidence(ranks, types, members, order)
        kinds = {backends.get(r) for r in ranks}
        backend = kinds.pop() if len(kinds) == 1 else None
        con.execute(
            "INSERT INTO process_groups VALUES (?, NULL, ?, ?, ?, NULL, ?, ?)",
            [name, list(ranks), len(ranks), backend, evidence, SOURCE],
        )
        for op, size in types:
            for r in ranks:
                for k, v in zip(mapping, (op, size, r, name, len(ranks)), strict=True):
                    mapping[k].append(v)
        made += 1
    with registered(
        con,
        "_ic_map",
        pa.table(
            {
                "op": pa.array(mapping["op"], pa.string()),
                "size": pa.array(mapping["size"], pa.int64()),
                "rank": pa.array(mapping["rank"], pa.int32()),
                "pg": pa.array(mapping["pg"], pa.string()),
                "gs": pa.array(mapping["gs"], pa.int32()),
            }
        ),
    ):
        con.execute(
            """UPDATE events_rich AS e SET pg_name = m.pg, group_size = coalesce(e.group_size, m.gs)
               FROM _ic_map m
               WHERE e.kind = 'comm' AND e.pg_name IS NULL AND e.rank = m.rank
                 AND coalesce(e.coll_op, e.name) = m.op
                 AND coalesce(e.bytes, e.in_nelems) IS NOT DISTINCT FROM m.size"""
        )
    return made


def _orders(con: duckdb.DuckDBPyConnection) -> dict[int, list[tuple[str, int | None]]]:
    """Per rank, the unlabelled comm events' types in time order."""
    out: dict[int, list[tuple[str, int | None]]] = defaultdict(list)
    for rank, op, size in con.execute(
        """SELECT rank, coalesce(coll_op, name), coalesce(bytes, in_nelems) FROM events
               WHERE kind = 'comm' AND pg_name IS NULL AND rank IS NOT NULL
               ORDER BY rank, ts_ns, stream"""
    ).fetchall():
        out[int(rank)].append((op, size))
    return out


def _evidence(
    ranks: tuple[int, ...],
    types: list[tuple[str, int | None]],
    members: dict[tuple[str, int | None], dict[int, tuple[int, int | None]]],
    order: dict[int, list[tuple[str, int | None]]],
) -> str:
    """Why these ranks form a group, and what might be wrong with it."""
    parts = []
    for t in types[:_MAX_TYPES_SHOWN]:
        counts = sorted({n for n, _gs in members[t].values()})
        shown = counts[0] if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
        parts.append(f"{_fmt_type(*t)} x{shown}")
    if len(types) > _MAX_TYPES_SHOWN:
        parts.append(f"and {len(types) - _MAX_TYPES_SHOWN} more types")
    text = (
        f"ranks {', '.join(map(str, ranks))} (and no other rank) ran "
        f"{'; '.join(parts)} with no process group recorded"
    )
    if len(ranks) > 1:
        mine = set(types)
        seqs = {r: [t for t in order.get(r, []) if t in mine] for r in ranks}
        ref = seqs[ranks[0]]
        diverge = [r for r in ranks[1:] if seqs[r] != ref]
        text += (
            "; same order on every member"
            if not diverge
            else f"; order differs on ranks {', '.join(map(str, diverge))} (trace windows may cut"
            " different collectives)"
        )
    sizes = {gs for t in types for _n, gs in members[t].values() if gs is not None}
    if sizes and sizes != {len(ranks)}:
        text += (
            f"; events report group size {sorted(sizes)}: several communicators of the same"
            " shape may be merged here"
        )
    return text
