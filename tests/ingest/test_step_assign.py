"""Step rules of `step_assign.assign`, on hand-built rank tables whose answers are worked out
by hand (the same rules the database tests check end to end through ingest)."""

from __future__ import annotations

import random

import pyarrow as pa
from ranklens.ingest.step_assign import assign


def _table(rows: list[tuple[str, str, int, int, int | None, int | None]]) -> pa.Table:
    names, kinds, devs, ts, dur, corr = zip(*rows, strict=True)
    return pa.table(
        {
            "name": pa.array(names).dictionary_encode(),
            "kind": pa.array(kinds),
            "device": pa.array(devs, pa.int32()),
            "ts_ns": pa.array(ts, pa.int64()),
            "dur_ns": pa.array(dur, pa.int64()),
            "correlation": pa.array(corr, pa.int64()),
        }
    )


def test_host_launch_and_late_device_events() -> None:
    ev = _table(
        [
            ("ProfilerStep#7", "annotation", -1, 100, 100, None),  # step 7: host [100, 200)
            ("ProfilerStep#8", "annotation", -1, 200, 100, None),  # step 8: host [200, 300)
            ("cudaLaunchKernel", "runtime", -1, 150, 5, 1),  # in step 7
            ("cudaLaunchKernel", "runtime", -1, 250, 5, 2),  # in step 8
            ("gemm", "compute", 0, 180, 40, 1),  # launched in 7: W7 = [180, 220)
            ("gemm", "compute", 0, 310, 30, 2),  # launched in 8, runs after its host span
            ("copy", "memcpy", 0, 330, 50, None),  # no launch: inside W8 = [310, 340), widens it
            ("orphan", "compute", 0, 900, 10, None),  # no launch, in no window: no step
            ("aten::mm", "cpu_op", -1, 350, 1, None),  # after every host span: no step
        ]
    )
    step, windows = assign(ev, has_gpu=True)
    assert step.to_pylist() == [7, 8, 7, 8, 7, 8, 8, None, None]
    got = [(w.step, w.cpu_start_ns, w.cpu_end_ns, w.start_ns, w.end_ns) for w in windows]
    assert got == [(7, 100, 200, 180, 220), (8, 200, 300, 310, 380)]


def test_cpu_rank_window_is_its_host_span_extended() -> None:
    ev = _table(
        [
            ("ProfilerStep#1", "annotation", -1, 0, 100, None),
            ("aten::add", "cpu_op", -1, 90, 30, None),  # starts inside, ends after: W to 120
        ]
    )
    step, windows = assign(ev, has_gpu=False)
    assert step.to_pylist() == [1, 1]
    assert [(w.start_ns, w.end_ns, w.source) for w in windows] == [(0, 120, "profiler_step")]


def test_no_profiler_step_is_one_pseudo_step() -> None:
    ev = _table(
        [
            ("cudaLaunchKernel", "runtime", -1, 10, 5, 1),
            ("gemm", "compute", 0, 40, 20, 1),
            ("note", "annotation", -1, 0, 500, None),
        ]
    )
    step, windows = assign(ev, has_gpu=True)
    assert step.to_pylist() == [-1, -1, -1]
    (w,) = windows
    # host span of the traced kinds (annotations are not), device window of the GPU work
    assert (w.step, w.cpu_start_ns, w.cpu_end_ns, w.start_ns, w.end_ns, w.source) == (
        -1,
        10,
        60,
        40,
        60,
        "trace",
    )


def _encodings(kinds: list[str | None]) -> list[pa.ChunkedArray]:
    """The same `kind` column as readers hand it over: plain, one dictionary, and chunks with
    dictionaries of their own (one holding a null value, as Nsight's reader builds them)."""
    half = len(kinds) // 2
    first = pa.array(kinds[:half], pa.string()).dictionary_encode()
    vocab = [None, *sorted({k for k in kinds[half:] if k is not None}, reverse=True)]
    second = pa.DictionaryArray.from_arrays(
        pa.array([vocab.index(k) for k in kinds[half:]], pa.int32()), pa.array(vocab, pa.string())
    )
    return [
        pa.chunked_array([pa.array(kinds, pa.string())]),
        pa.chunked_array([pa.array(kinds, pa.string()).dictionary_encode()]),
        pa.chunked_array([first, second]),
    ]


def test_kind_encoding_does_not_change_the_answer() -> None:
    rnd = random.Random(3)
    kinds = ["annotation", "runtime", "sync", "compute", "comm", "memcpy", "cpu_op", "other", None]
    for case in range(60):
        n = rnd.randint(2, 40)
        rows = []
        for i in range(n):
            k = rnd.choice(kinds)
            step_span = case % 3 and i < 2  # some ranks have ProfilerStep spans, some not
            name = f"ProfilerStep#{i + 4}" if step_span else "op"
            kind = "annotation" if step_span else k
            dev = -1 if kind in ("annotation", "runtime", "sync", "cpu_op") else rnd.choice([0, 1])
            dur = rnd.choice([None, rnd.randint(1, 50)]) if not step_span else 60
            rows.append((name, kind, dev, rnd.randint(0, 200), dur, rnd.choice([None, 1, 2, 3])))
        plain = _table(rows)
        want = assign(plain, has_gpu=bool(case % 2))
        for col in _encodings([r[1] for r in rows]):
            got = assign(plain.set_column(1, "kind", col), has_gpu=bool(case % 2))
            assert got[0].to_pylist() == want[0].to_pylist()
            assert got[1] == want[1]
    # and the plain answer is the rules' own: a null kind is no kind (no step of its own)
    ev = _table(
        [("ProfilerStep#1", "annotation", -1, 0, 100, None), ("x", "cpu_op", -1, 5, 1, None)]
    )
    nulled = ev.set_column(1, "kind", _encodings(["annotation", None])[2])
    assert assign(nulled, has_gpu=False)[0].to_pylist() == [1, 1]
