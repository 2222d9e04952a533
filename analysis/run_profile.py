"""What kind of run this is: its parallelisms, its model family, its framework, its groups.

Why: a fix is only useful in the run's own terms. Context-parallel advice on a run without CP,
or Megatron flags on a DLRM run, read as boilerplate and hide the advice that applies; a
process group is recognised by its parallelism and ranks ("PP [0, 4]"), never by its id.
Everything here is read from what the trace shows (process_groups, event names), so it is a
fact of the run, like the others in the report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import duckdb
import polars as pl
from ranklens.analysis._sql import query_pl

# Model families by the names of their signature ops (kernels, aten ops, annotations).
TRANSFORMER = "transformer"
RECSYS = "recsys"
UNKNOWN = "unknown"
_FAMILY_PATTERNS: dict[str, str] = {
    # flash/fused attention kernels, SDPA, rotary embeddings: an attention model
    TRANSFORMER: r"(?i)(attn|attention|flash_fwd|flash::|scaled_dot_product|rotary|\brope)",
    # FBGEMM/TorchRec embedding bags, jagged tensors: a recommendation model (DLRM-like)
    RECSYS: r"(?i)(embedding_bag|split_embedding|embeddingbag|fbgemm|\bkjt|sparse_data_dist)",
}
# Frameworks by the names they give their process groups or ranges.
_FRAMEWORK_PATTERNS: dict[str, str] = {
    "megatron": r"(TENSOR_MODEL_PARALLEL|PIPELINE_MODEL_PARALLEL|DATA_PARALLEL_GROUP|megatron)",
    "torchrec": r"(?i)(torchrec|KJT|EmbeddingBagCollection|sparse_data_dist)",
}
_MAX_LISTED = 8  # ranks named in a group label before it is shortened


@dataclass(frozen=True)
class RunProfile:
    """The run's parallelisms (DP, TP, PP, CP, EP, WORLD, ...), model family, framework and a
    label per process group."""

    parallelisms: frozenset[str] = frozenset()
    model: str = UNKNOWN
    framework: str | None = None
    groups: dict[str, str] = field(default_factory=dict)

    def has(self, *names: str) -> bool:
        """Whether the run has any of the parallelisms `names` (DP also counts DP_SHARD)."""
        have = self.parallelisms | ({"DP"} if "DP_SHARD" in self.parallelisms else set())
        return any(n in have for n in names)

    def group(self, pg_name: object) -> str:
        """A process group by its parallelism and ranks; the id when it is not known."""
        key = "" if pg_name is None else str(pg_name)
        return self.groups.get(key, f"group {key}" if key else "no group")


def group_label(parallelism: str | None, desc: str | None, ranks: list[int] | None) -> str:
    """'PP [0, 4, 8, 12]': the parallelism (its description when the parallelism is only OTHER
    or unknown) and its ranks, the middle left out past a few."""
    kind = parallelism if parallelism not in (None, "", "OTHER", "UNKNOWN") else (desc or "group")
    rs = sorted(ranks or [])
    if len(rs) > _MAX_LISTED:
        shown = ", ".join(map(str, rs[:3])) + ", ..., " + ", ".join(map(str, rs[-2:]))
        return f"{kind} [{shown}] ({len(rs)} ranks)"
    return f"{kind} [{', '.join(map(str, rs))}]"


def _groups(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    return query_pl(
        con, "SELECT pg_name, pg_desc, parallelism, ranks FROM process_groups ORDER BY pg_name"
    )


def group_labels(con: duckdb.DuckDBPyConnection, pgs: pl.DataFrame | None = None) -> dict[str, str]:
    """pg_name -> its label (group_label; the id added when two groups share ranks)."""
    labels: dict[str, str] = {}
    for r in (_groups(con) if pgs is None else pgs).iter_rows(named=True):
        label = group_label(r["parallelism"], r["pg_desc"], r["ranks"])
        if label in labels.values() and r["pg_name"] is not None:
            label += f" (group {r['pg_name']})"  # two groups on the same ranks
        labels[str(r["pg_name"])] = label
    return labels


def profile(con: duckdb.DuckDBPyConnection) -> RunProfile:
    """The profile of the run in `con` (empty facts where its tables hold none)."""
    pgs = _groups(con)
    labels = group_labels(con, pgs)
    # A dimension of size 1 (groups of one rank) is not parallelism the run has.
    pars = frozenset(
        str(r["parallelism"])
        for r in pgs.iter_rows(named=True)
        if r["parallelism"] and len(r["ranks"] or []) > 1
    )
    names = query_pl(
        con,
        """WITH n AS (SELECT DISTINCT name FROM events
                      WHERE kind IN ('compute', 'cpu_op', 'annotation', 'comm'))
           SELECT """
        + ", ".join(
            f"bool_or(regexp_matches(name, '{pat}')) AS {key}"
            for key, pat in {**_FAMILY_PATTERNS, **_FRAMEWORK_PATTERNS}.items()
        )
        + " FROM n",
    ).row(0, named=True)
    descs = " ".join(str(d) for d in pgs["pg_desc"].drop_nulls().to_list())
    # Attention wins over embeddings: LLMs have embeddings too, DLRM has no attention.
    model = next((k for k in (TRANSFORMER, RECSYS) if names[k]), UNKNOWN)
    framework = next(
        (k for k, pat in _FRAMEWORK_PATTERNS.items() if names[k] or re.search(pat, descs)), None
    )
    return RunProfile(pars, model, framework, labels)
