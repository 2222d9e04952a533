"""The post-run report: every registered analysis, findings ranked by what their fix saves.

Why here and not in the CLI: the CLI, the dashboard and `check` show the same report, so its
assembly (what runs, how findings rank, the run's facts) is analysis logic.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import duckdb
import polars as pl
from ranklens.analysis import _activity, advice, critical_path, results_store, run_profile, savings
from ranklens.analysis._base import Finding, Result
from ranklens.analysis._sql import query_pl

_SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
STORED = "report"  # the assembled report's name among the run's stored results
_SCENARIOS = {"scenario": pl.String}


@dataclass(frozen=True)
class Report:
    """All results of a run plus its facts; findings sorted most costly first."""

    facts: dict[str, Any]
    results: dict[str, Result]
    findings: tuple[Finding, ...] = field(default_factory=tuple)


def run_facts(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """What the run is: ranks, steps, formats, devices, files skipped."""
    ranks = query_pl(con, "SELECT * FROM ranks ORDER BY rank")
    steps = query_pl(con, "SELECT DISTINCT step FROM steps ORDER BY step")
    skipped = query_pl(con, "SELECT path, error FROM sources WHERE status = 'skipped'")
    warnings = query_pl(con, "SELECT value FROM meta WHERE key LIKE 'warning.%' ORDER BY key")
    fmts = query_pl(con, "SELECT DISTINCT format FROM sources WHERE status = 'ok'")
    sizes = ranks["world_size"].drop_nulls().to_list() if ranks.height else []
    world = max(int(w) for w in sizes) if sizes else None
    present = set(ranks["rank"].to_list())
    missing = sorted(set(range(world)) - present) if world is not None else []
    devices = sorted({d for d in ranks["device_name"].to_list() if d})
    return {
        "ranks": ranks["rank"].to_list(),
        "world_size": world,
        "missing_ranks": missing,
        "steps": steps["step"].to_list(),
        "formats": fmts["format"].to_list(),
        "devices": devices,
        "cpu_only": bool(ranks.height) and not any(ranks["has_gpu"].to_list()),
        "skipped": [
            {**r, "message": _names_file(r["path"], r["error"] or "")}
            for r in skipped.iter_rows(named=True)
        ],
        # what the ingest found suspicious (kept, but probably wrong): see ingest/sanity.py
        "warnings": warnings["value"].to_list(),
    }


def _names_file(path: str, error: str) -> str:
    """The error as one line that names the file once (reader errors start with it)."""
    return error if path in error else f"{path}: {error}"


def build_report(con: duckdb.DuckDBPyConnection, names: tuple[str, ...] | None = None) -> Report:
    """Run the registered analyses (all, or `names`) and rank their findings; the whole
    report as ingest stored it when it is still fresh (stored_report)."""
    if names is None and (kept := stored_report(con)) is not None:
        return kept[0]
    return _assemble(con, names)[0]


def _assemble(
    con: duckdb.DuckDBPyConnection,
    names: tuple[str, ...] | None,
    model_of: Callable[[], critical_path.Model] | None = None,
) -> tuple[Report, critical_path.Model | None]:
    """The report, and the dependency graph's model when critical_path was asked for (from
    `model_of` when given: built elsewhere, e.g. side by side with the analyses)."""
    from ranklens.analysis import REGISTRY, by_name

    mods = REGISTRY if names is None else tuple(by_name()[n] for n in names)
    others = tuple(m for m in mods if m.NAME != critical_path.NAME)  # cp replays their findings
    results: dict[str, Result] = {}
    for mod in others:
        if (kept := results_store.load(con, mod)) is not None:
            results[mod.NAME] = kept
    todo = tuple(m for m in others if m.NAME not in results)
    with ExitStack() as stack:
        if _activity.users(todo):  # computed once for all of them, and only when needed
            stack.enter_context(_activity.held(con))
        for mod in todo:
            results[mod.NAME] = mod.run(con)
    results = {m.NAME: results[m.NAME] for m in others}
    from ranklens.analysis.findings import derive

    prof = run_profile.profile(con)
    found = advice.tailor(
        [*(f for r in results.values() for f in r.findings), *derive(results)], prof
    )
    model = None
    if any(m.NAME == critical_path.NAME for m in mods):
        model = critical_path.model(con) if model_of is None else model_of()
        found, outcomes = savings.attach(model, found)
        results[critical_path.NAME] = critical_path.result_of(model, outcomes)
    findings = sorted(found, key=lambda f: (-f.rank_ns, _SEVERITY_ORDER[f.severity.value], f.code))
    facts = run_facts(con)
    facts.update(cross_rank_facts(con, results))
    facts.update(
        parallelisms=sorted(prof.parallelisms),
        model=prof.model,
        framework=prof.framework,
        groups=prof.groups,  # pg_name -> "PP [0, 4]": how faces name a group
    )
    if model is not None:  # whether the savings come from the replay, and why not
        u = model.ctx.unlinked
        facts["replay"] = {"used": not u.blind, "unlinked_ops": u.ops, "unlinked_share": u.share}
    return Report(facts, results, tuple(findings)), model


def store_report(
    con: duckdb.DuckDBPyConnection, model_of: Callable[[], critical_path.Model] | None = None
) -> bool:
    """Assemble the whole report and keep it in the run (ingest's last step), with the what-if
    fixes that apply to it; False when some part would not read back identical."""
    from ranklens.analysis.whatif_run import default_scenarios

    rep, model = _assemble(con, None, model_of)
    cp_res = rep.results.get(critical_path.NAME)
    if model is None or cp_res is None or not results_store.store(con, cp_res, critical_path):
        return False
    facts = json.dumps(rep.facts)
    findings = json.dumps([f.as_dict() for f in rep.findings])
    if json.loads(facts) != rep.facts or _findings(findings) != rep.findings:
        return False
    frames = {
        "facts": pl.DataFrame({"json": [facts]}),
        "scenarios": pl.DataFrame({"scenario": default_scenarios(model)}, schema=_SCENARIOS),
    }
    return results_store.put(con, STORED, _options(), frames, findings)


def stored_report(con: duckdb.DuckDBPyConnection) -> tuple[Report, list[str]] | None:
    """The report ingest stored and the what-if fixes that apply, if fresh: every analysis'
    result and the report itself made by this tool version with today's options on this
    state of the run (results_store's rule); else None."""
    from ranklens.analysis import REGISTRY

    got = results_store.get(con, STORED, _options())
    if got is None:
        return None
    frames, findings = got
    results: dict[str, Result] = {}
    for mod in REGISTRY:
        if (kept := results_store.load(con, mod)) is None:
            return None
        results[mod.NAME] = kept
    facts = json.loads(frames["facts"]["json"][0])
    rep = Report(facts, results, _findings(findings))
    return rep, [str(s) for s in frames["scenarios"]["scenario"].to_list()]


def stored_scenarios(con: duckdb.DuckDBPyConnection) -> list[str] | None:
    """The what-if fixes that apply to the run, as ingest stored them with its report (fresh),
    else None: the dashboard lists them without building the dependency graph."""
    got = results_store.get(con, STORED, _options())
    return None if got is None else [str(s) for s in got[0]["scenarios"]["scenario"].to_list()]


def _findings(text: str) -> tuple[Finding, ...]:
    return tuple(results_store.finding_of(d) for d in json.loads(text))


def _options() -> str:
    """Every analysis' options: the report is stale when any of them changes."""
    from ranklens.analysis import REGISTRY

    return json.dumps({m.NAME: results_store.options_of(m) for m in REGISTRY}, sort_keys=True)


def cross_rank_facts(con: duckdb.DuckDBPyConnection, results: dict[str, Result]) -> dict[str, Any]:
    """How far cross-rank numbers can be trusted (alignment, matching), and who straggles."""
    from ranklens.analysis import stragglers

    p = stragglers.Params()
    ranks = query_pl(
        con, "SELECT rank, host, clock_method, align_residual_ns FROM ranks ORDER BY rank"
    )
    cross = ranks.filter(pl.col("clock_method") != "single_host")
    poor = cross.filter(pl.col("align_residual_ns") > p.align_warn_ns)
    res = ranks["align_residual_ns"].drop_nulls()
    status = query_pl(con, "SELECT status, count(*) AS n FROM collectives GROUP BY ALL")
    counts = dict(zip(status["status"].to_list(), status["n"].to_list(), strict=True))
    judged = sum(n for k, n in counts.items() if k not in ("others_absent", "no_group"))
    out: dict[str, Any] = {
        "alignment": {
            "methods": sorted(set(ranks["clock_method"].drop_nulls().to_list())),
            "hosts": ranks["host"].n_unique(),
            "max_residual_ns": int(res.max()) if res.len() else None,  # type: ignore[arg-type]
            "poor": bool(poor.height),
            "poor_ranks": poor["rank"].to_list(),
            "threshold_ns": p.align_warn_ns,
        },
        "matching": {
            "comm_ops": sum(counts.values()),
            "matched": counts.get("matched", 0),
            "matched_share": counts.get("matched", 0) / judged if judged else None,
            "by_status": counts,
        },
        "stragglers": [],
    }
    res_s = results.get("stragglers")
    if res_s is not None:
        flagged = {r for f in res_s.findings if f.code == "STRAGGLER_RANK" for r in f.ranks}
        rows = res_s.table.filter(pl.col("rank").is_in(sorted(flagged))).sort(
            ["net_held_back_per_step_ns", "rank"], descending=[True, False]
        )
        out["stragglers"] = [
            {
                "rank": int(r["rank"]),
                "held_back_per_step_ns": int(r["net_held_back_per_step_ns"]),
                "share": float(r["net_held_back_share"]),
            }
            for r in rows.iter_rows(named=True)
        ]
    return out


def focus_ranks(report: Report, limit: int) -> list[int] | None:
    """Which ranks a size-limited view shows (None: all fit): the ranks the costliest
    findings name, then the extremes (most exposed communication, most idle), so a 1,024-rank
    report stays readable and still holds the evidence of its findings."""
    by_rank = report.results["breakdown"].tables["by_rank"]
    if by_rank.height <= limit:
        return None
    out: list[int] = []
    for fd in report.findings:
        for r in fd.ranks:
            if r not in out and len(out) < limit // 2:
                out.append(int(r))
    exposed = report.results["overlap"].tables["by_rank"]
    orders = [
        exposed.sort(["exposed_share", "rank"], descending=[True, False], nulls_last=True),
        by_rank.sort(["idle_share", "rank"], descending=[True, False], nulls_last=True),
    ]
    ranked = [o["rank"].to_list() for o in orders]
    for k in range(by_rank.height):
        for lst in ranked:
            if len(out) >= limit:
                return sorted(out)
            if k < len(lst) and int(lst[k]) not in out:
                out.append(int(lst[k]))
    return sorted(out)
