"""`ranklens report -f json`: the whole report as one JSON document, written a piece at a time.

Why its own module: the report's JSON holds every table of every analysis, gigabytes on a large
capture (the 5 M-kernel one-step Nsight export: 2.41 GB, its critical path's 9.3 M segments), so
it is streamed to the output rather than built as one string.
"""

from __future__ import annotations

import io
import json
from typing import IO

import polars as pl
from ranklens.analysis.report import Report


def report_json(report: Report) -> str:
    """Everything: facts, findings, and every table of every analysis (write_report_json)."""
    buf = io.StringIO()
    write_report_json(report, buf)
    return buf.getvalue()


def write_report_json(report: Report, fh: IO[str]) -> None:
    """report_json's text written to `fh` a table at a time, newline-terminated. Tables are
    written by polars' own JSON writer (rows as objects, NaN as null): through Python dicts a
    1,024-rank report took ~25 s and gigabytes. Why a piece at a time: the one-step capture of
    5 M kernels has a critical path of 9.3 M segments, 2.4 GB of JSON; joined into one string,
    then printed, the report took 119 s and 16 GB."""
    head = json.dumps(
        {"facts": report.facts, "findings": [f.as_dict() for f in report.findings]},
        indent=2,
        default=str,
    )
    fh.write(head[:-2] + ',\n  "analyses": {\n')
    for i, (name, res) in enumerate(report.results.items()):
        fh.write(("" if i == 0 else ",\n") + f"    {json.dumps(name)}: {{")
        for j, (k, df) in enumerate((("table", res.table), *res.tables.items())):
            fh.write(("" if j == 0 else ", ") + f"{json.dumps(k)}: ")
            write_frame_json(df, fh)
        fh.write("}")
    fh.write("\n  }\n}\n")


_JSON_ROWS = 1 << 18


def write_frame_json(df: pl.DataFrame, fh: IO[str], rows: int | None = None) -> None:
    """polars' JSON of `df` (a list of row objects), written `rows` rows at a time: the text
    is the same, and no piece nears 2 GiB, where polars' write_json cut the 9.3 M-segment
    critical path short (the report's JSON did not parse)."""
    rows = rows or _JSON_ROWS
    if df.height <= rows:
        fh.write(df.write_json())
        return
    fh.write("[")
    for at in range(0, df.height, rows):
        fh.write(("," if at else "") + df.slice(at, rows).write_json()[1:-1])
    fh.write("]")
