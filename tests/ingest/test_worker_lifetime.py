"""The decoding workers leave before the last rank is written: that write is a one-file
ingest's memory peak, and idle workers still hold ~60-80 MB each of what they decoded (the
402 MB trace's peak: ~1.5x -> ~1.25x the file)."""

from __future__ import annotations

import os
import signal
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import forkserver
from pathlib import Path
from typing import Any

import pytest
from ranklens.ingest import kineto_schedule, workpool
from ranklens.ingest.errors import WorkerDied
from ranklens.ingest.loader import load_traces

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "megatron_tp2_pp2_dp2" / "raw"


def test_workers_are_gone_before_the_last_rank_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pools: list[Any] = []
    real_pool = workpool.worker_pool

    def pool(*a: Any) -> Any:
        pools.append(real_pool(*a))
        return pools[-1]

    alive: list[int] = []  # live workers at each rank's write
    real_finish = kineto_schedule._finish_file

    def finish(*a: Any, **k: Any) -> None:
        procs = pools[-1]._processes or {}
        alive.append(sum(p.is_alive() for p in procs.values()))
        real_finish(*a, **k)

    monkeypatch.setattr(workpool, "SERIAL_BELOW_BYTES", 0)  # the sample is small: use the pool
    monkeypatch.setattr(workpool, "worker_pool", pool)
    monkeypatch.setattr(kineto_schedule, "_finish_file", finish)
    rep = load_traces([str(SAMPLE)], tmp_path / "r.duckdb", workers=2)
    assert rep.ranks == list(range(8)) and len(alive) == 8
    assert alive[-1] == 0  # the last rank: written with no worker left
    assert max(alive[:-1]) > 0  # the others: written while the workers decoded the next file


def _half_a_result() -> None:
    """In a worker: half a result message in the pool's result pipe, then SIGKILL: what the
    OOM killer leaves when it takes a worker that was sending a decoded piece (megabytes)."""
    import gc
    import multiprocessing.queues
    import signal
    import struct

    (queue,) = [o for o in gc.get_objects() if isinstance(o, multiprocessing.queues.SimpleQueue)]
    queue._writer._send(struct.pack("!i", 1 << 20) + b"x" * 100)  # says 1 MB, holds 100 bytes
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_worker_killed_while_it_sends_breaks_the_pool() -> None:
    """The pool's thread read the half message and waited for the rest forever: the ingest
    hung (seen in CI when a worker was killed 0.3 s into a 4-rank ingest). Now the pool breaks,
    as for any dead worker, and shuts down."""
    pool = workpool.worker_pool(2, "ranklens.ingest.workpool")
    try:
        workpool.start_workers(pool, 2)
        fut = pool.submit(_half_a_result)
        with pytest.raises(BrokenProcessPool):
            fut.result(timeout=30)
    finally:
        if not getattr(pool, "_broken", False):  # the old hang: unstick it, or pytest hangs too
            for p in list((pool._processes or {}).values()):  # type: ignore[attr-defined]
                p.kill()
            pool._result_queue._writer.close()  # type: ignore[attr-defined]
        pool.shutdown(wait=True)


def _kill_each_new_worker(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every worker the pool starts is SIGKILLed after its fork, before the pool writes it its
    task: what the OOM killer does to a worker that is starting. The pids killed."""
    real = forkserver.connect_to_new_process
    killed: list[int] = []

    def connect(fds: Any) -> Any:
        sentinel, w = real(fds)
        pid = forkserver.read_signed(sentinel)
        os.kill(pid, signal.SIGKILL)
        forkserver.read_signed(sentinel)  # its exit status, from the server: it is gone
        killed.append(pid)
        return sentinel, w

    monkeypatch.setattr(forkserver, "connect_to_new_process", connect)
    return killed


def test_a_worker_killed_as_it_starts_breaks_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python's pool raised BrokenPipeError from submit, unbroken: the next submit started
    another worker (the ingest went on as if nothing happened) and the pipe's error could be
    taken for a file's. Now the pool is broken, as for any dead worker, and stays so."""
    pool = workpool.worker_pool(2, "ranklens.ingest.workpool")
    try:
        killed = _kill_each_new_worker(monkeypatch)
        with pytest.raises(BrokenProcessPool, match="died as it started"):
            pool.submit(int)
        assert len(killed) == 1
        monkeypatch.undo()  # workers would start now: the pool must not start one
        with pytest.raises(BrokenProcessPool):
            pool.submit(int)
        assert not pool._processes  # type: ignore[attr-defined]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def test_an_ingest_whose_worker_is_killed_as_it_starts_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the Kineto scheduler (whose pool starts while the first file is read here):
    the worker's death, not the file's, and no output."""
    monkeypatch.setattr(workpool, "SERIAL_BELOW_BYTES", 0)  # the sample is small: use the pool
    killed = _kill_each_new_worker(monkeypatch)
    out = tmp_path / "r.duckdb"
    with pytest.raises(WorkerDied) as err:
        load_traces([str(SAMPLE)], out, workers=2)
    assert killed and "worker process died" in err.value.message, err.value.message
    assert "fewer --workers" in err.value.hint
    assert not out.exists()
