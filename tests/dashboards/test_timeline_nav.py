"""The timeline's selected event in the URL, and stepping through a search's matches.

A click puts `sel=RANK:STREAM:TS_NS:DUR_NS` (the raw start) in the permalink; the page built
from that link selects the same event, shows the same details and outlines and gives back the
same link. A link to an event the run lacks says so. Next/previous visit the matches of a
name in the time order SQL gives, each selected and centred, "k of n" shown, wrapping round.
Expected values come from SQL on the run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import dash
import plotly
import pytest
from ranklens.dashboards import timeline_details as td
from ranklens.dashboards import timeline_view as tv
from ranklens.dashboards.app import create_app
from ranklens.dashboards.data import RunData
from ranklens.dashboards.pages import timeline as tpage
from ranklens.sample_traces.gpu_job import GpuJob

from .conftest import job_db, run_data
from .test_timeline_run import drawn, sql


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dash.Dash]:
    data = RunData(
        job_db(tmp_path_factory.mktemp("timeline-nav"), GpuJob(tp=2, dp=1, pp=2, m=2, steps=2))
    )
    yield create_app(data.db_path, data=data)
    data.close()


def find(node: Any, cid: str) -> Any:
    """The component with id `cid` in a layout tree, or None."""
    if getattr(node, "id", None) == cid:
        return node
    kids = getattr(node, "children", None)
    for kid in kids if isinstance(kids, list) else [kids] if kids is not None else []:
        hit = find(kid, cid)
        if hit is not None:
            return hit
    return None


def as_json(x: Any) -> str:
    return json.dumps(x, cls=plotly.utils.PlotlyJSONEncoder, sort_keys=True)


def trace(fig: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((t for t in fig["data"] if t.get("name") == name), None)


def open_link(app: dash.Dash, link: str) -> Any:
    """The timeline page as a browser opening `link` gets it."""
    with app.server.test_request_context(link):
        return tpage.layout(**dict(parse_qsl(urlsplit(link).query)))


def test_a_clicked_event_round_trips_through_the_url(app: dash.Dash) -> None:
    data = run_data(app)
    t0 = data.extent().t0_ns
    s, _ = tv.resolve(data, [0], None, None, None)
    win = {"start_ns": s, "end_ns": s + 4_000_000}
    with app.server.test_request_context("/timeline"):
        fig, _, _ = tv.render(data, [0], win["start_ns"], win["end_ns"])
        kernel = next(d for d in drawn(fig) if d["c"][6] == "compute")
        click = {"points": [{"customdata": kernel["c"]}]}
        out = tv.update(data, "timeline-graph.clickData", None, click, [0], None, win)
    stream, ts, dur = sql(
        data,
        "SELECT stream, ts_ns, dur_ns FROM events WHERE rank = 0 AND stream = ? AND ts_ns = ?",
        kernel["c"][1],
        kernel["c"][2] + t0,
    )[0]
    link = out[3]
    assert dict(parse_qsl(urlsplit(link).query))["sel"] == f"0:{stream}:{ts}:{dur}"
    sel = out[1]["sel"]
    assert td.from_param(td.to_param(sel, t0), t0) == sel
    page = open_link(app, link)
    assert find(page, "timeline-window").data["sel"] == sel
    assert find(page, "timeline-permalink").href == link  # the same link back
    assert as_json(find(page, "timeline-details").children) == as_json(out[7])
    assert "timeline-details-table" in as_json(out[7])
    fig2 = find(page, "timeline-graph").figure
    assert as_json(trace(fig2, "selected")) == as_json(trace(out[0], "selected"))
    assert trace(fig2, "selected") is not None
    assert find(page, "timeline-warning").children == ""
    # Without a window, the link opens around the event.
    aligned = sql(
        data, "SELECT ats_ns, aend_ns FROM events_aligned WHERE rank = 0 AND ts_ns = ?", ts
    )
    page = open_link(app, f"/timeline?rank=0&sel=0:{stream}:{ts}:{dur}")
    store = find(page, "timeline-window").data
    assert store["start_ns"] < aligned[0][0] and store["end_ns"] > aligned[0][1]
    assert store["sel"] == sel


@pytest.mark.parametrize(
    ("value", "said"),
    [("0:7:12345:5", "is not in this run: no event is selected"), ("0:x:1", "is malformed")],
)
def test_a_link_to_a_missing_event_says_so(app: dash.Dash, value: str, said: str) -> None:
    page = open_link(app, f"/timeline?rank=0&sel={value}")
    assert said in find(page, "timeline-warning").children
    assert find(page, "timeline-window").data["sel"] is None
    assert find(page, "timeline-details").children is None
    assert "sel=" not in find(page, "timeline-permalink").href


def test_next_and_previous_visit_the_matches_in_time_order(app: dash.Dash) -> None:
    data = run_data(app)
    t0 = data.extent().t0_ns
    want = sql(
        data,
        "SELECT rank, stream, ts_ns, dur_ns, ats_ns, aend_ns FROM events_aligned "
        "WHERE rank IN (0, 1) AND name ILIKE '%allreduce%' "
        "ORDER BY ats_ns, rank, stream, ts_ns, dur_ns",
    )
    n = len(want)
    assert n > 2
    # From a view that starts at the third match: next is the third, "3 of n".
    width = 2_000_000
    win: dict[str, Any] = {"start_ns": want[2][4], "end_ns": want[2][4] + width, "q": "allreduce"}

    def step(trigger: str) -> tuple[Any, ...]:
        with app.server.test_request_context("/timeline"):
            out = tv.update(data, trigger, None, None, [0, 1], None, win)
        if isinstance(out[1], dict):
            win.update(out[1])
        return out

    for trigger, k in ((tv.NEXT, 3), (tv.NEXT, 4), (tv.PREV, 3), (tv.PREV, 2), (tv.PREV, 1)):
        out = step(trigger)
        rank, stream, ts, dur, s, e = want[k - 1]
        assert out[8] == f"{k} of {n}"
        assert out[1]["sel"] == {"rank": rank, "stream": stream, "ts": ts - t0, "dur": dur}
        # centred, the same width unless its collective on every rank needs more
        # (test_timeline_search_instance)
        assert out[1]["end_ns"] - out[1]["start_ns"] >= width
        assert out[1]["start_ns"] < s and out[1]["end_ns"] > e
        assert f"sel={rank}:{stream}:{ts}:{dur}" in out[3]
        assert str(ts) in as_json(out[7]) and trace(out[0], "selected") is not None  # panel
    assert step(tv.PREV)[8] == f"{n} of {n}"  # wraps round at either end
    assert step(tv.NEXT)[8] == f"1 of {n}"
    win["q"] = "no-such-kernel"
    assert step(tv.NEXT) == (dash.no_update,) * 8 + (
        "no event named like 'no-such-kernel' on these ranks",
    )
    win["q"] = ""
    assert step(tv.NEXT)[8] == "type a name to search first"


def test_a_new_search_clears_the_position(app: dash.Dash) -> None:
    data = run_data(app)
    s, e = tv.resolve(data, [0], None, None, None)
    win = {"start_ns": s, "end_ns": e}
    with app.server.test_request_context("/timeline"):
        out = tv.update(data, tv.SEARCH, None, None, [0], None, win, None, "gemm")
    assert out[8] == "" and out[1]["q"] == "gemm"
