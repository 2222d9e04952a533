"""`ranklens capture`: a real torchrun job profiled with no code change, then `check` on it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ranklens.cli.main import app
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "sample_traces" / "train.py"
runner = CliRunner()


def _ranklens(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("ranklens")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600)


def _capture_args(run: Path, train_args: tuple[str, ...], steps: str) -> list[str]:
    exe = Path(sys.executable).with_name("ranklens")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return [str(exe), "capture", "-o", str(run), "--steps", steps, "--", *torchrun,
            "--nproc-per-node", "4", str(TRAIN), *train_args]  # fmt: skip


def _capture(run: Path, *train_args: str, steps: str = "3") -> None:
    """`ranklens capture` of the sample model on 4 torchrun ranks (gloo, CPU)."""
    res = subprocess.run(
        _capture_args(run, train_args, steps), capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]


def _capture_together(*runs: tuple[Path, tuple[str, ...]], steps: str = "3") -> None:
    """Capture the runs at the same time. Why: runs compared with each other must see the same
    machine; taken one after the other, whatever else loads it (the rest of CI, steal) can
    load one run and not the next, and a rank starved in one run waits in its allreduces for
    half of every step: a real difference between the runs, but not one their configurations
    made (CI once saw DP exposed comm +49.7% of step between two identical runs)."""
    logs = [run.with_name(run.name + ".log") for run, _args in runs]
    procs = []
    for (run, args), log in zip(runs, logs, strict=True):
        with log.open("w") as out:  # a file, not a pipe: nobody reads them while all run
            procs.append(subprocess.Popen(_capture_args(run, args, steps), stdout=out, stderr=out))
    for proc, log in zip(procs, logs, strict=True):
        assert proc.wait(timeout=900) == 0, log.read_text()[-3000:]


def test_command_without_ranks_is_an_error(tmp_path: Path) -> None:
    res = runner.invoke(
        app,
        [
            "capture",
            "-o",
            str(tmp_path / "run"),
            "--",
            sys.executable,
            "-c",
            "print('no training here')",
        ],
    )
    assert res.exit_code == 1
    assert "no rank wrote a trace" in res.output and "hint:" in res.output


def test_failing_command_is_an_error(tmp_path: Path) -> None:
    res = runner.invoke(
        app,
        ["capture", "-o", str(tmp_path / "run"), "--", sys.executable, "-c", "raise SystemExit(7)"],
    )
    assert res.exit_code == 1 and "exited with code 7" in res.output


def test_no_command_is_a_usage_error() -> None:
    assert runner.invoke(app, ["capture"]).exit_code == 2


@pytest.mark.slow
def test_capture_torchrun_then_check(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="capture needs torch (CI installs torch==2.13.0)")
    run = tmp_path / "run"
    _capture(
        run,
        "--tp",
        "1",
        "--pp",
        "4",
        "--dp",
        "1",
        "--microbatches",
        "2",
        "--schedule",
        "gpipe",
        "--steps",
        "5",
        steps="2",
    )
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["ranks"] == [0, 1, 2, 3]
    assert manifest["files"] == [f"rank{r}.json.gz" for r in range(4)]
    # Generous thresholds pass.
    ok = _ranklens("check", str(run), "--max-exposed-comm", "0.99", "--max-idle", "0.99")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # A 4-stage pipeline with only 2 micro-batches: closed-form bubble (p-1)/(m+p-1) = 60%,
    # so a 25% limit fails with exit code 3, naming the metric and a stage.
    bad = _ranklens("check", str(run), "--max-bubble", "0.25", "-f", "json")
    assert bad.returncode == 3, bad.stdout + bad.stderr
    doc = json.loads(bad.stdout)
    (failed,) = [c for c in doc["checks"] if c["status"] == "fail"]
    assert failed["name"] == "max_bubble" and failed["worst"]["subject"].startswith("stage ")
    assert failed["worst"]["value"] > 0.4


@pytest.mark.slow
def test_capture_slowed_rank_fails_straggler_check(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="capture needs torch (CI installs torch==2.13.0)")
    run = tmp_path / "run"
    _capture(
        run,
        "--tp",
        "1",
        "--pp",
        "1",
        "--dp",
        "4",
        "--microbatches",
        "2",
        "--slow-rank",
        "3",
        "--slow-ms",
        "50",  # well above what 4 gloo processes sharing 2 busy cores add at random
        "--steps",
        "5",
        steps="2",
    )
    ok = _ranklens("check", str(run), "--max-straggler-wait", "0.9")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = _ranklens("check", str(run), "--max-straggler-wait", "0.05", "-f", "json")
    assert bad.returncode == 3, bad.stdout + bad.stderr
    (failed,) = [c for c in json.loads(bad.stdout)["checks"] if c["status"] == "fail"]
    assert failed["name"] == "max_straggler_wait"
    assert failed["worst"]["subject"] == "rank 3"  # the rank slowed by 50 ms per forward


@pytest.mark.slow
def test_baseline_two_real_runs(tmp_path: Path) -> None:
    """Two captures of one configuration: no regression (differences stay within the
    threshold or the measured step-to-step noise). A run with a rank slowed by 300 ms per
    forward: a step-time regression, named.

    Each forward also waits 150 ms off the CPU (--offcpu-ms), as a GPU job's CPU waits on its
    device. Why: without it a step is ~1 ms of compute, and on a loaded machine (12 gloo
    processes on 2 cores, beside whatever else runs) which rank the scheduler starves decides
    who waits in the all-reduce: CI once saw DP exposed comm +75.6% of step on one rank
    between two identical runs, a real difference the configuration did not make. Ranks that
    sleep wake on time under load: with 5 CPU hogs beside the three runs, exposed comm stayed
    at 1-7% of a ~320 ms step, and the slowed run came out +190% (noise ±29%)."""
    pytest.importorskip("torch", reason="capture needs torch (CI installs torch==2.13.0)")
    base, same, slow = tmp_path / "base", tmp_path / "same", tmp_path / "slow"
    dp4 = ("--tp", "1", "--pp", "1", "--dp", "4", "--microbatches", "2", "--steps", "6",
           "--offcpu-ms", "150")  # fmt: skip
    _capture_together(
        (base, dp4), (same, dp4), (slow, (*dp4, "--slow-rank", "3", "--slow-ms", "300"))
    )
    # The off-CPU wait is in the steps the profiler saw: 2 forwards x 150 ms each.
    steps = _ranklens("sql", str(base), "SELECT min(window_ns) AS ns FROM breakdown_by_step",
                      "-f", "csv")  # fmt: skip
    assert steps.returncode == 0, steps.stderr
    assert int(steps.stdout.split()[-1]) >= 300_000_000, steps.stdout
    ok = _ranklens(
        "check", str(same), "--baseline", str(base), "--max-regression", "25%", "-f", "json"
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = _ranklens(
        "check", str(slow), "--baseline", str(base), "--max-regression", "25%", "-f", "json"
    )
    assert bad.returncode == 3, bad.stdout + bad.stderr
    doc = json.loads(bad.stdout)
    (reg,) = [c for c in doc["checks"] if c["name"] == "max_regression"]
    assert reg["status"] == "fail"
    assert any(r.startswith("step time +") for r in doc["regressions"]), doc["regressions"]
