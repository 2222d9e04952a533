"""`ranklens whatif`: replay the run's graph with each fix and say what the step would gain.

Why its own module: the CLI and the dashboard ask the same question (which scenarios by
default, what the answer holds); the answer is analysis, the faces only print it.
"""

from __future__ import annotations

from typing import Any

import duckdb
import numpy as np
from ranklens.analysis import critical_path as cp
from ranklens.analysis import graph_replay as gr
from ranklens.analysis import whatif as wi


def default_scenarios(m: cp.Model) -> list[str]:
    """Every fix that applies to this run: stragglers, stage balance (with PP), contention,
    and each parallelism's communication hidden."""
    out = ["straggler"]
    if m.ctx.stage_of:
        out.append("stage-balance")
    out.append("contention")
    out += [f"overlap:{p.lower()}" for p in sorted(set(m.graph.inst_par.tolist()))]
    return out


def parse_all(names: list[str]) -> list[wi.Scenario]:
    """The scenarios the user wrote (WhatIfError on the first that cannot be read)."""
    return [wi.parse(s) for s in names]


def answer(con: duckdb.DuckDBPyConnection, parsed: list[wi.Scenario]) -> dict[str, Any]:
    """{measured_step_ns, replayed_step_ns, replay_error, steps, scenarios: [{name,
    predicted_step_ns, saving_ns, saving_share, note}], unmatched_note}: means over steps, per
    step inside; unmatched_note says why the savings miss what moves through unmatched comm
    (whatif.Unlinked), else None;
    no scenario: every one that applies (default_scenarios)."""
    return answer_of(cp.model(con, patterns=tuple(s.pattern for s in parsed if s.pattern)), parsed)


def answer_of(m: cp.Model, parsed: list[wi.Scenario]) -> dict[str, Any]:
    """`answer` from a model already built (the dashboard keeps one per run); its context must
    hold each scale-kernels pattern's per-node time (ctx.pattern_ns)."""
    if not parsed:
        parsed = [wi.parse(s) for s in default_scenarios(m)]
    g = m.graph
    measured = gr.measured_step_times(g)
    replayed = gr.step_times(g, m.base)
    rep = float(np.mean(replayed)) if len(replayed) else 0.0
    rows: list[dict[str, Any]] = []
    for o in wi.run_scenarios(g, parsed, m.ctx):
        pred = o.predicted if o.predicted is not None else replayed
        mean = float(np.mean(pred)) if len(pred) else 0.0
        rows.append(
            {
                "name": o.scenario.name,
                "predicted_step_ns": round(mean),
                "saving_ns": round(rep - mean),
                "saving_share": (rep - mean) / rep if rep else 0.0,
                "per_step_predicted_ns": [int(x) for x in pred],
                "note": o.note or None,
            }
        )
    rows.sort(key=lambda r: -int(r["saving_ns"]))
    mea = float(np.mean(measured)) if len(measured) else 0.0
    return {
        "steps": [int(s) for s in g.steps],
        "measured_step_ns": round(mea),
        "replayed_step_ns": round(rep),
        "replay_error": rep / mea - 1 if mea else 0.0,
        "per_step_measured_ns": [int(x) for x in measured],
        "inconsistent_members": g.inconsistent,
        "dropped_edges": g.dropped_edges,
        "unmatched_note": m.ctx.unlinked.explain() if m.ctx.unlinked.blind else None,
        "scenarios": rows,
    }
