"""`ranklens check`: evaluate thresholds over a run, naming the worst offender of each.

Why pure and here: CI keys on the verdicts, so they must come from the same numbers the report
shows. Each metric is a query returning (subject, value) rows — a subject is a rank, a stage or
a (rank, parallelism) pair — and a check passes when every row is within its threshold.
Metrics whose analysis did not produce data (e.g. no pipeline) are reported as "skipped" with
the reason, never as passed, and fail the gate unless the caller allows skipped checks.
"""

from __future__ import annotations

from contextlib import ExitStack, suppress
from dataclasses import dataclass, replace
from typing import Any

import duckdb
import polars as pl
from ranklens.analysis import _activity
from ranklens.analysis._sql import query_pl
from ranklens.analysis.check_config import CheckConfig
from ranklens.analysis.thresholds import THRESHOLDS
from ranklens.analysis.views import apply_all_views

EXIT_OK, EXIT_ERROR, EXIT_FAILED = 0, 1, 3


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check (one threshold, or one parallelism of a per-parallelism one)."""

    name: str
    metric: str
    threshold: float
    status: str  # pass | fail | skipped
    worst_subject: str | None
    worst_value: float | None
    message: str
    source: str
    n_subjects: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "metric": self.metric,
            "threshold": self.threshold,
            "status": self.status,
            "worst": {"subject": self.worst_subject, "value": self.worst_value},
            "subjects": self.n_subjects,
            "message": self.message,
            "source": self.source,
        }


def metric_rows(con: duckdb.DuckDBPyConnection, name: str) -> pl.DataFrame | None:
    """(subject, value[, parallelism]) rows of a metric, or None when the run has no data."""
    declared = THRESHOLDS.get(name)
    q = declared.query if declared is not None else None
    if q is None:
        return None
    try:
        df = query_pl(con, q)
    except duckdb.CatalogException:
        return None
    return df if df.height else None


def _judge(name: str, label: str, rows: pl.DataFrame, limit: float, source: str) -> Verdict:
    is_min = THRESHOLDS[name].kind == "min"
    ordered = rows.sort("value", descending=not is_min, maintain_order=True)
    worst = ordered.row(0, named=True)
    bad = rows.filter(pl.col("value") < limit) if is_min else rows.filter(pl.col("value") > limit)
    op = "<" if is_min else ">"
    status = "fail" if bad.height else "pass"
    if status == "fail":
        msg = (
            f"{label}: {worst['subject']} at {_show(name, worst['value'])} {op} "
            f"{_show(name, limit)} ({bad.height} of {rows.height} beyond the limit)"
        )
    else:
        msg = (
            f"{label}: worst {worst['subject']} at {_show(name, worst['value'])}, "
            f"within {_show(name, limit)}"
        )
    return Verdict(
        name,
        label,
        limit,
        status,
        worst["subject"],
        float(worst["value"]),
        msg,
        source,
        rows.height,
    )


def _show(name: str, v: float) -> str:
    return f"{v:.1f} µs" if name.endswith("_us") else f"{100 * v:.1f}%"


def evaluate(con: duckdb.DuckDBPyConnection, config: CheckConfig) -> list[Verdict]:
    """One verdict per configured threshold (per parallelism for max_exposed_comm)."""
    apply_all_views(con)
    with ExitStack() as stack:
        # metrics read from the activity views (unions of every event): held once for all
        if any(t.activity for name, t in THRESHOLDS.items() if name in config.values):
            with suppress(duckdb.CatalogException):  # no such tables: the metrics say skipped
                stack.enter_context(_activity.held(con))
        return _evaluate(con, config)


def _evaluate(con: duckdb.DuckDBPyConnection, config: CheckConfig) -> list[Verdict]:
    out: list[Verdict] = []
    for name, limit in config.values.items():
        if THRESHOLDS[name].query is None:
            continue  # judged against --baseline by run_compare.check_against
        source = config.sources.get(name, "default")
        label = THRESHOLDS[name].label
        rows = metric_rows(con, name)
        if isinstance(limit, dict):
            for par, lim in sorted(limit.items()):
                sub = None
                if rows is not None and "parallelism" in rows.columns:
                    sub = rows if par == "ALL" else rows.filter(pl.col("parallelism") == par)
                key = f"{name}[{par.lower()}]"
                if sub is None or sub.height == 0:
                    out.append(_skipped(key, label, lim, source, f"no {par} communication"))
                else:
                    v = _judge(name, f"{label} ({par})", sub, lim, source)
                    out.append(replace(v, name=key))
            continue
        if rows is None:
            out.append(_skipped(name, label, limit, source, "the run has no data for it"))
        else:
            out.append(_judge(name, label, rows, limit, source))
    return out


def _skipped(name: str, label: str, limit: float, source: str, why: str) -> Verdict:
    return Verdict(name, label, limit, "skipped", None, None, f"{label}: skipped, {why}", source)


def unevaluated_fail(verdicts: list[Verdict]) -> list[Verdict]:
    """A requested check the run has no data for fails the gate (an empty or all-skipped run
    must not pass CI by accident); `--allow-skipped` keeps them as skipped instead."""
    return [
        replace(
            v,
            status="fail",
            message=f"{v.message}: could not be evaluated, so it fails "
            "(--allow-skipped accepts checks without data)",
        )
        if v.status == "skipped"
        else v
        for v in verdicts
    ]


def exit_code(verdicts: list[Verdict]) -> int:
    """0 when nothing failed, 3 when a threshold was exceeded."""
    return EXIT_FAILED if any(v.status == "fail" for v in verdicts) else EXIT_OK
