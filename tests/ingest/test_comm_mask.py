"""shards.comm_mask picks the rows the cross-rank stage needs, whatever the encoding of a text
column (dictionary with or without null values, plain strings, absent): checked row by row
against the rule written in plain Python."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
from ranklens.ingest import shards

KINDS = ["comm", "runtime", "compute", "cpu_op", None]
NAMES = ["c10d::send", "c10d::recv_", "gemm", "nccl:all_reduce", None]


def _expected(row: dict[str, Any], corr: set[int], ext: set[int]) -> bool:
    host = row["device"] == -1
    named = (
        row["pg_name"] is not None
        or row["peer"] is not None
        or row["coll_op"] is not None
        or row["name"] in ("c10d::send", "c10d::recv_")
    )
    launch = row["kind"] == "runtime" and row["correlation"] in corr
    launched = row["device"] is not None and row["device"] >= 0 and row["external_id"] in ext
    return row["kind"] == "comm" or (host and named) or launch or launched


def _text(values: list[str | None], encoding: str) -> pa.Array:
    if encoding == "plain":
        return pa.array(values, pa.string())
    if encoding == "dict":
        return pa.array(values, pa.string()).dictionary_encode()
    # a dictionary holding a null value, as Nsight's reader builds for optional labels
    vocab = [None, *sorted({v for v in values if v is not None})]
    idx = [vocab.index(v) if v is not None or i % 2 else None for i, v in enumerate(values)]
    return pa.DictionaryArray.from_arrays(pa.array(idx, pa.int32()), pa.array(vocab, pa.string()))


def test_comm_mask_matches_the_rule_for_every_encoding() -> None:
    rnd = random.Random(7)
    for encoding in ("plain", "dict", "dict-with-null"):
        for _ in range(20):
            n = rnd.randint(1, 60)
            rows = [
                {
                    "kind": rnd.choice(KINDS),
                    "name": rnd.choice(NAMES),
                    "device": rnd.choice([-1, 0, 1, None]),
                    "pg_name": rnd.choice([None, None, "0"]),
                    "peer": rnd.choice([None, None, 3]),
                    "coll_op": rnd.choice([None, None, "all_reduce"]),
                    "correlation": rnd.choice([None, *range(8)]),
                    "external_id": rnd.choice([None, *range(8)]),
                }
                for _ in range(n)
            ]
            cols = {k: [r[k] for r in rows] for k in rows[0]}
            table = pa.table(
                {
                    "kind": _text(cols["kind"], encoding),
                    "name": _text(cols["name"], encoding),
                    "device": pa.array(cols["device"], pa.int32()),
                    "pg_name": _text(cols["pg_name"], encoding),
                    "peer": pa.array(cols["peer"], pa.int32()),
                    "coll_op": _text(cols["coll_op"], encoding),
                    "correlation": pa.array(cols["correlation"], pa.int64()),
                    "external_id": pa.array(cols["external_id"], pa.int64()),
                }
            )
            decoded = [  # what each row says once decoded (a null value reads as null)
                dict(zip(table.column_names, vals, strict=True))
                for vals in zip(*(table[c].to_pylist() for c in table.column_names), strict=True)
            ]
            corr, ext = {1, 2, 5}, {0, 4}
            keys = [shards.unique_keys([[5, 1, 2, 1]]), shards.unique_keys([[4], [0, 4]])]
            got = shards.comm_mask(table, *keys).to_pylist()
            assert got == [_expected(r, corr, ext) for r in decoded], encoding


def test_comm_mask_without_optional_columns() -> None:
    table = pa.table({"kind": pa.array(["comm", "compute"]).dictionary_encode()})
    empty = shards.unique_keys([])
    assert shards.comm_mask(table, empty, empty).to_pylist() == [True, False]
