"""Cross-rank work done once after all ranks are in: comm args, peers, process groups.

Why SQL: these are joins over millions of rows that DuckDB does in parallel and out of core;
Python never loops over events here. (Per-rank work, the steps, is done in steps.py.)
"""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa
from ranklens.ingest.database import registered
from ranklens.ingest.groups import label_from_description


def finish_database(con: duckdb.DuckDBPyConnection, groups: list[dict[str, Any]]) -> None:
    """Fill in what needs every rank: comm args from launching ops, process groups.
    (Steps are assigned per rank before its events are written: steps.py; the views over the
    tables, events_aligned included, come with the schema: schema.VIEWS_SQL.)"""
    _fill_comm_args(con)
    _fill_peers(con)
    _insert_groups(con, groups)


def fill_pids(con: duckdb.DuckDBPyConnection) -> None:
    """A rank whose trace names no process takes its host events' usual pid. Last, on the
    whole `events` (a sharded run's cross-rank stage sees only communication rows)."""
    con.execute(
        """UPDATE ranks SET pid = p.pid FROM (SELECT rank, mode(pid) AS pid FROM events
           WHERE device = -1 GROUP BY rank) p WHERE ranks.rank = p.rank AND ranks.pid IS NULL"""
    )


def _fill_comm_args(con: duckdb.DuckDBPyConnection) -> None:
    """Comm kernels without args inherit them from the host op that launched them
    (record_param_comms / c10d op with the same External id)."""
    con.execute(
        """UPDATE events_rich AS e SET pg_name = src.pg_name, in_nelems = src.in_nelems,
             out_nelems = src.out_nelems, dtype = src.dtype, group_size = src.group_size,
             seq = coalesce(e.seq, src.seq),
             coll_op = coalesce(src.coll_op, e.coll_op)
           FROM (SELECT rank, external_id, any_value(pg_name) AS pg_name,
                   any_value(in_nelems) AS in_nelems, any_value(out_nelems) AS out_nelems,
                   any_value(dtype) AS dtype, any_value(group_size) AS group_size,
                   any_value(seq) AS seq, any_value(coll_op) AS coll_op
                 FROM events WHERE device = -1 AND pg_name IS NOT NULL
                   AND external_id IS NOT NULL GROUP BY ALL) src
           WHERE e.kind = 'comm' AND e.device >= 0 AND e.pg_name IS NULL
             AND e.rank = src.rank AND e.external_id = src.external_id"""
    )


def _fill_peers(con: duckdb.DuckDBPyConnection) -> None:
    """Comm kernels take the p2p peer of their launching host op (record_param_comms' `Dst
    Rank` / `Src Rank`; NCCL kernels never carry it). Apart from _fill_comm_args because newer
    kernels have their own args but still no peer. An External id shared by ops with different
    peers (batched isend/irecv in one kernel) gives none: the kernel's peer is not one rank."""
    con.execute(
        """UPDATE events_rich AS e SET peer = src.peer
           FROM (SELECT rank, external_id, min(peer) AS peer
                 FROM events WHERE device = -1 AND peer IS NOT NULL AND external_id IS NOT NULL
                 GROUP BY rank, external_id HAVING min(peer) = max(peer)) src
           WHERE e.kind = 'comm' AND e.device >= 0 AND e.peer IS NULL
             AND e.rank = src.rank AND e.external_id = src.external_id"""
    )


def _insert_groups(con: duckdb.DuckDBPyConnection, groups: list[dict[str, Any]]) -> None:
    """Merge the groups every rank reported (same pg_name = same group) and label them."""
    merged: dict[str, dict[str, Any]] = {}
    for g in groups:
        cur = merged.setdefault(g["pg_name"], dict(g))
        for key in ("pg_desc", "backend", "size"):
            if cur.get(key) is None and g.get(key) is not None:
                cur[key] = g[key]
        if g.get("ranks"):
            # pg_config lists members in group-rank order: keep the first full list, add others
            # (a set: the world group of 1,024 ranks is reported 1,024 times)
            known = list(cur.get("ranks") or [])
            seen = set(known)
            cur["ranks"] = known + [r for r in g["ranks"] if r not in seen]
        if g.get("source") == "pg_config":
            cur["source"] = "pg_config"
    world = con.execute("SELECT max(world_size) FROM ranks").fetchall()[0][0]
    rows = []
    for name in sorted(merged, key=lambda n: (len(n), n)):
        g = merged[name]
        size = g.get("size") or (len(g["ranks"]) if g.get("ranks") else None)
        label, evidence = label_from_description(g.get("pg_desc"), size, world)
        rows.append(
            [
                name,
                g.get("pg_desc"),
                g.get("ranks"),
                size,
                g.get("backend"),
                label,
                evidence,
                g.get("source"),
            ]
        )
    if rows:  # one statement: executemany pays ~0.2 ms a row (417 groups at 1,024 ranks)
        cols = list(zip(*rows, strict=True))
        types = [_TEXT, _TEXT, pa.list_(pa.int32()), pa.int32(), _TEXT, _TEXT, _TEXT, _TEXT]
        table = pa.table([pa.array(c, t) for c, t in zip(cols, types, strict=True)], names=_PG)
        with registered(con, "_groups", table):
            con.execute("INSERT INTO process_groups SELECT * FROM _groups")


_TEXT = pa.string()
_PG = ["pg_name", "pg_desc", "ranks", "size", "backend", "parallelism", "evidence", "source"]
