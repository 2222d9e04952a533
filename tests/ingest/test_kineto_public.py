"""Every public Kineto trace ingests, checked against Python's json module on the same file."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest

Ingest = Callable[..., duckdb.DuckDBPyConnection]


def q(con: duckdb.DuckDBPyConnection, sql: str) -> list[tuple[Any, ...]]:
    return con.sql(sql).fetchall()


# -- real public traces, checked against Python's json on the same file --------------------------
def json_facts(path: Path) -> dict[str, Any]:
    """Facts computed independently of ranklens, with the standard json module."""
    with (gzip.open if path.name.endswith(".gz") else open)(path, "rt") as f:
        doc = json.load(f)
    timed = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "Trace"]
    kernels = [e for e in timed if e.get("cat") == "kernel"]
    return {
        "rank": (doc.get("distributedInfo") or {}).get("rank"),
        "n_events": len(timed),
        "per_stream": Counter(e["args"]["stream"] for e in kernels),
        "nccl": sum(e["name"].startswith(("nccl", "void nccl")) for e in kernels),
        "dpsk": sum("dpsk::ep::" in e["name"] for e in kernels),
        "memcpy": sum(e.get("cat") == "gpu_memcpy" for e in timed),
        "steps": {int(e["name"][13:]) for e in timed if e["name"].startswith("ProfilerStep#")},
    }


def check_against_json(con: duckdb.DuckDBPyConnection, rank: int, f: dict[str, Any]) -> None:
    r = f"rank = {rank}"
    assert q(con, f"SELECT count(*) FROM events WHERE {r}") == [(f["n_events"],)]
    per_stream = dict(
        q(con, f"SELECT stream, count(*) FROM events WHERE {r} AND cat = 'kernel' GROUP BY stream")
    )
    assert per_stream == dict(f["per_stream"])
    comm = q(
        con,
        f"SELECT count(*) FILTER (WHERE name LIKE 'nccl%' OR name LIKE 'void nccl%'), "
        f"count(*) FILTER (WHERE name LIKE '%dpsk::ep::%'), count(*) FROM events "
        f"WHERE {r} AND cat = 'kernel' AND kind = 'comm'",
    )
    assert comm == [(f["nccl"], f["dpsk"], f["nccl"] + f["dpsk"])]
    assert q(con, f"SELECT count(*) FROM events WHERE {r} AND kind = 'memcpy'") == [(f["memcpy"],)]
    assert {s for (s,) in q(con, f"SELECT step FROM steps WHERE {r}")} == f["steps"]


SINGLE_FILES = [
    "hta-testdata/trace_filter/sampled_rank-0.json.gz",
    "hta-testdata/trace_filter/sampled_rank-1.json.gz",
    "hta-testdata/nccl_parser_config/nccl_data.json.gz",
    "hta-testdata/negative_queue_length_values_check/rank0.json.gz",
    "hta-testdata/trace_diff/control/control.json.gz",
    "hta-testdata/trace_diff/test/test.json.gz",
    "hta-testdata/df_index_resolver/df_index_resolver.json.gz",
    "deepseek-profile-data/train.json",
]


@pytest.mark.shared
@pytest.mark.parametrize("rel", SINGLE_FILES, ids=[Path(p).name for p in SINGLE_FILES])
def test_public_trace_matches_json(ingest: Ingest, shared_traces: Path, rel: str) -> None:
    path = shared_traces / rel
    facts = json_facts(path)
    con = ingest([path])  # each on its own: several are rank 0/1 of different jobs
    (rank,) = q(con, "SELECT rank FROM ranks")[0]
    assert facts["rank"] is None or rank == facts["rank"]
    check_against_json(con, rank, facts)
    assert facts["dpsk"] > 0 or not rel.startswith("deepseek")


@pytest.mark.shared
def test_public_dlrm_eight_ranks(ingest: Ingest, shared_traces: Path) -> None:
    d = shared_traces / "param-dlrm-kineto" / "extracted"
    con = ingest([d], workers=2)
    assert q(con, "SELECT list(rank ORDER BY rank), max(world_size) FROM ranks") == [
        (list(range(8)), 8)
    ]
    for path in sorted(d.glob("rank*.json.gz")):
        facts = json_facts(path)
        check_against_json(con, facts["rank"], facts)
        assert facts["nccl"] > 0
