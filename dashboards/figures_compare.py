"""The compare page's chart and colours: step time per rank, baseline beside current.

Why the colours: a highlighted difference takes the colour its metric has on every other
page (red only for exposed communication, orange communication, greys bubble); step time and
the heaviest stage take the "more than the peers" colour, which is not communication.
"""

from __future__ import annotations

import plotly.graph_objects as go
from ranklens.dashboards.data_compare import RankRow
from ranklens.dashboards.figures import (
    ABOVE,
    BELOW,
    BUBBLE_COLORS,
    EXPOSED,
    KIND_COLORS,
    MS,
    styled,
)

BASE, CURRENT = BELOW, ABOVE  # light: before, dark: now
# Highlight colour of a regression, by Change.metric.
METRIC_COLORS: dict[str, str] = {
    "step_time": ABOVE,
    "bubble": BUBBLE_COLORS["measured"],
    "comm_share": KIND_COLORS["comm"],
    "exposed_comm": EXPOSED,
}
HEAVY = ABOVE


def tint(color: str, alpha: str = "33") -> str:
    """`color` (#RRGGBB) see-through, as a cell background that keeps its text readable."""
    return color + alpha


def step_times(rows: list[RankRow]) -> go.Figure:
    """Median step time per rank in both runs (ms), ranks in order."""
    ordered = sorted((r for r in rows if "step_time" in r.cells), key=lambda r: r.rank)
    x = [f"r{r.rank}" for r in ordered]
    fig = go.Figure(
        [
            go.Bar(
                name="baseline",
                x=x,
                y=[r.cells["step_time"].base / MS for r in ordered],
                marker={"color": BASE, "line": {"width": 0}},
            ),
            go.Bar(
                name="current",
                x=x,
                y=[r.cells["step_time"].cur / MS for r in ordered],
                marker={"color": CURRENT, "line": {"width": 0}},
            ),
        ]
    )
    fig.update_layout(barmode="group", yaxis_title="ms (median per step)")
    fig.update_xaxes(type="category")
    return styled(fig, "Step time per rank: baseline vs current", height=300)
