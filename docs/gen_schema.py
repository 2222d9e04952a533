"""Rewrite README.md's schema section from the declaration in ingest/schema.py.

Run: python docs/gen_schema.py   (tests/test_conventions.py fails when README is stale)
"""

from __future__ import annotations

import sys
from pathlib import Path

from ranklens.ingest.schema import markdown

START, END = "<!-- schema:start -->", "<!-- schema:end -->"


def render(readme: str) -> str:
    """README text with the schema section replaced."""
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{markdown()}{END}{tail}"


def main() -> int:
    path = Path(__file__).resolve().parents[1] / "README.md"
    path.write_text(render(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
