"""The Ray executor of a sharded ingest (engines.py): Ray tasks running the rank task.

Why checks before `ray.init`: Ray retries an address where nothing listens for minutes (a
mistyped port had run 6 minutes when it was killed), and of a cluster that refuses this
driver's token it logs "InvalidAuthToken" twenty times and raises "Failed to connect" after
~20 s: the user gets the reason, and what to do, from us.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import socket
from collections.abc import Iterator
from typing import Any

from ranklens.ingest.engines import Task, in_order
from ranklens.ingest.errors import RanklensError
from ranklens.ingest.lifecycle import stops_held
from ranklens.ingest.rank_task import RankResult, read_file
from ranklens.ingest.threads import Helper, through_stops

# A Ray instance started for one ingest: no dashboard (one more process, and a port opened for
# nothing), and none of Ray's INFO and WARNING lines among the CLI's output (a timestamped
# "Token authentication is enabled ..." and "Started a local Ray instance." on every run; its
# errors still show).
_LOCAL_RAY: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.ERROR}
_REACH_S = 3.0  # how long a cluster's head may take to accept a TCP connection
_HINT = "check --ray-address (e.g. ray://head:10001 or auto on a cluster node)"
# ray.shutdown, once every task is done, on a thread of its own: for a local instance it waits
# 1.1-1.3 s for Ray's processes to exit (0.09 CPU-s), which the ingest's cross-rank stage and
# stored results fill instead (--engine ray on 8 x 60 MB: 11.7 -> 10.1 s, 3 pairs alternated).
# One at a time: Ray's instance is the process's.
_closing: list[_Closing] = []


def results(
    tasks: list[Task], run_dir: str, workers: int, address: str | None
) -> Iterator[list[RankResult]]:
    """Every task's results in order, run as Ray tasks (at most two per CPU in flight)."""
    try:
        import ray
    except ImportError:
        raise RanklensError(
            "--engine ray needs Ray, which is not installed",
            "pip install 'ranklens[ray]' (or pip install ray), or use --engine local",
        ) from None
    settle()  # a local instance still shutting down is not one to run on
    started = not ray.is_initialized()

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

    finished = False
    try:
        if started:  # inside the try: a stop during ray.init shuts down what it started
            _connect(ray, address, workers)
        remote: Any = ray.remote(num_cpus=1, max_retries=0)(read_file)
        cpus: Any = ray.cluster_resources().get("CPU", workers)  # type: ignore[no-untyped-call]
        ahead = 2 * max(1, int(cpus))
        yield from in_order(lambda t: remote.remote(*t, run_dir), wait, tasks, ahead)
        finished = True
    finally:
        if started:  # finished: it shuts down beside the rest of the ingest (settle waits)
            _closing.append(_Closing(ray))
            if not finished:  # an error or a stop: tasks in flight end before the run is removed
                settle()


class _Closing:
    """ray.shutdown on a thread; its error, if any, kept for settle() to raise."""

    def __init__(self, ray: Any) -> None:
        self.ray = ray
        self.error: BaseException | None = None
        self.helper = Helper(self._run, name="ranklens-ray-shutdown").start()

    def _run(self) -> None:
        try:
            self.ray.shutdown()
        except BaseException as exc:  # raised by settle(), in the ingest's thread
            self.error = exc


def settle() -> None:
    """Wait for the shutdown of a local instance that `results` left running (loader: before
    an ingest returns, so that no Ray process outlives it); its error raised here. Through
    Ctrl+C too, a stop meanwhile raised once Ray is down: the instance was forgotten before
    the wait, so a stop that landed in it left the shutdown running, the interpreter's exit
    waited for its thread, and a second Ctrl+C there printed a traceback ("Exception ignored
    in threading._shutdown"; 1 of 5 double Ctrl+C sent as a local Ray instance stopped)."""
    while _closing:
        c = _closing[-1]
        try:
            through_stops(c.helper.wait)  # returns once Ray is down
        finally:
            _closing.pop()
        if c.error is not None:
            raise c.error


def environment_notes() -> list[str]:
    """What in this environment slows every Ray process (the workers and a local instance's
    own), said after a Ray ingest: each one imports jsonschema, which imports rfc3987_syntax
    when it is installed (Jupyter brings it) and `rfc3987` is not: ~0.8 CPU-s of building
    parsers in each (jsonschema issue 1428). Measured on 8 x 60 MB with --engine ray: the local
    instance's start 2.2 -> 4.9-5.8 s and the traces stage 5.1-6.1 -> 10.7-11.8 s."""
    if not _installed("rfc3987_syntax") or _installed("rfc3987"):
        return []
    return [
        "each Ray process here spends ~0.8 s of CPU importing rfc3987_syntax (jsonschema's "
        "IRI check, which Jupyter installs), seconds of every Ray ingest: `pip install rfc3987` "
        "(GPL) makes jsonschema use that instead, or `pip uninstall rfc3987-syntax` where "
        "nothing checks IRIs"
    ]


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _connect(ray: Any, address: str | None, workers: int) -> None:
    """ray.init: a local instance of `workers` CPUs for this ingest alone (address None), else
    the cluster at `address`, checked first to answer at all."""
    kwargs: dict[str, Any] = {"address": address, "log_to_driver": False}
    answered = False
    if address is None:
        kwargs.update(_LOCAL_RAY, num_cpus=workers)
    else:
        answered = _answers(address)
        kwargs["logging_level"] = logging.WARNING  # not Ray's "Connected to ..." lines
    # A local instance's start (2-4 s) is not cut by a stop: what ray.init had started when one
    # landed inside it was beyond ray.shutdown's reach. A cluster's connection starts nothing
    # here, and may wait a minute for its head: a stop ends it at once.
    held = stops_held() if address is None else contextlib.nullcontext()
    try:
        with held:
            ray.init(**kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        hint = _HINT
        if answered:  # then Ray refused this driver: the token, or the versions (or no Ray head)
            hint = (
                f"{address} answered, but Ray did not take this process: a cluster with "
                "token authentication (RAY_AUTH_MODE=token) needs its token here, in "
                "RAY_AUTH_TOKEN or the file RAY_AUTH_TOKEN_PATH names (default "
                "~/.ray/auth_token; `ray get-auth-token` on the head prints it); Ray and "
                "Python must also be the cluster's versions, and the address its head's"
            )
        raise RanklensError(
            f"cannot start or reach Ray at {address or 'a local instance'} ({exc})", hint
        ) from None


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of a `host:port` or `ray://host:port` address; None for `auto`, `local`
    and what Ray resolves itself."""
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _answers(address: str) -> bool:
    """Whether something accepted a TCP connection at the address' host:port (False: an
    address Ray resolves itself, not checked); a clear error when nothing did."""
    hp = _host_port(address)
    if hp is None:
        return False
    try:
        with socket.create_connection(hp, timeout=_REACH_S):
            pass
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise RanklensError(
            f"no Ray cluster answers at {address} ({why})",
            "start the cluster (`ray start --head` prints its address), or check --ray-address: "
            "the head's host:port (its GCS, 6379 unless started with another), ray://head:10001 "
            "(Ray Client), or auto on a node of the cluster",
        ) from None
    return True
