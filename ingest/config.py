"""Cross-rank options of a run: clock alignment, user offsets and the parallel layout.

Why one typed object: the CLI, `[tool.ranklens]` in pyproject.toml and tests all configure the
same three things, with precedence flag > pyproject > default. Parsing lives here so the CLI
stays free of logic and the database records exactly what was used.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ranklens.ingest.errors import RanklensError
from ranklens.ingest.tomlfile import load_toml

# Megatron-LM's rank order, fastest-varying dimension first (rank = tp + tp*(cp + cp*(...))).
DEFAULT_ORDER: tuple[str, ...] = ("tp", "cp", "ep", "dp_shard", "dp", "pp")
DIM_LABEL: dict[str, str] = {
    "tp": "TP",
    "cp": "CP",
    "ep": "EP",
    "dp_shard": "DP_SHARD",
    "dp": "DP",
    "pp": "PP",
}
_ALIASES = {"fsdp": "dp_shard", "dp_replicate": "dp", "sp": "cp"}


class ConfigError(RanklensError):
    """A layout, offsets file or [tool.ranklens] section that cannot be used."""


@dataclass(frozen=True)
class Layout:
    """Sizes of the parallel dimensions and their rank order (fastest-varying first)."""

    sizes: dict[str, int]
    order: tuple[str, ...] = DEFAULT_ORDER

    @property
    def world_size(self) -> int:
        n = 1
        for v in self.sizes.values():
            n *= v
        return n

    def check_fits(self, world_size: int | None, max_rank: int) -> None:
        """Raise unless the layout can describe this run: its product is the world size (or,
        with none recorded, covers every rank present)."""
        n = self.world_size
        if (world_size is not None and n != world_size) or n <= max_rank:
            have = f"world size {world_size}" if world_size is not None else f"rank {max_rank}"
            raise ConfigError(
                f"layout {self.describe()} describes {n} ranks, but the run has {have}",
                "give sizes whose product is the world size (e.g. tp=2,pp=2,dp=2 for 8 ranks)",
            )

    def describe(self) -> str:
        dims = ",".join(f"{d}={self.sizes[d]}" for d in self.order if d in self.sizes)
        return f"{dims},order={'-'.join(d for d in self.order if d in self.sizes)}"

    def groups(self, dim: str) -> list[tuple[int, ...]]:
        """Rank sets of the groups along `dim` (every other coordinate fixed), sorted."""
        dims = [d for d in self.order if self.sizes.get(d, 1) >= 1]
        sizes = [self.sizes.get(d, 1) for d in dims]
        strides = [1] * len(dims)
        for i in range(1, len(dims)):
            strides[i] = strides[i - 1] * sizes[i - 1]
        k = dims.index(dim)
        out: set[tuple[int, ...]] = set()
        for r in range(self.world_size):
            base = r - ((r // strides[k]) % sizes[k]) * strides[k]
            out.add(tuple(base + j * strides[k] for j in range(sizes[k])))
        return sorted(out)


@dataclass(frozen=True)
class RunOptions:
    """What cross-rank processing does at ingest.

    Attributes:
        align: estimate clock offsets across hosts from matched collectives.
        offsets: user-supplied offsets in ns, keyed by rank (int) or host name (str); they
            replace the estimate for the ranks they name.
        layout: the parallel layout, used to label process groups from their rank pattern.
        sources: where each value came from (flag, pyproject, default), for `--verbose`/meta.
    """

    align: bool = True
    offsets: dict[int | str, int] | None = None
    layout: Layout | None = None
    sources: dict[str, str] = field(default_factory=dict)


def parse_layout(text: str) -> Layout:
    """`tp=2,pp=2,dp=2[,order=tp-cp-ep-dp-pp]` -> Layout.

    Raises:
        ConfigError: unknown dimension, bad size, or an order that misses a given dimension.
    """
    sizes: dict[str, int] = {}
    order: tuple[str, ...] | None = None
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, val = part.partition("=")
        key = key.strip().lower()
        if not sep:
            raise ConfigError(f"layout item {part!r} has no '='", _LAYOUT_HINT)
        if key == "order":
            order = tuple(_ALIASES.get(d, d) for d in re.split(r"[-/ >]+", val.strip().lower()))
            continue
        key = _ALIASES.get(key, key)
        if key not in DIM_LABEL:
            raise ConfigError(f"unknown layout dimension {key!r}", _LAYOUT_HINT)
        if key in sizes:
            raise ConfigError(f"layout gives {key} twice ({text!r})", _LAYOUT_HINT)
        if not val.strip().isdigit() or int(val) < 1:
            raise ConfigError(f"layout size {part!r} is not a positive integer", _LAYOUT_HINT)
        sizes[key] = int(val)
    if not sizes:
        raise ConfigError(f"empty layout {text!r}", _LAYOUT_HINT)
    if order is None:
        order = DEFAULT_ORDER
    unknown = [d for d in order if d not in DIM_LABEL]
    if unknown:
        raise ConfigError(f"unknown dimension(s) {unknown} in layout order", _LAYOUT_HINT)
    if len(set(order)) != len(order):
        raise ConfigError(f"layout order {'-'.join(order)} repeats a dimension", _LAYOUT_HINT)
    missing = [d for d in sizes if d not in order]
    if missing:
        raise ConfigError(f"layout order {'-'.join(order)} misses {missing}", _LAYOUT_HINT)
    return Layout(sizes, order)


_LAYOUT_HINT = (
    "write e.g. --layout tp=2,pp=2,dp=2 (dimensions tp, cp, ep, dp, dp_shard, pp) and "
    "optionally order=tp-cp-ep-dp-pp (fastest-varying first, Megatron's default)"
)


def read_offsets(path: str | os.PathLike[str]) -> dict[int | str, int]:
    """A JSON object of clock offsets in ns: {"0": 0, "4": -1250000} (ranks) or host names.

    Raises:
        ConfigError: unreadable file or non-integer offsets.
    """
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read offsets ({exc})", _OFFSETS_HINT) from None
    if isinstance(doc, dict) and set(doc) <= {"ranks", "hosts"}:
        flat: dict[str, Any] = {**doc.get("hosts", {}), **doc.get("ranks", {})}
    elif isinstance(doc, dict):
        flat = doc
    else:
        raise ConfigError(f"{path}: offsets must be a JSON object", _OFFSETS_HINT)
    out: dict[int | str, int] = {}
    for key, val in flat.items():
        if not isinstance(val, int | float) or isinstance(val, bool):
            raise ConfigError(f"{path}: offset of {key!r} is not a number", _OFFSETS_HINT)
        if not abs(val) < OFFSET_LIMIT_NS:  # also NaN and inf (JSON's 1e400)
            raise ConfigError(
                f"{path}: offset of {key!r} ({val:g} ns) is out of range (|offset| must be "
                f"below {OFFSET_LIMIT_NS:.3g} ns)",
                _OFFSETS_HINT,
            )
        out[int(key) if str(key).lstrip("-").isdigit() else str(key)] = int(val)
    return out


# Clock offsets stay below 2^61 ns so that offset + start + duration fits int64 (sanity.py).
OFFSET_LIMIT_NS = 2**61


_OFFSETS_HINT = (
    'give a JSON object of ns offsets added to each rank\'s raw clock, e.g. {"0": 0, '
    '"4": -1250000}, or {"hosts": {"node1": 0, "node2": 350000}}'
)


def pyproject_section(start: str | os.PathLike[str] = ".") -> dict[str, Any]:
    """`[tool.ranklens]` of ./pyproject.toml (empty when there is none)."""
    path = Path(start) / "pyproject.toml"
    if not path.is_file():
        return {}
    try:
        doc = load_toml(path)
    except (OSError, ValueError) as exc:  # ValueError: TOMLDecodeError
        raise ConfigError(f"{path}: cannot read ({exc})", "fix the TOML syntax") from None
    section = doc.get("tool", {}).get("ranklens", {})
    if not isinstance(section, dict):
        return {}
    unknown = sorted(set(section) - set(SECTION_KEYS))
    if unknown:  # a misspelt key would silently leave its option at the default
        near = [m for k in unknown for m in difflib.get_close_matches(k, SECTION_KEYS, n=1)]
        raise ConfigError(
            f"{path}: unknown key(s) in [tool.ranklens]: {', '.join(unknown)}",
            (f"did you mean {', '.join(near)}? " if near else "")
            + f"known keys: {', '.join(SECTION_KEYS)}",
        )
    return section


# What `[tool.ranklens]` may hold: the run options (ingest/run.py) and the `check` table.
SECTION_KEYS = ("align", "offsets", "layout", "workers", "skip_bad", "allow_mixed", "check")


def resolve_options(
    *,
    no_align: bool = False,
    offsets_file: str | os.PathLike[str] | None = None,
    layout: str | None = None,
    section: dict[str, Any] | None = None,
) -> RunOptions:
    """Combine flags with a `[tool.ranklens]` section (flags win) into RunOptions."""
    sec = section or {}
    sources: dict[str, str] = {}
    align = not no_align
    sources["align"] = "flag" if no_align else "default"
    if not no_align and "align" in sec:
        align = bool(sec["align"])
        sources["align"] = "pyproject"
    offsets = None
    if offsets_file is not None:
        offsets, sources["offsets"] = read_offsets(offsets_file), "flag"
    elif "offsets" in sec:
        offsets, sources["offsets"] = read_offsets(str(sec["offsets"])), "pyproject"
    lay = None
    if layout is not None:
        lay, sources["layout"] = parse_layout(layout), "flag"
    elif "layout" in sec:
        raw = sec["layout"]
        text = ",".join(f"{k}={v}" for k, v in raw.items()) if isinstance(raw, dict) else raw
        lay, sources["layout"] = parse_layout(str(text)), "pyproject"
    return RunOptions(align=align, offsets=offsets, layout=lay, sources=sources)
