"""Who runs the per-rank tasks of a sharded ingest: this process, a local process pool, or Ray.

Why swappable: every executor calls the same pure function (`rank_task.read_file`) and hands
its results to the one writer in file order, so the run's tables are the same whichever ran it;
only where the work happens changes. Ray lets an existing cluster ingest a run too big for one
machine, as long as the output directory is on storage every node can write (the tasks write
their shards there; only the small results travel back).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from ranklens.ingest import workpool
from ranklens.ingest.errors import RanklensError, WorkerDied
from ranklens.ingest.rank_task import RankResult, read_file
from ranklens.ingest.tempfiles import sweep_abandoned

ENGINES = ("local", "ray")
# A Ray instance started for one ingest: no dashboard (one more process, and a port opened for
# nothing), and none of Ray's INFO and WARNING lines among the CLI's output (a timestamped
# "Token authentication is enabled ..." and "Started a local Ray instance." on every run; its
# errors still show).
_LOCAL_RAY: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.ERROR}

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
        results: Iterator[list[RankResult]] = _ray(tasks, run_dir, workers, address)
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


def _pool(tasks: list[Task], run_dir: str, workers: int) -> Iterator[list[RankResult]]:
    pool = workpool.worker_pool(workers, "ranklens.ingest.rank_task")
    try:
        yield from _in_order(
            lambda t: pool.submit(read_file, *t, run_dir), Future.result, tasks, 2 * workers
        )
    except BrokenProcessPool:
        raise WorkerDied(worked=workpool.worked(pool)) from None
    finally:
        try:
            pool.shutdown(wait=True, cancel_futures=True)
        finally:
            sweep_abandoned()  # the scratch of a worker that was killed mid-task


def _in_order(
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


def _ray(
    tasks: list[Task], run_dir: str, workers: int, address: str | None
) -> Iterator[list[RankResult]]:
    try:
        import ray
    except ImportError:
        raise RanklensError(
            "--engine ray needs Ray, which is not installed",
            "pip install 'ranklens[ray]' (or pip install ray), or use --engine local",
        ) from None
    started = not ray.is_initialized()
    if started:
        kwargs: dict[str, Any] = {"address": address, "log_to_driver": False}
        if address is None:  # a local instance for this ingest alone
            kwargs.update(_LOCAL_RAY, num_cpus=workers)
        else:
            kwargs["logging_level"] = logging.WARNING  # not Ray's "Connected to ..." lines
        try:
            ray.init(**kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise RanklensError(
                f"cannot start or reach Ray at {address or 'a local instance'} ({exc})",
                "check --ray-address (e.g. ray://head:10001 or auto on a cluster node)",
            ) from None
    remote: Any = ray.remote(num_cpus=1, max_retries=0)(read_file)

    def wait(ref: Any) -> list[RankResult]:
        try:
            return ray.get(ref)  # type: ignore[no-any-return]
        except ray.exceptions.RayError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, RanklensError):  # the task's own (ShardWriteFailed), as is
                raise cause from None
            first = (str(exc).strip().splitlines() or ["?"])[-1][:200]
            raise RanklensError(
                f"a Ray task died while reading a trace ({first})",
                "check the workers' memory and that the output directory is on storage "
                "every node can write",
            ) from None

    try:
        cpus: Any = ray.cluster_resources().get("CPU", workers)  # type: ignore[no-untyped-call]
        ahead = 2 * max(1, int(cpus))
        yield from _in_order(lambda t: remote.remote(*t, run_dir), wait, tasks, ahead)
    finally:
        if started:
            ray.shutdown()
