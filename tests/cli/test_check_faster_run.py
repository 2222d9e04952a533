"""`ranklens check --baseline` on a run whose compute got faster: not a regression.

Why: a share of the step also rises when the step shortens around an unchanged time. With
compute 30% faster and the same DP all-reduce, the DP share rose past a 5% limit and the gate
failed a run that was better in every way. Generated runs (sample_traces.gpu_job) are exact,
so the only changes are the injected ones: the compute time, or the DP all-reduce's time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ranklens.analysis import run_compare
from ranklens.cli.main import app
from ranklens.dashboards import data_compare as dc
from ranklens.dashboards.app import create_app
from ranklens.dashboards.data import RunData
from ranklens.dashboards.pages import compare
from ranklens.ingest import load_traces
from ranklens.sample_traces.gpu_job import GpuJob, write_job
from typer.testing import CliRunner

runner = CliRunner()
BASE = GpuJob(pp=2, dp=2, m=4, steps=5, t_fwd_us=1000.0, dp_us=3000.0)
JOBS = {
    "base": BASE,
    "faster": GpuJob(pp=2, dp=2, m=4, steps=5, t_fwd_us=700.0, dp_us=3000.0),
    "more_dp": GpuJob(pp=2, dp=2, m=4, steps=5, t_fwd_us=1000.0, dp_us=4500.0),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("faster")
    out = {}
    for name, job in JOBS.items():
        write_job(job, root / name)
        out[name] = root / f"{name}.duckdb"
        load_traces([str(root / name)], out[name], workers=1)
    return out


def _check(cur: Path, base: Path) -> tuple[int, dict[str, Any]]:
    args = ["check", str(cur), "--baseline", str(base), "--max-regression", "5%", "-f", "json"]
    res = runner.invoke(app, args)
    assert res.exit_code in (0, 3), res.output
    return res.exit_code, json.loads(res.stdout)


def _changes(cur: Path, base: Path) -> tuple[run_compare.Comparison, str]:
    """What the dashboard's compare page shows for the two runs: its data and its layout."""
    data, b = RunData(cur), dc.Baseline(RunData(base), "base", None)
    try:
        app = create_app(cur, data=data, baseline=b)
        with app.server.test_request_context(compare.PATH):
            return dc.comparison(data, b), str(compare.layout())
    finally:
        data.close()
        b.data.close()


def test_a_faster_run_with_the_same_communication_passes(runs: dict[str, Path]) -> None:
    code, doc = _check(runs["faster"], runs["base"])
    assert code == 0 and doc["regressions"] == [], doc["regressions"]
    cmp, page = _changes(runs["faster"], runs["base"])
    assert cmp.exit_code == 0 and "check --baseline would pass (exit 0)" in page
    assert "its time per step +0% of the base step" in page  # the page says why
    steps = [c for c in cmp.changes if c.metric == "step_time"]
    assert steps and all(c.delta < -0.15 for c in steps)  # every rank's step is faster
    dp = [c for c in cmp.changes if c.metric == "exposed_comm" and c.key == "DP"]
    assert dp and len(dp) == BASE.world
    # The share rose past the limit on every rank (the old verdict: a regression) ...
    assert all(c.delta > 0.05 for c in dp), [round(c.delta, 3) for c in dp]
    # ... while the all-reduce's time per step did not change.
    assert all(c.time_delta is not None and abs(c.time_delta) < 1e-3 for c in dp)
    assert not any(c.regression for c in cmp.changes)


def test_more_dp_time_is_still_a_regression(runs: dict[str, Path]) -> None:
    """The all-reduce 3 -> 4.5 ms in an unchanged compute: its share and its time grew."""
    code, doc = _check(runs["more_dp"], runs["base"])
    assert code == 3
    assert any(r.startswith("DP exposed comm +") for r in doc["regressions"]), doc
    cmp, page = _changes(runs["more_dp"], runs["base"])
    assert "check --baseline would FAIL (exit 3)" in page
    dp = [c for c in cmp.changes if c.metric == "exposed_comm" and c.key == "DP"]
    step = {c.rank: c.base for c in cmp.changes if c.metric == "step_time"}
    for c in dp:
        assert c.regression and c.time_delta is not None
        # 1.5 ms more per step, in units of that rank's baseline step (hand computed)
        assert c.time_delta == pytest.approx(1.5e6 / step[c.rank], rel=0.02)


def test_the_slower_run_against_the_faster_is_a_step_time_regression(
    runs: dict[str, Path],
) -> None:
    code, doc = _check(runs["base"], runs["faster"])
    assert code == 3 and doc["regressions"] and doc["regressions"][0].startswith("step time +")
    assert not any("comm" in r for r in doc["regressions"])  # its comm share fell
