"""Random DAGs as a replay reads them (ptr, e_src, e_lag, v_base, v_add, order), for the tests
that compare replays (test_replay_levels, test_replay_c)."""

from __future__ import annotations

import numpy as np
from ranklens.analysis.graph_build import NEG


def arrays(rng: np.random.Generator, n: int, e: int, lags: int = 3) -> dict[str, np.ndarray]:
    """A DAG on n vertices (edges from earlier to later in a random order), lags in
    [-lags, lags] so that ties are common, some bases and lags NEG (no constraint)."""
    order = rng.permutation(n)
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    a, b = rng.integers(0, n, e), rng.integers(0, n, e)
    keep = a != b
    a, b = a[keep], b[keep]
    src, dst = np.where(pos[a] < pos[b], a, b), np.where(pos[a] < pos[b], b, a)
    by_dst = np.argsort(dst, kind="stable")
    src, dst = src[by_dst], dst[by_dst]
    lag = rng.integers(-lags, lags + 1, len(src)).astype(np.int64)
    lag[rng.random(len(src)) < 0.1] = NEG
    base = rng.integers(0, 6, n).astype(np.int64)
    base[rng.random(n) < 0.3] = NEG
    return {
        "ptr": np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=n))]).astype(np.int64),
        "e_src": src.astype(np.int64),
        "e_lag": lag,
        "v_base": base,
        "v_add": rng.integers(0, 4, n).astype(np.int64),
        "order": order.astype(np.int64),
    }
