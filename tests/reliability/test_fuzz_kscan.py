"""Fuzz: raw bytes through the C scanner (`ingest/_kscan.c`): JSON-ish token soup and damaged
copies of real event arrays, over the whole buffer and over cut ranges.

The scanner must return columns or raise ValueError; a crash, a sanitizer report or a hang fails
the case (fuzzhost runs it in a worker process). CI also runs this file against a build with
AddressSanitizer and UndefinedBehaviorSanitizer (`.ci/kscan-asan`, RANKLENS_KSCAN_SO).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reliability.conftest import fuzzed

from .fuzzhost import Worker
from .test_fuzz_kineto import event

EXAMPLES = 400
TOKENS = [
    b"{", b"}", b"[", b"]", b",", b":", b'"', b"\\", b" ", b"\n", b"\t",
    b'"ph"', b'"X"', b'"ts"', b'"dur"', b'"args"', b'"name"', b'"cat"', b'"kernel"', b'"pid"',
    b'"tid"', b'"id"', b'"device"', b'"stream"', b'"External id"', b'"correlation"',
    b'"Collective name"', b'"In msg nelems"', b'"Group size"', b'"Process Group Ranks"',
    b'"Input Dims"', b'"grid"', b'"[0, 1]"', b"1", b"-1", b"0", b"1.5", b"1e400", b"-1e-400",
    b"9223372036854775807", b"9223372036854775808", b"-9223372036854775809", b"1" * 40, b"-0",
    b"null", b"true", b"false", b'"\\u0000"', b'"\\ud800"', b'"\\uDFFF\\uD800"', b'"\\x"',
    b'"\xff\xfe"', b'"\xc3"', b"\xef\xbb\xbf", b"\x00", b"[" * 200, b"{" * 200, b'"' + b"a" * 300,
]  # fmt: skip

soup = st.lists(st.one_of(st.sampled_from(TOKENS), st.binary(max_size=4)), max_size=80).map(
    b"".join
)


def _events(evs: list[dict[str, Any]]) -> bytes:
    """Events as the scanner sees them: the inside of the traceEvents array."""
    return ",".join(json.dumps(e) for e in evs).encode()


edits = st.lists(
    st.tuples(
        st.sampled_from(["flip", "insert", "delete"]),
        st.integers(0, 10**6),
        st.binary(min_size=1, max_size=3),
    ),
    max_size=4,
)


def damaged(raw: bytes, how: list[tuple[str, int, bytes]]) -> bytes:
    for kind, at, data in how:
        i = at % (len(raw) + 1)
        if kind == "flip" and raw:
            i = min(i, len(raw) - 1)
            raw = raw[:i] + data[:1] + raw[i + 1 :]
        elif kind == "insert":
            raw = raw[:i] + data + raw[i:]
        else:
            raw = raw[:i] + raw[i + len(data) :]
    return raw


inputs = st.one_of(
    soup,
    st.builds(damaged, st.lists(event, min_size=1, max_size=6).map(_events), edits),
    st.lists(event, max_size=6).map(_events),
)
cuts = st.lists(st.tuples(st.integers(0, 400), st.integers(0, 400)), max_size=2)


@pytest.fixture(scope="module")
def worker() -> Iterator[Worker]:
    from ranklens.ingest import kineto_fast

    if not kineto_fast.available() and not os.environ.get("RANKLENS_KSCAN_SO"):
        if os.environ.get("RANKLENS_REQUIRE_KSCAN") == "1":
            pytest.fail("the C scanner is not built (RANKLENS_REQUIRE_KSCAN=1)")
        pytest.skip("the C scanner is not built")
    w = Worker()
    so = os.environ.get("RANKLENS_KSCAN_SO")
    if so:  # CI's sanitizer build: make sure it is the one under test
        assert w.run("which") == ("ok", so)
    yield w
    w.close()


@fuzzed(EXAMPLES)
@given(buf=inputs, ranges=cuts)
def test_scanner_bytes(worker: Worker, buf: bytes, ranges: list[tuple[int, int]]) -> None:
    n = len(buf)
    answer = worker.run("scan", buf, [(min(a, n), min(max(a, b), n)) for a, b in ranges])
    assert answer[0] == "ok", f"{answer[0]} on {buf[:400]!r}:\n{answer[1]}"
