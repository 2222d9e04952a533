"""Who runs the per-rank tasks of a sharded ingest: this process, a local process pool, or Ray.

Why swappable: every executor calls the same pure function (`rank_task.read_file`) and hands
its results to the one writer in file order, so the run's tables are the same whichever ran it;
only where the work happens changes. Ray lets an existing cluster ingest a run too big for one
machine, as long as the output directory is on storage every node can write (the tasks write
their shards there; only the small results travel back).
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

from ranklens.ingest import workpool
from ranklens.ingest.errors import RanklensError, WorkerDied
from ranklens.ingest.rank_task import RankResult, read_file
from ranklens.ingest.tempfiles import sweep_abandoned

ENGINES = ("local", "ray")

Task = tuple[str, str, int]  # (format, path, trace id)
H = TypeVar("H")  # an executor's handle on a running task


def run_tasks(
    tasks: list[Task],
    run_dir: str,
    *,
    workers: int,
    engine: str = "local",
    address: str | None = None,
    done: Callable[[str, list[RankResult]], None],
) -> None:
    """Run every file's task, calling `done(path, results)` in `tasks` order."""
    if engine not in ENGINES:
        raise RanklensError(
            f"unknown engine {engine!r}", f"use one of: {', '.join(ENGINES)} (default local)"
        )
    if engine == "ray":
        from ranklens.ingest import ray_engine

        results: Iterator[list[RankResult]] = ray_engine.results(tasks, run_dir, workers, address)
    elif workers <= 1 or len(tasks) <= 1:
        results = (read_file(fmt, path, tid, run_dir) for fmt, path, tid in tasks)
    else:
        results = _pool(tasks, run_dir, workers)
    try:
        for (_fmt, path, _tid), res in zip(tasks, results, strict=True):
            done(path, res)
    finally:
        # On an error in `done` (a bad file without --skip-bad) or an interrupt, stop the
        # executor now: tasks still in flight must not write shards into a run being removed.
        close = getattr(results, "close", None)
        if close is not None:
            close()


def settle() -> None:
    """Wait for what an executor finishes after its last result (Ray's local instance shutting
    down beside the cross-rank stage and the stored results)."""
    if "ranklens.ingest.ray_engine" in sys.modules:
        from ranklens.ingest import ray_engine

        ray_engine.settle()


def _pool(tasks: list[Task], run_dir: str, workers: int) -> Iterator[list[RankResult]]:
    pool = workpool.worker_pool(workers, "ranklens.ingest.rank_task")
    try:
        yield from in_order(
            lambda t: pool.submit(read_file, *t, run_dir), Future.result, tasks, 2 * workers
        )
    except BrokenProcessPool:
        raise WorkerDied(worked=workpool.worked(pool)) from None
    finally:
        try:
            pool.shutdown(wait=True, cancel_futures=True)
        finally:
            sweep_abandoned()  # the scratch of a worker that was killed mid-task


def in_order(
    submit: Callable[[Task], H],
    wait: Callable[[H], list[RankResult]],
    tasks: list[Task],
    ahead: int,
) -> Iterator[list[RankResult]]:
    """Results in task order, at most `ahead` tasks in flight (bounded memory and temp disk);
    `submit` starts a task and `wait` gets its result, whatever the executor."""
    pending: deque[H] = deque()
    it = iter(tasks)
    for t in it:
        pending.append(submit(t))
        if len(pending) >= ahead:
            break
    while pending:
        res = wait(pending.popleft())
        nxt = next(it, None)
        if nxt is not None:
            pending.append(submit(nxt))
        yield res
