"""Clock-offset injection: shift real ranks' clocks by known per-host offsets, align, compare.

Why: the only ground truth for alignment is an offset we put in ourselves. Ranks of a real run
(one machine's clock, or whatever clocks they had) are regrouped into "hosts", every timestamp
of a host's ranks is shifted by that host's offset, and the estimate must move by exactly
minus the shift: error = (recovered offset - reference host's) - -(injected - reference's).
Matching is order-based, so shifting the matched collectives equals re-ingesting shifted traces.
Used by tests/ingest/test_clock.py and benchmarks/bench_align.py.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import duckdb
from ranklens.ingest.clock import align_clocks
from ranklens.ingest.config import RunOptions


@dataclass(frozen=True)
class Trial:
    """One injection: hosts of ranks, injected offsets (ns), errors per non-reference host."""

    hosts: dict[int, str]
    injected_ns: dict[str, int]
    errors_ns: dict[str, int]


def load_tables(db_path: str | os.PathLike[str]) -> duckdb.DuckDBPyConnection:
    """An in-memory copy of a run's `ranks` and `collectives` (all alignment reads)."""
    con = duckdb.connect()
    con.execute(f"ATTACH '{db_path}' AS src (READ_ONLY)")
    con.execute("CREATE TABLE ranks AS SELECT * FROM src.ranks")
    con.execute("CREATE TABLE collectives AS SELECT * FROM src.collectives")
    con.execute("DETACH src")
    return con


def inject(
    con: duckdb.DuckDBPyConnection, hosts: dict[int, str], injected_ns: dict[str, int]
) -> Trial:
    """Regroup ranks into hosts, shift their clocks, align; con keeps the original tables."""
    con.execute("CREATE OR REPLACE TEMP TABLE _orig_c AS SELECT * FROM collectives")
    con.execute("CREATE OR REPLACE TEMP TABLE _orig_r AS SELECT * FROM ranks")
    try:
        shift = {r: injected_ns[h] for r, h in hosts.items()}
        con.executemany(
            "UPDATE ranks SET host = ? WHERE rank = ?", [[h, r] for r, h in hosts.items()]
        )
        con.executemany(
            "UPDATE collectives SET ts_ns = ts_ns + ?, end_ns = end_ns + ?, "
            "arrive_ns = arrive_ns + ? WHERE rank = ?",
            [[s, s, s, r] for r, s in shift.items()],
        )
        align_clocks(con, RunOptions())
        got = dict(con.execute("SELECT rank, clock_offset_ns FROM ranks").fetchall())
    finally:
        con.execute("DELETE FROM collectives")
        con.execute("INSERT INTO collectives SELECT * FROM _orig_c")
        con.execute("DELETE FROM ranks")
        con.execute("INSERT INTO ranks SELECT * FROM _orig_r")
    ref_rank = min(hosts)
    ref = hosts[ref_rank]
    errors = {}
    for r, h in sorted(hosts.items()):
        if h == ref or h in errors:
            continue
        want = -(injected_ns[h] - injected_ns[ref])
        errors[h] = int(got[r] - got[ref_rank]) - want
    return Trial(hosts, injected_ns, errors)


def random_trials(
    con: duckdb.DuckDBPyConnection,
    ranks_per_host: int,
    n_trials: int,
    seed: int = 0,
    max_ns: int = 50_000_000,
) -> list[Trial]:
    """Trials with ranks dealt to hosts at random (so the error is measured over many
    groupings, not one) and offsets log-uniform in [1 µs, max_ns], random sign, per host."""
    rng = random.Random(seed)
    ranks = [r for (r,) in con.execute("SELECT rank FROM ranks ORDER BY rank").fetchall()]
    out = []
    for _ in range(n_trials):
        order = ranks[:]
        rng.shuffle(order)
        hosts = {r: f"h{i // ranks_per_host}" for i, r in enumerate(order)}
        inj = {
            h: int(rng.choice((-1, 1)) * 10 ** rng.uniform(3, len(str(max_ns)) - 1))
            for h in sorted(set(hosts.values()))
        }
        out.append(inject(con, hosts, inj))
    return out


def errors_of(trials: list[Trial]) -> list[int]:
    """Absolute errors (ns) of every non-reference host over the trials."""
    return sorted(abs(e) for t in trials for e in t.errors_ns.values())
