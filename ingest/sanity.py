"""What every reader's output must satisfy before it is stored, and what is merely suspicious.

Why one place for every format: a value the database cannot hold (a start beyond +-2^62 ns, an
end that overflows int64 once a clock offset is added, a rank beyond int32) must be an error
naming the file and the event, whichever reader produced it, never a silent zero or a wrap;
values that fit but make no sense (a 115-day kernel, a timestamp before 1970, a rank not below
its world size) are kept and reported as warnings, stored in `meta` so that every later
`report` shows them too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from ranklens.ingest.errors import RankError, TraceFormatError

if TYPE_CHECKING:  # workers import this module (NS_LIMIT, check_times): not duckdb
    import duckdb

# Times are int64 ns; starts, durations and ends stay inside +-2^62 (~146 years) so that adding
# a clock offset (|offset| < 2^61, config.read_offsets) can never overflow.
NS_LIMIT = 2**62
INT32_MAX = 2**31 - 1
_DAY_NS = 86_400 * 10**9
_HINT = "the trace is damaged; --skip-bad ingests the other ranks"


def check_times(path: str, table: pa.Table) -> None:
    """Raise naming the first event whose start, duration or end cannot be stored."""
    if not table.num_rows:
        return
    ts = table["ts_ns"].to_numpy(zero_copy_only=False)
    dur = table["dur_ns"].to_numpy(zero_copy_only=False)
    if ts.dtype != np.int64 or dur.dtype != np.int64:  # a NULL made them float: not stored
        ts = np.nan_to_num(ts.astype(np.float64)).astype(np.int64)
        dur = np.nan_to_num(dur.astype(np.float64)).astype(np.int64)
    ok = (np.abs(ts) < NS_LIMIT) & (dur >= 0) & (dur < NS_LIMIT)
    if ok.all():
        ok = ts + dur < NS_LIMIT  # both below 2^62: the sum cannot wrap
        if ok.all():
            return
    i = int(np.flatnonzero(~ok)[0])
    name = table["name"][i].as_py()
    t, d = int(ts[i]), int(dur[i])
    what = (
        f"starts at {t} ns"
        if abs(t) >= NS_LIMIT
        else (f"lasts {d} ns" if not 0 <= d < NS_LIMIT else f"ends at {t} + {d} ns")
    )
    raise TraceFormatError(
        f"{path}: event {name!r} {what}, out of range (times must stay within +-2^62 ns, "
        "about 146 years from 1970)",
        _HINT,
    )


def check_rank(path: str, rank: int, info: dict[str, Any]) -> None:
    """A rank and a world size the `ranks` table can hold (int32, rank >= 0)."""
    if not 0 <= rank <= INT32_MAX:
        raise RankError(
            f"{path}: rank {rank} is not a rank number (0 to {INT32_MAX})",
            "fix distributedInfo.rank in the trace, or rename the file to hold its rank "
            "(rank3.json.gz) and remove the bad distributedInfo",
        )
    for key, label in (("world_size", "world size"), ("num_sms", "SM count")):
        val = info.get(key)
        if val is not None and not 0 <= val <= INT32_MAX:
            raise TraceFormatError(
                f"{path}: {label} {val} is out of range (0 to {INT32_MAX})",
                "the trace header is damaged; --skip-bad ingests the other ranks",
            )


def run_warnings(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Values that fit but are suspicious, one line each (the data is kept as it is)."""
    out: list[str] = []
    rows = con.execute(
        f"""SELECT s.path, e.rank, count(*) FILTER (WHERE e.dur_ns > {_DAY_NS}),
                   max(e.dur_ns), arg_max(e.name, e.dur_ns), count(*) FILTER (WHERE e.ts_ns < 0),
                   arg_min(e.name, e.ts_ns)
            FROM events e JOIN sources s USING (trace_id)
            WHERE e.dur_ns > {_DAY_NS} OR e.ts_ns < 0
            GROUP BY ALL ORDER BY e.rank"""
    ).fetchall()
    for path, rank, n_long, longest, name, n_neg, first_neg in rows:
        if n_long:
            out.append(
                f"{path}: rank {rank} has {n_long} event(s) longer than a day (longest "
                f"{name!r}, {longest / _DAY_NS:.1f} days): its timestamps are probably wrong"
            )
        if n_neg:
            out.append(
                f"{path}: rank {rank} has {n_neg} event(s) starting before 1970 (negative "
                f"timestamps, e.g. {first_neg!r}): its clock base is probably wrong"
            )
    for path, rank, world in con.execute(
        """SELECT s.path, r.rank, r.world_size FROM ranks r JOIN sources s USING (trace_id)
           WHERE r.world_size IS NOT NULL AND r.rank >= r.world_size ORDER BY r.rank"""
    ).fetchall():
        what = "world size 0" if world == 0 else f"world size {world}, not above its rank"
        out.append(f"{path}: rank {rank} reports {what}: the header's distributedInfo is wrong")
    for (path,) in con.execute(
        "SELECT path FROM sources WHERE status = 'ok' AND n_events = 0 ORDER BY trace_id"
    ).fetchall():
        out.append(
            f"{path}: no timed event was kept (no complete event, ph 'X', with ts and dur): "
            "nothing of this rank is measured"
        )
    return out


def store_warnings(con: duckdb.DuckDBPyConnection, warnings: list[str]) -> None:
    """Keep the ingest's warnings in `meta` (warning.000, ...) so every report repeats them."""
    if warnings:
        rows = [[f"warning.{i:03d}", w] for i, w in enumerate(warnings)]
        con.executemany("INSERT INTO meta VALUES (?, ?)", rows)
