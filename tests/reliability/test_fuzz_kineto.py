"""Fuzz: Kineto JSON documents built from valid-ish and hostile events, ingested and reported.

Every case must end in success or a RanklensError (the CLI's `error:` + `hint:`) naming the
file: no other exception (a traceback), no crash, no hang (fuzzhost runs each case in a worker
process with a time limit). Hypothesis is derandomized, so the cases are the same every run.
"""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reliability.conftest import fuzzed

from .fuzzhost import Worker, check

EXAMPLES = 100
REPORT_EVERY = 6
RARE = 40  # one hostile field of an event in RARE: a document holds ~100 fields
_cases = itertools.count()
BIG = [2**31 - 1, 2**31, -(2**31) - 1, 2**53 + 1, 2**62, 2**63 - 1, 2**63, 2**64, 10**19, 10**30]
ODD_FLOATS = [1e20, 1e300, -1e300, 0.5, -0.0, 1e-300, float("inf"), float("-inf"), float("nan")]
CATS = ["kernel", "cuda_runtime", "cpu_op", "user_annotation", "gpu_user_annotation",
        "gpu_memcpy", "gpu_memset", "ac2g", "python_function", "cuda_driver", "Trace"]  # fmt: skip
NAMES = ["ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
         "ProfilerStep#1", "ProfilerStep#2", "aten::mm", "record_param_comms", "nccl:all_reduce",
         "gloo:all_reduce", "cudaLaunchKernel", "Memcpy HtoD (Pageable -> Device)",
         "forward_mb3", "ampere_sgemm_128x64_tn", "dpsk::ep::dispatch"]  # fmt: skip
ARG_KEYS = ["device", "stream", "correlation", "External id", "Collective name", "In msg nelems",
            "Out msg nelems", "Group size", "dtype", "Process Group Name", "Process Group Ranks",
            "Process Group Description", "Input Dims", "Input type", "grid", "block", "Src Rank",
            "Dst Rank", "Seq", "Global rank start", "Global rank stride", "bytes"]  # fmt: skip
DEEP = "\x00deep{}\x00"  # replaced by that many nested [ ] after json.dumps


def _deep(n: int) -> str:
    return DEEP.format(n)


def mostly(
    good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any], bad_in: int = 6
) -> st.SearchStrategy[Any]:
    """`bad` about once in `bad_in` draws: most documents get past the header to the events."""
    return st.integers(0, bad_in - 1).flatmap(lambda i: bad if i == bad_in - 1 else good)


numbers = st.one_of(
    st.integers(-1000, 10**7),
    st.sampled_from(BIG),
    st.sampled_from(ODD_FLOATS),
    st.floats(-1e6, 1e9),
)
hostile = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=6),
    st.sampled_from(["12", "-1", "0x10", "1e400", "", "NaN"]),
    st.lists(st.integers(-5, 5), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.integers(1, 3000).map(_deep),
)
value = st.one_of(numbers, hostile)
small = st.integers(0, 5000)
ints = st.integers(0, 8)
ARG_VALUES: dict[str, st.SearchStrategy[Any]] = {
    **{k: ints for k in ARG_KEYS},
    "Collective name": st.sampled_from(["allreduce", "all_gather", "send", "recv", "broadcast"]),
    "dtype": st.sampled_from(["Float", "BFloat16", "Int"]),
    "Process Group Name": st.sampled_from(["0", "1"]),
    "Process Group Description": st.sampled_from(["default_pg", "dp", "tp"]),
    "Process Group Ranks": st.sampled_from(["[0, 1]", "[0]", "[1, 0]"]),
    "Input Dims": st.just([[4, 4], [4]]),
    "Input type": st.just(["float", "float"]),
    "grid": st.just([1, 1, 1]),
    "block": st.just([128, 1, 1]),
}
args = st.fixed_dictionaries(
    {}, optional={k: mostly(v, value, RARE) for k, v in ARG_VALUES.items()}
).flatmap(lambda d: st.just(d) if d else st.dictionaries(st.text(max_size=4), value, max_size=2))
event = st.fixed_dictionaries(
    {
        "ph": mostly(st.sampled_from(["X"] * 8 + ["i", "f", "s", "M"]), hostile, RARE),
        "cat": mostly(st.sampled_from(CATS), hostile, RARE),
        "name": mostly(st.sampled_from(NAMES), hostile, RARE),
        "ts": mostly(small, value, RARE),
        "dur": mostly(small, value, RARE),
        "pid": mostly(st.integers(0, 2), value, RARE),
        "tid": mostly(st.integers(0, 4), value, RARE),
    },
    optional={
        "args": mostly(args, hostile, RARE),
        "id": mostly(st.integers(0, 9), value, RARE),
        "bp": st.just("e"),
    },
)
pg = st.fixed_dictionaries(
    {"pg_name": mostly(st.sampled_from(["0", "1"]), hostile)},
    optional={
        "ranks": mostly(st.lists(st.integers(0, 1), max_size=3), hostile, RARE),
        "pg_desc": mostly(st.sampled_from(["default_pg", "dp"]), hostile, RARE),
        "pg_size": mostly(st.integers(1, 2), value, RARE),
        "backend_config": st.just("cuda:nccl"),
    },
)
dist = st.fixed_dictionaries(
    {
        "rank": mostly(st.just(0), value, 20),
        "world_size": mostly(st.integers(1, 2), value, 20),
    },
    optional={
        "backend": mostly(st.sampled_from(["nccl", "gloo"]), hostile, RARE),
        "pg_config": mostly(st.lists(pg, max_size=3), hostile, RARE),
    },
)
document = st.fixed_dictionaries(
    {
        "traceEvents": mostly(st.lists(event, min_size=1, max_size=16), hostile, 20),
        "distributedInfo": mostly(dist, hostile, 20),
    },
    optional={
        "deviceProperties": mostly(
            st.lists(st.fixed_dictionaries({"id": st.integers(0, 1), "name": st.text(max_size=5)})),
            hostile,
            20,
        ),
        "baseTimeNanoseconds": mostly(st.integers(0, 2**60), value, 20),
        "schemaVersion": mostly(st.just(1), value, 20),
    },
)
# what happens to the bytes: kept, cut short, one byte changed, gzipped, or named .gz unzipped
damage = mostly(
    st.just(("keep", 0, 0)),
    st.one_of(
        st.tuples(st.just("cut"), st.integers(0, 10**6), st.just(0)),
        st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(0, 255)),
        st.just(("gzip", 0, 0)),
        st.just(("fake-gzip", 0, 0)),
    ),
    3,
)


def render(doc: dict[str, Any], how: tuple[str, int, int]) -> tuple[str, bytes]:
    """(file name, bytes) of a document after `how`."""
    text = json.dumps(doc)
    for n in sorted({int(m) for m in _deeps(text)}, reverse=True):
        text = text.replace(json.dumps(_deep(n)), "[" * n + "]" * n)
    raw = text.encode()
    kind, at, byte = how
    if kind == "cut":
        raw = raw[: at % (len(raw) + 1)]
    elif kind == "flip" and raw:
        i = at % len(raw)
        raw = raw[:i] + bytes([byte]) + raw[i + 1 :]
    if kind == "gzip":
        return "rank0.json.gz", gzip.compress(raw)
    return ("rank0.json.gz" if kind == "fake-gzip" else "rank0.json"), raw


def _deeps(text: str) -> list[str]:
    marker = json.dumps(DEEP).split("{}")
    parts = text.split(marker[0])[1:]
    return [p.split(marker[1])[0] for p in parts]


@fuzzed(EXAMPLES)
@given(doc=document, how=damage, two=st.booleans())
def test_kineto_documents(
    worker: Worker,
    tmp_path_factory: pytest.TempPathFactory,
    doc: dict[str, Any],
    how: Any,
    two: bool,
) -> None:
    """One rank, or two (the second the same events as rank 1: collectives to match); every
    REPORT_EVERY-th case is also reported (a report takes ~1 s even for a few events)."""
    folder = tmp_path_factory.mktemp("kineto-fuzz")
    files: dict[Path, bytes] = {}
    for rank in range(2 if two else 1):
        if rank and isinstance(doc.get("distributedInfo"), dict):
            doc = {**doc, "distributedInfo": {**doc["distributedInfo"], "rank": rank}}
        name, raw = render(doc, how)
        files[folder / name.replace("rank0", f"rank{rank}")] = raw
    for path, raw in files.items():
        path.write_bytes(raw)
    paths = [str(p) for p in files]
    report = next(_cases) % REPORT_EVERY == 0
    answer = worker.run("ingest", paths, str(folder / "out.duckdb"), report)
    check(answer, "rank", b"".join(files.values()))
    assert all(p.read_bytes() == raw for p, raw in files.items())  # inputs never change


def test_worker_reports_a_hang_and_a_crash() -> None:
    """The harness itself: a stuck or dying case is caught, and the next case runs."""
    w = Worker()
    try:
        assert w.run("stall", 60, timeout=1) == ("hang", 1)
        assert w.run("die")[0] == "crash"
        assert w.run("nope")[0] == "traceback"
        assert w.run("scan", b"{}", [])[0] == "ok"
    finally:
        w.close()
