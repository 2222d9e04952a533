"""The host side of the critical path: launches and blocking calls, against a host + device
simulation whose counterfactual is simulated too.

Truth: a host thread issues kernels with fixed Python time between launches and waits at
blocking synchronizes; one stream runs each kernel at max(its launch + latency, the previous
kernel's end). The same program with kernels twice as fast is simulated again; the what-if
`scale-kernels` on the first trace must predict the second trace's step time. A host-bound run
barely gains (the next launch comes no sooner), a device-bound one gains almost half, and a run
whose host blocks in the middle of the step gains in between: numbers a model that keeps the
device's gaps fixed gets wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import duckdb
import numpy as np
import pytest
from kineto_builder import KinetoTrace
from ranklens.analysis import critical_path as cp
from ranklens.analysis import graph_build as gb
from ranklens.analysis import graph_replay as gr
from ranklens.analysis import whatif as wi

Ingest = Callable[..., duckdb.DuckDBPyConnection]
LATENCY_US = 4.0  # launch call start -> kernel start, at the soonest


@dataclass(frozen=True)
class Program:
    """What the host does each step: Python time before each launch, kernel durations, and
    after which kernels it blocks (cudaStreamSynchronize, e.g. a loss.item())."""

    python_us: tuple[float, ...]
    kernel_us: tuple[float, ...]
    block_after: tuple[int, ...] = ()

    def scaled(self, f: float) -> Program:
        return Program(self.python_us, tuple(d * f for d in self.kernel_us), self.block_after)


def simulate(p: Program, steps: int = 2) -> KinetoTrace:
    """Render the program as one GPU rank's Kineto trace, timed by the rules above."""
    t = KinetoTrace(rank=0, world_size=1)
    step_start = 0.0
    for step in range(1, steps + 1):
        host, dev_free = step_start + 2.0, step_start
        for i, (py, d) in enumerate(zip(p.python_us, p.kernel_us, strict=True)):
            host += py
            start = max(host + LATENCY_US, dev_free)
            t.kernel(f"gemm_{i}", start, d, launch=host)
            dev_free = start + d
            host += 0.5  # the launch call
            if i in p.block_after:
                end = max(host + 1.0, dev_free + 1.0)
                t.runtime("cudaStreamSynchronize", host, end - host)
                host = end
        end = max(host + 1.0, dev_free + 1.0)
        t.runtime("cudaDeviceSynchronize", host, end - host)
        t.step(step, step_start, end + 5.0)
        step_start = end + 5.0
    return t


def _measured(con: duckdb.DuckDBPyConnection) -> np.ndarray:
    return gr.measured_step_times(cp.model(con).graph)


def _predicted(con: duckdb.DuckDBPyConnection, scenario: str) -> np.ndarray:
    sc = wi.parse(scenario)
    m = cp.model(con, gb.BuildParams(), (sc.pattern,))
    (o,) = wi.run_scenarios(m.graph, [sc], m.ctx)
    assert o.predicted is not None, o.note
    return o.predicted


N = 12
CASES = {
    # host-bound: 100 µs of Python per 20 µs kernel; halving kernels saves ~10 µs (the last)
    "host_bound": Program((100.0,) * N, (20.0,) * N),
    # device-bound: the host is far ahead; halving kernels saves ~half the step
    "device_bound": Program((5.0,) * N, (100.0,) * N),
    # crosses over: device-bound at 50 µs, host-bound at 25 µs (30 µs of Python a launch)
    "crossover": Program((30.0,) * N, (50.0,) * N),
    # the host blocks after kernel 5 (loss.item()), then launches the rest late
    "blocking": Program((10.0,) * 6 + (200.0,) + (10.0,) * 5, (80.0,) * N, (5,)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_speedup_matches_the_simulated_counterfactual(ingest: Ingest, name: str) -> None:
    """scale-kernels ×0.5 predicts the step time of the same program with kernels twice as
    fast within 2%; the unchanged replay reproduces the measured step exactly."""
    prog = CASES[name]
    con = ingest(simulate(prog))
    m = cp.model(con)
    measured = gr.measured_step_times(m.graph)
    assert np.array_equal(gr.step_times(m.graph, m.base), measured)
    truth = _measured(ingest(simulate(prog.scaled(0.5))))
    predicted = _predicted(con, "scale-kernels:^gemm_=0.5")
    assert np.all(np.abs(predicted / truth - 1) <= 0.02), (measured, predicted, truth)


def test_the_saving_is_what_the_host_allows(ingest: Ingest) -> None:
    """The three regimes differ as the truth says: host-bound saves about one kernel's half,
    device-bound about half the kernels' time."""
    saving = {}
    for name in ("host_bound", "device_bound"):
        prog = CASES[name]
        con = ingest(simulate(prog))
        saving[name] = float(np.mean(_measured(con) - _predicted(con, "scale-kernels:gemm=0.5")))
    assert 5_000 <= saving["host_bound"] <= 15_000  # ns: the last kernel's 10 µs
    assert saving["device_bound"] >= 0.9 * N * 50_000


def test_host_edges_in_the_graph(ingest: Ingest) -> None:
    """Launch edges exist and each synchronize inside the step waits for the device (the
    last one returns after the step's window and is left out); on the host-bound program the
    path runs through the host (host_launch), on the device-bound one through the kernels."""
    shares = {}
    for name in ("host_bound", "device_bound", "blocking"):
        m = cp.model(ingest(simulate(CASES[name])))
        kinds = {k: int((m.graph.e_kind == i).sum()) for i, k in enumerate(gb.EDGE_KINDS)}
        assert kinds["launch"] >= 2  # at least one per step
        n_sync = 2 * len(CASES[name].block_after)
        assert kinds["block"] == n_sync
        total = sum(s.end_ns - s.start_ns for s in m.path)
        shares[name] = {
            c: sum(s.end_ns - s.start_ns for s in m.path if s.category == c) / total
            for c in ("host_launch", "compute")
        }
    assert shares["host_bound"]["host_launch"] > 0.75
    assert shares["device_bound"]["compute"] > 0.9
