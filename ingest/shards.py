"""A run stored as a directory: `catalog.duckdb` with the small tables, and each rank's events in
Parquet shards (`events/rank=N/t<trace>-<piece>.parquet`) written by the task that decoded it.

Why (design.md, "Storage at scale"; docs/scale.md): one DuckDB writer inserting every row caps an
ingest at ~2.9 µs per row whatever the cores. The cross-rank stage (groups, matching, alignment)
reads and updates only communication rows, so those stay a real table in the catalog
(`events_comm`); everything else is written once, by the per-rank task, as Parquet. The view
`events` is the union of the two with the table's column types (but `kind`, kept as text:
_view_sql says why), so every face sees the same table names and values whatever the storage.

The catalog's `events` view names the shards by a path relative to the run directory (the run
stays one directory to copy); ranklens connections shadow it with a temporary view on the
absolute path (`attach`), which is also what lets the sandboxed SQL console read the shards and
nothing else on the file system.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from ranklens.ingest.errors import ShardWriteFailed
from ranklens.ingest.schema import EVENTS_PLAIN, EVENTS_RICH, TABLE_BY_NAME

_SHARED_HINT = (
    "with --engine ray the output (-o) must be on storage every node mounts at the same path "
    "(NFS, Lustre, a mounted bucket): each node writes the shards of the ranks it reads there"
)

CATALOG = "catalog.duckdb"
EVENTS_DIR = "events"
COMM_TABLE = "events_comm"
_COMPRESSION = "zstd"

# Host ops the cross-rank stage reads besides comm kernels (gloo's p2p issue ops).
_HOST_P2P = ("c10d::send", "c10d::recv_")


def is_sharded_run(path: str | os.PathLike[str]) -> bool:
    """A directory holding a run's catalog."""
    p = Path(path)
    return p.is_dir() and (p / CATALOG).is_file()


def catalog_of(path: str | os.PathLike[str]) -> Path:
    """The DuckDB file of a run: the catalog of a sharded run, else the file itself."""
    return Path(path) / CATALOG if is_sharded_run(path) else Path(path)


def comm_keys(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(correlation ids of comm events, External ids of host ops that name a collective) of a
    piece: which launches and kernels the cross-rank stage joins to comm rows (p2p_batches)."""
    kind = table["kind"].cast(pa.string()) if "kind" in table.column_names else None
    if kind is None or "correlation" not in table.column_names:
        corr = np.empty(0, np.int64)
    else:
        corr = _ints(table["correlation"].filter(pc.equal(kind, "comm")))
    cols = table.column_names
    if "coll_op" in cols and "external_id" in cols and "device" in cols:
        host = pc.and_(pc.equal(table["device"], -1), pc.is_valid(table["coll_op"]))
        ext = _ints(table["external_id"].filter(pc.fill_null(host, False)))
    else:
        ext = np.empty(0, np.int64)
    return corr, ext


def _ints(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(col.drop_null().to_numpy(zero_copy_only=False), dtype=np.int64)


def comm_mask(table: pa.Table, corr: pa.Array, ext: pa.Array) -> pa.Array:
    """Rows the cross-rank stage reads or updates (ingest/post.py, p2p_batches.py,
    gloo_groups.py, matching.py, communicators.py): comm events; host ops carrying a group,
    peer or collective; gloo's send/recv issue ops; the runtime launches of comm kernels
    (`corr`, the rank's unique keys: `unique_keys`); device events launched by a collective
    host op (`ext`)."""
    n = table.num_rows

    def col(name: str, typ: pa.DataType) -> pa.ChunkedArray | pa.Array:
        return table[name] if name in table.column_names else pa.nulls(n, typ)

    kind = col("kind", pa.string())
    device = col("device", pa.int32())
    host = pc.equal(device, -1)
    named = pc.or_kleene(
        pc.or_kleene(
            pc.is_valid(col("pg_name", pa.string())), pc.is_valid(col("peer", pa.int32()))
        ),
        pc.or_kleene(
            pc.is_valid(col("coll_op", pa.string())),
            text_is_in(col("name", pa.string()), pa.array(_HOST_P2P)),
        ),
    )
    launch = pc.and_kleene(
        text_is_in(kind, _RUNTIME), pc.is_in(col("correlation", pa.int64()), corr)
    )
    launched = pc.and_kleene(
        pc.greater_equal(device, 0), pc.is_in(col("external_id", pa.int64()), ext)
    )
    mask = pc.or_kleene(
        pc.or_kleene(text_is_in(kind, _COMM), pc.and_kleene(host, named)),
        pc.or_kleene(launch, launched),
    )
    out = pc.fill_null(mask, False)  # Kleene logic: an unknown never hides a known true
    return out.combine_chunks() if isinstance(out, pa.ChunkedArray) else out


_RUNTIME, _COMM = pa.array(["runtime"]), pa.array(["comm"])


def unique_keys(keys: list[np.ndarray]) -> pa.Array:
    """One rank's `comm_keys` column, each key once (what `comm_mask` looks up)."""
    return pa.array(np.unique(np.concatenate(keys)) if keys else np.empty(0, np.int64))


def text_is_in(col: pa.ChunkedArray | pa.Array, values: pa.Array) -> pa.ChunkedArray | pa.Array:
    """`col` is one of `values`, for a text column that may be dictionary-encoded: tested on
    each dictionary's few values, not on millions of decoded rows."""
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    if not chunks or not pa.types.is_dictionary(chunks[0].type):
        return pc.is_in(col, values)
    out = [
        pc.fill_null(pc.take(pc.is_in(ch.dictionary, values), ch.indices), False) for ch in chunks
    ]  # a null row is not in `values`, as pc.is_in says
    return pa.chunked_array(out, pa.bool_())


def part_dir(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / EVENTS_DIR / f"rank={rank}"


def write_part(
    run_dir: str, rank: int, trace_id: int, index: int, rows: pa.Table
) -> tuple[str, int]:
    """Write one piece of a rank's non-communication events (without the `rank` column: the
    directory says it); returns its path relative to the run directory and its size in bytes
    (what the run's writer checks it sees: check_parts). Never creates the run directory: a
    task on a machine that does not see it says so (ShardWriteFailed) instead of writing the
    rank's events where the run will never read them."""
    body = _plain(rows.drop_columns([c for c in ("rank",) if c in rows.column_names]))
    run = Path(run_dir)
    if not run.is_dir():
        raise ShardWriteFailed(
            f"cannot write the events of rank {rank}: the run directory {run} does not exist "
            f"on {socket.gethostname()}",
            _SHARED_HINT,
        )
    d = part_dir(run_dir, rank)
    name = f"t{trace_id}-{index}.parquet"
    try:
        d.mkdir(parents=True, exist_ok=True)  # events/ and rank=N/, inside the run
        pq.write_table(body, d / name, compression=_COMPRESSION)
        size = (d / name).stat().st_size
    except OSError as exc:  # full, read-only, permissions: the storage's, not the trace's
        raise ShardWriteFailed(
            f"cannot write {d / name} (the events of rank {rank}): {exc.strerror or exc}",
            "check the free space and permissions of the output's file system; nothing of "
            "this run is kept",
        ) from exc
    return f"{EVENTS_DIR}/rank={rank}/{name}", size


def check_parts(run_dir: str | os.PathLike[str], rank: int, parts: list[tuple[str, int]]) -> None:
    """What the run's writer does with a task's result: every shard the task wrote (path, bytes)
    is here, whole. A task on a machine whose output directory is not this one's (not shared
    storage) wrote them elsewhere, and the run would lack that rank's events."""
    for rel, size in parts:
        try:
            seen: int | None = Path(run_dir, rel).stat().st_size
        except OSError:
            seen = None
        if seen != size:
            got = "it is not there" if seen is None else f"{seen:,} of its {size:,} bytes are"
            raise ShardWriteFailed(
                f"the shard {rel} of rank {rank} was written by the task that read its trace, "
                f"but in the run directory {run_dir} on {socket.gethostname()} {got}",
                _SHARED_HINT,
            )


def _plain(t: pa.Table) -> pa.Table:
    """Columns in the schema's order and types (strings stay dictionary-encoded: Parquet keeps
    that as its own dictionary pages)."""
    types = {"INTEGER": pa.int32(), "BIGINT": pa.int64()}
    cols, names = [], []
    for c in TABLE_BY_NAME["events"].columns:
        if c.name == "rank":
            continue
        typ = types.get(c.type, pa.string())
        if c.name in t.column_names:
            a = t[c.name]
            if not pa.types.is_dictionary(a.type) or typ != pa.string():
                a = a.cast(typ)
            else:
                a = pa.chunked_array([_no_null_values(ch) for ch in a.chunks], a.type)
        else:
            a = pa.nulls(t.num_rows, typ)
        cols.append(a)
        names.append(c.name)
    return pa.table(cols, names=names)


def _no_null_values(a: pa.DictionaryArray) -> pa.DictionaryArray:
    """`a` with no null in its dictionary (the rows that pointed at one are null): Parquet's
    writer refuses such a dictionary, which a reader builds when it maps names to optional
    labels (Nsight's kernel name -> collective op)."""
    values = a.dictionary
    if not values.null_count:
        return a
    keep = np.asarray(values.is_valid().to_numpy(zero_copy_only=False))
    new = pa.array((np.cumsum(keep) - 1).astype(np.int32), mask=~keep)
    idx = pc.take(new, a.indices).cast(a.indices.type)
    return pa.DictionaryArray.from_arrays(idx, values.drop_null())


def remove_parts(run_dir: str | os.PathLike[str], trace_id: int) -> None:
    """Remove a file's shards (the file turned out bad, or its rank was claimed already)."""
    for p in Path(run_dir, EVENTS_DIR).glob(f"rank=*/t{trace_id}-*.parquet"):
        p.unlink(missing_ok=True)


def _view_sql(glob: str) -> str:
    """`events` over the catalog's comm rows and the shards. Why ENUM columns (kind) stay
    VARCHAR: a filter on a cast column is not pushed into the Parquet scan, so every query
    decoded every row's strings (the pipeline's bubbles on 8 ranks x 60 MB: 2.3 -> 1.0 s).
    The values are the same; only their type (and ORDER BY kind) differs from a one-file run."""
    cols = TABLE_BY_NAME["events"].columns
    names = ", ".join(f'"{c.name}"' for c in cols)
    cast = ", ".join(
        f'"{c.name}"' if c.type.startswith("ENUM") else f'CAST("{c.name}" AS {c.type}) "{c.name}"'
        for c in cols
    )
    src = (
        f"read_parquet('{_sql_str(glob)}', hive_partitioning = true, "
        "hive_types = {'rank': INTEGER}, union_by_name = false)"
    )
    return f"SELECT {names} FROM {COMM_TABLE} UNION ALL SELECT {cast} FROM {src}"


def _sql_str(s: str) -> str:
    return s.replace("'", "''")


def _glob(run_dir: str | os.PathLike[str]) -> str:
    return f"{Path(run_dir).resolve()}/{EVENTS_DIR}/*/*.parquet"


def seal(con: duckdb.DuckDBPyConnection, run_dir: str | os.PathLike[str]) -> None:
    """After the cross-rank stage: the communication rows (both tables behind `events`) become
    `events_comm`, and `events` the view over them and the shards (relative to the run
    directory, so it survives a move), shadowed on this connection by the absolute one
    (`attach`)."""
    con.execute(f"CREATE TABLE {COMM_TABLE} AS SELECT * FROM events")  # rich and plain rows
    con.execute("DROP VIEW events")
    con.execute(f"DROP TABLE {EVENTS_RICH}; DROP TABLE {EVENTS_PLAIN}")
    con.execute(f"SET file_search_path = '{_sql_str(str(Path(run_dir).resolve()))}'")
    con.execute(f"CREATE VIEW events AS {_view_sql(f'{EVENTS_DIR}/*/*.parquet')}")
    con.execute("RESET file_search_path")
    attach(con, run_dir)


def attach(con: duckdb.DuckDBPyConnection, run_dir: str | os.PathLike[str]) -> None:
    """Make `events` readable on a connection to a sharded run's catalog, whatever the working
    directory (a temporary view on the shards' absolute path; views stored in the catalog
    resolve `events` to it)."""
    con.execute(f"CREATE OR REPLACE TEMP VIEW events AS {_view_sql(_glob(run_dir))}")


def shard_dir_of(path: str | os.PathLike[str]) -> Path:
    """The shards' directory of a sharded run (what the sandboxed console may read)."""
    return Path(path).resolve() / EVENTS_DIR
