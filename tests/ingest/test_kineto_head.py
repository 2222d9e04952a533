"""The first file is prepared and decoded in the main process while the workers start, and its
hash, like every multi-piece file's, is taken in the pool (kineto_schedule._first_while_starting).

Why: the workers' start (~0.3 s) left the main process waiting, and the first write waited for
the first file's pieces; the main process, the one writer, also hashed each multi-piece file in
its own chain of work. Moving that work must not change a table, a hash, or which error a run
stops at and names.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import duckdb
import pytest
from ranklens.ingest import file_hash, kineto, kineto_schedule, load_traces, workpool
from ranklens.ingest.errors import TraceFormatError
from test_bad_input import good, with_event
from test_kineto import bad_cuts, chunky, dump_tables


class _Starting:
    """The workers' start as the main process sees it: still running until the first file is
    decoded here whole (or a piece fails), then done at once when waited for. Deterministic, where
    a start slowed by a sleep left it to the machine's speed how many pieces were decoded."""

    def __init__(self, target: Any, name: str) -> None:
        self.target = target
        self.running = True

    def start(self) -> _Starting:
        return self

    def wait(self) -> None:
        self.target()
        self.running = False


def _slow_start(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Workers that start only once the main process decoded the first file's pieces; returns
    what each piece decoded here came to ("ok" or the error's name)."""
    here: list[str] = []
    first = kineto_schedule._first_while_starting

    def spied(pool: Any, batch: Any) -> Any:
        head = first(pool, batch)
        here.extend(type(f.exception()).__name__ if f.exception() else "ok" for f in head.pieces)
        return head

    monkeypatch.setattr(kineto_schedule, "Helper", _Starting)
    monkeypatch.setattr(kineto_schedule, "_first_while_starting", spied)
    monkeypatch.setattr(workpool, "SERIAL_BELOW_BYTES", 0)  # small files: use the pool anyway
    return here


def _sources(db: Path) -> list[tuple[str, str | None]]:
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT path, sha256 FROM sources ORDER BY path").fetchall()
    return [(str(p), h) for p, h in rows]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("nested", [False, True], ids=["clean-cuts", "bad-cuts"])
def test_the_first_file_decoded_here_matches_serial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nested: bool
) -> None:
    paths = [chunky(r, nested).write(tmp_path / f"rank{r}.json") for r in (0, 1, 2)]
    load_traces(paths, tmp_path / "serial.duckdb", workers=1)  # one piece per file, no pool
    monkeypatch.setattr(kineto, "PIECE_BYTES", 4096)
    here = _slow_start(monkeypatch)
    prep = kineto.prepare(str(paths[0]))
    assert len(prep.pieces) > 10 and (bad_cuts(prep) > 0) == nested
    load_traces(paths, tmp_path / "parallel.duckdb", workers=2)
    if nested:  # the first piece that does not decode alone ends it: the file goes serial
        assert here[-1] == "BadCut" and set(here[:-1]) <= {"ok"}
    else:  # every piece of the first file (the others are the workers')
        assert here == ["ok"] * len(prep.pieces)
    assert dump_tables(tmp_path / "parallel.duckdb") == dump_tables(tmp_path / "serial.duckdb")
    # each hash, taken here, in a worker's preparation or as a pool task, is the file's own
    assert _sources(tmp_path / "parallel.duckdb") == [(str(p), _sha(p)) for p in paths]


def test_a_bad_first_file_is_the_error_at_its_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rank0.json holds a kernel of negative duration and says it is rank 1 (its piece fails
    here, in the main process); rank1.json.gz is a good rank 1 that its claim must not refuse."""
    here = _slow_start(monkeypatch)
    bad = tmp_path / "rank0.json"
    bad.write_bytes(with_event(cat="kernel", name="neg_k", pid=0, tid=7, ts=5, dur=-1))
    paths = [bad] + [good(r).write(tmp_path / f"rank{r}.json.gz") for r in (1, 2, 3)]
    with pytest.raises(TraceFormatError, match=r"rank0\.json"):
        load_traces(paths, tmp_path / "raise.duckdb", workers=2)
    assert here == ["TraceFormatError"]  # the error came from its piece, decoded here
    rep = load_traces(paths, tmp_path / "skip.duckdb", workers=2, on_error="skip")
    assert [Path(s.path).name for s in rep.skipped] == ["rank0.json"]
    assert rep.ranks == [1, 2, 3]
    assert [h for _p, h in _sources(tmp_path / "skip.duckdb")] == [None] + [
        _sha(p) for p in paths[1:]
    ]


def test_a_first_file_that_is_no_trace_is_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _slow_start(monkeypatch)
    broken = tmp_path / "rank0.json"
    broken.write_bytes(b'{"traceEvents": [{"ph": "X", ')  # its preparation fails, here
    paths = [broken] + [good(r).write(tmp_path / f"rank{r}.json") for r in (1, 2)]
    with pytest.raises(TraceFormatError, match=r"rank0\.json"):
        load_traces(paths, tmp_path / "raise.duckdb", workers=2)
    rep = load_traces(paths, tmp_path / "skip.duckdb", workers=2, on_error="skip")
    assert [Path(s.path).name for s in rep.skipped] == ["rank0.json"] and rep.ranks == [1, 2]


def test_pieces_in_flight_cover_a_whole_small_rank() -> None:
    """While a rank is written, the next one's pieces decode: with two workers, six pieces are
    submitted before the write, then the hash (one piece more than workers left a 60 MB rank's
    last pieces waiting for that write, the workers idle)."""
    seen: list[str] = []

    class Pool:
        def submit(self, fn: Any, *args: Any) -> Future[Any]:
            seen.append(f"piece {args[1]}" if fn is kineto.decode_staged else fn.__name__)
            return Future()  # never done: the first results are not asked for here

    prep = kineto.Prepared(
        path="x", data_path="x", temp_dir=None, size_bytes=1, sha256="", base_ns=0,
        has_device=False, rank=0, info={}, groups=[], pieces=[(0, 1)] * 9, raw_bytes=1,
    )  # fmt: skip
    gen = kineto_schedule._parallel_file(None, Pool(), 0, prep, 0, 2, [])  # type: ignore[arg-type]
    next(gen)  # the file is started: what it submitted before the write of the one before
    gen.close()
    assert seen == [f"piece {i}" for i in range(6)] + ["file_sha256"]


@pytest.mark.parametrize("size", [0, 1, 4095, 3 * 65536, 3 * 65536 + 7])
def test_file_hash_is_the_files_sha256(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """The hash read through windows of the file (here 64 KiB, so that windows meet inside
    the file and at its end) is the SHA-256 of its bytes, empty file included."""
    monkeypatch.setattr(file_hash, "_HASH_WINDOW", 1 << 16)
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    path = tmp_path / "rank0.json"
    path.write_bytes(data)
    assert file_hash.file_sha256(str(path)) == hashlib.sha256(data).hexdigest()
