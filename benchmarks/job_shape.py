"""The job shape flags of the benchmarks that generate a GPU-shaped job (sample_traces.gpu_job).

Why one place: bench_gpu_job, bench_shards and bench_whatif take the same --tp/--dp/--pp/--m/
--steps, build the job from them and cache its traces in benchmarks/_work/ under their names.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from ranklens.sample_traces.gpu_job import GpuJob, write_job

WORK = Path(__file__).resolve().parent / "_work"


def add_flags(ap: argparse.ArgumentParser, m: int = 8, steps: int = 4) -> None:
    """--tp 8 --dp 32 --pp 4 --m M --steps STEPS (1,024 ranks by default)."""
    for name, default in (("tp", 8), ("dp", 32), ("pp", 4), ("m", m), ("steps", steps)):
        ap.add_argument(f"--{name}", type=int, default=default)


def job(a: argparse.Namespace, **more: Any) -> GpuJob:
    """The job of the parsed flags, with `more` of GpuJob's fields."""
    return GpuJob(tp=a.tp, dp=a.dp, pp=a.pp, m=a.m, steps=a.steps, **more)


def tag(a: argparse.Namespace) -> str:
    """The flags in a file name: tp8_dp32_pp4_m8_s4."""
    return f"tp{a.tp}_dp{a.dp}_pp{a.pp}_m{a.m}_s{a.steps}"


def traces(j: GpuJob, src: Path, rebuild: bool = False) -> bool:
    """Write the job's traces to `src` unless that very job is there (its repr in job.txt:
    the benchmarks inject different slow ranks into the same shape); True if written."""
    made = src / "job.txt"
    if (
        not rebuild
        and (src / "truth.json").exists()
        and made.exists()
        and made.read_text() == repr(j)
    ):
        return False
    shutil.rmtree(src, ignore_errors=True)
    write_job(j, src)
    made.write_text(repr(j))
    return True
