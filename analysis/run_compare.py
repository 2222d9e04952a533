"""Two runs side by side: what `ranklens check --baseline` says, and the per-rank numbers behind it.

Why here, once: the dashboard's compare page and `check --baseline` must agree, so both take
their verdicts from `check_against` (the thresholds of check.evaluate plus the regression
verdict over baseline.compare's changes and each PP stage's bubble) and their numbers from the
same `Change`s. The bubble is the pipeline analysis' own per-step table, judged by baseline's
rule (median per step, beyond max_regression in share points and the runs' noise), so a
stage whose bubble grew fails the gate like a slower step; runs without a pipeline have none.
Thresholds come from `baseline_config`, for `check` and `dashboard` alike (flag > file > 5%).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

import duckdb
import polars as pl
from ranklens.analysis import baseline, pipeline, results_store
from ranklens.analysis import check as check_mod
from ranklens.analysis.baseline import Change
from ranklens.analysis.check import Verdict
from ranklens.analysis.check_config import CheckConfig, resolve

DEFAULT_MAX_REGRESSION = "5%"  # what --baseline is judged with when no threshold is given
BUBBLE = baseline.BUBBLE  # the metric name of the per-stage bubble Changes


def baseline_config(
    flags: dict[str, str | None], config_file: str | os.PathLike[str] | None = None
) -> CheckConfig:
    """check's thresholds (flag > file > none) with max_regression defaulting to 5%; a bad
    value or file raises check_config.ConfigError (the CLI's `error:`/`hint:`)."""
    cfg = resolve(flags, config_file)
    if "max_regression" not in cfg.values:
        cfg = resolve({**flags, "max_regression": DEFAULT_MAX_REGRESSION}, config_file)
    return cfg


def check_against(
    cur: duckdb.DuckDBPyConnection,
    base: duckdb.DuckDBPyConnection,
    cfg: CheckConfig,
    facts: tuple[Pipeline, Pipeline] | None = None,
) -> tuple[list[Verdict], list[Change]]:
    """The verdicts `check --baseline` gives (before --allow-skipped) and the changes behind
    its regression verdict: step time, comm per parallelism and the bubble per PP stage.
    facts: both runs' pipeline_facts when the caller has them already."""
    limit = float(cfg.values["max_regression"])
    verdicts = check_mod.evaluate(cur, cfg)
    p_cur, p_base = facts if facts is not None else (pipeline_facts(cur), pipeline_facts(base))
    changes = baseline.compare(cur, base, limit) + bubble_changes(p_cur, p_base, limit)
    verdicts.append(baseline.verdict(changes, limit, cfg.sources["max_regression"]))
    return verdicts, changes


def bubble_changes(cur: Pipeline, base: Pipeline, limit: float) -> list[Change]:
    """Each rank's stage bubble (share of the step, median per step) judged by baseline's
    rule, its rise a regression only if the bubble's time grew too; none unless both runs
    have a pipeline."""
    times = (cur.bubble_times, base.bubble_times)
    return baseline.judge_runs(BUBBLE, cur.bubble, base.bubble, limit, times)


@dataclass(frozen=True)
class Pipeline:
    """What the pipeline analysis says of one run: each rank's stage, each pipeline's heaviest
    rank (the one with the most work in most steps) and each stage's bubble per step (its
    fraction, and its time beside the bubble + work it is a fraction of)."""

    stages: dict[int, int] = field(default_factory=dict)
    heavy: frozenset[int] = frozenset()
    bubble: dict[tuple[int, str], list[float]] = field(default_factory=dict)
    bubble_times: dict[tuple[int, str], baseline.Times] = field(default_factory=dict)


def pipeline_facts(con: duckdb.DuckDBPyConnection) -> Pipeline:
    """Pipeline facts from the pipeline analysis itself (as ingest stored it, when fresh);
    empty when the run has no pipeline."""
    try:
        res = results_store.compute_or_load(con, pipeline)
    except duckdb.Error:  # a run the analysis cannot read has no pipeline to compare
        return Pipeline()
    table = res.table.filter(
        pl.col("work_ns").is_not_null() & pl.col("bubble_fraction").is_not_null()
    )
    bubble: dict[tuple[int, str], list[float]] = {}
    times: dict[tuple[int, str], baseline.Times] = {}
    for row in table.sort("rank", "step").iter_rows(named=True):
        key = (int(row["rank"]), "PP")
        bubble.setdefault(key, []).append(float(row["bubble_fraction"]))
        ns, of = times.setdefault(key, ([], []))
        ns.append(float(row["bubble_ns"]))
        of.append(float(row["bubble_ns"] + row["work_ns"]))
    stages = {int(r): int(s) for r, s in res.table.select("rank", "stage").unique().iter_rows()}
    heavy: set[int] = set()
    sched = res.tables["schedule"]
    if "heavy_rank" in sched.columns:
        for _, part in sched.group_by("pp_group"):
            ranks = [int(r) for r in part["heavy_rank"].drop_nulls().to_list()]
            if ranks:
                heavy.add(Counter(ranks).most_common(1)[0][0])
    return Pipeline(stages, frozenset(heavy), bubble, times)


@dataclass(frozen=True)
class Comparison:
    """The current run against its baseline.

    Attributes:
        limit: max_regression (a fraction: relative for step time, share points otherwise).
        verdicts: what `check --baseline` prints, skipped checks failing as it does by default.
        changes: step time, exposed comm and comm share per rank and each rank's stage bubble,
            as check judges them.
        regressions: check's lines naming what regressed most.
        cur, base: each run's pipeline facts (stages, heaviest stage).
    """

    limit: float
    verdicts: tuple[Verdict, ...]
    changes: tuple[Change, ...]
    regressions: tuple[str, ...]
    cur: Pipeline
    base: Pipeline

    @property
    def exit_code(self) -> int:
        return check_mod.exit_code(list(self.verdicts))

    @property
    def bubble(self) -> tuple[Change, ...]:
        """The per-stage bubble changes (a subset of `changes`)."""
        return tuple(c for c in self.changes if c.metric == BUBBLE)


def compare_runs(
    cur: duckdb.DuckDBPyConnection, base: duckdb.DuckDBPyConnection, cfg: CheckConfig
) -> Comparison:
    """Everything the compare page shows, from the definitions check and the analyses use."""
    p_cur, p_base = pipeline_facts(cur), pipeline_facts(base)
    verdicts, changes = check_against(cur, base, cfg, (p_cur, p_base))
    return Comparison(
        float(cfg.values["max_regression"]),
        tuple(check_mod.unevaluated_fail(verdicts)),
        tuple(changes),
        tuple(baseline.summarize(changes)),
        p_cur,
        p_base,
    )
