"""The C scanner (kineto_fast) against the reference decoder (msgspec, kineto_events).

The scanner is only an accelerator: on every input it must give exactly the reference's columns,
or refuse (None) so that the reference decides. Checked on every real trace we have and on
generated events that exercise the JSON corners (escapes, non-ASCII, string ids, nulls,
duplicate keys, numbers of every shape, nested unknown args).
"""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ranklens.ingest import kineto, kineto_fast
from ranklens.ingest.kineto_events import _Event, columns

REPO = Path(__file__).resolve().parents[2]


def test_scanner_is_built_where_required() -> None:
    """CI sets RANKLENS_REQUIRE_KSCAN=1: a broken build must not hide behind the fallback."""
    if os.environ.get("RANKLENS_REQUIRE_KSCAN") == "1":
        assert kineto_fast.available(), "the C scanner (ranklens.ingest._kscan) is not built"
    elif not kineto_fast.available():
        pytest.skip("C scanner not built (no compiler at install time)")


needs_scanner = pytest.mark.skipif(not kineto_fast.available(), reason="C scanner not built")


def _reference(buf: bytes, has_dev: bool = True) -> kineto_fast.Columns:
    events = msgspec.json.decode(b"[" + buf + b"]", type=list[_Event])
    return columns("t.json", has_dev, "nccl", 5_000, events, 3, 1)


def _plain(t: pa.Table) -> dict[str, list[Any]]:
    out = {}
    for name in t.column_names:
        col = t[name]
        if pa.types.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        out[name] = (str(col.type), col.to_pylist())
    return out


def assert_same(buf: bytes, has_dev: bool = True) -> bool:
    """Fast == reference on buf (events without brackets); False if the scanner refused."""
    fast = kineto_fast.columns(buf, 0, len(buf), has_dev, "nccl", 5_000, 3, 1)
    try:
        ref = _reference(buf, has_dev)
    except Exception:  # the reference rejects it: the scanner must too
        assert fast is None, "the scanner accepted input the reference decoder rejects"
        return False
    if fast is None:
        return False
    assert _plain(fast[0]) == _plain(ref[0])
    assert sorted(fast[1]) == sorted(ref[1])
    assert fast[2] == ref[2]
    return True


def _trace_files() -> list[Path]:
    shared = REPO.parent / "shared" / "traces" / "public"
    files = sorted(shared.rglob("*.json")) + sorted(shared.rglob("*.json.gz"))
    return files + sorted((REPO / "sample_traces").glob("*/raw/*.json*"))


@needs_scanner
@pytest.mark.parametrize("path", _trace_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_traces_decode_identically(path: Path, request: pytest.FixtureRequest) -> None:
    if "shared" in path.parts:
        request.getfixturevalue("shared_traces")  # skip or fail as the suite does
    prep = kineto.prepare(str(path), 1 << 20)
    try:
        with (
            open(prep.data_path, "rb") as f,
            mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm,
        ):
            for lo, hi in prep.pieces:
                assert assert_same(mm[lo:hi], prep.has_device), (
                    f"scanner refused {path} [{lo}:{hi}]"
                )
    finally:
        kineto.cleanup(prep)


# -- generated events ----------------------------------------------------------------------------
def _mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`bad` one draw in ten (so that most generated events are valid and really compared)."""
    return st.integers(0, 9).flatmap(lambda k: bad if k == 0 else good)


_text = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12
) | st.sampled_from(["ProfilerStep#3", "ncclKernel_AllReduce_RING_LL_Sum_float", "Trace", 'é"\\/'])
_num = (
    st.integers(-(2**63), 2**63 - 1)
    | st.integers(2**63, 2**70)
    | st.floats(allow_nan=False, allow_infinity=False, width=64)
    | st.none()
)
_id = st.integers(-(2**40), 2**40) | st.sampled_from(["Spans", "stream 7", "12", None])
# p2p peers that are not plain ranks: the reference judges them all (the scanner refuses)
_peer_odd = st.sampled_from([-1, 2**31, 2**40, "", "x", "1.0", "٣", "01234567890", " 1"]) | _num
_args = st.fixed_dictionaries(
    {},
    optional={
        "External id": st.integers(-(2**63), 2**63 - 1) | st.none(),
        "correlation": st.integers(0, 2**40) | st.none(),
        "stream": st.integers(0, 99) | st.none(),
        "device": _mostly(st.integers(0, 7) | st.none(), st.just(2**40)),
        "Collective name": st.sampled_from(["allreduce", "send", "all_gather"]) | st.none(),
        "In msg nelems": st.integers(0, 2**31),
        "Group size": _mostly(st.integers(0, 64), st.just(2**40)),
        "dtype": st.sampled_from(["Float", "BFloat16"]) | st.none(),
        "Process Group Name": st.sampled_from(["0", "1", "pg\\u00e9"]) | st.none(),
        "Process Group Description": _text | st.none(),
        "Process Group Ranks": st.lists(st.integers(0, 8), max_size=4) | st.just("[0, 1]"),
        "bytes": _mostly(st.integers(0, 2**40) | st.floats(0, 1e12), _num),
        "Dst Rank": _mostly(st.integers(0, 2**31 - 1) | st.none(), _peer_odd),
        "Src Rank": _mostly(st.integers(0, 1023) | st.sampled_from(["7", "0012"]), _peer_odd),
        "grid": st.lists(st.integers(-5, 2**33), max_size=3) | st.none(),
        "block": st.lists(st.integers(0, 1024), max_size=3),
        "Input Dims": st.lists(st.lists(st.integers(0, 9), max_size=2), max_size=2),
        "Input type": st.lists(st.sampled_from(["float", "", "TensorList"]), max_size=3),
        "Concrete Inputs": st.lists(st.sampled_from(["", "1", "[]"]), max_size=2),
        "name": _text,
        "unknown": st.recursive(st.none() | _num | _text, lambda c: st.lists(c, max_size=2)),
    },
)


_event = st.fixed_dictionaries(
    {
        "ph": st.sampled_from(["X", "X", "X", "M", "i", "s", ""]),
        "ts": _mostly(st.floats(0, 1e13, allow_nan=False) | st.integers(0, 2**53), st.none()),
        "dur": _mostly(st.floats(0, 1e6, allow_nan=False) | st.integers(0, 10**6), st.none()),
    },
    optional={
        "cat": st.sampled_from(["kernel", "cpu_op", "gpu_memcpy", "cuda_runtime", "Trace"])
        | st.none(),
        "name": _text | st.sampled_from(["process_name", "thread_name"]),
        "pid": _id,
        "tid": _id,
        "args": _args | st.none(),
    },
)


def _render(events: list[dict[str, Any]], spaced: bool, escape: bool) -> bytes:
    sep = (",\n  ", ", ", ": ") if spaced else (",", ",", ":")
    return (
        sep[0].join(json.dumps(e, ensure_ascii=escape, separators=sep[1:]) for e in events).encode()
    )


@needs_scanner
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_event, max_size=6), st.booleans(), st.booleans())
def test_generated_events_decode_identically(
    events: list[dict[str, Any]], spaced: bool, escape: bool
) -> None:
    assert_same(_render(events, spaced, escape))


@needs_scanner
def test_common_events_are_not_refused() -> None:
    """The scanner must actually take the usual shapes (else the fast path is a no-op)."""
    ev = [
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
         "pid": 0, "tid": 7, "ts": 1.5, "dur": 3.25,
         "args": {"External id": 9, "correlation": 4, "stream": 7, "device": 0, "grid": [1, 2, 3],
                  "Collective name": "allreduce", "Process Group Name": "0", "dtype": "Float",
                  "Process Group Ranks": [0, 1], "In msg nelems": 8, "Group size": 2}},
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 1,
         "dur": 1, "args": {"External id": 9, "Rank": 0, "Dst Rank": 12,
                            "Collective name": "send"}},
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 3,
         "dur": 1, "args": {"External id": 10, "Src Rank": "5", "Collective name": "recv"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm \\u00e9", "pid": "Spans", "tid": 1,
         "ts": 0.001, "dur": 0, "args": {"Input Dims": [[2, 3]], "Input type": ["float"]}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "stream 7"}},
    ]  # fmt: skip
    assert assert_same(_render(ev, True, False))


@needs_scanner
@pytest.mark.parametrize(
    "bad",
    [
        b'{"ph": "X", "name": "a", "ts": 1, "dur": -1}',  # negative duration
        b'{"ph": "X", "name": "a", "ts": 1}',  # no duration
        b'{"ph": "X", "name": "a\xff", "ts": 1, "dur": 1}',  # invalid UTF-8
        b'{"ph": "X", "name": "a", "ts": 1, "dur": 1},',  # trailing comma
        b'{"ph": "X", "name": "a", "ts": 1, "dur": 1',  # truncated
        b'{"p\\u0068": "X", "name": "a", "ts": 1, "dur": 1}',  # escaped key
        b'{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"stream": 1.5}}',  # float int
        b'{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"Dst Rank": 2147483648}}',
        b'{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"Src Rank": "\\u0031"}}',
    ],
)
def test_scanner_refuses_what_the_reference_must_judge(bad: bytes) -> None:
    assert kineto_fast.columns(bad, 0, len(bad), True, None, 0, 0, 0) is None


_UTF8_OK = ["é", "€", "𝄞", "aé€𝄞b" * 5, "\u07ff\u0800\uffff\U00010000\U0010ffff"]
_UTF8_BAD = [
    b"\x80",  # a continuation byte alone
    b"\xc0\xaf",  # overlong '/'
    b"\xe0\x80\xaf",  # overlong, three bytes
    b"\xed\xa0\x80",  # a surrogate (U+D800)
    b"\xf4\x90\x80\x80",  # past U+10FFFF
    b"\xf5\x80\x80\x80",  # a lead byte no sequence has
    b"\xe2\x82",  # cut short by the closing quote
    b"\xc3\x28",  # a lead byte without its continuation
]


@needs_scanner
@pytest.mark.parametrize("where", ["name", "cat", "args"])
@pytest.mark.parametrize("pad", [0, 7, 13])
def test_utf8_in_strings_checked_where_scanned(where: str, pad: int) -> None:
    """The scanner checks UTF-8 inside each string it scans (no pass over the whole piece
    first): every sequence length decodes as the reference does, at any alignment of the
    8-byte skip, and every kind of invalid sequence is left to the reference, which rejects it."""

    def event(text: bytes) -> bytes:
        value = b'"' + b"x" * pad + text + b'"'
        fields = {
            "name": b'"ph": "X", "name": %s, "ts": 1, "dur": 1',
            "cat": b'"ph": "X", "cat": %s, "name": "a", "ts": 1, "dur": 1',
            "args": b'"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"dtype": %s}',
        }[where]
        return b"{" + fields % value + b"}"

    for text in _UTF8_OK:
        assert assert_same(event(text.encode()))
    for bad in _UTF8_BAD:
        buf = event(bad)
        assert kineto_fast.columns(buf, 0, len(buf), True, None, 0, 0, 0) is None, bad
        with pytest.raises(msgspec.DecodeError):
            _reference(buf, True)


@needs_scanner
def test_fields_of_one_event_do_not_reach_the_next() -> None:
    """Each event starts with every field absent (the scanner clears only the flags that say a
    field is there): what one event set is NULL on the next that lacks it."""
    full = {
        "ph": "X", "cat": "kernel", "name": "k", "pid": "Spans", "tid": 7, "ts": 1, "dur": 2,
        "args": {"External id": 1, "correlation": 2, "stream": 3, "device": 0,
                 "Collective name": "send", "In msg nelems": 4, "Out msg nelems": 5,
                 "Group size": 2, "dtype": "Float", "Process Group Name": "0",
                 "Process Group Description": "d", "Process Group Ranks": [0, 1], "Seq": 9,
                 "bytes": 64, "Dst Rank": 1, "grid": [1, 2, 3], "block": [4, 5, 6],
                 "Input Dims": [[1]], "Input type": ["float"], "Concrete Inputs": ["1"]},
    }  # fmt: skip
    bare = {"ph": "X", "name": "b", "ts": 3, "dur": 1}
    meta = {"ph": "M", "pid": 1, "tid": 2}  # a metadata event with no name at all
    for events in ([full, bare], [full, {**bare, "args": {}}], [full, meta, bare]):
        assert assert_same(_render(events, True, False))
    buf = _render([full, bare], True, False)
    fast = kineto_fast.columns(buf, 0, len(buf), True, None, 0, 0, 0)
    assert fast is not None
    row = {k: v[1] for k, v in _plain(fast[0]).items()}
    assert all(row[c][1] is None for c in ("correlation", "coll_op", "pg_name", "launch"))


@needs_scanner
@pytest.mark.parametrize("after", ["", ', "deviceProperties": [{"id": 0}], "x": [1, [2]]'])
def test_events_array_located_without_full_parse(tmp_path: Path, after: str) -> None:
    """Keys (with arrays) after `traceEvents` and cuts inside nested values still locate the
    array's end exactly, and agree with the full-parse path."""
    ev = [
        {"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1,
         "args": {"Input Dims": [[1, 2], [3]], "nested": [{"a": 1}, {"b": [2]}]}}
        for i in range(400)
    ]  # fmt: skip
    body = ",\n  ".join(json.dumps(e) for e in ev)
    path = tmp_path / "rank0.json"
    path.write_text(f'{{"schemaVersion": 1, "traceEvents": [\n  {body}\n]{after}}}')
    fast = kineto.prepare(str(path), 2048)
    os.environ["RANKLENS_PURE_PYTHON"] = "1"
    try:
        ref = kineto.prepare(str(path), 2048)
    finally:
        del os.environ["RANKLENS_PURE_PYTHON"]
    assert fast.pieces == ref.pieces and len(fast.pieces) > 10
    assert fast.pieces[-1][1] == path.read_bytes().rindex(b"\n]") + 1
