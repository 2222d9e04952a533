"""Thresholds for `ranklens check`: one typed object, with where each value came from.

Precedence: command-line flag > TOML file (`--config`, or `[tool.ranklens.check]` in the
pyproject.toml of the current directory) > defaults (no threshold). `--verbose` prints the
sources, so a CI log says why a check ran with the value it did.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ranklens.analysis.thresholds import THRESHOLDS
from ranklens.ingest.errors import RanklensError
from ranklens.ingest.tomlfile import load_toml


class ConfigError(RanklensError):
    """A threshold is malformed or unknown."""


@dataclass(frozen=True)
class CheckConfig:
    """Resolved thresholds: name -> value (float, or {parallelism: float}), and sources."""

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)


def parse_value(name: str, raw: Any) -> Any:
    """A threshold from a flag string or TOML value ('5%', '0.05', 'dp=0.05,tp=0.1', table)."""
    if name not in THRESHOLDS:
        known = ", ".join(THRESHOLDS)
        raise ConfigError(f"unknown threshold {name!r}", f"known thresholds: {known}")
    kind = THRESHOLDS[name].kind
    if kind == "max_by":
        if isinstance(raw, dict):
            return {str(k).upper(): _number(name, v) for k, v in raw.items()}
        if isinstance(raw, str) and "=" in raw:
            out: dict[str, float] = {}
            for part in raw.split(","):
                key, _, val = part.partition("=")
                if not key.strip() or not val.strip():
                    raise ConfigError(
                        f"{name}: cannot read {part!r}", "write it as dp=0.05,tp=0.10"
                    )
                out[key.strip().upper()] = _number(name, val)
            return out
        return {"ALL": _number(name, raw)}
    return _number(name, raw)


def _number(name: str, raw: Any) -> float:
    try:
        if isinstance(raw, str) and raw.strip().endswith("%"):
            return float(raw.strip()[:-1]) / 100.0
        return float(raw)
    except (TypeError, ValueError):
        raise ConfigError(
            f"{name}: {raw!r} is not a number", "use a fraction (0.05) or a percentage (5%)"
        ) from None


def _read_toml(path: Path, section: tuple[str, ...]) -> dict[str, Any]:
    try:
        doc = load_toml(path)
    except (OSError, ValueError) as exc:  # ValueError: TOMLDecodeError
        raise ConfigError(
            f"{path}: cannot read thresholds ({exc})", "check the TOML syntax"
        ) from None
    for key in section:
        doc = doc.get(key, {})
        if not isinstance(doc, dict):
            raise ConfigError(f"{path}: [{'.'.join(section)}] is not a table", None)
    return doc


def resolve(
    flags: dict[str, str | None],
    config_file: str | os.PathLike[str] | None = None,
    cwd: str | os.PathLike[str] = ".",
) -> CheckConfig:
    """Merge flag > file > defaults into a CheckConfig with provenance."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    file_vals: dict[str, Any] = {}
    file_name = ""
    if config_file is not None:
        p = Path(config_file)
        file_vals = _read_toml(p, ())
        if "tool" in file_vals:  # a pyproject.toml given explicitly
            file_vals = _read_toml(p, ("tool", "ranklens", "check"))
        elif "check" in file_vals and isinstance(file_vals["check"], dict):
            file_vals = file_vals["check"]
        file_name = str(p)
    else:
        pyproject = Path(cwd) / "pyproject.toml"
        if pyproject.is_file():
            file_vals = _read_toml(pyproject, ("tool", "ranklens", "check"))
            file_name = f"{pyproject} [tool.ranklens.check]"
    for name, raw in file_vals.items():
        values[name] = parse_value(name, raw)
        sources[name] = file_name
    for name, raw in flags.items():
        if raw is not None:
            values[name] = parse_value(name, raw)
            sources[name] = f"--{name.replace('_', '-')}"
    return CheckConfig(values, sources)
