"""What trace formats are registered, and what one registry line brings with it.

`ingest.readers.READERS` is the one list of formats: the directory scan, the routing of a file
to its reader (suffix, else sniffing), the mixed-run rule, communicator inference and the
output-name check derive from it. The first tests pin what is registered; the toy tests add a
format with its one line (monkeypatch; the toy lives here, not in the package) and find it
read end to end, ingest to tables.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from kineto_builder import KinetoTrace
from ranklens.ingest import load_traces, output, readers
from ranklens.ingest._model import RankPart, Reader, event_schema
from ranklens.ingest.errors import MixedFormatsError, NoTracesError, TraceFormatError

INGEST = Path(readers.__file__).resolve().parent


def q(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.sql(sql).fetchall()


# ---------------------------------------------------------------------------------------------
# what is registered
# ---------------------------------------------------------------------------------------------
def test_registered_readers() -> None:
    assert [r.name for r in readers.READERS] == ["kineto", "nsys", "jax"]
    assert {r.name: r.suffixes for r in readers.READERS} == {
        "kineto": (".json", ".json.gz"),
        "nsys": (".sqlite", ".nsys-rep"),
        "jax": (".json", ".json.gz"),  # shared with Kineto: its sniff takes only JAX traces
    }
    assert [r.name for r in readers.READERS if r.sniff is not None] == ["jax"]
    # Kineto schedules its own worker processes; Nsight and JAX read one file at a time.
    assert {r.name: (r.load is not None, r.read is not None) for r in readers.READERS} == {
        "kineto": (True, False),
        "nsys": (False, True),
        "jax": (False, True),
    }
    assert [r.name for r in readers.READERS if r.carries_groups] == ["kineto"]
    assert [r.name for r in readers.READERS if r.select is not None] == ["nsys", "jax"]
    assert readers.trace_suffixes() == (".json", ".json.gz", ".sqlite", ".nsys-rep")
    # (tests/ingest/test_jax_reader.py: the JAX reader on real traces, scan to report)


@pytest.mark.parametrize(
    "name,reader",
    [
        ("rank0.json", "kineto"),
        ("rank0.json.gz", "kineto"),
        ("rank0.sqlite", "nsys"),
        ("rank0.nsys-rep", "nsys"),
        ("rank0.trace", "kineto"),  # named explicitly, no reader claims it: the first reader
    ],
)
def test_routing_by_suffix(name: str, reader: str) -> None:
    assert readers.reader_for(f"/nowhere/{name}").name == reader


def test_step_marker_is_defined_once() -> None:
    """The ProfilerStep pattern is compiled in classify.py only (every reader and the step
    assignment use it from there)."""
    defined = [
        p.name
        for p in sorted(INGEST.glob("*.py"))
        if re.search(r"re\.compile\([^)]*ProfilerStep", p.read_text())
    ]
    assert defined == ["classify.py"]


# ---------------------------------------------------------------------------------------------
# a toy format, registered with one line
# ---------------------------------------------------------------------------------------------
# A text format: "rank R world W" then one event per line: kind name device ts_ns dur_ns.
TOY_MAGIC = "#toy-trace"


def read_toy(path: str, trace_id: int) -> Iterable[RankPart]:
    lines = Path(path).read_text().splitlines()
    if not lines or lines[0] != TOY_MAGIC:
        raise TraceFormatError(f"{path}: not a toy trace (no {TOY_MAGIC} line)", "give a toy")
    _, rank, _, world = lines[1].split()
    rows = [line.split() for line in lines[2:]]
    n = len(rows)
    cols: dict[str, Any] = {
        "kind": [r[0] for r in rows],
        "cat": ["toy"] * n,
        "name": [r[1] for r in rows],
        "device": [int(r[2]) for r in rows],
        "stream": [7 if int(r[2]) >= 0 else 1 for r in rows],
        "pid": [1] * n,
        "tid": [1] * n,
        "ts_ns": [int(r[3]) for r in rows],
        "dur_ns": [int(r[4]) for r in rows],
        "coll_op": ["all_reduce" if r[0] == "comm" else None for r in rows],
    }
    schema = event_schema()
    table = pa.table(
        {
            f.name: pa.array(cols[f.name], f.type) if f.name in cols else pa.nulls(n, f.type)
            for f in schema
        },
        schema=schema,
    )
    info = {"world_size": int(world), "has_gpu": True, "device_name": "Toy GPU"}
    yield RankPart(int(rank), info, events=[table], threads=[(1, 1, "toy main")])


def toy_file(path: Path, rank: int, suffix_magic: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    events = [
        f"annotation ProfilerStep#{s} -1 {1000 * s} 900" for s in (1, 2)
    ] + [  # one kernel and one collective per step
        line
        for s in (1, 2)
        for line in (
            f"compute gemm_{rank} 0 {1000 * s + 100} 300",
            f"comm ncclDevKernel_AllReduce 0 {1000 * s + 500} 200",
        )
    ]
    head = [TOY_MAGIC] if suffix_magic else []
    path.write_text("\n".join([*head, f"rank {rank} world 2", *events]) + "\n")
    return path


TOY = Reader(name="toy", title="Toy", unit="trace", suffixes=(".toy",), read=read_toy)


def test_a_toy_reader_registered_with_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    for r in (0, 1):
        toy_file(run / f"rank{r}.toy", r)
    with pytest.raises(NoTracesError):  # unregistered: a directory of .toy holds no trace
        load_traces([run], tmp_path / "none.duckdb", workers=1)

    monkeypatch.setattr(readers, "READERS", (*readers.READERS, TOY))  # its one line
    assert ".toy" in readers.trace_suffixes()
    assert readers.reader_for(str(run / "rank0.toy")) is TOY
    db = tmp_path / "toy.duckdb"
    report = load_traces([run], db, workers=1)
    assert report.ranks == [0, 1] and not report.skipped
    assert q(db, "SELECT trace_id, format, rank, n_events, status FROM sources ORDER BY 1") == [
        (0, "toy", 0, 6, "ok"),
        (1, "toy", 1, 6, "ok"),
    ]
    assert q(db, "SELECT rank, world_size, device_name, has_gpu FROM ranks ORDER BY 1") == [
        (0, 2, "Toy GPU", True),
        (1, 2, "Toy GPU", True),
    ]
    assert q(db, "SELECT DISTINCT rank, name FROM threads ORDER BY 1") == [
        (0, "toy main"),
        (1, "toy main"),
    ]
    # steps come from the ProfilerStep markers, as for every format
    assert q(db, "SELECT rank, step, cpu_start_ns, cpu_end_ns FROM steps ORDER BY 1, 2") == [
        (r, s, 1000 * s, 1000 * s + 900) for r in (0, 1) for s in (1, 2)
    ]
    assert q(db, "SELECT step, count(*) FROM events WHERE device = 0 GROUP BY 1 ORDER BY 1") == [
        (1, 4),
        (2, 4),
    ]
    # no process groups in a toy file: communicators inferred, collectives matched across ranks
    assert q(db, "SELECT source, ranks FROM process_groups") == [("inferred_sequence", [0, 1])]
    assert q(
        db, "SELECT op, count(DISTINCT instance_id), count(*) FROM collectives GROUP BY 1"
    ) == [("all_reduce", 2, 4)]
    # and an output named like a toy trace is refused, as for every format
    with pytest.raises(output.OutputError, match="named like a trace"):
        output.check_output(tmp_path / "out.toy", [])


def test_a_bad_toy_file_is_skipped_like_any_other(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(readers, "READERS", (*readers.READERS, TOY))
    good = toy_file(tmp_path / "rank0.toy", 0)
    bad = tmp_path / "rank1.toy"
    bad.write_text("hello\n")
    with pytest.raises(TraceFormatError, match="not a toy trace"):
        load_traces([good, bad], tmp_path / "a.duckdb", workers=1)
    report = load_traces([good, bad], tmp_path / "b.duckdb", workers=1, on_error="skip")
    assert report.ranks == [0] and [s.path for s in report.skipped] == [str(bad)]


def test_a_toy_reader_found_by_sniffing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A format sharing `.json` with Kineto takes the files whose first bytes are its own;
    Kineto stays the reader of the others (the first claimant)."""

    def sniff(head: bytes) -> bool:
        return head.startswith(TOY_MAGIC.encode())

    json_toy = Reader(
        name="toy", title="Toy", unit="trace", suffixes=(".json",), read=read_toy, sniff=sniff
    )
    monkeypatch.setattr(readers, "READERS", (*readers.READERS, json_toy))
    toys = [toy_file(tmp_path / "toy" / f"rank{r}.json", r) for r in (0, 1)]
    kin = KinetoTrace(rank=0, world_size=1)
    kin.step(1, 0, 100)
    kineto = kin.write(tmp_path / "kin" / "rank0.json")
    assert [readers.reader_for(str(p)).name for p in (*toys, kineto)] == ["toy", "toy", "kineto"]
    report = load_traces([tmp_path / "toy"], tmp_path / "toy.duckdb", workers=1)
    assert report.ranks == [0, 1]
    assert q(tmp_path / "toy.duckdb", "SELECT DISTINCT format FROM sources") == [("toy",)]
    # mixing it with Kineto traces is refused like any two formats
    with pytest.raises(MixedFormatsError, match=r"mixes 1 Kineto trace\(s\) .* and 2 Toy"):
        load_traces([tmp_path / "toy", kineto], tmp_path / "m.duckdb", workers=1)
