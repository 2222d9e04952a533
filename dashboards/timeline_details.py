"""The selected event of the timeline: which one was clicked, every column of it, its launch ->
kernel flows and the marks that draw them.

Why apart from the page: a click names an event by what its hover point carries (rank,
stream, raw start relative to the run's origin, duration); finding it again, and its partners
that share its `correlation` id, are queries (analysis.timeline_lanes), and the panel is
shaped from what the database holds, not from the figure.
"""

from __future__ import annotations

from typing import Any

import polars as pl
from dash import html
from ranklens.analysis import timeline_lanes as tlz
from ranklens.dashboards import components as ui
from ranklens.dashboards.data import RunData
from ranklens.dashboards.figures import MS

Selection = dict[str, int]  # rank, stream, ts (raw start - t0), dur (ns)


def clicked(click: Any) -> Selection | None:
    """The event a click on the timeline's hover trace names, or None (an overlay, a bucket,
    the critical path)."""
    try:
        c = click["points"][0]["customdata"]
        if len(c) < 8:  # a bucket or a path segment: no single event
            return None
        return {"rank": int(c[0]), "stream": int(c[1]), "ts": int(c[2]), "dur": int(c[7])}
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def to_param(sel: Selection, t0: int) -> str:
    """The selection as a link names it: `RANK:STREAM:TS_NS:DUR_NS`, the raw start on the
    rank's own clock (not the job clock, so realigning the run keeps the link)."""
    return f"{sel['rank']}:{sel['stream']}:{t0 + sel['ts']}:{sel['dur']}"


def from_param(value: Any, t0: int) -> Selection | None:
    """The selection a link's `sel` names (to_param), or None when it is malformed."""
    parts = str(value or "").split(":")
    if len(parts) != 4:
        return None
    try:
        rank, stream, ts, dur = (int(p) for p in parts)
    except ValueError:
        return None
    return {"rank": rank, "stream": stream, "ts": ts - t0, "dur": dur}


def around(row: dict[str, Any]) -> tuple[int, int]:
    """A window on the job clock that shows the event `row` (selected_event) with room on
    either side: for a link that names the event but no window."""
    s, e = int(row["ats_ns"]), int(row["aend_ns"])
    pad = max(e - s, 100_000)
    return s - pad, e + pad


def selected_event(data: RunData, sel: Selection) -> dict[str, Any] | None:
    """Every column of the selected event (events_aligned, its group's parallelism, its
    thread's name), or None when the run has no such event."""
    cur = data.cursor()
    try:
        rows = tlz.event(cur, sel["rank"], sel["stream"], data.extent().t0_ns + sel["ts"])
    finally:
        cur.close()
    if rows.is_empty():
        return None
    same = rows.filter(pl.col("dur_ns") == sel["dur"])
    return (same if same.height else rows).row(0, named=True)


def flows_of(data: RunData, row: dict[str, Any]) -> pl.DataFrame:
    """The launch -> kernel links of the selected event (analysis.timeline_lanes.flows)."""
    cur = data.cursor()
    try:
        return tlz.flows(
            cur,
            int(row["rank"]),
            int(row["stream"]),
            int(row["ts_ns"]),
            int(row["dur_ns"]),
            row["correlation"],
        )
    finally:
        cur.close()


def marks_of(
    data: RunData, sel: Selection | None
) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
    """The selected event as an outline row (rank, stream, start_ns, end_ns on the job clock)
    and its flows, for timeline_marks.Marks."""
    row = selected_event(data, sel) if sel else None
    if row is None:
        return None, None
    one = pl.DataFrame(
        {
            "rank": [int(row["rank"])],
            "stream": [int(row["stream"])],
            "start_ns": [int(row["ats_ns"])],
            "end_ns": [int(row["aend_ns"])],
        }
    )
    return one, flows_of(data, row)


def flow_span(flows: pl.DataFrame | None) -> tuple[int, int] | None:
    """The time the selected event's flows cover on the job clock (to bring them into view)."""
    if flows is None or flows.is_empty():
        return None
    return int(flows["start_ns"].min()), int(flows["end_ns"].max())  # type: ignore[arg-type]


def _value(name: str, v: Any, t0: int) -> str:
    if v is None:
        return "—"
    if name in ("ats_ns", "aend_ns"):
        return f"{v} ({(v - t0) / MS:.6f} ms since the run's start)"
    if name == "dur_ns":
        return f"{v} ({v / MS:.6f} ms)"
    return str(v)


def _cell(name: str) -> Any:
    """`data-column` on a value cell, so tests and users' scripts can address it by name."""
    return {"data-column": name}


def panel(data: RunData, sel: Selection | None) -> Any:
    """Every column of the selected event as a two-column table, and its flows."""
    row = selected_event(data, sel) if sel else None
    if row is None:
        return html.Div("no event selected", id="timeline-details-none", style={"color": "#777"})
    t0 = data.extent().t0_ns
    body = [html.Tr([html.Th(k), html.Td(_value(k, v, t0), **_cell(k))]) for k, v in row.items()]
    flows = flows_of(data, row)
    pairs = flows.filter(pl.col("host")).height if flows.height else 0
    note = (
        f"{pairs} launch → kernel flow(s) drawn (correlation "
        + ", ".join(str(c) for c in flows["correlation"].unique().sort().to_list()[:8])
        + ("…" if flows["correlation"].n_unique() > 8 else "")
        + ")"
        if flows.height
        else "no launch → kernel flow (no correlation id)"
    )
    head = f"{row['name']} · rank {row['rank']} · {row['kind']}"
    return html.Div(
        [
            html.B(head),
            html.Div(note, id="timeline-details-flows", style={"color": "#555"}),
            html.Table(html.Tbody(body), id="timeline-details-table", className="ranklens-table"),
        ],
        style={**ui.CARD, "overflow": "auto", "maxHeight": "480px"},
    )
