"""A capture without step marks is one step, and its critical path can hold every kernel.

A 5 M-kernel Nsight export built its path as one Python object per segment: a minute and
7 GB. The path is now columns (graph_replay.Path); here, on a hand-made trace whose answer is
known (a synchronous launch loop), the path is every kernel exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import numpy as np
import pytest
from ranklens.analysis import critical_path as cp
from ranklens.ingest import load_traces

N = 3000


def test_every_kernel_of_a_synchronous_loop_is_on_the_path(tmp_path: Path) -> None:
    """launch, kernel, cudaStreamSynchronize, N times: each launch waits for the kernel before
    it, so the path is every kernel, at its measured start and length."""
    dur = np.random.default_rng(7).integers(2, 40, N)  # µs
    events: list[dict[str, object]] = []
    t, starts = 1000.0, []
    for i, d in enumerate(dur.tolist()):
        k = t + 3
        starts.append(round(k * 1000))
        events += [
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 0, "tid": 1,
             "ts": t, "dur": 1, "args": {"correlation": 2 * i + 1}},
            {"ph": "X", "cat": "kernel", "name": f"gemm_{i % 7}", "pid": 0, "tid": 7, "ts": k,
             "dur": d, "args": {"device": 0, "stream": 7, "correlation": 2 * i + 1}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 0,
             "tid": 1, "ts": t + 1.5, "dur": k + d + 1 - (t + 1.5),
             "args": {"correlation": 2 * i + 2}},
        ]  # fmt: skip
        t = k + d + 2
    trace = tmp_path / "rank0.json"
    trace.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0}}))
    db = tmp_path / "run.duckdb"
    load_traces([trace], db, workers=1)
    with duckdb.connect(str(db), read_only=True) as con:
        m = cp.model(con)
        res = cp.result_of(m, [])
    path = res.tables["critical_path"]
    (step,) = res.table.rows(named=True)
    assert step["step"] == -1 and step["replay_error"] == 0.0
    comp = path.filter(path["category"] == "compute")
    assert comp["start_ns"].to_list() == starts
    assert comp["dur_ns"].to_list() == (dur * 1000).tolist()
    assert comp["name"].to_list() == [f"gemm_{i % 7}" for i in range(N)]
    assert comp["stream"].unique().to_list() == [7] and comp["rank"].unique().to_list() == [0]
    # one chain in time order, whose pieces add up to the replayed step
    assert path["seq"].to_list() == list(range(path.height))
    assert (path["start_ns"][1:] == path["end_ns"][:-1]).all()
    assert int(path["dur_ns"].sum()) == step["replayed_step_ns"]
    assert [s.category for s in m.path] == path["category"].to_list()


def test_a_long_path_made_a_block_at_a_time_is_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """graph_replay makes a long path's segments a block of vertices at a time (memory): blocks
    of 97 vertices give the path one block gives."""
    from ranklens.analysis import graph_replay as gr

    events = []
    for i in range(N):  # kernels back to back on two streams that wait on each other
        stream = 7 + i % 2
        args = {"device": 0, "stream": stream, "correlation": i + 1}
        events.append({"ph": "X", "cat": "kernel", "name": f"k{i % 5}", "pid": 0, "tid": stream,
                       "ts": 1000.0 + 5 * i, "dur": 3 + i % 2, "args": args})  # fmt: skip
    trace = tmp_path / "rank0.json"
    trace.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0}}))
    db = tmp_path / "run.duckdb"
    load_traces([trace], db, workers=1)
    with duckdb.connect(str(db), read_only=True) as con:
        whole = cp.path_table(cp.model(con))
        monkeypatch.setattr(gr, "SEGMENT_BLOCK", 97)
        blocks = cp.path_table(cp.model(con))
    assert whole.height > 3 * 97
    assert blocks.equals(whole)
