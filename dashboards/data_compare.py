"""The compare page's data: the baseline run the dashboard was opened with, and the comparison
shaped as one row per rank.

Why here and not in the page: the numbers and verdicts are analysis.run_compare's (the ones
`ranklens check --baseline` prints); this only lays them out per rank, orders the rows by the
biggest regression and computes them once per served run (both runs are read-only).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb
import flask
from ranklens.analysis import run_compare
from ranklens.analysis.baseline import Change
from ranklens.analysis.check_config import CheckConfig
from ranklens.analysis.run_compare import Comparison
from ranklens.dashboards.data import RunData

BASELINE_KEY = "RANKLENS_BASELINE"
MS = 1e6
# What each compared metric is called on the page, by Change.metric.
LABELS: dict[str, str] = {
    "step_time": "step time",
    run_compare.BUBBLE: "bubble",
    "exposed_comm": "exposed comm",
    "comm_share": "comm share",
}


ONE_KEY = ("step_time", run_compare.BUBBLE)  # metrics with one value per rank


@dataclass(frozen=True)
class Baseline:
    """The run the current one is compared with, what the user called it, and check's
    thresholds as `ranklens dashboard --config/--max-regression` resolved them
    (run_compare.baseline_config; None: ./pyproject.toml's, resolved when first shown)."""

    data: RunData
    name: str
    config: CheckConfig | None = None


def baseline() -> Baseline | None:
    """The baseline of the app serving this request (None: opened without --baseline)."""
    base = flask.current_app.config.get(BASELINE_KEY)
    assert base is None or isinstance(base, Baseline)
    return base


def comparison(data: RunData, base: Baseline) -> Comparison:
    """The current run against `base`, with the thresholds `ranklens check --baseline` would
    take from the same flags (base.config; else ./pyproject.toml's, max_regression 5% unless
    set): once per run and thresholds."""
    cfg = base.config if base.config is not None else run_compare.baseline_config({})

    def build(cur: duckdb.DuckDBPyConnection) -> Comparison:
        other = base.data.cursor()
        try:
            return run_compare.compare_runs(cur, other, cfg)
        finally:
            other.close()

    # keyed by the thresholds too: a verdict is only ever shown for the config that made it
    out = data.cached(f"comparison {base.name} {sorted(cfg.values.items())!r}", build)
    assert isinstance(out, Comparison)
    return out


@dataclass(frozen=True)
class Column:
    """One compared metric as a column: Change.metric and key (parallelism, or 'all')."""

    metric: str
    key: str

    @property
    def id(self) -> str:
        return self.metric if self.metric in ONE_KEY else f"{self.metric}_{self.key.lower()}"

    @property
    def label(self) -> str:
        name = LABELS.get(self.metric, self.metric)
        return name if self.id == self.metric else f"{name} {self.key}"


@dataclass(frozen=True)
class RankRow:
    """One rank's changes by column id, its PP stage and whether it is its pipeline's
    heaviest stage now (`heavy`) and in the baseline (`was_heavy`)."""

    rank: int
    stage: int | None
    heavy: bool
    was_heavy: bool
    cells: dict[str, Change] = field(default_factory=dict)

    @property
    def regressed(self) -> bool:
        return any(c.regression for c in self.cells.values())

    @property
    def worst(self) -> float:
        """The largest change (relative step time or share points), regressions first."""
        flagged = [c.delta for c in self.cells.values() if c.regression]
        return max(flagged or [c.delta for c in self.cells.values()] or [0.0])

    def step_delta_ms(self) -> float | None:
        c = self.cells.get("step_time")
        return None if c is None else (c.cur - c.base) / MS


def columns(cmp: Comparison) -> list[Column]:
    """Step time, bubble, then exposed comm and comm share per parallelism (present ones)."""
    seen = {(c.metric, c.key) for c in cmp.changes}
    keys = sorted({k for m, k in seen if m in ("exposed_comm", "comm_share")})
    order = [("step_time", "all"), (run_compare.BUBBLE, "PP")]
    order += [(m, k) for k in keys for m in ("exposed_comm", "comm_share")]
    return [Column(m, k) for m, k in order if (m, k) in seen]


def rank_rows(cmp: Comparison) -> list[RankRow]:
    """One row per rank in both runs, the biggest regression first (then the biggest change)."""
    by_rank: dict[int, dict[str, Change]] = {}
    for c in cmp.changes:
        by_rank.setdefault(c.rank, {})[Column(c.metric, c.key).id] = c
    rows = [
        RankRow(
            rank,
            cmp.cur.stages.get(rank),
            rank in cmp.cur.heavy,
            rank in cmp.base.heavy,
            cells,
        )
        for rank, cells in by_rank.items()
    ]
    return sorted(rows, key=lambda r: (not r.regressed, -r.worst, r.rank))


def base_stage_of_heavy(cmp: Comparison) -> list[int]:
    """The baseline's heaviest stages, by stage number (what 'was stage N' names)."""
    return sorted(cmp.base.stages[r] for r in cmp.base.heavy if r in cmp.base.stages)
