"""Console results of any DuckDB type, in a form every face can show (table, CSV, JSON, Parquet,
the dashboard's table).

Why: a user's query can return types that Arrow readers reject or that cannot become Python
values (INTERVAL, BLOB, BIT, UNION, BIGNUM, UHUGEINT; a timestamp at infinity; a HUGEINT
beyond int64); such a column comes back as text, exact, instead of a traceback or a silent
NULL. Plain numbers, strings, lists and structs keep their types (lists and structs of dates,
timestamps or huge integers become text: one such value would fail the whole column).
"""

from __future__ import annotations

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

# DuckDB types shown as DuckDB's own text (CAST AS VARCHAR), also inside lists and structs.
AS_TEXT = ("INTERVAL", "BLOB", "BIT", "UNION", "TIME WITH TIME ZONE", "BIGNUM", "VARINT")
_UNSIGNED_HUGE = "UHUGEINT"  # above decimal(38) (DuckDB's Arrow form), so text
_INT64 = (-(2**63), 2**63 - 1)
_PER_S = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}
_DAYS = (-719_162, 2_932_896)  # 0001-01-01 and 9999-12-31, days since 1970-01-01


def renderable(rel: duckdb.DuckDBPyRelation) -> duckdb.DuckDBPyRelation:
    """`rel` with the columns no reader takes cast to text (by position: names may repeat)."""
    types = [str(t) for t in rel.types]
    if not any(_as_text(t) for t in types):
        return rel
    cols = [
        f"CAST(#{i} AS VARCHAR) AS {_ident(name)}" if _as_text(t) else f"#{i} AS {_ident(name)}"
        for i, (name, t) in enumerate(zip(rel.columns, types, strict=True), start=1)
    ]
    return rel.project(", ".join(cols))


def to_frame(table: pa.Table) -> pl.DataFrame:
    """Arrow -> polars. Whole-number HUGEINT/DECIMAL (SUM over BIGINT) read as int64 when every
    value fits (text otherwise); repeated column names get DuckDB's `_1` suffixes; a column
    polars cannot take comes back as text rather than failing the query."""
    table = _safe_temporal(table.rename_columns(_unique(table.column_names)))
    try:
        df = pl.from_arrow(table)
    except Exception:  # any polars conversion failure: that column as text
        df = pl.DataFrame([_column(table.column(i), n) for i, n in enumerate(table.column_names)])
    assert isinstance(df, pl.DataFrame)
    whole = [
        n
        for n, t in df.schema.items()
        if t == pl.Int128 or (isinstance(t, pl.Decimal) and t.scale == 0)
    ]
    return df.with_columns(
        pl.col(n).cast(pl.Int64) if _fits_int64(df[n]) else pl.col(n).cast(pl.Utf8) for n in whole
    )


def _as_text(type_name: str) -> bool:
    nested = "[" in type_name or type_name.startswith(("STRUCT", "MAP"))
    return (
        type_name.startswith(_UNSIGNED_HUGE)
        or any(k in type_name for k in AS_TEXT)
        or (nested and any(k in type_name for k in ("TIMESTAMP", "DATE", "HUGEINT")))
    )


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _unique(names: list[str]) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for name in names:
        new, k = name, 0
        while new in seen:
            k += 1
            new = f"{name}_{k}"
        seen.add(new)
        out.append(new)
    return out


def _column(col: pa.ChunkedArray, name: str) -> pl.Series:
    try:
        s = pl.from_arrow(col)
        assert isinstance(s, pl.Series)
        return s.alias(name)
    except Exception:
        return pl.Series(name, [None if v is None else str(v) for v in col.to_pylist()], pl.Utf8)


def _fits_int64(s: pl.Series) -> bool:
    lo, hi = s.min(), s.max()
    return lo is None or (_INT64[0] <= int(lo) and int(hi) <= _INT64[1])  # type: ignore[arg-type]


def _safe_temporal(table: pa.Table) -> pa.Table:
    """Dates and timestamps outside 0001..9999 (DuckDB's infinity included), which polars and
    Python cannot hold, as text; such a column only."""
    for i, field in enumerate(table.schema):
        t = field.type
        if pa.types.is_timestamp(t):
            per_day, raw = 86_400 * _PER_S[t.unit], pc.cast(table.column(i), pa.int64())
        elif pa.types.is_date32(t):
            per_day, raw = 1, pc.cast(table.column(i), pa.int32())
        else:
            continue
        mm = pc.min_max(raw).as_py()
        lo, hi = _DAYS[0] * per_day, (_DAYS[1] + 1) * per_day - 1
        if mm["min"] is None or (lo <= mm["min"] and mm["max"] <= hi):
            continue
        top = 2**63 - 1 if pa.types.is_timestamp(t) else 2**31 - 1
        unit = t.unit if pa.types.is_timestamp(t) else "days"
        text = [
            None
            if v is None
            else str(pa.scalar(v, type=t).as_py())
            if lo <= v <= hi
            else "infinity"
            if v >= top
            else "-infinity"
            if v <= -top
            else f"{v} {unit} since 1970-01-01"
            for v in raw.to_pylist()
        ]
        table = table.set_column(i, field.name, pa.array(text, pa.string()))
    return table
