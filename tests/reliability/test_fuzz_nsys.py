"""Fuzz: Nsight Systems SQLite exports with hostile tables, ingested (and some reported).

A valid-ish export (tests/ingest/nsys_fixtures.py's tables: kernels, runtime launches, copies,
NVTX ranges, GPU and process info) is damaged the ways exporters and users damage them: a
column renamed or of another declared type, a table missing, values that are text, blobs,
floats, NULL, huge or negative, an end before its start. Every case ends in success or a
RanklensError naming the file; never a traceback, a crash or a hang (fuzzhost).
"""

from __future__ import annotations

import importlib.util
import itertools
import sqlite3
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reliability.conftest import fuzzed

from .fuzzhost import Worker, check

EXAMPLES = 60
REPORT_EVERY = 6
_cases = itertools.count()
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096UL>)"


def _fixtures() -> ModuleType:
    """tests/ingest/nsys_fixtures.py (its folder is not a package)."""
    path = Path(__file__).resolve().parents[1] / "ingest" / "nsys_fixtures.py"
    spec = importlib.util.spec_from_file_location("ranklens_fuzz_nsys_fixtures", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


FX = _fixtures()

odd = st.one_of(
    st.sampled_from([2**63 - 1, -(2**63), 2**62, -1, 0, 2**31, 10**18]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.binary(max_size=6),
    st.none(),
)
times = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**5)), min_size=1, max_size=6)
damage = st.lists(
    st.one_of(
        st.tuples(st.just("rename"), st.sampled_from(sorted(FX.DDL)), st.integers(0, 20)),
        st.tuples(st.just("retype"), st.sampled_from(sorted(FX.DDL)), st.integers(0, 20)),
        st.tuples(st.just("drop"), st.sampled_from(sorted(FX.DDL)), st.just(0)),
        st.tuples(st.just("value"), st.sampled_from(sorted(FX.DDL)), st.integers(0, 400), odd),
        st.tuples(st.just("backwards"), st.just("CUPTI_ACTIVITY_KIND_KERNEL"), st.just(0)),
    ),
    min_size=1,
    max_size=4,
)


def build(path: Path, spans: list[tuple[int, int]], damages: list[Any], env: bool) -> Path:
    """A valid-ish export of one rank at `path`, then damaged."""
    db = FX.NsysDB(path).meta(env={"RANK": "0", "WORLD_SIZE": "1"} if env else None)
    db.process(100, "python")
    db.gpu(0, "NVIDIA H100 80GB HBM3", 132)
    for i, (start, dur) in enumerate(spans, start=1):
        db.runtime(100, start, start + 5, "cudaLaunchKernel_v7000", i)
        db.kernel(100, start + 10, start + 10 + dur, NCCL if i % 2 else "void gemm(float*)", corr=i)
        db.nvtx(100, start, start + dur + 20, f"ProfilerStep#{i}")
    db.memcpy(100, 5, 9, 4096)
    rows: dict[str, list[dict[str, Any]]] = {t: [dict(r) for r in rs] for t, rs in db.rows.items()}
    ddl = {t: [c.strip() for c in FX.DDL[t].split(", ")] for t in rows}
    for kind, table, at, *rest in damages:
        if table not in rows:
            continue
        cols = ddl[table]
        if kind == "drop":
            del rows[table], ddl[table]
        elif kind == "rename":
            name, _, decl = cols[at % len(cols)].partition(" ")
            cols[at % len(cols)] = f"{name.strip(chr(34))}_x {decl}"
            for r in rows[table]:
                r[f"{name.strip(chr(34))}_x"] = r.pop(name.strip(chr(34)), None)
        elif kind == "retype":
            name = cols[at % len(cols)].split(" ")[0]
            cols[at % len(cols)] = f"{name} TEXT"
        elif kind == "value":
            r = rows[table][at % len(rows[table])]
            r[sorted(r)[at % len(r)]] = rest[0]
        elif kind == "backwards":
            for r in rows[table]:
                r["start"], r["end"] = r["end"], r["start"]
    con = sqlite3.connect(path)
    try:
        for table, rs in rows.items():
            decl = ", ".join(
                c.replace(" NOT NULL", "").replace("PRIMARY KEY", "") for c in ddl[table]
            )
            con.execute(f'CREATE TABLE "{table}" ({decl})')
            names = sorted({k for r in rs for k in r})
            con.executemany(
                f'INSERT INTO "{table}" ({", ".join(chr(34) + n + chr(34) for n in names)}) '
                f"VALUES ({', '.join('?' * len(names))})",
                [[r.get(n) for n in names] for r in rs],
            )
        con.commit()
    finally:
        con.close()
    return path


@fuzzed(EXAMPLES)
@given(spans=times, damages=damage, env=st.booleans())
def test_nsys_exports(
    worker: Worker,
    tmp_path_factory: pytest.TempPathFactory,
    spans: list[tuple[int, int]],
    damages: list[Any],
    env: bool,
) -> None:
    folder = tmp_path_factory.mktemp("nsys-fuzz")
    path = build(folder / "rank0.sqlite", spans, damages, env)
    before = path.read_bytes()
    report = next(_cases) % REPORT_EVERY == 0
    answer = worker.run("ingest", [str(path)], str(folder / "out.duckdb"), report)
    check(answer, "rank0", repr(damages).encode())
    assert path.read_bytes() == before  # the input is never changed
