"""Analysis tables and evidence as people read them: the rows that matter first, few digits.

Why: analysis tables are exact for code (ns, epoch-ns timestamps, group ids, floats to 16
digits, columns that are empty on a given run); a reader wants the costliest rows on top,
milliseconds since the run started to 3 significant digits, shares as percentages, groups by
their parallelism and ranks, and no column with nothing in it. Only presentation happens
here: rows are reordered and relabelled, never recomputed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import polars as pl

MS = 1e6
# Columns that are instants (epoch ns on the job clock): shown as ms since the run's start.
_INSTANT = re.compile(r"(^|_)(ts|start|end|arrive|first_ts|last_ts|first_start|last_end)_ns$")
_INSTANT_MS = re.compile(_INSTANT.pattern.replace("_ns$", "_ms$"))
# Columns that are shares of something (0..1, or signed relative changes): shown in %.
_SHARE = re.compile(r"(_share|_fraction|_ratio|^closed_form|^overlap|_imbalance|^slowdown)$")
# What a row costs, by table: the first of these a table has orders it (largest first).
IMPACT: tuple[str, ...] = (
    "time_lost_ns",
    "net_held_back_per_step_ns",
    "caused_wait_ns",
    "skew_ns",
    "total_time_ns",
    "exposed_ns",
    "time_at_stake_ns",
)
GROUP_COLUMNS = ("pg_name", "pp_group", "group")


def readable(
    df: pl.DataFrame,
    *,
    t0_ns: int | None = None,
    groups: Mapping[str, str] | None = None,
    sort_by: str | None = "auto",
) -> pl.DataFrame:
    """`df` reordered by impact (`sort_by`: a column, "auto" for the first of IMPACT it has,
    None to keep its order), empty columns left out, instants as ms since `t0_ns`, durations
    in ms, group ids replaced by `groups`' labels. Values stay numbers (see `cell`)."""
    by = next((c for c in IMPACT if c in df.columns), None) if sort_by == "auto" else sort_by
    if by is not None and by in df.columns:
        df = df.sort(by, descending=True, nulls_last=True, maintain_order=True)
    df = df.select([c for c in df.columns if not _empty(df[c])])
    if groups and "parallelism" in df.columns and any(c in df.columns for c in GROUP_COLUMNS):
        df = df.drop("parallelism")  # the group's label starts with it
    cols: list[pl.Expr] = []
    for name, dtype in df.schema.items():
        col = pl.col(name)
        if name in GROUP_COLUMNS and groups:
            labels = dict(groups)
            cols.append(
                col.cast(pl.Utf8)
                .replace_strict(labels, default=col.cast(pl.Utf8), return_dtype=pl.Utf8)
                .alias("group" if "group" not in df.columns else name)
            )
        elif _NS.search(name) and dtype.is_numeric():
            instant = _INSTANT.search(name) is not None
            if instant and t0_ns is None:
                cols.append(col)
                continue
            ms = (col - (t0_ns if instant else 0)).cast(pl.Float64) / MS
            cols.append(ms.alias(_NS.sub("_ms", name)))
        else:
            cols.append(col)
    return df.select(cols)


def _empty(s: pl.Series) -> bool:
    """No value worth a column: all null, all empty text or all empty lists."""
    if s.null_count() == s.len():
        return True
    if s.dtype == pl.Utf8:
        return bool((s.fill_null("") == "").all())
    if isinstance(s.dtype, pl.List):
        return bool((s.list.len().fill_null(0) == 0).all())
    return False


def cell(name: str, v: Any) -> str:
    """One value as text: 3 significant digits (whole numbers from 100 on), shares in %,
    instants (ms since the run's start) to the µs, lists and dicts briefly."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v != v:  # NaN
            return ""
        if _INSTANT_MS.search(name):  # an instant: to the µs, or events cannot be told apart
            return f"{v:,.3f}"
        if _SHARE.search(name):
            return f"{v * 100:+.3g}%" if "imbalance" in name or "slowdown" in name else pct(v)
        return num(v)
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10_000 else str(v)
    if isinstance(v, list):
        return "[" + ", ".join(cell(name, x) for x in v) + "]"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {cell(str(k), x)}" for k, x in v.items())
    return str(v)


def num(v: float) -> str:
    """3 significant digits; whole numbers from 100 on (1,234 not 1.23e+03)."""
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def pct(v: float) -> str:
    return f"{num(v * 100)}%"


def evidence_items(
    evidence: Mapping[str, Any], groups: Mapping[str, str] | None = None
) -> list[tuple[str, Any]]:
    """A finding's evidence as (label, value) pairs a page lays out: lists of records as
    frames (a table each, shaped by `readable`), ns in ms, shares in %, groups by their
    labels, the rest as text. Why not JSON: nested braces and 9-digit nanoseconds were what
    readers skipped."""
    out: list[tuple[str, Any]] = []
    for key, value in evidence.items():
        label = _NS.sub("", key).replace("_", " ")
        if isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
            flat = [
                {str(k): cell(str(k), x) if isinstance(x, dict | list) else x for k, x in r.items()}
                for r in value
            ]
            frame = pl.DataFrame(flat, strict=False, infer_schema_length=None)
            out.append((label, readable(frame, groups=groups, sort_by=None)))
        elif isinstance(value, dict):
            out.append(
                (label, ", ".join(f"{k}: {_scalar(key, v, groups)}" for k, v in value.items()))
            )
        elif isinstance(value, list):
            out.append((label, ", ".join(_scalar(key, v, groups) for v in value) or "none"))
        else:
            out.append((label, _scalar(key, value, groups)))
    return out


_NS = re.compile(r"_ns(?=_|$)")


def _scalar(key: str, v: Any, groups: Mapping[str, str] | None) -> str:
    """One evidence value in the unit its key names (`*_ns*`: ms; shares: %)."""
    if key in GROUP_COLUMNS and groups is not None and str(v) in groups:
        return groups[str(v)]
    if isinstance(v, int | float) and not isinstance(v, bool):
        if _NS.search(key):
            return f"{num(v / MS)} ms"
        if re.search(r"share|fraction|closed_form", key):
            return pct(float(v))
        return num(float(v)) if isinstance(v, float) else cell(key, v)
    return cell(key, v)


def instance_summary(inst: pl.DataFrame) -> str:
    """Who a collective instance waited for: the rank that arrived last and by how much after
    the first, and the rank that waited longest (timeline.instance rows: rank, arrive_ns)."""
    rows = inst.filter(pl.col("arrive_ns").is_not_null()).sort("arrive_ns", "rank")
    if rows.height < 2:
        return "one rank only: nobody waited"
    first, last = rows.row(0, named=True), rows.row(-1, named=True)
    skew = (int(last["arrive_ns"]) - int(first["arrive_ns"])) / MS
    if skew <= 0:
        return "every rank arrived at once"
    return (
        f"rank {last['rank']} arrived last, {num(skew)} ms after rank {first['rank']} (first): "
        f"the others waited up to {num(skew)} ms for it"
    )
