"""One colour, one meaning: red (figures.EXPOSED) is exposed communication on every chart,
and nothing else is red (PP communication, bubbles, severities, imbalance once were)."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import polars as pl
from ranklens.analysis import Finding, Result, Severity
from ranklens.dashboards import (
    figures,
    figures_comm,
    figures_contention,
    figures_overview,
    figures_pipeline,
)

MS = 1_000_000


def _colours(trace: Any) -> set[str]:
    c = trace.marker.color if trace.marker is not None else None
    if c is None:
        return set()
    return {str(x) for x in c} if isinstance(c, list | tuple) else {str(c)}


def _figures() -> list[go.Figure]:
    ranks = pl.DataFrame(
        {
            "rank": [0, 1],
            "steps": [1, 1],
            "window_ns": [10 * MS, 10 * MS],
            "compute_ns": [5 * MS, 4 * MS],
            "exposed_comm_ns": [2 * MS, 1 * MS],
            "idle_ns": [1 * MS, 2 * MS],
            "exposed_wait_ns": [1 * MS, 0],
            "exposed_transfer_ns": [1 * MS, 1 * MS],
            "caused_wait_ns": [0, 1 * MS],
            "waited_ns": [1 * MS, 0],
            "late_count": [0, 3],
            "compute_imbalance": [0.2, -0.2],
        }
    )
    steps = ranks.with_columns(
        step=pl.lit(1), compute_share=pl.lit(0.5), comm_share=pl.lit(0.3), idle_share=pl.lit(0.1)
    )
    par = pl.DataFrame(
        {"rank": [0, 1], "step": [1, 1], "parallelism": ["PP", "DP"], "comm_share": [0.2, 0.1]}
    )
    by_group = pl.DataFrame(
        {
            "parallelism": ["PP"],
            "coll_op": ["send_recv"],
            "hidden_ns": [MS],
            "exposed_ns": [MS],
        }
    )
    stages = pl.DataFrame(
        {
            "stage": [0, 1],
            "bubble_fraction": [0.3, 0.2],
            "closed_form": [0.2, 0.2],
            "warmup_bubble_ns": [MS, MS],
            "steady_bubble_ns": [MS, MS],
            "cooldown_bubble_ns": [MS, MS],
        }
    )
    kernels = pl.DataFrame(
        {
            "name": ["gemm"],
            "shape": ["s"],
            "slowdown": [0.3],
            "time_lost_ns": [MS],
            "n_matched": [2],
            "t_alone_ns": [MS],
            "t_overlapped_ns": [1.3 * MS],
        }
    )
    fs = [Finding("X", s, "m", "f", MS, ranks=(1,)) for s in Severity]
    return [
        figures.time_split(ranks),
        figures_overview.comm_share(steps, par, 1),
        figures_overview.findings_bar(fs),
        figures_comm.comm_by_op(by_group),
        figures_comm.wait_transfer(ranks),
        figures_comm.late_ranks(ranks),
        figures_comm.imbalance(ranks),
        figures_pipeline.bubble_by_stage(stages),
        figures_pipeline.bubble_phases(stages),
        figures_contention.slowdown(Result("contention", kernels)),
    ]


def test_red_means_exposed_communication_only() -> None:
    seen = 0
    for fig in _figures():
        for trace in fig.data:
            if figures.EXPOSED in _colours(trace):
                seen += 1
                name = str(trace.name or "")
                assert "exposed" in name or "waited" in name, name
    assert seen >= 4  # the split, the op bars, waiting, the wait others had
    assert figures.EXPOSED not in figures.PAR_COLORS.values()  # PP comm is not red


def test_pp_comm_has_its_own_colour_on_every_page() -> None:
    share = figures_overview.comm_share(
        pl.DataFrame({"rank": [0], "step": [1], "compute_share": [0.5], "idle_share": [0.1]}),
        pl.DataFrame({"rank": [0], "step": [1], "parallelism": ["PP"], "comm_share": [0.2]}),
        1,
    )
    pp = next(t for t in share.data if t.name == "PP comm")
    assert _colours(pp) == {figures.PAR_COLORS["PP"]}
    assert figures.PAR_COLORS["PP"] not in (figures.EXPOSED, figures.KIND_COLORS["comm"])
