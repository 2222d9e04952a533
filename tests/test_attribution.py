"""Parallelism attribution: Megatron/DeviceMesh names, ops carried, the rank layout (flag or
pyproject), and the gloo worker-thread attribution it all rests on in CPU runs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest
from kineto_builder import PgConfig, cpu_trace
from multirank import gpu_job
from ranklens.ingest.config import ConfigError, Layout, parse_layout, resolve_options
from ranklens.ingest.groups import attribute

Ingest = Callable[..., duckdb.DuckDBPyConnection]
SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
KIND_LABEL = {"DP": "DP", "TP": "TP", "PP": "PP", "MP": "OTHER"}


def _truth(name: str) -> dict:  # type: ignore[type-arg]
    return json.loads((SAMPLES / name / "truth.json").read_text())  # type: ignore[no-any-return]


def _labels(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    return dict(con.execute("SELECT pg_name, parallelism FROM process_groups").fetchall())


def test_parse_layout_and_groups() -> None:
    lay = parse_layout("tp=2,pp=2,dp=2")
    assert lay.order[:3] == ("tp", "cp", "ep") and lay.world_size == 8
    assert lay.groups("tp") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert lay.groups("dp") == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert lay.groups("pp") == [(0, 4), (1, 5), (2, 6), (3, 7)]
    other = parse_layout("dp=2, tp=4, order=pp-dp-tp")
    assert other.groups("dp") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    for bad in ("tp=two", "xx=2", "tp=2,order=pp-dp", ""):
        with pytest.raises(ConfigError):
            parse_layout(bad)


def test_pyproject_layout_and_flag_precedence(tmp_path: Path) -> None:
    from ranklens.ingest.config import pyproject_section

    (tmp_path / "pyproject.toml").write_text(
        "[tool.ranklens]\nlayout = { tp = 4, dp = 2 }\nalign = false\n"
    )
    sec = pyproject_section(tmp_path)
    opts = resolve_options(section=sec)
    assert opts.layout == Layout({"tp": 4, "dp": 2}) and not opts.align
    assert opts.sources == {"align": "pyproject", "layout": "pyproject"}
    opts = resolve_options(layout="tp=2,dp=4", section=sec)
    assert opts.layout is not None and opts.layout.sizes == {"tp": 2, "dp": 4}
    assert opts.sources["layout"] == "flag"


@pytest.mark.parametrize(
    ("desc", "label"),
    [
        ("TENSOR_MODEL_PARALLEL_GROUP", "TP"),
        ("mesh_tp", "TP"),
        ("mesh_dp_shard", "DP_SHARD"),
        ("mesh_dp_replicate", "DP"),
        ("mesh_cp", "CP"),
        ("EXPERT_MODEL_PARALLEL_GROUP", "EP"),
        ("default_pg", "WORLD"),
        (None, "OTHER"),
    ],
)
def test_labels_from_names(desc: str | None, label: str) -> None:
    assert attribute(desc, [0, 1], 2, 8, {}, None)[0] == label


@pytest.mark.parametrize(
    ("desc", "label"),
    [
        # Megatron-LM composites: several model dimensions are OTHER, not their first word
        ("TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP", "OTHER"),
        ("TENSOR_AND_DATA_PARALLEL_GROUP", "OTHER"),
        ("TENSOR_AND_CONTEXT_PARALLEL_GROUP", "OTHER"),
        ("TENSOR_AND_EXPERT_PARALLEL_GROUP", "OTHER"),
        ("EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP", "OTHER"),
        ("EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP", "OTHER"),
        ("MODEL_PARALLEL_GROUP", "OTHER"),
        ("AMAX_REDUCTION_GROUP", "OTHER"),
        ("EMBEDDING_GROUP", "OTHER"),
        ("POSITION_EMBEDDING_GROUP", "OTHER"),
        # data parallel over dp x cp replicas (gradient reduction) is DP
        ("DATA_PARALLEL_GROUP_WITH_CP", "DP"),
        ("DATA_PARALLEL_GROUP_WITH_CP_GLOO", "DP"),
        ("INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP", "DP"),
        ("DATA_MODULO_EXPERT_PARALLEL_GROUP", "DP"),
        ("EXPERT_DATA_PARALLEL_GROUP", "DP"),
        ("EXPERT_TENSOR_PARALLEL_GROUP", "TP"),
        ("CONTEXT_PARALLEL_GROUP", "CP"),
        ("HIERARCHICAL_CONTEXT_PARALLEL_GROUPS", "CP"),
        ("mesh_dp_cp", "DP"),
        ("mesh_dp_shard_cp", "DP_SHARD"),
        # DeviceMesh-like short names, either case
        ("dp", "DP"),
        ("TP", "TP"),
        ("pp", "PP"),
        ("Cp", "CP"),
        ("ep", "EP"),
        # words, not substrings: no dimension hides inside another word
        ("dpo_eval", "OTHER"),
    ],
)
def test_labels_from_composite_and_short_names(desc: str, label: str) -> None:
    assert attribute(desc, [0, 1], 2, 8, {}, None)[0] == label


@pytest.mark.parametrize("desc", ["dp", "DP", "tp", "pp", "cp", "ep"])
def test_short_name_wins_over_spanning_the_world(desc: str) -> None:
    label, why = attribute(desc, list(range(8)), 8, 8, {}, None)
    assert label == desc.upper() and "spans" not in why


def test_gloo_dp_group_of_every_rank_is_dp(ingest: Ingest) -> None:
    """A gloo group named `dp` that holds the whole world is labelled by its name, not WORLD."""
    groups = [
        PgConfig("0", [0, 1], "default_pg", "cpu:gloo"),
        PgConfig("1", [0, 1], "dp", "cpu:gloo"),
    ]
    traces = []
    for rank in (0, 1):
        t = cpu_trace(rank, pg_config=groups)
        t.step(1, 0, 1000)
        t.host("aten::mm", 0, 50, args={"Input Dims": [[16, 16], [16, 16]]})
        traces.append(t)
    assert _labels(ingest(traces)) == {"0": "WORLD", "1": "DP"}


def test_labels_from_ops_and_layout_override() -> None:
    assert attribute(None, [0, 4], 2, 8, {"send": 3, "recv": 3}, None)[0] == "PP"
    assert attribute(None, [0, 1, 2, 3], 4, 8, {"all_to_all": 8}, None)[0] == "EP"
    lay = parse_layout("tp=2,pp=2,dp=2")
    assert attribute(None, [0, 2], 2, 8, {"all_reduce": 3}, lay)[0] == "DP"
    assert attribute(None, [0, 1, 4, 5], 4, 8, {}, lay)[0] == "OTHER"  # tp x pp
    label, why = attribute("DATA_PARALLEL_GROUP", [0, 1], 2, 8, {}, lay)
    assert label == "TP" and "overrides the name" in why


def test_megatron_named_groups_and_gloo_threads(ingest: Ingest) -> None:
    """Every gloo span lands in a group of the right kind: the big gradient all-reduce in a
    DP group, the per-layer all-reduces in TP groups, send/recv in PP groups."""
    truth = _truth("megatron_tp2_pp2_dp2")
    con = ingest([SAMPLES / "megatron_tp2_pp2_dp2" / "raw"])
    kind = {g["pg_name"]: g["kind"] for g in truth["groups"]}
    rows = con.execute(
        "SELECT rank, name, shapes, pg_name, count(*) FROM events WHERE kind = 'comm' GROUP BY ALL"
    ).fetchall()
    for rank, name, shape, pg, _ in rows:
        expect = (
            "PP"
            if name in ("gloo:send", "gloo:recv")
            else ("DP" if shape == "[[525824]]" else "TP")
        )
        assert kind.get(pg) == expect, (rank, name, shape, pg)
        members = next(g["ranks"] for g in truth["groups"] if g["pg_name"] == pg)
        assert rank in members
    labels = _labels(con)
    for g in truth["groups"]:
        assert labels[g["pg_name"]] == KIND_LABEL[g["kind"]]


def test_unnamed_groups_labeled_from_layout(ingest: Ingest) -> None:
    """The same job with unnamed groups: without a layout only the p2p groups are known (PP,
    from their ops); with the job's layout every group gets its truth label."""
    truth = _truth("unnamed_tp2_pp2_dp2")
    raw = SAMPLES / "unnamed_tp2_pp2_dp2" / "raw"
    bare = _labels(ingest([raw]))
    for g in truth["groups"]:
        want = "PP" if g["kind"] == "PP" else "OTHER"
        assert bare[g["pg_name"]] == want, (g, bare[g["pg_name"]])
    cfg = truth["config"]
    opts = resolve_options(layout=f"tp={cfg['tp']},pp={cfg['pp']},dp={cfg['dp']}")
    con = ingest([raw], options=opts)
    labels = _labels(con)
    for g in truth["groups"]:
        assert labels[g["pg_name"]] == KIND_LABEL[g["kind"]], g
    evidence = dict(con.execute("SELECT pg_name, evidence FROM process_groups").fetchall())
    assert "layout tp=2,dp=2,pp=2" in evidence["7"]
    assert con.execute("SELECT value FROM meta WHERE key = 'layout'").fetchall() == [
        ("tp=2,dp=2,pp=2,order=tp-dp-pp",)
    ]


def test_overlap_reported_per_parallelism(ingest: Ingest) -> None:
    """Communication share and exposure come out per parallelism once groups are known."""
    from ranklens.analysis import overlap

    tp = PgConfig("1", [0, 1], "TENSOR_MODEL_PARALLEL_GROUP")
    job = gpu_job(2, groups=[tp])
    job.collective("all_reduce", {0: 100, 1: 100}, 300, pg="1")
    job.collective("all_reduce", {0: 400, 1: 400}, 600)
    con = ingest(job.traces)
    par = overlap.run(con).tables["by_parallelism"]
    assert set(par["parallelism"]) == {"TP", "WORLD"}
