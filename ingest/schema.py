"""The normalized schema: declared once, here; DDL and docs are generated from it.

Every reader (Kineto, Nsight) writes these tables and nothing else, so every analysis works
whatever format a rank came in. Times are int64 nanoseconds; raw timestamps are never changed
(clock correction is the per-rank `ranks.clock_offset_ns`, applied by the `events_aligned` view).
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEMA_VERSION = 2

KINDS: tuple[str, ...] = (
    "compute",  # GPU compute kernel, or a CPU op doing the work in a CPU-only (gloo) trace
    "comm",  # communication executing: NCCL/DeepEP kernels, gloo worker spans, p2p waits
    "memcpy",  # GPU memory copy (H2D, D2H, D2D, P2P)
    "memset",  # GPU memset
    "sync",  # host-side synchronization (cudaDeviceSynchronize, cudaStreamSynchronize, ...)
    "runtime",  # CUDA runtime/driver API call on the host (launches, allocations)
    "cpu_op",  # host-side operator that is not the device work (GPU traces, comm issue ops)
    "annotation",  # user/profiler ranges (record_function, NVTX, ProfilerStep)
    "other",  # anything else with a duration, kept so nothing vanishes
)


@dataclass(frozen=True)
class Column:
    """One column: name, DuckDB type, and what it means."""

    name: str
    type: str
    doc: str


@dataclass(frozen=True)
class Table:
    """One table of the normalized schema."""

    name: str
    doc: str
    columns: tuple[Column, ...]

    def ddl(self) -> str:
        """The CREATE TABLE statement for this table."""
        cols = ",\n  ".join(f'"{c.name}" {c.type}' for c in self.columns)
        return f"CREATE TABLE {self.name} (\n  {cols}\n);"

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


_KIND_ENUM = "ENUM(" + ", ".join(f"'{k}'" for k in KINDS) + ")"

TABLES: tuple[Table, ...] = (
    Table(
        "meta",
        "Key/value facts about the database: schema and tool version, ingest time, options.",
        (
            Column("key", "VARCHAR", "Name of the fact (schema_version, tool_version, ...)."),
            Column("value", "VARCHAR", "Its value, as text."),
        ),
    ),
    Table(
        "sources",
        "One row per input file, ingested or skipped, so no rank disappears silently.",
        (
            Column("trace_id", "INTEGER", "Id of the file within this run (0..n-1)."),
            Column("path", "VARCHAR", "Path of the file as given."),
            Column("format", "VARCHAR", "kineto, nsys or jax (the reader's name)."),
            Column("size_bytes", "BIGINT", "File size on disk."),
            Column("sha256", "VARCHAR", "SHA-256 of the file's bytes (re-ingest detection)."),
            Column("rank", "INTEGER", "Rank read from the file; NULL if it was skipped early."),
            Column("n_events", "BIGINT", "Timed events ingested from it."),
            Column("status", "VARCHAR", "ok or skipped."),
            Column("error", "VARCHAR", "Why it was skipped (NULL when ok)."),
        ),
    ),
    Table(
        "ranks",
        "One row per rank: where it ran and how its clock maps onto the job's clock.",
        (
            Column("rank", "INTEGER", "Global rank."),
            Column("world_size", "INTEGER", "World size the rank reported (NULL if unknown)."),
            Column("trace_id", "INTEGER", "The source file (sources.trace_id)."),
            Column("host", "VARCHAR", "Host name when the trace records it."),
            Column("pid", "BIGINT", "Host process id of the rank."),
            Column("backend", "VARCHAR", "Distributed backend (nccl, gloo, ...)."),
            Column("device_name", "VARCHAR", "GPU model (NULL for CPU-only ranks)."),
            Column("num_sms", "INTEGER", "Streaming multiprocessors of the GPU."),
            Column("has_gpu", "BOOLEAN", "Whether the trace holds device (GPU) activity."),
            Column("clock_offset_ns", "BIGINT", "Added to raw timestamps to reach the job clock."),
            Column(
                "clock_method",
                "VARCHAR",
                "How the offset was obtained: none, single_host, collectives, p2p (hosts no "
                "collective links, linked through send/recv), user, unconnected.",
            ),
            Column(
                "align_residual_ns",
                "BIGINT",
                "p90 over its collectives of abs(aligned end - consensus end) (NULL: none).",
            ),
        ),
    ),
    Table(
        "process_groups",
        "One row per process group (communicator), merged across the ranks that report it.",
        (
            Column("pg_name", "VARCHAR", "Group id the framework gave it (same on all members)."),
            Column("pg_desc", "VARCHAR", "Description as the framework named it (may be NULL)."),
            Column("ranks", "INTEGER[]", "Member global ranks, in group-rank order."),
            Column("size", "INTEGER", "Number of members."),
            Column("backend", "VARCHAR", "Backend of the group (nccl, gloo, ...)."),
            Column("parallelism", "VARCHAR", "DP, TP, PP, CP, EP, DP_SHARD, WORLD or OTHER."),
            Column("evidence", "VARCHAR", "Why the group got that label."),
            Column("source", "VARCHAR", "Where the group came from (pg_config, event_args, ...)."),
        ),
    ),
    Table(
        "events",
        "Every timed interval of every rank; `kind` is assigned once, at ingest. A view: over "
        "`events_rich` (every column) and `events_plain` (rows with no collective argument, "
        "`bytes`, `shapes` or `concrete`, stored without those columns: a faster write); in a "
        "sharded run, over `events_comm` and the Parquet shards.",
        (
            Column("rank", "INTEGER", "Global rank."),
            Column("trace_id", "INTEGER", "Source file (sources.trace_id)."),
            Column("kind", _KIND_ENUM, "Event class: " + ", ".join(KINDS) + "."),
            Column("cat", "VARCHAR", "Category as the trace named it (kernel, cpu_op, ...)."),
            Column("name", "VARCHAR", "Event name (kernel or operator name)."),
            Column("device", "INTEGER", "GPU index for device events; -1 for host events."),
            Column("stream", "BIGINT", "CUDA stream for device events; thread id for host ones."),
            Column("pid", "BIGINT", "Process id (host) or device id (device) in the trace."),
            Column("tid", "BIGINT", "Thread id (host) or stream (device) in the trace."),
            Column("ts_ns", "BIGINT", "Start, raw clock of the rank, ns since the epoch."),
            Column("dur_ns", "BIGINT", "Duration in ns (>= 0)."),
            Column("correlation", "BIGINT", "Launch/kernel correlation id (NULL if none)."),
            Column("external_id", "BIGINT", "Profiler External id linking ops to launches."),
            Column("step", "INTEGER", "Training step the event belongs to (NULL if none)."),
            Column("coll_op", "VARCHAR", "Normalized collective op (all_reduce, send, ...)."),
            Column("pg_name", "VARCHAR", "Process group of a communication event, if known."),
            Column("in_nelems", "BIGINT", "Collective input element count."),
            Column("out_nelems", "BIGINT", "Collective output element count."),
            Column("dtype", "VARCHAR", "Collective element type."),
            Column("group_size", "INTEGER", "Collective group size as the event reports it."),
            Column("seq", "BIGINT", "Collective sequence number within its group, if given."),
            Column("peer", "INTEGER", "Peer global rank of a p2p op, if known."),
            Column("bytes", "BIGINT", "Bytes moved (memcpy/memset)."),
            Column("launch", "VARCHAR", "Kernel launch shape, 'grid=[..] block=[..]'."),
            Column("shapes", "VARCHAR", "Input shapes of a host op (JSON text)."),
            Column("concrete", "VARCHAR", "Concrete inputs of a host op (JSON; gloo p2p peer)."),
        ),
    ),
    Table(
        "collectives",
        "One row per communication op per rank, matched across ranks into collective instances.",
        (
            Column("rank", "INTEGER", "Global rank."),
            Column("pg_name", "VARCHAR", "Process group (NULL: none could be inferred)."),
            Column("op", "VARCHAR", "Collective op (all_reduce, all_gather, send, recv, ...)."),
            Column("seq", "BIGINT", "Order within the group (p2p: within sender->receiver)."),
            Column("instance_id", "BIGINT", "Logical collective, shared by all its ranks."),
            Column(
                "status",
                "VARCHAR",
                "matched, incomplete (a member never joined), op_mismatch, size_mismatch, "
                "duplicate, others_absent (no other member's trace in the run), no_group or "
                "peer_unknown (a send/recv in a group of 3+ whose peer could not be found).",
            ),
            Column("peer", "INTEGER", "Peer global rank of a send/recv."),
            Column("group_size", "INTEGER", "n: ranks in the group (2 for send/recv)."),
            Column("nelems", "BIGINT", "Elements of the full array (all-gather output, ...)."),
            Column("dtype", "VARCHAR", "Element type as the trace names it."),
            Column("bytes", "BIGINT", "Bytes of the full array (NULL when the type is unknown)."),
            Column("device", "INTEGER", "GPU of the kernel; -1 for host (gloo) spans."),
            Column("stream", "BIGINT", "CUDA stream, or the thread for host spans."),
            Column("name", "VARCHAR", "Name of the communication event."),
            Column("step", "INTEGER", "Step of the event."),
            Column("ts_ns", "BIGINT", "Start of the event, raw clock of the rank."),
            Column("end_ns", "BIGINT", "End of the event, raw clock of the rank."),
            Column(
                "arrive_ns",
                "BIGINT",
                "When the rank joined, raw clock (the start; for a gloo isend, its issue op).",
            ),
            Column(
                "peer_source",
                "VARCHAR",
                "Where a send/recv's peer came from: trace (Src/Dst Rank, gloo args), "
                "inferred (the adjacent stage whose p2p stream answers it; a batch's ops by "
                "the rendezvous rule; else by size and aligned end time), group_of_two.",
            ),
        ),
    ),
    Table(
        "steps",
        "Training steps per rank: the host window and the device window it produced.",
        (
            Column("rank", "INTEGER", "Global rank."),
            Column("step", "INTEGER", "Step number (ProfilerStep#N), -1 for a whole trace."),
            Column("cpu_start_ns", "BIGINT", "Start of the host-side step span."),
            Column("cpu_end_ns", "BIGINT", "End of the host-side step span."),
            Column("start_ns", "BIGINT", "Start of the step's window W on the device/worker."),
            Column("end_ns", "BIGINT", "End of the step's window W."),
            Column("source", "VARCHAR", "profiler_step or trace (no step markers found)."),
        ),
    ),
    Table(
        "threads",
        "Names of processes and threads/streams as the trace labelled them.",
        (
            Column("rank", "INTEGER", "Global rank."),
            Column("pid", "BIGINT", "Process (or device) id."),
            Column("tid", "BIGINT", "Thread (or stream) id; -1 for a process-level name."),
            Column("name", "VARCHAR", "The label (last one wins when renamed)."),
        ),
    ),
)

TABLE_BY_NAME: dict[str, Table] = {t.name: t for t in TABLES}

# `events` is stored as two tables and read through one view of that name (event_store.py says
# why): `events_rich` holds every column, `events_plain` all but these, for rows that have none.
EVENTS_SPARSE: tuple[str, ...] = (
    "coll_op", "pg_name", "in_nelems", "out_nelems", "dtype", "group_size", "seq", "peer",
    "bytes", "shapes", "concrete",
)  # fmt: skip
EVENTS_RICH, EVENTS_PLAIN = "events_rich", "events_plain"


def events_ddl() -> str:
    """The two tables behind `events`, and the view that is `events` (rich rows first)."""
    cols = TABLE_BY_NAME["events"].columns
    rich = Table(EVENTS_RICH, "", cols)
    plain = Table(EVENTS_PLAIN, "", tuple(c for c in cols if c.name not in EVENTS_SPARSE))
    names = ", ".join(f'"{c.name}"' for c in cols)
    padded = ", ".join(
        f'CAST(NULL AS {c.type}) AS "{c.name}"' if c.name in EVENTS_SPARSE else f'"{c.name}"'
        for c in cols
    )
    return (
        f"{rich.ddl()}\n{plain.ddl()}\nCREATE VIEW events AS SELECT {names} FROM {EVENTS_RICH}"
        f"\nUNION ALL SELECT {padded} FROM {EVENTS_PLAIN};"
    )


VIEWS_SQL = """
CREATE OR REPLACE VIEW events_aligned AS
SELECT e.*, e.ts_ns + COALESCE(r.clock_offset_ns, 0) AS ats_ns,
       e.ts_ns + COALESCE(r.clock_offset_ns, 0) + e.dur_ns AS aend_ns
FROM events e LEFT JOIN ranks r USING (rank);
CREATE OR REPLACE VIEW collectives_aligned AS
SELECT c.*, c.ts_ns + COALESCE(r.clock_offset_ns, 0) AS ats_ns,
       c.end_ns + COALESCE(r.clock_offset_ns, 0) AS aend_ns,
       c.arrive_ns + COALESCE(r.clock_offset_ns, 0) AS aarrive_ns
FROM collectives c LEFT JOIN ranks r USING (rank);
"""


def ddl() -> str:
    """All CREATE statements, in dependency order."""
    return (
        "\n\n".join(events_ddl() if t.name == "events" else t.ddl() for t in TABLES)
        + "\n"
        + VIEWS_SQL
    )


def markdown() -> str:
    """The schema reference for README.md, generated from the declaration."""
    out: list[str] = []
    for t in TABLES:
        out.append(f"#### `{t.name}`\n{t.doc}\n\n| column | type | meaning |\n|---|---|---|")
        for c in t.columns:
            typ = "ENUM" if c.type.startswith("ENUM") else c.type
            out.append(f"| `{c.name}` | {typ} | {c.doc} |")
        out.append("")
    out.append(
        "#### `events_aligned` (view)\n`events` plus `ats_ns`/`aend_ns`: start and end on the "
        "job clock (raw + `ranks.clock_offset_ns`).\n"
    )
    out.append(
        "#### `collectives_aligned` (view)\n`collectives` plus `ats_ns`/`aend_ns`/`aarrive_ns` on "
        "the job clock.\n"
    )
    return "\n".join(out)
