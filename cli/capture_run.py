"""Launch a command under `ranklens capture` and collect what its ranks wrote.

Kept apart from main.py because it manages a subprocess; it imports neither torch nor the
analyses (the user's job imports torch; ranklens.capture's sitecustomize does the profiling).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from ranklens.capture import BOOT_DIR, ENV_DIR, ENV_STEPS, ENV_WAIT, write_manifest
from ranklens.ingest.errors import RanklensError


def run(command: list[str], out_dir: Path, *, steps: int, wait: int) -> dict[str, Any]:
    """Run `command` with capture enabled; return the manifest. Raises on failure/no traces."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stale = list(out_dir.glob("rank*.json.gz"))
    if stale:
        raise RanklensError(
            f"{out_dir} already holds traces ({stale[0].name}, ...)",
            "capture into a new directory so runs do not mix",
        )
    env = dict(os.environ)
    env[ENV_DIR] = str(out_dir.resolve())
    env[ENV_STEPS] = str(steps)
    env[ENV_WAIT] = str(wait)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (BOOT_DIR, env.get("PYTHONPATH")) if p)
    try:
        code = subprocess.call(command, env=env)
    except FileNotFoundError:
        raise RanklensError(
            f"cannot run {command[0]!r}: not found", "check the command after --"
        ) from None
    if code != 0:
        raise RanklensError(
            f"the command exited with code {code}: {' '.join(command)}",
            f"fix the training command; traces written so far are kept in {out_dir}",
        )
    doc = write_manifest(out_dir, {"steps": steps, "wait": wait, "warmup": 1}, command)
    if not doc["files"]:
        raise RanklensError(
            f"the command finished but no rank wrote a trace into {out_dir}",
            f"ranks are processes with a RANK variable (torchrun, SLURM) that call "
            f"optimizer.step() at least {wait + 1 + steps} times; otherwise use "
            "ranklens.capture.profile_steps in the script",
        )
    return doc
