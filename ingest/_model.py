"""What a format reader hands to the loader: one `RankPart` per rank found in a file.

Readers (kineto.py, nsys.py) know formats; the loader (loader.py) knows the database. A reader
returns plain Arrow tables whose columns are `EVENT_COLUMNS`, so the loader inserts them in bulk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from ranklens.ingest.schema import TABLE_BY_NAME

# Columns a reader fills; `step` is assigned by the loader from the step markers.
EVENT_COLUMNS: tuple[str, ...] = tuple(
    c for c in TABLE_BY_NAME["events"].column_names if c not in ("step",)
)
RANK_COLUMNS: tuple[str, ...] = TABLE_BY_NAME["ranks"].column_names
GROUP_COLUMNS: tuple[str, ...] = TABLE_BY_NAME["process_groups"].column_names


@dataclass
class RankPart:
    """Everything one file says about one rank.

    Attributes:
        rank: the global rank, or None when the file does not say (the loader then tries the
            file name, else raises a RankError).
        info: values for `ranks` columns (world_size, host, pid, backend, device_name, ...).
        events: Arrow tables with exactly EVENT_COLUMNS (rank/trace_id may be null: the loader
            fills them). The sink takes them out of the list as it stages them.
        groups: `process_groups` rows as dicts (pg_name, pg_desc, ranks, size, backend, source).
        threads: (pid, tid, name) labels; tid -1 names a process.
        warnings: things the user should know that did not stop the ingest.
    """

    rank: int | None
    info: dict[str, Any] = field(default_factory=dict)
    events: list[pa.Table] = field(default_factory=list)
    groups: list[dict[str, Any]] = field(default_factory=list)
    threads: list[tuple[int, int, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def n_events(self) -> int:
        return sum(t.num_rows for t in self.events)


def event_schema() -> pa.Schema:
    """Arrow schema of a reader's event table (kind as a plain string)."""
    types: dict[str, pa.DataType] = {
        "INTEGER": pa.int32(),
        "BIGINT": pa.int64(),
        "VARCHAR": pa.string(),
    }
    fields = []
    for col in TABLE_BY_NAME["events"].columns:
        if col.name == "step":
            continue
        fields.append(pa.field(col.name, types.get(col.type, pa.string())))
    return pa.schema(fields)
