"""Every `ranklens check` threshold, declared once: its kind, label, flag help and query.

Why one declaration: the config reader (check_config), the evaluation (check) and the CLI
(`--NAME` options, generated from this table) all read it, so adding a threshold is one entry.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Threshold:
    """One threshold of `ranklens check`.

    Attributes:
        name: its key in TOML and its flag (`--max-idle` for max_idle).
        kind: "max" / "min" (one number) or "max_by" (per parallelism, or "all").
        label: what the verdicts call the metric.
        help: the help text of its command-line flag.
        query: (subject, value[, parallelism]) rows over the run's analysis views; None for a
            threshold judged against `--baseline` (run_compare.check_against) instead.
        activity: its query reads the activity views (held once for all such checks).
    """

    name: str
    kind: str
    label: str
    help: str
    query: str | None = None
    activity: bool = False


_FRACTION = "Fraction (0.25) or percentage (25%)."


def _per_rank(name: str, kind: str, label: str, help: str, expr: str, view: str) -> Threshold:
    """A threshold on one value per rank of an activity view (most of them are)."""
    query = f"""SELECT 'rank ' || rank AS subject, {expr} AS value FROM {view}
               WHERE {expr} IS NOT NULL"""
    return Threshold(name, kind, label, help, query, activity=True)


_DECLARED = (
    Threshold(
        "max_bubble",
        "max",
        "pipeline bubble fraction of the step, per stage",
        f"Pipeline bubble, per stage. {_FRACTION}",
        # Per stage: the report's bubble fraction (pipeline_steps.sql pipeline_stage_bubble).
        """SELECT 'stage ' || stage || ' (rank ' || rank || ')' AS subject,
        bubble_fraction AS value FROM pipeline_stage_bubble WHERE bubble_fraction IS NOT NULL""",
    ),
    Threshold(
        "max_exposed_comm",
        "max_by",
        "exposed communication share of the step, per parallelism",
        "Exposed comm share per parallelism: 0.1, or dp=0.05,tp=0.10.",
        """
        SELECT 'rank ' || p.rank AS subject, p.parallelism,
               sum(p.exposed_ns) / sum(w.window_ns) AS value
        FROM overlap_by_parallelism p
        JOIN (SELECT rank, step, window_ns FROM overlap_by_step) w USING (rank, step)
        GROUP BY p.rank, p.parallelism""",
        activity=True,
    ),
    _per_rank(
        "min_overlap",
        "min",
        "overlap ratio |M ∩ C| / |M|, per rank",
        "Overlap ratio per rank.",
        "overlap_ratio",
        "overlap_by_rank",
    ),
    _per_rank(
        "max_comm_share",
        "max",
        "communication share |M| / |W|, per rank",
        "Comm share per rank.",
        "comm_share",
        "breakdown_by_rank",
    ),
    _per_rank(
        "max_idle",
        "max",
        "idle share of the step, per rank",
        "Idle share per rank.",
        "idle_share",
        "breakdown_by_rank",
    ),
    _per_rank(
        "max_straggler_wait",
        "max",
        "share of the step others spend waiting for a rank",
        "Share of the step others wait for one rank.",
        "net_held_back_share",
        "stragglers_by_rank",
    ),
    Threshold(
        "max_align_residual_us",
        "max",
        "clock alignment residual per rank, µs",
        "Clock alignment residual per rank, µs.",
        """SELECT 'rank ' || rank AS subject,
        align_residual_ns / 1000.0 AS value FROM ranks WHERE align_residual_ns IS NOT NULL""",
    ),
    Threshold(
        "max_regression",
        "max",
        "regression vs --baseline, as a fraction (0.05 = 5%)",
        "Regression allowed vs --baseline (5%).",
    ),
)

# name -> declaration, in the order the CLI lists the flags.
THRESHOLDS: dict[str, Threshold] = {t.name: t for t in _DECLARED}
