"""TOML files on every supported Python: tomllib from 3.11, its backport tomli on 3.10.

Why one module: `requires-python` says 3.10, where `import tomllib` fails at import time; the
version check lives here once instead of at each reader.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # 3.10: the same API as the tomli package (a dependency there only)
    import tomli as tomllib


def load_toml(path: Path) -> dict[str, Any]:
    """The document at `path`. Raises OSError when it cannot be read and ValueError (a
    TOMLDecodeError) when it is not TOML."""
    return tomllib.loads(path.read_text())
