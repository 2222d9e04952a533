"""The timeline page's logic: which window a link or an action asks for, and that window drawn.

Why apart from the page: the page only wires Dash components to these functions, so every
way the view changes (deep link, pan/zoom, step, click, search, reset, path toggle) is one
plain function that tests call without a browser.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import dash
import polars as pl
from dash import html
from ranklens.analysis import timeline as tl
from ranklens.analysis import timeline_lanes as tlz
from ranklens.dashboards import components as ui
from ranklens.dashboards import data_whatif as dw
from ranklens.dashboards import tables
from ranklens.dashboards import timeline_details as td
from ranklens.dashboards.data import RunData, evidence
from ranklens.dashboards.figures import MS
from ranklens.dashboards.figures_timeline import timeline as timeline_figure
from ranklens.dashboards.timeline_layers import lane_map
from ranklens.dashboards.timeline_marks import Marks, name_matches

MAX_SEARCH = 40  # characters of a search kept
NEXT, PREV = "timeline-search-next.n_clicks", "timeline-search-prev.n_clicks"
# Enter in the search box (its text is the callback's State): dcc.Input's debounce mode puts
# the caret back after a re-render, so fast typing came out scrambled ("alreducel")
SEARCH = "timeline-search.n_submit"


def step_of(data: RunData, ranks: list[int] | None, start: int, end: int) -> int | None:
    """The step whose window (over `ranks`) holds the view, so the Step menu never names a
    step the view has left."""
    sw = data.cached("step_windows", tl.step_windows)
    if ranks:
        sw = sw.filter(pl.col("rank").is_in(ranks))
    w = sw.group_by("step").agg(pl.col("start_ns").min(), pl.col("end_ns").max())
    # Ranks' step windows overlap at the edges: the step that began last holds the view.
    # (to the µs a link's window is written in)
    hit = w.filter((pl.col("start_ns") <= start + 1000) & (pl.col("end_ns") >= end - 1000))
    return int(hit.sort("start_ns")["step"][-1]) if hit.height else None


def step_window(data: RunData, step: int, ranks: list[int] | None) -> tuple[int, int] | None:
    """The step's window on the job clock over the chosen ranks (from the steps table)."""
    sw = data.cached("step_windows", tl.step_windows).filter(pl.col("step") == step)
    if ranks:
        sw = sw.filter(pl.col("rank").is_in(ranks))
    if sw.is_empty():
        return None
    return int(sw["start_ns"].min()), int(sw["end_ns"].max())


def all_steps(data: RunData) -> list[int]:
    sw = data.cached("step_windows", tl.step_windows)
    return [int(s) for s in sw["step"].unique().sort().to_list()]


def all_ranks(data: RunData) -> list[int]:
    return [int(r) for r in data.report().facts.get("ranks") or []]


def resolve(
    data: RunData,
    ranks: list[int] | None,
    step: int | None,
    start_ms: float | None,
    end_ms: float | None,
    sel: td.Selection | None = None,
) -> tuple[int, int]:
    """The window a deep link asks for: start/end, else around the selected event, else the
    step, else the first step."""
    ext = data.extent()
    if start_ms is not None and end_ms is not None and end_ms > start_ms:
        return ext.t0_ns + int(start_ms * MS), ext.t0_ns + int(end_ms * MS)
    row = td.selected_event(data, sel) if sel else None
    if row is not None:
        return td.around(row)
    steps = all_steps(data)
    if step is None and steps:
        step = steps[0]
    if step is not None:
        w = step_window(data, step, ranks)
        if w is not None:
            return w
    return ext.t0_ns, max(ext.t1_ns, ext.t0_ns + 1)


def search_text(value: Any) -> str:
    return str(value or "").strip()[:MAX_SEARCH]


def href(
    ranks: list[int] | None,
    step: int | None,
    s_ms: float,
    e_ms: float,
    hl: str | None,
    cp: bool,
    q: str,
    sel: str = "",
) -> str:
    """The permalink of a view (components.timeline_href, plus the search and the selected
    event as timeline_details.to_param names it)."""
    base = ui.timeline_href(ranks, step, s_ms, e_ms, hl, cp)
    more = urlencode({k: v for k, v in (("q", q), ("sel", sel)) if v}, safe=":")
    return base + (("&" if "?" in base else "?") + more if more else "")


def render(
    data: RunData,
    ranks: list[int] | None,
    start_ns: int,
    end_ns: int,
    highlight: pl.DataFrame | None = None,
    hl: str | None = None,
    cp: bool = False,
    q: str = "",
    sel: td.Selection | None = None,
) -> tuple[dict[str, Any], str, str]:
    """Figure, label and permalink of one window; `hl` outlines that finding's evidence,
    `cp` draws the critical path of the steps in view, `q` outlines the events whose name
    holds it, `sel` is the selected event (outlined, with its launch -> kernel flows)."""
    ext = data.extent()
    cur = data.cursor()
    try:
        win = tl.window(cur, ext, start_ns, end_ns, ranks, base=data.timeline_base())
        key = ("evidence", hl, start_ns, end_ns, tuple(ranks or ()))
        shown = data.memo(key, lambda: evidence(cur, win, hl, ranks, ext)) if hl else None
        found, n_found = (
            tlz.matches(cur, ext, start_ns, end_ns, ranks, q)
            if q and win.mode != "events"
            else (None, name_matches(win.events, q).height)
        )
    finally:
        cur.close()
    outlined = pl.concat(
        [
            h.select("rank", "stream", "start_ns", "end_ns")
            for h in (highlight, shown)
            if h is not None and not h.is_empty()
        ]
        or [pl.DataFrame(schema={"rank": pl.Int64})],
        how="diagonal_relaxed",
    )
    data.grow_lanes(tlz.need_rows(win.events))  # never two slices of a window on one row
    path = dw.path_segments(data, start_ns, end_ns, ranks) if cp else None
    one, flows = td.marks_of(data, sel)
    steps = data.cached("step_windows", tl.step_windows)
    marks = Marks(steps=steps, search=q, found=found, selected=one, flows=flows)
    lanes = lane_map(data.timeline_lanes(), ranks)
    fig = timeline_figure(win, ext.t0_ns, outlined if outlined.height else None, path, lanes, marks)
    s_ms, e_ms = (start_ns - ext.t0_ns) / MS, (end_ns - ext.t0_ns) / MS
    label = (
        f"window {s_ms:.3f} – {e_ms:.3f} ms ({e_ms - s_ms:.3f} ms), "
        f"{'all ranks' if not ranks else 'ranks ' + ', '.join(map(str, ranks))}, "
        + (
            f"{win.events.height} events"
            if win.mode == "events"
            else f"aggregated into {win.bucket_ns / MS:.3g} ms buckets"
        )
    )
    if hl:
        label += f"; evidence of {hl}: " + (
            f"{shown.height} events outlined" if shown is not None else "none drawn as events"
        )
    if path is not None:
        steps_cp = ", ".join(str(x) for x in path["step"].unique().sort().to_list()) or "none"
        label += f"; critical path: {path.height} segments (steps {steps_cp})"
    if q:
        label += f"; '{q}': {n_found} matches in view"
    step = step_of(data, ranks, start_ns, end_ns)
    picked = td.to_param(sel, ext.t0_ns) if sel and one is not None else ""
    return fig, label, href(ranks, step, s_ms, e_ms, hl, cp, q, picked)


def update(
    data: RunData,
    trigger: Any,
    relayout: Any,
    click: Any,
    ranks_v: Any,
    step_v: Any,
    win: dict[str, Any],
    cp_v: Any = None,
    q_v: Any = None,
) -> tuple[Any, ...]:
    """One callback for every way the window changes (pan/zoom, ranks, step, click, reset,
    path toggle, search, next/previous match); `trigger`: the Dash prop id that fired, e.g.
    "timeline-relayout.data". Returns figure, window store, label, permalink, instance
    panel, step, ranks, details panel, search position ("k of n")."""
    ranks = ui.parse_ints(ranks_v)
    start, end = int(win["start_ns"]), int(win["end_ns"])
    hl = win.get("hl")
    cp = bool(cp_v) if trigger == "timeline-cp.value" else bool(win.get("cp"))
    q = search_text(q_v) if trigger == SEARCH else str(win.get("q") or "")
    sel: td.Selection | None = win.get("sel")
    highlight = None
    info: Any = dash.no_update
    details: Any = dash.no_update
    pos: Any = "" if trigger == SEARCH else dash.no_update
    if trigger in (NEXT, PREV):
        found, pos = search_step(data, ranks, q, sel, start, end, trigger == NEXT)
        if found is None:
            return (dash.no_update,) * 8 + (pos,)
        sel, start, end = found
        # Selected as a click selects it: details, flows, its collective on every rank.
        details = td.panel(data, sel)
        highlight, info = selection_instance(data, sel)
        ranks, start, end = _bring_into_view(data, sel, highlight, ranks, start, end)
    elif trigger == "timeline-graph.clickData":
        picked = td.clicked(click)
        highlight, info = instance_view(data, click)
        if picked is None and highlight is None:
            return (dash.no_update,) * 4 + (info,) + (dash.no_update,) * 4
        if picked is not None:
            sel, details = picked, td.panel(data, picked)
        ranks, start, end = _bring_into_view(data, picked, highlight, ranks, start, end)
    elif trigger == "timeline-relayout.data":
        new = _relayout_window(data, relayout, start, end)
        if new is None:
            return (dash.no_update,) * 9
        start, end = new
    elif trigger == "timeline-step.value":
        step = ui.parse_int(step_v)
        w = step_window(data, step, ranks) if step is not None else None
        if w is not None:
            start, end = w
    elif trigger == "timeline-reset.n_clicks":
        ext = data.extent()
        start, end = ext.t0_ns, max(ext.t1_ns, ext.t0_ns + 1)
    fig, label, link = render(data, ranks, start, end, highlight, hl, cp, q, sel)
    step = step_of(data, ranks, start, end)
    store = {"start_ns": start, "end_ns": end, "hl": hl, "cp": cp, "q": q, "sel": sel}
    return fig, store, label, link, info, step, ranks, details, pos


def _bring_into_view(
    data: RunData,
    sel: td.Selection | None,
    inst: pl.DataFrame | None,
    ranks: list[int] | None,
    start: int,
    end: int,
) -> tuple[list[int] | None, int, int]:
    """Ranks and window widened so that the selected event's launch -> kernel flows and its
    collective instance (every member rank, even where it lies outside the view) show."""
    span = td.flow_span(td.marks_of(data, sel)[1]) if sel is not None else None
    if span is not None and (span[0] < start or span[1] > end):
        pad = max((span[1] - span[0]) // 10, 1000)
        start, end = min(start, span[0] - pad), max(end, span[1] + pad)
    if inst is not None:
        lo, hi = int(inst["arrive_ns"].min()), int(inst["end_ns"].max())  # type: ignore[arg-type]
        pad = max((hi - lo) // 10, 1000)
        start, end = min(start, lo - pad), max(end, hi + pad)
        if ranks:
            ranks = sorted(set(ranks) | set(inst["rank"].to_list()))
    return ranks, start, end


def search_step(
    data: RunData,
    ranks: list[int] | None,
    q: str,
    sel: td.Selection | None,
    start: int,
    end: int,
    forward: bool,
) -> tuple[tuple[td.Selection, int, int] | None, str]:
    """The next (previous) event whose name holds `q`, in time order over `ranks`, after the
    selected event (none selected: from the view's start), as (selection, window start,
    end), and its position "k of n". The window keeps its width, centred on the match (one
    longer than the view: the match with a tenth of it either side)."""
    if not q:
        return None, "type a name to search first"
    row = td.selected_event(data, sel) if sel else None
    far = -(2**62)
    anchor: tlz.Key = (
        (
            int(row["ats_ns"]),
            int(row["rank"]),
            int(row["stream"]),
            int(row["ts_ns"]),
            int(row["dur_ns"]),
        )
        if row is not None
        else (start, far, far, far, far)  # the first match from the view's start
    )
    cur = data.cursor()
    try:
        hit, k, n = tlz.step_match(cur, q, ranks, anchor, forward)
    finally:
        cur.close()
    if hit is None:
        return None, f"no event named like '{q}'" + (" on these ranks" if ranks else "")
    s, e = int(hit["ats_ns"]), int(hit["aend_ns"])
    width = end - start
    if e - s <= width:
        start = (s + e) // 2 - width // 2
        end = start + width
    else:
        pad = max((e - s) // 10, 1000)
        start, end = s - pad, e + pad
    t0 = data.extent().t0_ns
    picked: td.Selection = {
        "rank": int(hit["rank"]),
        "stream": int(hit["stream"]),
        "ts": int(hit["ts_ns"]) - t0,
        "dur": int(hit["dur_ns"]),
    }
    return (picked, start, end), f"{k} of {n}"


def linked_selection(data: RunData, value: Any) -> tuple[td.Selection | None, str | None]:
    """The event a link's `sel` names, or None and why (malformed, or no such event in
    this run): a link to a missing event says so rather than quietly showing the run."""
    if not value:
        return None, None
    sel = td.from_param(value, data.extent().t0_ns)
    if sel is None:
        return None, f"the selected event in this link (sel={str(value)[:80]}) is malformed"
    if td.selected_event(data, sel) is None:
        return None, (
            f"the selected event in this link (rank {sel['rank']}, stream {sel['stream']}, "
            f"start {sel['ts'] + data.extent().t0_ns} ns, {sel['dur']} ns long) is not in "
            "this run: no event is selected"
        )
    return sel, None


def _relayout_window(data: RunData, relayout: Any, start: int, end: int) -> tuple[int, int] | None:
    if not isinstance(relayout, dict):
        return None
    t0 = data.extent().t0_ns
    if "xaxis.range[0]" in relayout and "xaxis.range[1]" in relayout:
        lo, hi = float(relayout["xaxis.range[0]"]), float(relayout["xaxis.range[1]"])
    elif isinstance(relayout.get("xaxis.range"), list):
        lo, hi = (float(v) for v in relayout["xaxis.range"][:2])
    elif relayout.get("xaxis.autorange"):
        ext = data.extent()
        return ext.t0_ns, max(ext.t1_ns, ext.t0_ns + 1)
    else:
        return None
    new = (t0 + int(lo * MS), t0 + int(hi * MS))
    if new[1] <= new[0] or (abs(new[0] - start) < 1000 and abs(new[1] - end) < 1000):
        return None
    return new


def selection_instance(data: RunData, sel: td.Selection) -> tuple[pl.DataFrame | None, Any]:
    """instance_view of a selected event (a link's), as a click on it gives."""
    return instance_view(
        data, {"points": [{"customdata": [sel["rank"], sel["stream"], sel["ts"]]}]}
    )


def instance_view(data: RunData, click: Any) -> tuple[pl.DataFrame | None, Any]:
    """The clicked event's collective instance on every rank, and a table of it."""
    try:
        rank, stream, rel_ns = (int(v) for v in click["points"][0]["customdata"][:3])
    except (KeyError, IndexError, TypeError, ValueError):
        return None, dash.no_update
    ts_ns = data.extent().t0_ns + rel_ns  # the figure carries raw starts relative to t0
    cur = data.cursor()
    try:
        inst = tl.instance(cur, rank, stream, ts_ns)
    finally:
        cur.close()
    if inst.is_empty():
        return None, html.Div(
            "the clicked event is not part of a matched collective", id="timeline-instance-none"
        )
    t0 = data.extent().t0_ns
    shown = inst.select(
        "instance_id",
        "rank",
        "op",
        "pg_name",
        "parallelism",
        "status",
        "bytes",
        *[
            ((pl.col(c) - t0) / MS).round(3).alias(c.replace("_ns", "_ms"))
            for c in ("arrive_ns", "start_ns", "end_ns")
        ],
    )
    head = (
        f"collective instance {inst['instance_id'][0]}: {inst['op'][0]} on "
        f"{inst.height} ranks (outlined in the timeline)"
    )
    who = html.Div(tables.instance_summary(inst), id="timeline-instance-late")
    return inst, html.Div(
        [html.B(head), who, ui.table(shown, "timeline-instance-table")], style=ui.CARD
    )
