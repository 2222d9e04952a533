"""Cross-rank work after every rank is in: groups of unlabeled communication, collective
matching, clock alignment and parallelism attribution (in that order: each needs the last;
send/recv without peers are paired after a first alignment and matched again).

Why one entry point: the loader calls it once, and what it did is recorded in `meta` so a
report can say how far the cross-rank numbers can be trusted. Why two halves: the first
(`attribute_communication`) needs no option and rewrites events; the second
(`match_align_label`) depends on the layout and offsets and only writes small tables, so
`ranklens realign` (realign.py) re-runs it on a stored run without its traces.
"""

from __future__ import annotations

from collections import defaultdict

import duckdb
import pyarrow as pa
from ranklens.ingest.clock import align_clocks
from ranklens.ingest.communicators import infer_communicators
from ranklens.ingest.config import RunOptions
from ranklens.ingest.database import registered
from ranklens.ingest.gloo_groups import attribute_gloo
from ranklens.ingest.groups import attribute
from ranklens.ingest.matching import match_collectives
from ranklens.ingest.p2p_batch_peers import infer_batched
from ranklens.ingest.p2p_batches import link_batches
from ranklens.ingest.p2p_infer import (
    candidate_pairs,
    has_unknown,
    infer_by_stream,
    infer_peers,
)


def finish_cross_rank(con: duckdb.DuckDBPyConnection, options: RunOptions | None = None) -> None:
    """Attribute, match, align and label; write a summary into `meta`."""
    facts = attribute_communication(con)
    facts.update(match_align_label(con, options or RunOptions()))
    con.executemany("INSERT INTO meta VALUES (?, ?)", sorted(facts.items()))


def check_layout(con: duckdb.DuckDBPyConnection, options: RunOptions | None) -> None:
    """A layout that cannot describe the run is refused (before it labels any group)."""
    if options is None or options.layout is None:
        return
    world, top = con.execute("SELECT max(world_size), max(rank) FROM ranks").fetchall()[0]
    options.layout.check_fits(None if world is None else int(world), int(top))


def attribute_communication(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """Give communication the traces left unlabelled a group (batched p2p kernels, gloo
    threads, inferred communicators). It writes `events`, takes no option, and so is done once
    at ingest: `realign` starts from what it stored."""
    facts: dict[str, str] = {}
    n_ranks, world = con.execute("SELECT count(*), max(world_size) FROM ranks").fetchall()[0]
    facts["p2p_batched_kernels"] = str(link_batches(con))
    for k, v in attribute_gloo(con).items():
        facts[k] = str(v)
    if n_ranks > 1 and (world is None or n_ranks >= world):
        # Communication no trace labelled (old Kineto, Nsight): communicators from op sequences.
        # Only with every rank present: two sampled ranks of 128 running SendRecv kernels need
        # not talk to each other, and pairing them by order would invent collectives.
        facts["inferred_groups"] = str(infer_communicators(con))
        facts["inferred_groups_merged"] = str(_merge_inferred(con))
    return facts


def match_align_label(con: duckdb.DuckDBPyConnection, opts: RunOptions) -> dict[str, str]:
    """Match collectives, align clocks and label groups: the part that depends on the options
    (user offsets steer p2p peer inference too). It writes `collectives`, the clock columns of
    `ranks` and `process_groups`' labels, never `events`, so it can run again (`realign`).
    Returns its facts for `meta` (keys: `realign.FACT_KEYS`)."""
    facts: dict[str, str] = {}
    statuses = match_collectives(con)
    if has_unknown(con):
        # Send/recv without peers: pair neighbours' stream classes, then (for what stays)
        # align on every adjacent-stage pairing (the true ones agree) and pair op by op.
        hints = infer_by_stream(con)
        statuses = match_collectives(con, hints)
        if has_unknown(con):
            align_clocks(con, opts, candidate_pairs(con))
            hints = pa.concat_tables([hints, infer_batched(con), infer_peers(con)])
            statuses = match_collectives(con, hints)
        facts["p2p_peers_inferred"] = str(hints.num_rows)
    for status, n in statuses.items():
        facts[f"collectives_{status}"] = str(n)
    facts.update(align_clocks(con, opts).summary)
    label_groups(con, opts)
    if opts.layout is not None:
        facts["layout"] = opts.layout.describe()
    for key, src in opts.sources.items():
        facts[f"option_{key}"] = src
    return facts


def _merge_inferred(con: duckdb.DuckDBPyConnection) -> int:
    """An inferred communicator whose members are exactly those of one group the traces
    declared (pg_config) is that group: its events take the declared name."""
    pairs = con.execute(
        """SELECT i.pg_name, min(g.pg_name) FROM process_groups i JOIN process_groups g
             ON list_sort(i.ranks) = list_sort(g.ranks) AND g.source <> i.source
           WHERE i.source = 'inferred_sequence' GROUP BY i.pg_name HAVING count(*) = 1"""
    ).fetchall()
    for inferred, known in pairs:
        con.execute(
            "UPDATE events_rich SET pg_name = ? WHERE kind = 'comm' AND pg_name = ?",
            [known, inferred],
        )
        con.execute("DELETE FROM process_groups WHERE pg_name = ?", [inferred])
    return len(pairs)


def label_groups(con: duckdb.DuckDBPyConnection, options: RunOptions) -> None:
    """Set `process_groups.parallelism` and `evidence` from every kind of evidence."""
    world = con.execute("SELECT max(world_size) FROM ranks").fetchall()[0][0]
    ops: dict[str, dict[str, int]] = defaultdict(dict)
    for pg, op, n in con.execute(
        "SELECT pg_name, op, count(*) FROM collectives WHERE pg_name IS NOT NULL GROUP BY ALL"
    ).fetchall():
        ops[str(pg)][str(op)] = int(n)
    labels: dict[str, tuple[str | None, str | None]] = {}  # a repeated name: its last row's
    for pg, desc, ranks, size in con.execute(
        "SELECT pg_name, pg_desc, ranks, size FROM process_groups"
    ).fetchall():
        labels[pg] = attribute(desc, ranks, size, world, ops.get(pg, {}), options.layout)
    if labels:  # one UPDATE, not one per group (each of which scans the table)
        got = pa.table(
            {
                "pg": pa.array(list(labels), pa.string()),
                "label": pa.array([v[0] for v in labels.values()], pa.string()),
                "why": pa.array([v[1] for v in labels.values()], pa.string()),
            }
        )
        with registered(con, "_labels", got):
            con.execute(
                "UPDATE process_groups SET parallelism = u.label, evidence = u.why "
                "FROM _labels u WHERE process_groups.pg_name = u.pg"
            )
