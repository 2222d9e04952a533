"""Issue 14 item 2, at the decoders: the C scanner and the reference decoder agree on where a
time stops being storable (US_LIMIT). Below it both give the same columns; at and beyond it
the scanner refuses and the reference raises an error naming the event, so the user's message
never depends on which decoder ran."""

from __future__ import annotations

import json

import msgspec
import pytest
from ranklens.ingest import kineto_fast
from ranklens.ingest.errors import TraceFormatError
from ranklens.ingest.kineto_events import US_LIMIT, _Event, columns

pytestmark = pytest.mark.skipif(not kineto_fast.available(), reason="C scanner not built")


def _buf(ts: float, dur: float) -> bytes:
    ev = {"ph": "X", "cat": "kernel", "name": "edge", "pid": 0, "tid": 7, "ts": ts, "dur": dur}
    return json.dumps(ev).encode()


def _reference(buf: bytes) -> list[int]:
    events = msgspec.json.decode(b"[" + buf + b"]", type=list[_Event])
    table = columns("t.json", True, "nccl", 0, events, 0, 0)[0]
    return [table["ts_ns"][0].as_py(), table["dur_ns"][0].as_py()]


@pytest.mark.parametrize(
    "ts,dur",
    [
        (US_LIMIT - 1, 1),
        (1, US_LIMIT - 1),
        (-(US_LIMIT - 1), 0),
        (US_LIMIT - 1.5, 0.25),
    ],
)
def test_just_inside_both_agree(ts: float, dur: float) -> None:
    buf = _buf(ts, dur)
    fast = kineto_fast.columns(buf, 0, len(buf), True, "nccl", 0, 0, 0)
    assert fast is not None
    assert [fast[0]["ts_ns"][0].as_py(), fast[0]["dur_ns"][0].as_py()] == _reference(buf)


@pytest.mark.parametrize(
    "ts,dur", [(US_LIMIT, 1), (1, US_LIMIT), (-US_LIMIT - 1, 1), (1e300, 1), (1, 1e20)]
)
def test_beyond_scanner_refuses_reference_names_the_event(ts: float, dur: float) -> None:
    buf = _buf(ts, dur)
    assert kineto_fast.columns(buf, 0, len(buf), True, "nccl", 0, 0, 0) is None
    with pytest.raises(TraceFormatError, match=r"'edge'.*out of range"):
        _reference(buf)
