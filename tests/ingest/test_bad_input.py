"""Damaged and wrong inputs: always a RanklensError naming the file (and the event or byte when
the reader knows it) with a hint; with on_error="skip" the good files still go in and the bad
one is listed in the report and in the `sources` table. Never a bare traceback."""

from __future__ import annotations

import glob
import gzip
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest
from kineto_builder import KinetoTrace
from ranklens.ingest import RanklensError, load_traces, workpool
from ranklens.ingest.errors import NoTracesError, RankError, TraceFormatError

PNG = bytes.fromhex("89504e470d0a1a0a0000000d49484452") + b"\x00\x00\x00\x10" * 8


def good(rank: int = 0) -> KinetoTrace:
    t = KinetoTrace(rank=rank, world_size=2)
    t.step(1, 0, 100)
    t.kernel("gemm", 10, 20)
    t.nccl("AllReduce", 30, 10, stream=9)
    return t


def with_event(**event: Any) -> bytes:
    t = good(1)
    t.add(**event)
    return t.dumps()


def half() -> bytes:
    data = good(1).dumps()
    return data[: len(data) // 2]


def corrupt_gz() -> bytes:
    z = bytearray(gzip.compress(good(1).dumps()))
    z[len(z) // 2] ^= 0xFF  # a flipped byte: bad deflate data or CRC
    return bytes(z)


def bad_utf8() -> bytes:
    return with_event(cat="kernel", name="BADNAME", pid=0, tid=7, ts=50, dur=1).replace(
        b"BADNAME", b"gemm_\xff\xfe_kernel"
    )


def big_id() -> bytes:
    return with_event(
        cat="kernel", name="k", pid=0, tid=7, ts=50, dur=1, args={"correlation": 2**70}
    )


# name -> (file name, bytes, what the message must say)
CASES: dict[str, tuple[str, Callable[[], bytes], str]] = {
    "truncated": ("rank1.json", half, "truncated"),
    "truncated-gz": ("rank1.json.gz", lambda: gzip.compress(good(1).dumps())[:-30], "gzip"),
    "corrupt-gz": ("rank1.json.gz", corrupt_gz, "gzip"),
    "empty": ("rank1.json", lambda: b"", "empty"),
    "not-a-trace": ("rank1.json", lambda: b'{"a": 1}', "traceEvents"),
    "json-list": ("rank1.json", lambda: b"[1, 2]", "not a Kineto trace"),
    "png": ("rank1.json", lambda: PNG, "not valid JSON"),
    "negative-dur": (
        "rank1.json",
        lambda: with_event(cat="kernel", name="neg_k", pid=0, tid=7, ts=50, dur=-3),
        "'neg_k'",
    ),
    "missing-dur": (
        "rank1.json",
        lambda: with_event(cat="cpu_op", name="no_dur", pid=1, tid=1, ts=50),
        "'no_dur'",
    ),
    "missing-ts": (
        "rank1.json",
        lambda: with_event(cat="cpu_op", name="no_ts", pid=1, tid=1, dur=5),
        "no timestamp",
    ),
    "id-beyond-int64": ("rank1.json", big_id, "correlation"),
    "invalid-utf8": ("rank1.json", bad_utf8, "UTF-8"),
}


def write_case(d: Path, case: str) -> Path:
    name, make, _ = CASES[case]
    p = d / name
    p.write_bytes(make())
    return p


def check_error(err: RanklensError, path: Path, fragment: str) -> None:
    assert isinstance(err, RanklensError)
    assert str(path) in err.message, err.message
    assert fragment in err.message, err.message
    assert err.hint, "every error needs a hint"


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_file_raises_a_clear_error(tmp_path: Path, case: str) -> None:
    bad = write_case(tmp_path, case)
    with pytest.raises(TraceFormatError) as ei:
        load_traces([bad], tmp_path / "o.duckdb", workers=1)
    check_error(ei.value, bad, CASES[case][2])
    assert sorted(p.name for p in tmp_path.iterdir()) == [bad.name]  # no database left


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_file_is_skipped_and_recorded(tmp_path: Path, case: str) -> None:
    ok = good(0).write(tmp_path / "rank0.json")
    bad = write_case(tmp_path, case)
    db = tmp_path / "o.duckdb"
    report = load_traces([ok, bad], db, on_error="skip", workers=1)
    assert report.ranks == [0]
    assert [s.path for s in report.skipped] == [str(bad)]
    check_error(TraceFormatError(report.skipped[0].reason, "-"), bad, CASES[case][2])
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.sql(
            "SELECT path, status, error IS NOT NULL, rank FROM sources ORDER BY path"
        ).fetchall() == [(str(ok), "ok", False, 0), (str(bad), "skipped", True, None)]
        assert con.sql("SELECT DISTINCT rank FROM events").fetchall() == [(0,)]
        assert con.sql("SELECT rank FROM ranks").fetchall() == [(0,)]


def test_error_positions(tmp_path: Path) -> None:
    # invalid UTF-8: the message gives the offset of the bad byte in the file
    p = write_case(tmp_path, "invalid-utf8")
    with pytest.raises(TraceFormatError) as ei:
        load_traces([p], tmp_path / "o.duckdb", workers=1)
    m = re.search(r"byte (\d+)", ei.value.message)
    assert m and int(m.group(1)) == p.read_bytes().index(b"\xff"), ei.value.message
    # a bad value names the event
    p = write_case(tmp_path, "negative-dur")
    with pytest.raises(TraceFormatError) as ei:
        load_traces([p], tmp_path / "o.duckdb", workers=1)
    assert "negative duration" in ei.value.message and "neg_k" in ei.value.message


def test_invalid_utf8_in_the_header(tmp_path: Path) -> None:
    t = good(1)
    t.extra_header["host_name"] = "HOSTX"
    p = tmp_path / "rank1.json"
    p.write_bytes(t.dumps().replace(b"HOSTX", b"node\xff7"))
    with pytest.raises(TraceFormatError) as ei:
        load_traces([p], tmp_path / "o.duckdb", workers=1)
    at = p.read_bytes().index(b"\xff")
    check_error(ei.value, p, f"byte {at}")


def test_unused_id_beyond_int64_is_ignored(tmp_path: Path) -> None:
    # `Comms Id` (seen beyond int64 in real traces) is not read: the file ingests
    data = with_event(
        cat="kernel",
        name="k",
        pid=0,
        tid=7,
        ts=50,
        dur=1,
        args={"Comms Id": 2**70, "correlation": 5},
    )
    (tmp_path / "rank1.json").write_bytes(data)
    assert load_traces([tmp_path / "rank1.json"], tmp_path / "o.duckdb", workers=1).ranks == [1]


def test_directory_without_traces(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "sub").mkdir()
    for inputs in ([tmp_path], [str(tmp_path / "*.json")]):
        with pytest.raises(NoTracesError) as ei:
            load_traces(inputs, tmp_path / "o.duckdb", workers=1)
        assert str(tmp_path) in ei.value.message and ei.value.hint


def test_two_files_claiming_one_rank(tmp_path: Path) -> None:
    a = good(0).write(tmp_path / "a" / "trace.json")
    b = good(0).write(tmp_path / "b" / "trace.json")
    with pytest.raises(RankError) as ei:
        load_traces([a, b], tmp_path / "o.duckdb", workers=1)
    assert str(a) in ei.value.message and str(b) in ei.value.message and ei.value.hint
    report = load_traces([a, b], tmp_path / "o.duckdb", on_error="skip", workers=1)
    assert report.ranks == [0] and [s.path for s in report.skipped] == [str(b)]
    with duckdb.connect(str(tmp_path / "o.duckdb"), read_only=True) as con:
        assert con.sql("SELECT path, status FROM sources ORDER BY path").fetchall() == [
            (str(a), "ok"),
            (str(b), "skipped"),
        ]


def test_every_file_bad_is_an_error_even_when_skipping(tmp_path: Path) -> None:
    bad = [write_case(tmp_path, "truncated"), write_case(tmp_path, "png")]
    bad[1] = bad[1].rename(tmp_path / "rank2.json")
    with pytest.raises(NoTracesError) as ei:
        load_traces(bad, tmp_path / "o.duckdb", on_error="skip", workers=1)
    assert all(str(p) in ei.value.message for p in bad) and ei.value.hint
    assert not (tmp_path / "o.duckdb").exists()


# -- the parallel loader reports the same errors and cleans up after itself -------------------
@pytest.mark.parametrize("case", ["truncated", "invalid-utf8", "negative-dur", "corrupt-gz"])
def test_parallel_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    monkeypatch.setattr(workpool, "SERIAL_BELOW_BYTES", 0)
    bad = write_case(tmp_path, case)
    ok = good(0).write(tmp_path / "rank0.json")
    with pytest.raises(RanklensError) as ei:
        load_traces([bad, ok], tmp_path / "o.duckdb", workers=2)
    check_error(ei.value, bad, CASES[case][2])
    report = load_traces([bad, ok], tmp_path / "o.duckdb", workers=2, on_error="skip")
    assert report.ranks == [0] and [s.path for s in report.skipped] == [str(bad)]


def test_parallel_error_leaves_no_inflated_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # rank0 fails after every .gz was already inflated (in a worker, ahead of its turn)
    monkeypatch.setattr(workpool, "SERIAL_BELOW_BYTES", 0)
    bad = tmp_path / "rank0.json"
    bad.write_bytes(with_event(cat="kernel", name="neg_k", pid=0, tid=7, ts=5, dur=-1))
    marker = f"marker-{tmp_path.name}"
    paths = [bad]
    for r in (1, 2, 3):
        t = good(r)
        t.thread_name(1, marker)
        paths.append(t.write(tmp_path / f"rank{r}.json.gz"))
    with pytest.raises(TraceFormatError):
        load_traces(paths, tmp_path / "o.duckdb", workers=2)
    leftovers = [
        f
        for f in glob.glob(str(Path(tempfile.gettempdir()) / "ranklens-*" / "*"))
        if marker.encode() in Path(f).read_bytes()
    ]
    assert leftovers == []


@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 5, 7, 64])
def test_the_first_invalid_utf8_byte_whatever_the_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """kineto._invalid_utf8 (msgspec 0.23's error has no position) reads 16 MB at a time: a
    character cut between two reads is not an error, the offset counts from the file's start."""
    import mmap

    from ranklens.ingest import kineto

    monkeypatch.setattr(kineto, "_UTF8_CHUNK", chunk)
    utf8 = ValueError("Invalid UTF-8 encoded string")
    for data, lo, want in (
        (b"ab\xc3\xa9cd\xffef", 0, 6),  # a valid 2-byte character, then 0xff
        (b"ab\xe2\x82\xacx\xc3", 0, 6),  # a 3-byte one, then a character the file cuts short
        (b"\xff ab\xc3\xa9 \xfe", 1, 7),  # from `lo`: the 0xff before it is not looked at
        (b"ab\xc3\xa9cd", 0, None),
    ):
        f = tmp_path / "t.bin"
        f.write_bytes(data)
        with f.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            assert kineto._invalid_utf8(mm, utf8, lo) == want, (data, lo)
            assert kineto._invalid_utf8(mm, ValueError("expected ','"), lo) is None
