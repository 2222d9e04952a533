"""Report lines that read wrong when a fact is missing: checked on hand-built facts, and on a
real one-rank Nsight export (nothing to align it with)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ranklens.analysis.results_store import finalize_run
from ranklens.cli.main import app
from ranklens.cli.render import cross_rank_lines, devices_text, steps_text
from ranklens.ingest import load_traces
from typer.testing import CliRunner

runner = CliRunner()
SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def _alignment(res: int | None, methods: list[str]) -> dict[str, object]:
    return {"alignment": {"max_residual_ns": res, "methods": methods, "poor": False}}


def test_alignment_line_with_and_without_a_residual() -> None:
    assert cross_rank_lines(_alignment(12_700, ["single_host"]), markup=False) == [
        "clock alignment: single_host, residual up to 12.7 µs (one host: end spread, not "
        "clock error)"
    ]
    assert cross_rank_lines(_alignment(None, ["single_host"]), markup=False) == [
        "clock alignment: single_host, no residual measured (no shared collective)"
    ]


def test_steps_and_devices_text() -> None:
    assert steps_text([-1]) == "none marked (the whole trace is one window)"
    assert steps_text([3, 4]) == "3, 4"
    assert devices_text({"devices": ["H100"], "cpu_only": False}) == "devices: H100"
    assert devices_text({"devices": [], "cpu_only": True}) == "CPU-only"
    assert devices_text({"devices": [], "cpu_only": False}) == "GPU model not recorded"


def test_one_rank_export_report(tmp_path: Path, shared_traces: Path) -> None:
    src = shared_traces / "pipit-nsys" / "perlmutter-cloverleaf-cuda.sqlite"
    db = tmp_path / "one.duckdb"
    res = runner.invoke(app, ["ingest", str(src), "-o", str(db)])
    assert res.exit_code == 0, res.output
    facts = json.loads(runner.invoke(app, ["report", str(db), "-f", "json"]).stdout)["facts"]
    assert facts["ranks"] == [0] and facts["alignment"]["max_residual_ns"] is None
    text = runner.invoke(app, ["report", str(db)], env={"COLUMNS": "200"}).output
    assert "no residual measured (no shared collective)" in text
    assert "residual up to -" not in text


def _table_numbers(text: str) -> list[str]:
    """The values in the report's table rows (lines between │ borders), in order."""
    rows = [ln for ln in text.splitlines() if ln.startswith("│")]
    return sorted(c.strip() for ln in rows for c in ln.strip("│").split("│"))


@pytest.fixture(scope="module")
def megatron(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample as `ranklens ingest` writes it: its results stored, so each report reads
    them back (the text is what a report computing them prints: results_store's round trip)."""
    db = tmp_path_factory.mktemp("narrow") / "m.duckdb"
    load_traces([str(SAMPLES / "megatron_tp2_pp2_dp2" / "raw")], db, finalize=finalize_run)
    return db


@pytest.mark.parametrize("columns", [80, 50])
def test_no_number_is_cut_in_a_narrow_report(megatron: Path, columns: int) -> None:
    """Piped output (a CI log) is 80 columns: the pipeline table printed its bubbles as
    "67.5…". Now its columns go to a second table: every value of the wide report is there,
    whole, and no line is wider than the console."""
    wide = runner.invoke(app, ["report", str(megatron)], env={"COLUMNS": "200"}).output
    narrow = runner.invoke(app, ["report", str(megatron)], env={"COLUMNS": str(columns)}).output
    assert "(continued)" in narrow and "(continued)" not in wide
    tables = [ln for ln in narrow.splitlines() if ln[:1] in "┏┃┡│└"]
    assert tables and max(len(ln) for ln in tables) <= columns
    assert not any("…" in ln for ln in tables)
    values = set(_table_numbers(wide)) - {""}
    assert values and values <= set(_table_numbers(narrow))
    assert any(v.endswith("%") for v in values) and any("." in v for v in values)


@pytest.mark.parametrize(
    ("saving", "words"),
    [
        (1_234_000, "saves ~1.234 ms/step (replay of straggler:3; at stake ~2.000 ms)"),
        (0, "no saving by replay of straggler:3 (its step is unchanged; at stake ~2.000 ms)"),
        (-129_000, "no saving by replay of straggler:3 (its step is 0.129 ms longer; at stake"),
    ],
)
def test_a_replay_that_saves_nothing_says_so(saving: int, words: str) -> None:
    """A replayed fix that does not shorten the step (stage-balance replayed -0.129 ms on an
    interleaved job) reads "no saving", never "saves ~-0.129 ms"; the CLI and the dashboard's
    findings say the same."""
    from ranklens.analysis._base import Finding, Severity
    from ranklens.cli.render import finding_gain
    from ranklens.dashboards.whatif_panel import saving as dash_saving

    fd = Finding(
        "STRAGGLER_RANK", Severity.WARNING, "m", "f", time_at_stake_ns=2_000_000,
        saving_ns=saving, saving_method="replay of straggler:3",
    )  # fmt: skip
    assert finding_gain(fd).startswith(words)
    shown = str(dash_saving(fd).children)
    assert "-0." not in finding_gain(fd) and "-0." not in shown
    assert ("no saving" in shown) == (saving <= 0)


def test_a_finding_with_nothing_at_stake_says_so() -> None:
    """ALIGN_RESIDUAL_POOR warns about the numbers and costs no step time: not "~0.000 ms/step
    at stake", which reads as a measured zero."""
    from ranklens.analysis._base import Finding, Severity
    from ranklens.cli.render import finding_gain
    from ranklens.dashboards.whatif_panel import saving as dash_saving

    fd = Finding("ALIGN_RESIDUAL_POOR", Severity.WARNING, "m", "f")
    assert finding_gain(fd) == "no time at stake measured"
    assert "no time at stake measured" in str(dash_saving(fd).children)
    fd = Finding("X", Severity.WARNING, "m", "f", time_at_stake_ns=2_500_000)
    assert finding_gain(fd) == "~2.500 ms/step at stake"
