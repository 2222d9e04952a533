"""Issue 14 items 2 and 8 (values): numbers the database cannot hold are errors naming the file
and the event (in both Kineto decoders), never zeroed or a traceback; with --skip-bad the rank
is skipped and said so; absurd but storable values are kept and warned about, at ingest and in
every later report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from reliability.conftest import patch_json, write_run
from reliability.harness import clear_error, ok, run, snapshot, unchanged

K = {"cat": "kernel", "pid": 0, "tid": 7}
# name -> (extra event on rank 1, what the error must say besides the file)
OUT_OF_RANGE: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "dur-1e20": ({**K, "name": "hugek", "ts": 50, "dur": 1e20}, ("'hugek'", "dur", "out of range")),
    "dur-10^19-int": (
        {**K, "name": "hugek", "ts": 50, "dur": 10**19},
        ("'hugek'", "dur", "out of range"),
    ),
    "ts-1e300": ({**K, "name": "farts", "ts": 1e300, "dur": 1}, ("'farts'", "ts", "out of range")),
    "ts-minus-1e300": ({**K, "name": "negts", "ts": -1e300, "dur": 1}, ("'negts'", "out of range")),
    # start and duration fit; their end does not (INT64 overflow once an offset is added)
    "end-overflow": (
        {**K, "name": "endk", "ts": 2.5e15, "dur": 1e15},
        ("'endk'", "ends at", "out of range"),
    ),
    "device-2^40": (
        {**K, "name": "devk", "ts": 50, "dur": 1, "args": {"device": 2**40}},
        ("'devk'", "device"),
    ),
    "group-size-2^40": (
        {
            **K,
            "name": "ncclKernel_AllReduce_RING_LL_Sum_float",
            "ts": 50,
            "dur": 1,
            "args": {"Group size": 2**40},
        },
        ("Group size", "1099511627776"),
    ),
    "correlation-2^70": (
        {**K, "name": "corrk", "ts": 50, "dur": 1, "args": {"correlation": 2**70}},
        ("'corrk'", "correlation"),
    ),
    "bytes-1e300": (
        {**K, "cat": "gpu_memcpy", "name": "cpy", "ts": 50, "dur": 1, "args": {"bytes": 1e300}},
        ("'cpy'", "bytes"),
    ),
}


@pytest.fixture(scope="module")
def previous_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run ranklens wrote: each case copies it as the output its failed ingest must leave
    as it was (made once: a copy is as good as a fresh one for that)."""
    root = tmp_path_factory.mktemp("prev")
    ok(run(["ingest", write_run(root) / "rank0.json", "-o", root / "prev.duckdb"], root))
    return root / "prev.duckdb"


@pytest.mark.parametrize("case", sorted(OUT_OF_RANGE))
def test_out_of_range_is_an_error_naming_the_event(
    tmp_path: Path, case: str, decoder_env: dict[str, str], previous_output: Path
) -> None:
    extra, fragments = OUT_OF_RANGE[case]
    runs = write_run(tmp_path, extra)
    prev = tmp_path / "prev.duckdb"
    shutil.copyfile(previous_output, prev)
    before = snapshot(tmp_path)
    res = run(["ingest", runs, "-o", prev], tmp_path, env=decoder_env)
    clear_error(res, str(runs / "rank1.json"), *fragments)
    unchanged(before, snapshot(tmp_path))  # the previous output too


@pytest.mark.parametrize("case", ["dur-1e20", "ts-1e300", "end-overflow", "device-2^40"])
def test_skip_bad_skips_the_rank_and_says_so(
    tmp_path: Path, case: str, decoder_env: dict[str, str]
) -> None:
    runs = write_run(tmp_path, OUT_OF_RANGE[case][0])
    db = tmp_path / "out.duckdb"
    before = snapshot(runs)
    res = run(["ingest", runs, "-o", db, "--skip-bad"], tmp_path, env=decoder_env)
    ok(res)
    skipped = [ln for ln in res.err.splitlines() if ln.startswith("skipped:")]
    assert len(skipped) == 1 and str(runs / "rank1.json") in skipped[0], res.err
    assert "ingested 1 rank(s)" in res.out
    unchanged(before, snapshot(runs))
    q = run(["sql", db, "SELECT count(*) AS n FROM events WHERE rank = 1", "-f", "csv"], tmp_path)
    assert q.out.splitlines()[1] == "0"  # nothing of the bad rank stored, let alone zeroed
    rep = run(["report", db], tmp_path)
    ok(rep)
    assert "skipped:" in rep.out and ("out of range" in rep.out or "beyond" in rep.out)


HEADER: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "rank-2^40": ({"dist": {"rank": 2**40}}, ("rank 1099511627776",)),
    "rank-negative": ({"dist": {"rank": -1}}, ("rank -1",)),
    "world-size-2^40": ({"dist": {"world_size": 2**40}}, ("world size",)),
    "base-time-2^70": ({"baseTimeNanoseconds": 2**70}, ("baseTimeNanoseconds",)),
    "num-sms-2^40": (
        {"deviceProperties": [{"id": 0, "name": "H100", "numSms": 2**40}]},
        ("SM count",),
    ),
}


@pytest.mark.parametrize("case", sorted(HEADER))
def test_header_out_of_range(tmp_path: Path, case: str, decoder_env: dict[str, str]) -> None:
    runs = write_run(tmp_path)
    patch_json(runs / "rank1.json", **json.loads(json.dumps(HEADER[case][0])))
    before = snapshot(tmp_path)
    res = run(["ingest", runs, "-o", tmp_path / "o.duckdb"], tmp_path, env=decoder_env)
    clear_error(res, str(runs / "rank1.json"), *HEADER[case][1])
    unchanged(before, snapshot(tmp_path))
    # the same through `report` (a negative rank used to get in and break it)
    clear_error(run(["report", runs], tmp_path, env=decoder_env), *HEADER[case][1])


def test_deeply_nested_args(tmp_path: Path, decoder_env: dict[str, str]) -> None:
    runs = write_run(tmp_path)
    p = runs / "rank1.json"
    deep = b"[" * 200_000 + b"]" * 200_000
    event = b'{"ph": "X", "cat": "cpu_op", "name": "n", "pid": 1, "tid": 1, "ts": 1, "dur": 1, '
    p.write_bytes(
        p.read_bytes().replace(b'"traceEvents": [', b'"traceEvents": [' + event + b'"args": {"d": '
        + deep + b"}},", 1)
    )  # fmt: skip
    before = snapshot(tmp_path)
    res = run(["ingest", runs, "-o", tmp_path / "o.duckdb"], tmp_path, env=decoder_env)
    clear_error(res, str(p), "nested too deeply")
    unchanged(before, snapshot(tmp_path))


ABSURD: dict[str, tuple[dict[str, Any] | None, dict[str, Any], str]] = {
    "115-day-kernel": ({**K, "name": "longk", "ts": 50, "dur": 115 * 86400e6}, {}, "115.0 days"),
    "negative-ts": ({**K, "name": "early", "ts": -5e6, "dur": 1}, {"baseTimeNanoseconds": 0},
                    "before 1970"),
    "rank-not-below-world": (None, {"dist": {"world_size": 1}}, "world size 1"),
    "world-size-0": (None, {"dist": {"world_size": 0}}, "world size 0"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(ABSURD))
def test_absurd_values_are_kept_and_warned(
    tmp_path: Path, case: str, decoder_env: dict[str, str]
) -> None:
    extra, header, fragment = ABSURD[case]
    runs = write_run(tmp_path, extra)
    if header:
        patch_json(runs / "rank1.json", **header)
    before = snapshot(runs)
    db = tmp_path / "o.duckdb"
    res = run(["ingest", runs, "-o", db], tmp_path, env=decoder_env)
    ok(res)
    warning = [ln for ln in res.err.splitlines() if ln.startswith("warning:") and fragment in ln]
    assert warning and str(runs / "rank1.json") in warning[0], res.err
    unchanged(before, snapshot(runs))
    for fmt in ("table", "markdown"):
        rep = run(["report", db, "-f", fmt], tmp_path)
        ok(rep)
        assert fragment in rep.out, rep.out  # stored with the run, shown by every report
    js = json.loads(run(["report", db, "-f", "json"], tmp_path).out)
    assert any(fragment in w for w in js["facts"]["warnings"])
