"""Profile a few training steps on every rank, with the settings ranklens's analyses need.

Two ways in:
- the Python API: ``with ranklens.capture.profile_steps("run/") as cap:`` and ``cap.step()``
  after each training step;
- ``ranklens capture -- CMD``: no code change. The command runs with this package's
  ``sitecustomize`` on PYTHONPATH; in every process that has a ``RANK`` (torchrun, SLURM, ...)
  it registers a global optimizer-step hook, so each ``optimizer.step()`` ends a profiled step.

Each rank writes ``rank{r}.json.gz`` (named by its global rank) into one run directory;
``write_manifest`` records what was captured. torch is imported only when capturing.
"""

from __future__ import annotations

import atexit
import gzip
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV_DIR = "RANKLENS_CAPTURE_DIR"
ENV_STEPS = "RANKLENS_CAPTURE_STEPS"
ENV_WAIT = "RANKLENS_CAPTURE_WAIT"
MANIFEST = "manifest.json"
BOOT_DIR = str(Path(__file__).resolve().parent / "_boot")


def _rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return int(os.environ.get("RANK", "0"))


def _exporter(out_dir: Path) -> Any:
    """on_trace_ready: write this rank's trace as rank{r}.json.gz (atomically)."""

    def handler(prof: Any) -> None:
        rank = _rank()
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = out_dir / f".rank{rank}.json"
        prof.export_chrome_trace(str(tmp))
        with open(tmp, "rb") as src, gzip.open(out_dir / f".rank{rank}.json.gz", "wb") as gz:
            shutil.copyfileobj(src, gz)
        os.replace(out_dir / f".rank{rank}.json.gz", out_dir / f"rank{rank}.json.gz")
        tmp.unlink()

    return handler


@dataclass
class Capture:
    """A running capture: call ``step()`` once per training step."""

    profiler: Any

    def step(self) -> None:
        self.profiler.step()


def _profiler(out_dir: Path, wait: int, warmup: int, active: int) -> Any:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    return profile(
        activities=activities,
        schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        record_shapes=True,  # shapes and collective sizes for contention and busbw
        with_stack=False,  # stacks multiply trace size; analyses do not use them
        on_trace_ready=_exporter(out_dir),
    )


@contextmanager
def profile_steps(
    out_dir: str | os.PathLike[str], *, active: int = 3, wait: int = 1, warmup: int = 1
) -> Iterator[Capture]:
    """Profile `active` steps after `wait` + `warmup` steps; each rank writes its trace."""
    prof = _profiler(Path(out_dir), wait, warmup, active)
    prof.start()
    try:
        yield Capture(prof)
    finally:
        prof.stop()
        if _rank() == 0:
            write_manifest(out_dir, {"active": active, "wait": wait, "warmup": warmup})


def auto_capture() -> None:
    """Start capturing at the first optimizer step of this process (sitecustomize calls this
    when RANKLENS_CAPTURE_DIR is set): every later optimizer step ends a profiled step."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    out = Path(os.environ[ENV_DIR])
    active = int(os.environ.get(ENV_STEPS, "3"))
    wait = int(os.environ.get(ENV_WAIT, "1"))
    state: dict[str, Any] = {}

    def hook(*_: Any) -> None:
        prof = state.get("prof")
        if prof is None:
            state["prof"] = prof = _profiler(out, wait, 1, active)
            prof.start()
            atexit.register(prof.stop)  # a run shorter than the schedule still exports
        else:
            prof.step()

    register_optimizer_step_post_hook(hook)


def write_manifest(
    out_dir: str | os.PathLike[str], settings: dict[str, Any], command: list[str] | None = None
) -> dict[str, Any]:
    """Record the captured files, their ranks and how they were made, in manifest.json."""
    out = Path(out_dir)
    files = sorted(p.name for p in out.glob("rank*.json.gz"))
    ranks = sorted(int(f[4:].split(".")[0]) for f in files)
    doc = {
        "tool": "ranklens capture",
        "files": files,
        "ranks": ranks,
        "settings": settings,
        "command": command,
    }
    (out / MANIFEST).write_text(json.dumps(doc, indent=2) + "\n")
    return doc
