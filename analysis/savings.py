"""What each finding's fix saves, from a replay of the dependency graph (critical_path).

Why: a finding's `time_at_stake_ns` is a heuristic per analysis; the replay of its fix on the
cross-rank graph says what the step would gain, waits and dependencies included, and ranks the
findings by the same measure. A finding whose fix the replay cannot express keeps its estimate,
and so do all of them when communication the graph could not join would hold the replay's waits
(whatif.Unlinked: a straggler's fix then "saves 0" while the others wait on it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
from ranklens.analysis import critical_path as cp
from ranklens.analysis import graph_replay as gr
from ranklens.analysis import whatif as wi
from ranklens.analysis._base import Finding


def _straggler(f: Finding) -> str | None:
    return "straggler:" + ",".join(str(r) for r in f.ranks) if f.ranks else None


def _exposed(f: Finding) -> str | None:
    by_par = f.evidence.get("exposed_ns_by_parallelism") or {}
    known = {k: v for k, v in by_par.items() if k and v}
    return f"overlap:{max(known, key=lambda k: known[k]).lower()}" if known else None


# finding code -> the scenario that replays its fix
SCENARIO_OF: dict[str, Callable[[Finding], str | None]] = {
    "STRAGGLER_RANK": _straggler,
    "STRAGGLER_COMPUTE_IMBALANCE": _straggler,
    "STRAGGLER_EXPOSED_WAIT": lambda f: "straggler",  # its fix: late ranks at their peers' pace
    "PIPELINE_STAGE_IMBALANCE": lambda f: "stage-balance",
    "CONTENTION_COMPUTE_SLOWDOWN": lambda f: "contention",
    "OVERLAP_EXPOSED_COMM_HIGH": _exposed,
    "PIPELINE_DP_INTO_BUBBLES": lambda f: "overlap:dp",
}


def attach(m: cp.Model, findings: list[Finding]) -> tuple[list[Finding], list[wi.Outcome]]:
    """Each finding with a replayable fix gets saving_ns (mean over steps) and its method."""
    names = sorted({s for f in findings if (s := _scenario(f)) is not None})
    outcomes = wi.run_scenarios(m.graph, [wi.parse(n) for n in names], m.ctx)
    if m.ctx.unlinked.blind:
        return findings, outcomes
    replayed = float(np.mean(gr.step_times(m.graph, m.base))) if len(m.graph.steps) else 0.0
    saving: dict[str, int] = {
        o.scenario.name: round(replayed - float(np.mean(o.predicted)))
        for o in outcomes
        if o.predicted is not None
    }
    out = []
    for f in findings:
        sc = _scenario(f)
        if sc is not None and sc in saving:
            f = dataclasses.replace(f, saving_ns=saving[sc], saving_method=f"replay of {sc}")
        out.append(f)
    return out, outcomes


def _scenario(f: Finding) -> str | None:
    rule = SCENARIO_OF.get(f.code)
    return rule(f) if rule is not None else None


# a finding that costs no step time: a warning about the numbers (alignment), or a share
NO_STAKE = "no time at stake measured"


def not_shorter(f: Finding) -> str | None:
    """Why a replayed fix saves nothing, when its replay's step is no shorter ("its step is
    0.129 ms longer"); None when it saves time or was not replayed. The faces print these
    words: "saves ~-0.129 ms" reads as a bug."""
    if f.saving_ns is None or f.saving_ns > 0:
        return None
    return (
        f"its step is {-f.saving_ns / 1e6:.3f} ms longer"
        if f.saving_ns
        else "its step is unchanged"
    )


def not_replayed(facts: dict[str, Any]) -> str | None:
    """Why a report's findings carry no replayed saving (its `replay` fact), else None."""
    rp = facts.get("replay") or {}
    if rp.get("used", True):
        return None
    return (
        f"not replayed: {rp['unlinked_ops']:,} comm ops ({rp['unlinked_share']:.0%} of the "
        "communication time) have no matched peer, and a replay would keep their waits"
    )
