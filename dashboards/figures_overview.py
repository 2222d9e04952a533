"""Figure builders of the overview: the ranks x steps heatmap, comm share, top findings.

Why apart from figures.py: these read several analyses' tables (breakdown, stragglers, the
report's findings) and carry the overview's rules of reading (colour relative to the step,
overlapping shares side by side, bars that overlap said so); figures.py keeps the shared
palette and layout.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import polars as pl
from ranklens.analysis import Finding
from ranklens.dashboards.figures import (
    KIND_COLORS,
    MS,
    PAR_COLORS,
    SEVERITY_COLORS,
    SPLIT_COLORS,
    empty,
    rank_axis,
    styled,
)

# Heatmap metrics: (label, source, column). Source "breakdown" is breakdown.table,
# "stragglers" is stragglers.tables["by_step"].
HEATMAP_METRICS: dict[str, tuple[str, str, str]] = {
    "compute_ns": ("compute time (union of compute)", "breakdown", "compute_ns"),
    "window_ns": ("step time (window W)", "breakdown", "window_ns"),
    "exposed_comm_ns": ("exposed communication", "breakdown", "exposed_comm_ns"),
    "idle_ns": ("idle time", "breakdown", "idle_ns"),
    "exposed_wait_ns": ("waiting for late ranks", "stragglers", "exposed_wait_ns"),
}


def comm_share(by_step: pl.DataFrame, by_par: pl.DataFrame, step: int) -> go.Figure:
    """One step per rank: compute share, communication share per parallelism, idle share.

    Communication of different parallelisms can run at once and under compute, so the bars
    stand side by side: each is |M_x| / |W| (breakdown.by_parallelism), not an exclusive split;
    "all comm" (hatched) is their union |M| / |W| (breakdown's comm_share), never past 100%.
    """
    steps = by_step.filter(pl.col("step") == step).sort("rank")
    if steps.is_empty():
        return empty(f"no step {step} in this run")
    x = steps["rank"].to_list()
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            x=x,
            y=(steps["compute_share"] * 100).to_list(),
            name="compute",
            marker={"color": SPLIT_COLORS["compute"], "line": {"width": 0}},
        )
    )
    if "comm_share" in steps.columns:
        fig.add_trace(
            go.Bar(
                x=x,
                y=(steps["comm_share"].fill_null(0) * 100).to_list(),
                name="all comm (union)",
                marker={
                    "color": KIND_COLORS["comm"],
                    "line": {"width": 0},
                    "pattern": {"shape": "/", "fgcolor": "white"},
                },
            )
        )
    par = by_par.filter(pl.col("step") == step)
    for p in sorted(par["parallelism"].unique().to_list()):
        part = steps.select("rank").join(
            par.filter(pl.col("parallelism") == p), on="rank", how="left"
        )
        fig.add_trace(
            go.Bar(
                x=x,
                y=(part["comm_share"].fill_null(0) * 100).to_list(),
                name=f"{p} comm",
                marker={"color": PAR_COLORS.get(p, PAR_COLORS["OTHER"]), "line": {"width": 0}},
            )
        )
    fig.add_trace(
        go.Bar(
            x=x,
            y=(steps["idle_share"] * 100).to_list(),
            name="idle",
            marker={"color": SPLIT_COLORS["idle"], "line": {"width": 0}},
        )
    )
    # Side by side, not stacked: the shares overlap (comm under compute, DP beside PP), so a
    # stack would pass 100% and read as an exclusive split (time_split is that one).
    fig.update_layout(barmode="group", hovermode="x")
    rank_axis(fig, len(x))
    fig.update_yaxes(title="% of step time (shares overlap)", range=[0, 100])
    return styled(
        fig,
        f"Communication share by parallelism, step {step}<br><sup>side by side: shares "
        "overlap; all comm = their union</sup>",
    )


def heatmap(
    table: pl.DataFrame,
    metric: str,
    focus_rank: int | None = None,
    named: tuple[int, ...] = (),
) -> go.Figure:
    """Ranks x steps of one per-step metric: a straggler or a slow stage is a hot row.

    The colour is relative to the step, so a hot cell is a large part of its step and a
    0.15 ms difference stays pale: a time as % of that rank's step window; the step time
    itself as % above the median step. Ranks `named` by the findings are outlined (dashed),
    the `focus_rank` solid; hover gives the ms."""
    label, _, col = HEATMAP_METRICS[metric]
    if table.is_empty() or col not in table.columns or "window_ns" not in table.columns:
        return empty(f"no {label} for this run")
    t = table.select("rank", "step", *dict.fromkeys([col, "window_ns"])).with_columns(
        ms=pl.col(col) / MS
    )
    if col == "window_ns":
        med = float(t["window_ns"].median() or 0) or 1.0  # type: ignore[arg-type]
        t = t.with_columns(pct=(pl.col("window_ns") / med - 1) * 100)
        unit, zmax = "% above the median step", max(20.0, float(t["pct"].max() or 0))  # type: ignore[arg-type]
    else:
        t = t.with_columns(pct=pl.col(col) / pl.col("window_ns") * 100)
        unit, zmax = "% of the step", 100.0
    ranks = t["rank"].unique().sort().to_list()
    steps = t["step"].unique().sort().to_list()
    ms = t.pivot(on="step", index="rank", values="ms").sort("rank")
    pct = t.pivot(on="step", index="rank", values="pct").sort("rank")
    cols = [str(s) for s in steps]

    def grid(wide: pl.DataFrame, digits: int) -> list[list[float | None]]:
        return [
            [None if v is None else round(v, digits) for v in row]
            for row in wide.select(cols).rows()
        ]

    fig = go.Figure(
        go.Heatmap(
            z=grid(pct, 2),
            x=cols,
            y=[f"r{r}" for r in ranks],
            customdata=grid(ms, 6),
            colorscale="YlOrRd",
            zmin=0,
            zmax=zmax,
            colorbar={"title": unit.replace(" the ", "<br>the ")},
            hovertemplate="%{y} step %{x}: %{customdata:.3g} ms (%{z:.3g}"
            + unit
            + ")<extra></extra>",
        )
    )
    for r, dash in [*((r, "dot") for r in named if r != focus_rank), (focus_rank, "solid")]:
        if r is not None and r in ranks:
            i = ranks.index(r)
            fig.add_shape(
                type="rect",
                xref="paper",
                x0=0,
                x1=1,
                y0=i - 0.5,
                y1=i + 0.5,
                line={"color": "black", "width": 2, "dash": dash},
            )
    fig.update_xaxes(title="step", type="category")
    fig.update_yaxes(title="rank", autorange="reversed", type="category")
    note = "; dotted: the top finding's ranks" if set(named) & set(ranks) else ""
    return styled(
        fig,
        f"Ranks x steps: {label}<br><sup>colour: {unit}{note}</sup>",
        height=max(300, 170 + 18 * len(ranks)),
        r=130,
        t=80,
        b=70,
    )


def finding_rows(findings: tuple[Finding, ...] | list[Finding]) -> list[dict[str, Any]]:
    """Findings as table rows, most costly first (the order build_report gave them)."""
    rows = []
    for i, f in enumerate(findings, 1):
        rows.append(
            {
                "#": i,
                "severity": f.severity.value,
                "code": f.code,
                "at stake (ms/step)": round(f.time_at_stake_ns / MS, 2),
                "ranks": ", ".join(str(r) for r in f.ranks[:16])
                + (" ..." if len(f.ranks) > 16 else ""),
                "message": f.message,
                "fix": f.fix,
            }
        )
    return rows


def findings_bar(
    findings: tuple[Finding, ...] | list[Finding], top: int = 8, step_ns: float | None = None
) -> go.Figure:
    """The top findings by time at stake per step. The findings overlap (the same exposed
    time is at stake in an overlap, a straggler and a pipeline finding), so their bars can
    add up to more than a step: the mean step (`step_ns`) is drawn and the title says so."""
    index = [i for i, f in enumerate(findings) if f.time_at_stake_ns > 0][:top]
    top_f = [findings[i] for i in index]
    if not top_f:
        return empty("no finding with time at stake")
    fig = go.Figure(
        go.Bar(
            x=[f.time_at_stake_ns / MS for f in top_f][::-1],
            y=[f"{f.code} {_ranks_label(f)}" for f in top_f][::-1],
            orientation="h",
            marker_color=[SEVERITY_COLORS[f.severity.value] for f in top_f][::-1],
            hovertext=[f.message for f in top_f][::-1],
            customdata=index[::-1],  # the finding's place in `findings`: a click opens it
            hovertemplate="%{hovertext}<br>%{x:.2f} ms/step<extra></extra>",
        )
    )
    fig.update_xaxes(title="time at stake (ms per step)")
    title = "Top findings by time at stake"
    total = sum(f.time_at_stake_ns for f in top_f)
    if step_ns:
        fig.add_vline(
            x=step_ns / MS,
            line_dash="dash",
            line_color="#555",
            annotation_text=f"mean step {step_ns / MS:.3g} ms",
        )
        if total > step_ns:
            title += (
                f"<br><sup>they overlap: together {total / MS:.3g} ms, more than the "
                f"{step_ns / MS:.3g} ms step (the same time is at stake in several)</sup>"
            )
    width = 20 + 7 * max(len(label) for label in fig.data[0].y)  # ~7 px a character
    return styled(fig, title, height=160 + 40 * len(top_f), l=min(width, 360))


def mean_step_ns(table: pl.DataFrame) -> float | None:
    """The mean step window of breakdown.table (rank x step rows), or None when empty."""
    mean = table["window_ns"].cast(pl.Float64).mean() if "window_ns" in table.columns else None
    return float(mean) if isinstance(mean, float) else None


def named_ranks(findings: tuple[Finding, ...] | list[Finding], n_ranks: int) -> tuple[int, ...]:
    """The ranks the costliest finding that names some (not all) ranks points at: what the
    heatmap outlines, so the hot row and the finding's rank can be compared at a glance."""
    for f in findings:
        if f.ranks and len(f.ranks) < n_ranks:
            return tuple(f.ranks)
    return ()


def _ranks_label(f: Finding) -> str:
    if not f.ranks:
        return ""
    if len(f.ranks) == 1:
        return f"(rank {f.ranks[0]})"
    return f"({len(f.ranks)} ranks)"
