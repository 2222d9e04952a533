"""Tables of numbers that are never cut: split across several tables rather than shown as
"67.5…".

Why: rich shrinks columns to the console's width and ends a cell that no longer fits with an
ellipsis. Piped output (a CI log, `ranklens report run > report.txt`) is 80 columns wide, so
the pipeline table's 10 columns printed bubbles as "67.5…" and "18.5…": numbers nobody can
read or believe. A value is never shortened: when the columns cannot all fit, the ones after
the first `keys` (which say what a row is) go to a second table.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

_EDGE = 1  # the table's left border
_PER_COLUMN = 3  # a column's padding (one space each side) and its right border


def print_table(
    console: Console,
    title: str,
    labels: Sequence[str],
    rows: Sequence[Sequence[str]],
    keys: int = 1,
) -> None:
    """Right-justified columns, each as wide as its widest value; split into as many tables
    as the console's width needs, each repeating the first `keys` columns."""
    values = [max([len(row[i]) for row in rows], default=0) for i in range(len(labels))]
    # A column as wide as rich makes it: its header unwrapped, unless it is all that is left.
    widths = [max(v, len(label)) for v, label in zip(values, labels, strict=True)]
    for n, cols in enumerate(_parts(widths, keys, console.width)):
        t = Table(title=title if n == 0 else f"{title} (continued)", title_justify="left")
        for i in cols:
            t.add_column(labels[i], justify="right", min_width=values[i])
        for row in rows:
            t.add_row(*[row[i] for i in cols])
        console.print(t)


def _parts(widths: list[int], keys: int, width: int) -> list[list[int]]:
    """Column indexes of each table: the key columns, then as many others as fit."""
    key_cols = list(range(min(keys, len(widths))))
    base = _EDGE + sum(widths[i] + _PER_COLUMN for i in key_cols)
    parts: list[list[int]] = []
    used = width  # start a new part at the first column
    for i in range(len(key_cols), len(widths)):
        need = widths[i] + _PER_COLUMN
        if parts and used + need <= width:
            parts[-1].append(i)
            used += need
        else:
            parts.append([*key_cols, i])
            used = base + need
    return parts or [key_cols]
