"""Clock alignment: one offset per clock domain (host), estimated from matched collectives.

Why: ranks on different hosts stamp events with clocks that disagree by microseconds to tens
of milliseconds (NTP), which is the size of the skews and waits ranklens measures. Ranks on one
host share a clock, so the unknowns are one offset per host (a rank of unknown host is its own
domain); raw timestamps stay as they are and `ranks.clock_offset_ns` is applied by views.

Model: the end of a collective whose result needs every member's data (all-reduce, all-gather,
reduce-scatter, all-to-all, barrier, grouped send/recv) is near-simultaneous on all its ranks:
end_r + o_host(r) = T_i + noise. Per instance and host the median end is taken; offsets start
from alternating medians (robust to outliers) and are refined by iteratively reweighted least
squares (Huber weights, conjugate gradients on the normal equations, O(rows) per iteration),
one reference host per connected set of hosts at offset 0. Each rank's residual is the p90 of
|aligned end - instance consensus| over its instances: after alignment its collective ends
agree with the others' within that. Broadcast/reduce/gather/scatter and point-to-point ops do
not end together and are not used.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
from ranklens.ingest.clock_p2p import link_components
from ranklens.ingest.config import RunOptions
from ranklens.ingest.database import registered

SYNC_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier", "send_recv")
_HUBER_C = 1.5
_IRLS_ITERS = 8
_MEDIAN_ITERS = 20


@dataclass
class Alignment:
    """Per-rank result and run-level summary."""

    offsets: dict[int, int]
    methods: dict[int, str]
    residuals: dict[int, int | None]
    summary: dict[str, str]


def align_clocks(
    con: duckdb.DuckDBPyConnection, options: RunOptions, p2p: pl.DataFrame | None = None
) -> Alignment:
    """Estimate (or take) offsets, write them into `ranks`, and return what was done.

    `p2p`: pairs of send/recv ends that should agree (`a`, `ea`, `b`, `eb`) to link hosts no
    collective joins; by default the matched send/recv instances of `collectives`.
    """
    ranks = con.execute("SELECT rank, host FROM ranks ORDER BY rank").fetchall()
    domain = {int(r): (str(h) if h else f"rank:{r}") for r, h in ranks}
    # Ends relative to the earliest one: float64 holds ns exactly only below 2^53.
    ends = pl.from_arrow(
        con.sql(
            f"""SELECT instance_id AS i, rank,
                       end_ns - min(end_ns) OVER () AS end_ns FROM collectives
                WHERE status = 'matched' AND op IN {SYNC_OPS!r} AND group_size >= 2"""
        ).to_arrow_table()
    )
    assert isinstance(ends, pl.DataFrame)
    doms = sorted(set(domain.values()))
    if options.offsets is not None:
        offsets, methods = _user(domain, options.offsets)
        note = "user-supplied offsets"
    elif not options.align:
        offsets, methods = dict.fromkeys(domain, 0), dict.fromkeys(domain, "none")
        note = "alignment disabled"
    elif len(doms) == 1:
        offsets, methods = dict.fromkeys(domain, 0), dict.fromkeys(domain, "single_host")
        note = "one host: one clock"
    else:
        offsets, methods, note = _estimate(domain, ends, _p2p_pairs(con) if p2p is None else p2p)
    residuals = _residuals(ends, offsets)
    res = Alignment(offsets, methods, residuals, {})
    _write(con, res)
    worst = max((v for v in residuals.values() if v is not None), default=None)
    res.summary = {
        "align_method": ",".join(sorted(set(methods.values()))),
        "align_note": note,
        "align_domains": str(len(doms)),
        "align_instances": str(ends["i"].n_unique() if ends.height else 0),
        "align_max_residual_ns": "" if worst is None else str(worst),
    }
    return res


def _user(
    domain: dict[int, str], given: dict[int | str, int]
) -> tuple[dict[int, int], dict[int, str]]:
    offsets: dict[int, int] = {}
    methods: dict[int, str] = {}
    for r, d in domain.items():
        val = given.get(r, given.get(d))
        offsets[r] = 0 if val is None else int(val)
        methods[r] = "none" if val is None else "user"
    return offsets, methods


def _estimate(
    domain: dict[int, str], ends: pl.DataFrame, p2p: pl.DataFrame
) -> tuple[dict[int, int], dict[int, str], str]:
    """Offsets per domain from instance ends, then p2p links; see the module docstring."""
    names = sorted(set(domain.values()), key=lambda d: min(r for r, x in domain.items() if x == d))
    did = {d: k for k, d in enumerate(names)}
    n_dom = len(names)
    o, comp = _from_collectives(did, domain, ends)
    o, comp, linked = link_components(p2p, {r: did[d] for r, d in domain.items()}, o, comp)
    if len(set(comp.tolist())) == n_dom:
        return (
            dict.fromkeys(domain, 0),
            dict.fromkeys(domain, "none"),
            "no collective or send/recv spans two hosts",
        )
    main = comp[0]
    offsets = {r: round(float(o[did[d]])) for r, d in domain.items()}
    methods = {
        r: ("p2p" if did[d] in linked else "unconnected" if comp[did[d]] != main else "collectives")
        for r, d in domain.items()
    }
    n_un = int((comp != main).sum())
    n_p2p = len(linked)
    note = f"{n_dom} hosts, {n_un} not linked to the reference by any collective or send/recv"
    if n_p2p:
        note += f", {n_p2p} linked through send/recv"
    return offsets, methods, note


def _p2p_pairs(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """Matched send/recv instances: the ends of one message (relative, like `ends`)."""
    df = pl.from_arrow(
        con.sql(
            """WITH m AS (SELECT instance_id, op, rank, end_ns FROM collectives
                          WHERE status = 'matched' AND op IN ('send', 'recv'))
               SELECT s.rank AS a, s.end_ns AS ea, r.rank AS b, r.end_ns AS eb
               FROM m s JOIN m r USING (instance_id) WHERE s.op = 'send' AND r.op = 'recv'"""
        ).to_arrow_table()
    )
    assert isinstance(df, pl.DataFrame)
    return df


def _from_collectives(
    did: dict[str, int], domain: dict[int, str], ends: pl.DataFrame
) -> tuple[np.ndarray, np.ndarray]:
    """Offsets and connected components of domains from collective ends (IRLS)."""
    n_dom = len(did)
    dmap = pl.DataFrame(
        {"rank": list(domain), "h": [did[d] for d in domain.values()]},
        schema={"rank": pl.Int32, "h": pl.Int64},
    )
    rows = (
        ends.with_columns(pl.col("rank").cast(pl.Int32))
        .join(dmap, on="rank")
        .group_by("i", "h")
        .agg(pl.col("end_ns").median().alias("m"))
        .filter(pl.col("h").n_unique().over("i") > 1)
    )
    if rows.is_empty():
        return np.zeros(n_dom), np.arange(n_dom)
    inst = rows["i"].rank("dense").cast(pl.Int64).to_numpy() - 1
    h = rows["h"].to_numpy()
    m = rows["m"].to_numpy().astype(np.float64)
    comp = _components(inst, h, n_dom)
    o = _median_init(inst, h, m, n_dom)
    w = np.ones_like(m)
    for _ in range(_IRLS_ITERS):
        o = _weighted_ls(inst, h, m, w, n_dom, o)
        r = m + o[h] - _consensus(inst, m + o[h], w)
        scale = max(1.4826 * float(np.median(np.abs(r))), 1_000.0)
        w = np.minimum(1.0, _HUBER_C * scale / np.maximum(np.abs(r), 1e-9))
    for c in set(comp.tolist()):
        members = np.flatnonzero(comp == c)
        o[members] -= o[members.min()]
    return o, comp


def _components(inst: np.ndarray, h: np.ndarray, n: int) -> np.ndarray:
    """Connected sets of domains (linked when they share an instance)."""
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    first: dict[int, int] = {}
    for i, d in zip(inst.tolist(), h.tolist(), strict=True):
        if i in first:
            a, b = find(first[i]), find(d)
            if a != b:
                parent[max(a, b)] = min(a, b)
        else:
            first[i] = d
    return np.array([find(x) for x in range(n)])


def _consensus(inst: np.ndarray, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted mean of x per instance, broadcast back to rows."""
    num = np.bincount(inst, w * x)
    den = np.bincount(inst, w)
    out: np.ndarray = (num / np.maximum(den, 1e-12))[inst]
    return out


def _median_init(inst: np.ndarray, h: np.ndarray, m: np.ndarray, n: int) -> np.ndarray:
    """Alternating medians: T_i = med_h(m + o_h), o_h = med_i(T_i - m)."""
    o = np.zeros(n)
    df = pl.DataFrame({"i": inst, "h": h, "m": m})
    for _ in range(_MEDIAN_ITERS):
        df = df.with_columns((pl.col("m") + pl.Series(o[h])).alias("a"))
        t = df.select(pl.col("a").median().over("i")).to_series().to_numpy()
        new = (
            df.with_columns(d=pl.Series(t) - pl.col("m"))
            .group_by("h")
            .agg(pl.col("d").median())
            .sort("h")
        )
        nxt = np.zeros(n)
        nxt[new["h"].to_numpy()] = new["d"].to_numpy()
        if np.max(np.abs(nxt - o)) < 0.5:
            return nxt
        o = nxt
    return o


def _weighted_ls(
    inst: np.ndarray, h: np.ndarray, m: np.ndarray, w: np.ndarray, n: int, o0: np.ndarray
) -> np.ndarray:
    """Minimize sum w (m + o_h - T_i)^2 over o (T eliminated) by conjugate gradients."""
    wi = np.maximum(np.bincount(inst, w), 1e-12)
    wh = np.bincount(h, w, minlength=n)
    eps = 1e-9 * max(float(wh.mean()), 1e-12)

    def apply(x: np.ndarray) -> np.ndarray:
        t = np.bincount(inst, w * x[h]) / wi
        out: np.ndarray = wh * x - np.bincount(h, w * t[inst], minlength=n) + eps * x
        return out

    mi = np.bincount(inst, w * m) / wi
    b = np.bincount(h, w * mi[inst], minlength=n) - np.bincount(h, w * m, minlength=n)
    x = o0.copy()
    r = b - apply(x)
    p = r.copy()
    rs = float(r @ r)
    tol = 1e-6 * max(float(b @ b), 1.0)
    for _ in range(max(4 * n, 50)):
        if rs <= tol:
            break
        ap = apply(p)
        alpha = rs / max(float(p @ ap), 1e-300)
        x += alpha * p
        r -= alpha * ap
        rs_new = float(r @ r)
        p = r + (rs_new / rs) * p
        rs = rs_new
    return x


def _residuals(ends: pl.DataFrame, offsets: dict[int, int]) -> dict[int, int | None]:
    """Per rank: p90 of |aligned end - median aligned end of the instance| (None: no data)."""
    out: dict[int, int | None] = dict.fromkeys(offsets)
    if ends.is_empty():
        return out
    off = pl.DataFrame(
        {"rank": list(offsets), "o": list(offsets.values())},
        schema={"rank": pl.Int32, "o": pl.Int64},
    )
    df = (
        ends.with_columns(pl.col("rank").cast(pl.Int32))
        .join(off, on="rank")
        .with_columns(a=(pl.col("end_ns") + pl.col("o")).cast(pl.Float64))
        .with_columns(r=(pl.col("a") - pl.col("a").median().over("i")).abs())
        .group_by("rank")
        .agg(pl.col("r").quantile(0.9, "higher"))
    )
    for rank, r in df.iter_rows():
        out[int(rank)] = round(float(r))
    return out


def _write(con: duckdb.DuckDBPyConnection, res: Alignment) -> None:
    ranks = list(res.offsets)
    with registered(
        con,
        "_align",
        pa.table(
            {
                "rank": pa.array(ranks, pa.int32()),
                "o": pa.array([res.offsets[r] for r in ranks], pa.int64()),
                "m": pa.array([res.methods[r] for r in ranks], pa.string()),
                "res": pa.array([res.residuals.get(r) for r in ranks], pa.int64()),
            }
        ),
    ):
        con.execute(
            """UPDATE ranks SET clock_offset_ns = a.o, clock_method = a.m,
               align_residual_ns = a.res FROM _align a WHERE ranks.rank = a.rank"""
        )
