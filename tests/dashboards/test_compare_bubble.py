"""A PP stage whose bubble grew fails `ranklens check --baseline`, and the compare page says
the same, with the same thresholds (`ranklens dashboard --config/--max-regression`).

Why generated runs: the simulated pipeline (sample_traces.gpu_job) is exact, so the only change
is the one injected: stage 2's compute kernels shortened to 80%, which leaves its step window,
its communication and every other stage as they were and turns the time saved into bubble.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from ranklens.analysis import baseline as baseline_mod
from ranklens.analysis import run_compare
from ranklens.cli.main import app as cli
from ranklens.dashboards import data_compare as dc
from ranklens.dashboards import server
from ranklens.dashboards.app import create_app
from ranklens.dashboards.data import RunData, current
from ranklens.dashboards.pages import compare
from ranklens.ingest import load_traces
from ranklens.sample_traces.gpu_job import GpuJob, write_job
from typer.testing import CliRunner

JOB = GpuJob(pp=4, m=8, dp=2, steps=5)
STAGE = 2  # the stage whose bubble grows
STAGE_RANKS = sorted(JOB.rank(t, d, STAGE) for t in range(JOB.tp) for d in range(JOB.dp))
runner = CliRunner()


def _scale_compute(db: Path, ranks: list[int], by_step: dict[int, float]) -> None:
    """Shorten the compute kernels of `ranks` in place, by a factor per step."""
    con = duckdb.connect(str(db))
    for step, factor in by_step.items():
        for table in ("events_rich", "events_plain"):  # the two tables behind `events`
            con.execute(
                f"UPDATE {table} SET dur_ns = CAST(dur_ns * ? AS BIGINT) "
                "WHERE kind = 'compute' AND step = ? AND rank IN (SELECT unnest(?))",
                [factor, step, ranks],
            )
    con.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """base; bubbly (stage 2's bubble grown); same (a copy of base); noisy_base/noisy_cur
    (stage 2's bubble varying a lot from step to step, its median moved a little); flat (a run
    without a pipeline)."""
    root = tmp_path_factory.mktemp("bubble")
    out: dict[str, Path] = {}
    for name, job in (("base", JOB), ("flat", GpuJob(pp=1, dp=4, steps=3))):
        write_job(job, root / name)
        out[name] = root / f"{name}.duckdb"
        load_traces([str(root / name)], out[name], workers=1)
    out["flat_copy"] = root / "flat_copy.duckdb"  # the dashboard opens each file once
    shutil.copy(out["flat"], out["flat_copy"])
    steps = [JOB.first_step + k for k in range(JOB.steps)]
    variants = {
        "bubbly": dict.fromkeys(steps, 0.8),
        "same": {},
        "noisy_base": dict(zip(steps, (1.0, 0.9, 0.8, 0.7, 0.6), strict=True)),
        "noisy_cur": dict(zip(steps, (0.96, 0.86, 0.76, 0.66, 0.56), strict=True)),
    }
    for name, by_step in variants.items():
        out[name] = root / f"{name}.duckdb"
        shutil.copy(out["base"], out[name])
        _scale_compute(out[name], STAGE_RANKS, by_step)
    return out


def _check(cur: Path, base: Path, *args: str) -> tuple[int, dict[str, Any]]:
    res = runner.invoke(cli, ["check", str(cur), "--baseline", str(base), *args, "-f", "json"])
    assert res.exit_code in (0, 3), res.output
    return res.exit_code, json.loads(res.stdout)


def _page(cur: Path, base: Path, config: Any = None) -> tuple[run_compare.Comparison, str]:
    """The compare page's data and its rendered layout, as the dashboard would serve them."""
    data, b = RunData(cur), dc.Baseline(RunData(base), "base", config)
    try:
        cmp = dc.comparison(data, b)
        app = create_app(cur, data=data, baseline=b)
        with app.server.test_request_context(compare.PATH):
            return cmp, str(compare.layout())
    finally:
        data.close()
        b.data.close()


def _same_verdicts(doc: dict[str, Any], cmp: run_compare.Comparison) -> None:
    assert [(c["name"], c["status"], c["message"]) for c in doc["checks"]] == [
        (v.name, v.status, v.message) for v in cmp.verdicts
    ]
    assert doc["regressions"] == list(cmp.regressions)


def test_a_grown_stage_bubble_fails_check_and_the_page_says_so(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    code, doc = _check(runs["bubbly"], runs["base"], "--summary", str(tmp_path / "s.md"))
    assert code == 3
    (line,) = doc["regressions"]  # the bubble alone: nothing else moved
    want_ranks = baseline_mod._ranges(STAGE_RANKS)
    assert line.startswith("PP bubble +") and f"of step on ranks {want_ranks} (noise" in line
    reg = next(c for c in doc["checks"] if c["name"] == "max_regression")
    assert reg["status"] == "fail" and reg["worst"]["subject"].endswith(" bubble PP")
    assert int(reg["worst"]["subject"].split()[1]) in STAGE_RANKS
    assert line in (tmp_path / "s.md").read_text()  # the markdown summary names it too
    text = runner.invoke(cli, ["check", str(runs["bubbly"]), "--baseline", str(runs["base"])])
    assert text.exit_code == 3 and f"REGRESSION {line}" in " ".join(text.output.split())

    cmp, page = _page(runs["bubbly"], runs["base"])
    _same_verdicts(doc, cmp)
    assert cmp.exit_code == code
    flagged = {(c.metric, c.rank) for c in cmp.changes if c.regression}
    assert flagged == {(run_compare.BUBBLE, r) for r in STAGE_RANKS}
    grown = {c.rank: c.delta for c in cmp.bubble}
    assert all(grown[r] > 0.10 for r in STAGE_RANKS)  # ~16 points: 20% of stage 2's work
    assert all(abs(d) < 0.005 for r, d in grown.items() if r not in STAGE_RANKS)
    rows = dc.rank_rows(cmp)
    assert [r.rank for r in rows if r.regressed] == STAGE_RANKS  # on top, and only they
    assert "check --baseline would FAIL (exit 3)" in page and line in page
    assert "--max-bubble" not in page  # the legend no longer says check ignores the bubble


def test_an_unchanged_bubble_passes(runs: dict[str, Path]) -> None:
    code, doc = _check(runs["same"], runs["base"])
    cmp, page = _page(runs["same"], runs["base"])
    assert code == 0 == cmp.exit_code and doc["regressions"] == []
    _same_verdicts(doc, cmp)
    assert {c.rank for c in cmp.bubble} == set(range(JOB.world))  # compared, not absent
    assert "check --baseline would pass (exit 0)" in page


def test_a_bubble_shift_within_the_noise_is_not_counted(runs: dict[str, Path]) -> None:
    code, doc = _check(runs["noisy_cur"], runs["noisy_base"], "--max-regression", "1%")
    assert code == 0 and doc["regressions"] == []
    cmp, _ = _page(
        runs["noisy_cur"], runs["noisy_base"], run_compare.baseline_config({"max_regression": "1%"})
    )
    _same_verdicts(doc, cmp)
    moved = [c for c in cmp.bubble if c.rank in STAGE_RANKS]
    assert moved and all(
        c.delta > 0.01 and c.noise is not None and c.noise > c.delta and not c.regression
        for c in moved
    )


def test_a_run_without_a_pipeline_has_no_bubble_changes(runs: dict[str, Path]) -> None:
    code, doc = _check(runs["flat"], runs["flat_copy"])
    cmp, _ = _page(runs["flat"], runs["flat_copy"])
    assert code == 0 == cmp.exit_code and cmp.bubble == () and not cmp.cur.stages
    _same_verdicts(doc, cmp)
    assert {c.metric for c in cmp.changes} == {"step_time", "exposed_comm", "comm_share"}


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[run_compare.Comparison]]:
    """`ranklens dashboard` run to the point it would listen: what its compare page holds
    (the other pages left unwarmed: not what is tested here, and most of the time)."""
    seen: list[run_compare.Comparison] = []
    monkeypatch.setattr(server, "warm_pages", lambda app, paths=None: None)
    monkeypatch.setattr(server.Warmer, "__init__", lambda self, *a: None)
    monkeypatch.setattr(server.Warmer, "stop", lambda self: None)

    def run(self: server.Port, wsgi_app: Any) -> None:
        with wsgi_app.test_request_context(compare.PATH):
            base = dc.baseline()
            assert base is not None
            seen.append(dc.comparison(current(), base))

    monkeypatch.setattr(server.Port, "serve", run)
    yield seen


@pytest.mark.parametrize(("limit", "code"), [("20%", 0), ("0.1", 3)])
def test_dashboard_thresholds_are_checks(
    runs: dict[str, Path],
    served: list[run_compare.Comparison],
    tmp_path: Path,
    limit: str,
    code: int,
) -> None:
    """The same --max-regression (or --config file, the flag winning) gives the same verdict."""
    cur, base = str(runs["bubbly"]), str(runs["base"])
    conf = tmp_path / "ranklens.toml"
    conf.write_text('[check]\nmax_regression = "50%"\nmax_idle = 0.99\n')
    for args in (["--max-regression", limit], ["--config", str(conf), "--max-regression", limit]):
        said, doc = _check(runs["bubbly"], runs["base"], *args)
        res = runner.invoke(cli, ["dashboard", cur, "--port", "0", "--baseline", base, *args])
        assert res.exit_code == 0, res.output
        cmp = served.pop()
        assert said == code == cmp.exit_code
        _same_verdicts(doc, cmp)
        assert cmp.limit == pytest.approx(0.2 if code == 0 else 0.1)
    if code:
        return
    # the file alone: its 50% passes, and its max_idle is judged on the page as in check
    said, doc = _check(runs["bubbly"], runs["base"], "--config", str(conf))
    assert runner.invoke(
        cli, ["dashboard", cur, "--port", "0", "--baseline", base, "--config", str(conf)]
    )
    cmp = served.pop()
    assert said == 0 == cmp.exit_code and {v.name for v in cmp.verdicts} == {
        "max_idle",
        "max_regression",
    }
    _same_verdicts(doc, cmp)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-regression", "lots"], "error: max_regression: 'lots' is not a number"),
        (["--config", "{conf}"], "error: max_regression: 'x' is not a number"),
    ],
)
def test_dashboard_rejects_bad_thresholds_as_check_does(
    runs: dict[str, Path],
    served: list[run_compare.Comparison],
    tmp_path: Path,
    args: list[str],
    message: str,
) -> None:
    conf = tmp_path / "bad.toml"
    conf.write_text('max_regression = "x"\n')
    args = [a.format(conf=conf) for a in args]
    cur, base = str(runs["bubbly"]), str(runs["base"])
    for command in ("check", "dashboard"):
        res = runner.invoke(cli, [command, cur, "--baseline", base, *args])
        assert res.exit_code == 1 and "Traceback" not in res.output, res.output
        assert message in res.output and "hint: use a fraction (0.05) or a percentage (5%)" in (
            res.output
        )
    assert served == []  # never got as far as serving
    alone = runner.invoke(cli, ["dashboard", cur, "--max-regression", "5%"])
    assert alone.exit_code == 1 and "hint: add --baseline BASE" in alone.output
