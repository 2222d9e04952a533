"""Pure figure builders for the pipeline page (pipeline analysis tables in, figures out).

Why the step window is drawn under the blocks: a bubble is the part of a stage's window with
no micro-batch block, so shading the window and drawing the blocks on top shows the bubbles
exactly where the analysis counts them, without the dashboard computing any gap itself.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import polars as pl
from ranklens.dashboards.figures import BUBBLE_COLORS, MS, empty, styled

PHASE_COLORS: dict[str, str] = {
    "F": "#4C78A8",
    "B": "#54A24B",
    "W": "#B279A2",
    "FB": "#72B7B2",
    "BF": "#72B7B2",
}


def gantt(blocks: pl.DataFrame, windows: pl.DataFrame, t0_ns: int, title: str) -> go.Figure:
    """Stage x time: each stage's step window (grey: bubble wherever no block covers it) and
    its F/B/W micro-batch blocks, labelled with the micro-batch index.

    Args:
        blocks: pipeline.tables["blocks"] rows of one pipeline and step (job clock).
        windows: rank, stage, start_ns, end_ns of the same step (job clock).
        t0_ns: origin of the time axis.
    """
    if blocks.is_empty():
        return empty("no micro-batch blocks found for this step")
    stages = windows.sort("stage")
    labels = {
        int(r["stage"]): f"stage {r['stage']} (rank {r['rank']})"
        for r in stages.iter_rows(named=True)
    }
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            orientation="h",
            base=((stages["start_ns"] - t0_ns) / MS).to_list(),
            x=((stages["end_ns"] - stages["start_ns"]) / MS).to_list(),
            y=[labels[int(s)] for s in stages["stage"].to_list()],
            width=0.9,
            name="bubble (step window not in a block)",
            marker={"color": "rgba(200,200,200,0.6)", "line": {"width": 0}},
            hovertemplate="step window %{x:.2f} ms<extra></extra>",
        )
    )
    for phase in sorted(blocks["phase"].unique().to_list()):
        part = blocks.filter(pl.col("phase") == phase)
        mbs = ["" if m is None else str(m) for m in part["mb"].to_list()]
        fig.add_trace(
            go.Bar(
                orientation="h",
                base=((part["start_ns"] - t0_ns) / MS).to_list(),
                x=(part["dur_ns"] / MS).to_list(),
                y=[labels.get(int(s), f"stage {s}") for s in part["stage"].to_list()],
                width=0.7,
                name=phase,
                text=[f"{phase}{m}" for m in mbs],
                textposition="inside",
                insidetextanchor="middle",
                marker={
                    "color": PHASE_COLORS.get(phase, "#888"),
                    "line": {"color": "white", "width": 1},
                },
                hovertemplate=f"{phase}" + "%{text} %{x:.2f} ms<extra></extra>",
            )
        )
    fig.update_layout(barmode="overlay")
    fig.update_xaxes(title="time since run start (ms, job clock)")
    fig.update_yaxes(autorange="reversed", title="")
    return styled(fig, title, height=140 + 60 * len(labels))


def bubble_by_stage(stages: pl.DataFrame) -> go.Figure:
    """Measured bubble fraction per stage next to the schedule's closed form (stages table)."""
    if stages.is_empty():
        return empty("no pipeline stages")
    x = [f"stage {s}" for s in stages["stage"].to_list()]
    fig = go.Figure(
        [
            go.Bar(
                x=x,
                y=stages[col].to_list(),
                name=name,
                marker_color=BUBBLE_COLORS[name],
                texttemplate="%{y:.3f}",
                textposition="outside",
            )
            for col, name in (("bubble_fraction", "measured"), ("closed_form", "closed form"))
        ]
    )
    fig.update_layout(barmode="group")
    fig.update_yaxes(title="bubble / (bubble + work)", range=[0, 1.05])
    return styled(fig, "Bubble fraction per stage: measured vs closed form (all steps)")


def bubble_phases(stages: pl.DataFrame) -> go.Figure:
    """Where each stage's bubble sits: warm-up, steady state, cool-down (ms over all steps)."""
    if stages.is_empty():
        return empty("no pipeline stages")
    x = [f"stage {s}" for s in stages["stage"].to_list()]
    fig = go.Figure()
    for col, name in (
        ("warmup_bubble_ns", "warm-up"),
        ("steady_bubble_ns", "steady state"),
        ("cooldown_bubble_ns", "cool-down"),
    ):
        color = BUBBLE_COLORS[name]
        fig.add_trace(
            go.Bar(x=x, y=(stages[col].fill_null(0) / MS).to_list(), name=name, marker_color=color)
        )
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title="bubble (ms, all steps)")
    return styled(fig, "Bubble by phase")


# The excess-bubble terms (analysis.pipeline_model), what a negative value of each means.
TERMS: tuple[tuple[str, str, str], ...] = (
    (
        "imbalance_ns",
        "stage imbalance",
        "the stages' different speeds happened to shorten the "
        "replay (the slow stage's extra time fell where others waited anyway)",
    ),
    (
        "microbatch_variance_ns",
        "micro-batch variance",
        "the slower micro-batches fell where they stalled no other stage",
    ),
    ("p2p_ns", "p2p", "transfers overlapped waits the replay already had"),
    (
        "order_ns",
        "block order",
        "the observed block order packs tighter than the textbook schedule the closed form assumes",
    ),
    (
        "unexplained_ns",
        "unexplained",
        "the measured bubble is smaller than the replay of the "
        "measured blocks: blocks overlap on the stage (communication under compute) or their "
        "ranges include part of the waits",
    ),
)


def heavy_stage_line(row: dict[str, Any]) -> str | None:
    """The schedule row's heavy stage in words (pipeline.tables["schedule"] row), or None."""
    if row.get("heavy_stage") is None:
        return None
    ratio = row.get("busy_max_over_mean")
    return f"heavy stage: stage {row['heavy_stage']} (rank {row['heavy_rank']})" + (
        f", {ratio:.2f}x the mean busy time of the stages" if ratio is not None else ""
    )


def decomposition_lines(row: dict[str, Any]) -> tuple[str, list[str]]:
    """The excess bubble's terms in ms ('stage imbalance 3.21 ms, ...') and, for each negative
    term, what it means: the terms are replays that differ by one assumption each, so a term
    is negative when its cause gave time back; they still add up to the excess."""
    parts, notes = [], []
    for col, label, negative in TERMS:
        v = row.get(col)
        if v is None:
            continue
        parts.append(f"{label} {v / MS:.2f} ms")
        if v < -0.005 * MS:  # below 5 µs: rounding, not a cause
            notes.append(f"{label} is negative ({v / MS:.2f} ms): {negative}")
    return ", ".join(parts), notes
