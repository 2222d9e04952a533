"""What-if: re-time the dependency graph with one thing changed and say how much faster the step is.

Same order and dependencies, changed durations (graph_build.Graph, graph_replay.replay):
- `straggler[:R[,R..]]`: the ranks' compute at their peers' median (peers: the ranks of the
  same pipeline stage, all ranks without PP); without ranks, every rank above its peers'
  median comes down to it;
- `stage-balance`: each pipeline stage's compute at the mean over the stages (layers moved
  between stages: the total stays);
- `balance:PAR`: each rank's compute at the mean of its PAR group (e.g. `balance:cp`, a causal
  mask split evenly over the context-parallel ranks: the total stays);
- `contention`: compute kernels that ran beside communication at their alone duration (the
  contention analysis' per-class baseline on the same rank);
- `overlap:PAR`: the parallelism's communication fully hidden: no transfer time, and a
  collective's members no longer wait for each other (a recv still waits for its send: the
  data dependency of a pipeline stays); `dp` is data parallelism whole, DP_SHARD (FSDP/HSDP's
  shard groups) included, as elsewhere (run_profile.has); `dp_shard` is the shard part alone;
- `scale-comm:PAR=F`: its transfers F times faster (PAR as for overlap);
- `scale-kernels:REGEX=F`: compute/copy events whose name matches REGEX take F times as long.
The saving is replayed - predicted, both from the model, so the model's own error cancels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar

import duckdb
import numpy as np
import numpy.typing as npt
from ranklens.analysis import graph_replay as gr
from ranklens.analysis.graph_build import E_LAUNCH, E_OWN, E_TRANSFER, NEG, V_NODE, Graph
from ranklens.ingest.errors import RanklensError

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

KINDS = (
    "straggler",
    "stage-balance",
    "balance",
    "contention",
    "overlap",
    "scale-comm",
    "scale-kernels",
)


# the parallelisms a scenario's PAR stands for, when more than itself
FAMILY: dict[str, tuple[str, ...]] = {"DP": ("DP", "DP_SHARD")}


class WhatIfError(RanklensError):
    """A scenario the user wrote that cannot be read."""


@dataclass(frozen=True)
class Scenario:
    """One change to replay, as the user wrote it (`name`) and parsed."""

    name: str
    kind: str
    ranks: tuple[int, ...] = ()
    parallelism: str = ""
    factor: float = 1.0
    pattern: str = ""


def parse(text: str) -> Scenario:
    """'straggler:3', 'stage-balance', 'contention', 'overlap:dp', 'scale-comm:dp=2',
    'scale-kernels:gemm=0.8' -> Scenario (errors say what form is expected)."""
    kind, _, arg = text.strip().partition(":")
    kind = kind.strip().lower()
    hint = (
        "use straggler[:RANK,...], stage-balance, balance:PAR, contention, overlap:PAR, "
        "scale-comm:PAR=F or scale-kernels:REGEX=F (PAR: dp, tp, pp, cp, ep, ...)"
    )
    if kind == "straggler":
        try:
            ranks = tuple(int(x) for x in arg.split(",") if x.strip())
        except ValueError:
            raise WhatIfError(f"bad rank list in {text!r}", hint) from None
        return Scenario(text, kind, ranks=ranks)
    if kind in ("stage-balance", "contention") and not arg:
        return Scenario(text, kind)
    if kind in ("overlap", "balance") and arg:
        return Scenario(text, kind, parallelism=arg.strip().upper())
    if kind in ("scale-comm", "scale-kernels") and "=" in arg:
        what, _, f = arg.rpartition("=")
        try:
            factor = float(f)
        except ValueError:
            raise WhatIfError(f"bad factor in {text!r}", hint) from None
        if factor <= 0 or not what:
            raise WhatIfError(f"bad scenario {text!r}", hint)
        if kind == "scale-comm":
            return Scenario(text, kind, parallelism=what.strip().upper(), factor=factor)
        try:
            re.compile(what)
        except re.error as exc:
            raise WhatIfError(f"bad regular expression in {text!r}: {exc}", hint) from None
        return Scenario(text, kind, pattern=what, factor=factor)
    raise WhatIfError(f"unknown scenario {text!r}", hint)


# statuses whose members are in this run but that the graph could not join (matching.py)
UNLINKED_STATUSES = ("peer_unknown", "incomplete", "op_mismatch", "size_mismatch", "duplicate")
MAX_UNLINKED_SHARE = 0.02  # of the communication ops' time: above it, replays are blind


@dataclass(frozen=True)
class Unlinked:
    """Communication whose peers are in the run but that no matched instance joins.

    Why: the replay keeps such an op at its measured length, its wait included, so a fix that
    makes its peer earlier moves nothing behind it. Above MAX_UNLINKED_SHARE replays say so
    (a straggler's fix can read "saves 0"), and findings keep their estimate.
    """

    ops: int = 0
    share: float = 0.0  # of the communication ops' summed time (a ratio of op time)
    NOTE: ClassVar[str] = "unmatched comm keeps its measured waits"  # on each replayed scenario

    @property
    def blind(self) -> bool:
        return self.share > MAX_UNLINKED_SHARE

    def explain(self) -> str:
        return (
            f"{self.ops:,} comm ops ({self.share:.0%} of the communication time) have no "
            "matched peer: the replay keeps their measured waits, so it cannot see what a fix "
            "changes through them"
        )


def unlinked(con: duckdb.DuckDBPyConnection) -> Unlinked:
    """The run's unlinked communication (see Unlinked)."""
    row = con.execute(
        "SELECT count(*) FILTER (WHERE u), coalesce(sum(d) FILTER (WHERE u), 0), "
        "coalesce(sum(d), 0) FROM (SELECT status IN (SELECT unnest(?::VARCHAR[])) AS u, "
        "greatest(end_ns - ts_ns, 0) AS d FROM collectives)",
        [list(UNLINKED_STATUSES)],
    ).fetchone()
    n, part, total = (int(x) for x in row) if row else (0, 0, 0)
    return Unlinked(n, part / total if total else 0.0)


@dataclass
class Context:
    """What scenarios need besides the graph: stages, and per node the contention excess and
    the time of events matching a kernel pattern (read while the events are numbered)."""

    stage_of: dict[int, int]
    groups: dict[str, list[list[int]]] = field(default_factory=dict)  # parallelism -> members
    contention_ns: F64 | None = None
    pattern_ns: dict[str, F64] = field(default_factory=dict)
    unlinked: Unlinked = Unlinked()


@dataclass(frozen=True)
class Outcome:
    """A scenario's predicted step times (per step of g.steps) or why it does not apply; a
    prediction's note says when unmatched comm kept its waits (Unlinked)."""

    scenario: Scenario
    predicted: I64 | None
    note: str = ""


def groups(con: duckdb.DuckDBPyConnection) -> dict[str, list[list[int]]]:
    """Parallelism -> the member ranks of each of its groups."""
    out: dict[str, list[list[int]]] = {}
    for par, ranks in con.execute("SELECT parallelism, ranks FROM process_groups").fetchall():
        out.setdefault(str(par), []).append([int(r) for r in ranks or []])
    return out


def stages(con: duckdb.DuckDBPyConnection) -> dict[int, int]:
    """Rank -> its position in its pipeline group (no PP group: absent)."""
    rows = con.execute("SELECT ranks FROM process_groups WHERE parallelism = 'PP'").fetchall()
    return {int(r): i for (ranks,) in rows for i, r in enumerate(ranks or [])}


def durations(g: Graph, sc: Scenario, ctx: Context) -> tuple[I64, I64, str]:
    """The vertices' own times and the edges' lags under the scenario, and a note when it
    changes nothing (not applicable to this run)."""
    add = g.v_add.copy()
    lag = g.e_lag.copy()
    node_v = np.flatnonzero(g.v_kind == V_NODE)
    nodes = g.v_node[node_v]
    compute = g.n_busy[nodes, 0]
    if sc.kind in ("straggler", "stage-balance", "balance"):
        f = _compute_factor(g, sc, ctx)
        if f is None:
            what = "pipeline stages" if sc.kind == "stage-balance" else f"{sc.parallelism} group"
            return add, lag, f"no {what} in this run"
        add[node_v] -= np.rint(compute * (1.0 - f[g.n_rank[nodes]])).astype(np.int64)
    elif sc.kind == "contention":
        if ctx.contention_ns is None or not ctx.contention_ns.any():
            return add, lag, "no compute ran slower beside communication"
        add[node_v] -= np.rint(ctx.contention_ns[nodes]).astype(np.int64)
    elif sc.kind == "scale-kernels":
        t = ctx.pattern_ns.get(sc.pattern)
        if t is None or not t.any():
            return add, lag, f"no compute or copy event matches {sc.pattern!r}"
        add[node_v] -= np.rint(t[nodes] * (1.0 - sc.factor)).astype(np.int64)
    else:
        inst = np.isin(g.inst_par, FAMILY.get(sc.parallelism, (sc.parallelism,)))
        if not inst.any():
            return add, lag, f"no matched {sc.parallelism} communication in this run"
        tr = (g.e_kind == E_TRANSFER) & inst[np.maximum(g.e_inst, 0)]
        if sc.kind == "overlap":
            # hidden: no transfer time; a collective's members no longer wait for each other,
            # a receiver still needs its sender to have arrived (the data it computes on)
            lag[tr] = np.where(g.inst_p2p[g.e_inst[tr]], 0, NEG)
            scale = 0.0
        else:
            lag[tr] = np.rint(lag[tr] / sc.factor).astype(np.int64)
            scale = 1.0 / sc.factor
        own = g.e_kind == E_OWN
        hit = np.zeros(len(g.v_kind), dtype=bool)
        dst = np.repeat(np.arange(len(g.v_kind)), np.diff(g.ptr))
        hit[dst[tr]] = True
        sel = own & hit[dst]
        lag[sel] = np.rint(lag[sel] * scale).astype(np.int64)
    _launch_offsets(g, add, lag)
    return add, np.maximum(lag, NEG), ""


def _launch_offsets(g: Graph, add: I64, lag: I64) -> None:
    """A queued kernel sits earlier in a node whose work got shorter, so its launch constrains
    the node's start more (in proportion to how far into the node it was)."""
    la = np.flatnonzero(g.e_kind == E_LAUNCH)
    if len(la) == 0:
        return
    dst = np.repeat(np.arange(len(g.v_kind)), np.diff(g.ptr))[la]
    shrink = (g.v_add - add)[dst]
    lag[la] += np.rint(shrink * g.e_frac[la]).astype(np.int64)


def _compute_factor(g: Graph, sc: Scenario, ctx: Context) -> F64 | None:
    """Per rank: the factor its compute is scaled by."""
    n_ranks = int(g.n_rank.max()) + 1 if len(g.n_rank) else 0
    comp = np.bincount(g.n_rank, weights=g.n_busy[:, 0], minlength=n_ranks)
    present = np.bincount(g.n_rank, minlength=n_ranks) > 0
    stage = np.array([ctx.stage_of.get(r, 0) for r in range(n_ranks)])
    f = np.ones(n_ranks)
    if sc.kind == "balance":  # e.g. a causal mask split unevenly over context-parallel ranks
        found = [m for m in ctx.groups.get(sc.parallelism, []) if len(m) > 1]
        if not found:
            return None
        for members in found:
            mine = [r for r in members if r < n_ranks and present[r]]
            mean = float(np.mean(comp[mine])) if mine else 0.0
            for r in mine:
                if comp[r] > 0:
                    f[r] = mean / comp[r]
        return f
    if sc.kind == "stage-balance":
        if not ctx.stage_of:
            return None
        per_stage = {
            s: float(np.mean(comp[(stage == s) & present])) for s in set(stage[present].tolist())
        }
        mean = float(np.mean(list(per_stage.values())))
        for s, c in per_stage.items():
            if c > 0:
                f[stage == s] = mean / c
        return f
    targets = sc.ranks or tuple(int(r) for r in np.flatnonzero(present))
    for r in targets:
        if r >= n_ranks or not present[r] or comp[r] <= 0:
            continue
        peers = present & (stage == stage[r])
        if sc.ranks:
            peers[r] = False
        if not peers.any():
            continue
        med = float(np.median(comp[peers]))
        f[r] = min(1.0, med / comp[r])
    return f


def run_scenarios(g: Graph, scenarios: list[Scenario], ctx: Context) -> list[Outcome]:
    """Replay each scenario; predicted step times per step, or the note why it changes nothing."""
    out = []
    for sc in scenarios:
        add, lag, note = durations(g, sc, ctx)
        if note:
            out.append(Outcome(sc, None, note))
            continue
        blind = ctx.unlinked.NOTE if ctx.unlinked.blind else ""
        out.append(Outcome(sc, gr.step_times(g, gr.replay(g, add, lag)), blind))
    return out


def node_pattern_ns(con: duckdb.DuckDBPyConnection, g: Graph, pattern: str) -> F64:
    """Per node: summed duration of its compute/copy events whose name matches `pattern`
    (needs the numbered events, view _critical_path_ev; the pattern is a bound parameter)."""
    try:
        rows = con.execute(
            "SELECT eid, e - s FROM _critical_path_ev "
            "WHERE cls IN (0, 2) AND regexp_matches(name, ?)",
            [pattern],
        ).fetchnumpy()
    except duckdb.Error as exc:  # RE2 refuses what Python's re accepts (look-arounds)
        raise WhatIfError(
            f"the regular expression {pattern!r} is not one DuckDB (RE2) reads: {exc}",
            "use RE2 syntax: no look-arounds or back-references",
        ) from None
    eid = np.asarray(rows["eid"], dtype=np.int64)
    dur = np.asarray(rows[list(rows)[1]], dtype=np.float64)
    return np.bincount(g.ev_node[eid], weights=dur, minlength=len(g.n_start)).astype(np.float64)


def node_contention_ns(con: duckdb.DuckDBPyConnection, g: Graph) -> F64:
    """Per node: the time its compute kernels lost beside communication (dur - the class's
    alone median on the rank, for those that ran overlapped; contention.sql's definitions)."""
    rows = con.execute(
        "WITH k AS MATERIALIZED (SELECT * FROM contention_kernels(0.5)), "
        "b AS (SELECT rank, cls, op, median(dur) AS t_alone FROM k WHERE state = 'alone' "
        "      GROUP BY ALL HAVING count(*) >= 3) "
        "SELECT v.eid, k.dur - b.t_alone AS excess FROM k JOIN b USING (rank, cls, op) "
        "JOIN _critical_path_ev v ON v.rank = k.rank AND v.stream = k.stream AND v.raw_ts = k.s "
        "  AND v.cls = 0 "
        "WHERE k.state = 'overlapped' AND k.dur > b.t_alone"
    ).fetchnumpy()
    eid = np.asarray(rows["eid"], dtype=np.int64)
    ex = np.asarray(rows["excess"], dtype=np.float64)
    return np.bincount(g.ev_node[eid], weights=ex, minlength=len(g.n_start)).astype(np.float64)
