"""Checks on the committed sample traces and on the generator that makes them.

The committed scenarios are the ground truth other tests and demos rely on, so each rank file
must really carry the rank, groups, steps and gloo events that its truth.json promises. The fast
tests read only JSON (no torch); the slow test runs a real 2-rank gloo job.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
GENERATOR = SAMPLES / "generate.py"
SCENARIOS = sorted(p.parent.name for p in SAMPLES.glob("*/truth.json"))
EXPECTED_SCENARIOS = {
    "megatron_tp2_pp2_dp2",
    "straggler_rank3",
    "pp4_gpipe_m2",
    "pp4_1f1b_m8",
    "unnamed_tp2_pp2_dp2",
}
MEGATRON_DESCS = {
    "DP": "DATA_PARALLEL_GROUP",
    "TP": "TENSOR_MODEL_PARALLEL_GROUP",
    "PP": "PIPELINE_MODEL_PARALLEL_GROUP",
    "MP": "MODEL_PARALLEL_GROUP",
}


def _load_generator() -> ModuleType:
    """Import generate.py by path (it is a script folder, not necessarily on sys.path)."""
    spec = importlib.util.spec_from_file_location("_sample_generate", GENERATOR)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _read(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


def check_scenario(folder: Path) -> None:
    """Assert every rank trace in ``folder`` matches its truth.json."""
    truth = json.loads((folder / "truth.json").read_text())
    cfg = truth["config"]
    world = cfg["world_size"]
    assert world == cfg["tp"] * cfg["pp"] * cfg["dp"]
    files = sorted((folder / f).name for f in truth["trace_files"])
    trace_dir = (folder / truth["trace_files"][0]).parent
    assert sorted(p.name for p in trace_dir.glob("rank*")) == files
    assert files == sorted(f"rank{r}.json.gz" for r in range(world))
    for r in range(world):
        trace = _read(trace_dir / f"rank{r}.json.gz")
        info = trace["distributedInfo"]
        assert info["backend"] == "gloo"
        assert (info["rank"], info["world_size"]) == (r, world)
        have = {(g["pg_desc"], tuple(g["ranks"]), g["pg_name"]) for g in info["pg_config"]}
        mine = [g for g in truth["groups"] if r in g["ranks"]]
        assert {g["kind"] for g in mine} == {"DP", "TP", "PP", "MP"}
        for g in mine:
            desc = "undefined" if cfg["unnamed"] else MEGATRON_DESCS[g["kind"]]
            assert g["pg_desc"] == desc
            assert (desc, tuple(g["ranks"]), g["pg_name"]) in have, (r, g)
        events = trace["traceEvents"]
        names = [e.get("name", "") for e in events]
        assert sum(n.startswith("ProfilerStep#") for n in names) == cfg["steps"]
        gloo = [e for e in events if e.get("name", "").startswith("gloo:")]
        assert gloo and all(e["cat"] == "user_annotation" for e in gloo)
        for kind in ("forward", "backward"):
            n_mb = sum(n.startswith(f"{kind}_mb") for n in names)
            assert n_mb == cfg["steps"] * cfg["microbatches"], (r, kind)


def check_truth(folder: Path) -> None:
    """Assert truth.json's measured injection agrees with what the config asked for."""
    truth = json.loads((folder / "truth.json").read_text())
    cfg = truth["config"]
    assert truth["torch_version"].startswith("2.")
    assert [r["rank"] for r in truth["ranks"]] == list(range(cfg["world_size"]))
    for r in truth["ranks"]:
        profiled = [s for s in r["steps"] if s["profiled"]]
        assert [s["step"] for s in profiled] == truth["profiled_steps"]
        slow = r["summary"]["injected_slow_ms"]
        if r["rank"] == cfg["slow_rank"]:
            # once per micro-batch, for at least the time asked, inside that forward; how
            # far past the deadline the last matmul ran depends on the machine's load, so
            # there is no upper bound in wall time (a double injection would fail the count)
            for s in r["steps"]:
                assert len(s["slow_ns"]) == cfg["microbatches"]
                assert all(x >= cfg["slow_ms"] * 1e6 for x in s["slow_ns"])
                assert all(x <= f for x, f in zip(s["slow_ns"], s["forward_ns"], strict=True))
            assert slow >= cfg["slow_ms"] * cfg["microbatches"]
        else:
            assert slow == 0.0


@pytest.mark.parametrize("name", SCENARIOS)
def test_committed_scenario(name: str) -> None:
    check_scenario(SAMPLES / name)
    check_truth(SAMPLES / name)
    readme = (SAMPLES / name / "README.md").read_text()
    assert f"--scenario {name}" in readme and "torch 2." in readme


def test_all_scenarios_committed_and_small() -> None:
    assert set(SCENARIOS) >= EXPECTED_SCENARIOS
    total = 0
    for name in SCENARIOS:
        size = sum(p.stat().st_size for p in (SAMPLES / name).glob("raw/*.json.gz"))
        assert size <= 1_500_000, (name, size)
        total += size
    assert total <= 5_000_000


def test_straggler_ranks_wait_in_dp_allreduce() -> None:
    truth = json.loads((SAMPLES / "straggler_rank3" / "truth.json").read_text())
    wait = {r["rank"]: r["summary"]["dp_allreduce_ms"] for r in truth["ranks"]}
    assert truth["config"]["slow_rank"] == 3
    assert all(wait[r] > wait[3] for r in (0, 1, 2))


def test_megatron_layout() -> None:
    gen = _load_generator()
    groups = gen.group_layout(2, 2, 2)
    by_kind: dict[str, list[list[int]]] = {}
    for g in groups:
        by_kind.setdefault(g["kind"], []).append(g["ranks"])
    assert by_kind == {
        "DP": [[0, 2], [1, 3], [4, 6], [5, 7]],
        "MP": [[0, 1, 4, 5], [2, 3, 6, 7]],
        "TP": [[0, 1], [2, 3], [4, 5], [6, 7]],
        "PP": [[0, 4], [1, 5], [2, 6], [3, 7]],
    }
    assert gen.rank_coords(6, 2, 2) == (0, 1, 1)


def test_generator_help_without_torch() -> None:
    code = (
        "import runpy, sys; sys.modules['torch'] = None; "
        f"sys.argv = ['generate.py', '--help']; runpy.run_path({str(GENERATOR)!r}, "
        "run_name='__main__')"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    assert "--slow-rank" in res.stdout


@pytest.mark.slow
def test_generator_runs_real_job(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch is needed to run a real gloo job")
    out = tmp_path / "job"
    cmd = [
        sys.executable,
        str(GENERATOR),
        "--out",
        str(out),
        "--tp",
        "1",
        "--pp",
        "2",
        "--dp",
        "1",
        "--microbatches",
        "2",
        "--steps",
        "1",
        "--slow-rank",
        "1",
        "--slow-ms",
        "5",
        "--raw",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-4000:]
    check_scenario(out)
    check_truth(out)
    truth = json.loads((out / "truth.json").read_text())
    assert truth["config"]["schedule"] == "1f1b"
    assert [r["schedule_order"] for r in truth["ranks"]] == [
        ["F0", "F1", "B0", "B1"],
        ["F0", "B0", "F1", "B1"],
    ]
