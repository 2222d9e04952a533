"""Fixtures of the reliability corpus: small runs built on the fly, and the session's tally."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from kineto_builder import KinetoTrace

from reliability.fuzzhost import Worker


def good_trace(rank: int, world_size: int | None = 2) -> KinetoTrace:
    """A small valid rank: one step, a kernel, an all-reduce."""
    t = KinetoTrace(rank=rank, world_size=world_size if world_size is not None else 2)
    t.step(1, 0, 100)
    t.kernel("gemm", 10, 20)
    t.nccl("AllReduce", 30, 10, stream=9)
    return t


def write_run(
    root: Path, extra: dict[str, Any] | None = None, *, rank: int = 1, name: str = "run"
) -> Path:
    """A two-rank run directory; rank `rank` gets `extra` as one more event (if given)."""
    run = root / name
    run.mkdir(parents=True, exist_ok=True)
    for r in (0, 1):
        t = good_trace(r)
        if extra is not None and r == rank:
            t.add(**extra)
        t.write(run / f"rank{r}.json")
    return run


def patch_json(path: Path, **top: Any) -> None:
    """Set top-level keys of a written trace (distributedInfo fields go in `dist`)."""
    doc = json.loads(path.read_text())
    for key, val in top.pop("dist", {}).items():
        doc["distributedInfo"][key] = val
    doc.update(top)
    path.write_text(json.dumps(doc))


def fuzzed(examples: int) -> settings:
    """The fuzz tests' hypothesis settings: the same cases every run (derandomized, no example
    database) and no deadline (a case runs in the worker, slow ones are its business)."""
    return settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@pytest.fixture(scope="module")
def worker() -> Iterator[Worker]:
    """One fuzz worker process (fuzzhost.py) for a module's cases."""
    w = Worker()
    yield w
    w.close()


@pytest.fixture(params=["c-scanner", "reference"])
def decoder_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """Both Kineto decoders: the C scanner (default) and the msgspec reference."""
    return {"RANKLENS_PURE_PYTHON": "1" if request.param == "reference" else "0"}
