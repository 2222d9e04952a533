"""A search match selected with next/previous is selected as a click on it selects it: a
collective's instance is outlined on every member rank and listed, with the rank that
arrived last and by how much, the window and ranks widened to show it.

The job's rank 1 computes 1.5x slower, so it reaches each tensor-parallel all-reduce late.
Expected values come from SQL on the run (collectives_aligned), never from the page's code.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import dash
import pytest
from ranklens.dashboards import timeline_view as tv
from ranklens.dashboards.app import create_app
from ranklens.dashboards.data import RunData
from ranklens.dashboards.figures import MS
from ranklens.dashboards.tables import num
from ranklens.sample_traces.gpu_job import GpuJob

from .conftest import job_db, run_data
from .test_timeline_nav import as_json
from .test_timeline_run import sql


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dash.Dash]:
    job = GpuJob(tp=2, dp=1, pp=2, m=2, steps=2, rank_factor={1: 1.5})
    data = RunData(job_db(tmp_path_factory.mktemp("timeline-search-instance"), job))
    yield create_app(data.db_path, data=data)
    data.close()


def shapes(fig: dict[str, Any]) -> list[dict[str, Any]]:
    layout = fig["layout"]
    return list(layout["shapes"] if isinstance(layout, dict) else layout.shapes or [])


def test_a_searched_collective_opens_its_instance_as_a_click_does(app: dash.Dash) -> None:
    data = run_data(app)
    t0 = data.extent().t0_ns
    want = sql(
        data,
        "SELECT e.rank, e.stream, e.ts_ns, e.dur_ns, e.ats_ns, c.instance_id "
        "FROM events_aligned e JOIN collectives c USING (rank, stream, ts_ns) "
        "WHERE e.rank = 0 AND e.name ILIKE '%allreduce%' AND c.instance_id IS NOT NULL "
        "ORDER BY e.ats_ns, e.rank, e.stream, e.ts_ns, e.dur_ns",
    )
    k = len(want) // 2  # one in the middle of the run
    rank, stream, ts, dur, ats, iid = want[k]
    members = sql(
        data,
        "SELECT rank, aarrive_ns, aend_ns FROM collectives_aligned WHERE instance_id = ? "
        "ORDER BY aarrive_ns, rank",
        iid,
    )
    assert len(members) == 2 and members[-1][1] > members[0][1]  # someone was late
    width = 1_000_000
    win: dict[str, Any] = {"start_ns": ats - 100_000, "end_ns": ats - 100_000 + width}
    win["q"] = "ncclDevKernel_AllReduce"
    with app.server.test_request_context("/timeline"):
        found = tv.update(data, tv.NEXT, None, None, [0], None, dict(win))
    assert found[1]["sel"] == {"rank": rank, "stream": stream, "ts": ts - t0, "dur": dur}
    # its instance listed: every member rank, the late one and by how much
    panel = as_json(found[4])
    assert f"collective instance {iid}" in panel and "timeline-instance-table" in panel
    late, first = members[-1], members[0]
    skew = (late[1] - first[1]) / MS
    assert f"rank {late[0]} arrived last, {num(skew)} ms after rank {first[0]}" in panel
    # ... outlined on every member rank, which the view now shows, whole
    assert found[6] == sorted({0} | {m[0] for m in members})
    assert len(shapes(found[0])) == len(members)
    assert found[1]["start_ns"] < min(m[1] for m in members)
    assert found[1]["end_ns"] > max(m[2] for m in members)
    assert "ts_ns" in as_json(found[7]) and str(ts) in as_json(found[7])  # details
    # The same as a click on that event in the view the search left.
    click = {"points": [{"customdata": [rank, stream, ts - t0, 0, 0, 0, 0, dur]}]}
    with app.server.test_request_context("/timeline"):
        clicked = tv.update(data, "timeline-graph.clickData", None, click, found[6], None, found[1])
    assert found[8] == f"{k + 1} of {len(want)}"
    for i in range(8):
        assert as_json(found[i]) == as_json(clicked[i]), i


def test_a_searched_event_outside_any_collective_says_so(app: dash.Dash) -> None:
    data = run_data(app)
    s, e = tv.resolve(data, [0], None, None, None)
    win = {"start_ns": s, "end_ns": e, "q": "gemm"}
    with app.server.test_request_context("/timeline"):
        out = tv.update(data, tv.NEXT, None, None, [0], None, win)
    assert out[1]["sel"] is not None and out[6] == [0]
    assert "is not part of a matched collective" in as_json(out[4])
    assert shapes(out[0]) == []
