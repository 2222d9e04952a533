"""The one neutral result type every analysis returns; faces convert it at the edge."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import polars as pl


class Severity(str, Enum):
    """How much a finding matters; CI can fail on warning or critical."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


@dataclass(frozen=True)
class Finding:
    """A problem found in the numbers, with the evidence and the fix in practitioner's terms.

    `code` is stable (CI and users key on it); `time_at_stake_ns` estimates the step time that
    fixing it could give back, per step, and ranks findings in the report.
    """

    code: str
    severity: Severity
    message: str
    fix: str
    time_at_stake_ns: int = 0
    ranks: tuple[int, ...] = ()
    steps: tuple[int, ...] = ()
    window_ns: tuple[int, int] | None = None
    value: float | None = None
    threshold: float | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    saving_ns: int | None = None  # what the fix saves per step, by replay (analysis/savings.py)
    saving_method: str | None = None

    @property
    def rank_ns(self) -> int:
        """What the report ranks by: the replayed saving, else the time at stake."""
        return self.saving_ns if self.saving_ns is not None else self.time_at_stake_ns

    def as_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "severity": self.severity.value,
            "message": self.message,
            "fix": self.fix,
            "time_at_stake_ns": self.time_at_stake_ns,
            "ranks": list(self.ranks),
            "steps": list(self.steps),
            "window_ns": list(self.window_ns) if self.window_ns else None,
            "value": self.value,
            "threshold": self.threshold,
            "evidence": self.evidence,
            "saving_ns": self.saving_ns,
            "saving_method": self.saving_method,
        }


@dataclass(frozen=True)
class Result:
    """An analysis' output: its main table, secondary tables, findings and the params used."""

    name: str
    table: pl.DataFrame
    findings: tuple[Finding, ...] = ()
    params: Any = None
    tables: dict[str, pl.DataFrame] = field(default_factory=dict)
