"""Fix texts chosen by the run: no context-parallel or LLM advice where the run has neither.

Independent facts: the public DLRM traces (8 V100 ranks, TorchRec/FBGEMM embeddings, one
WORLD group) have no CP, no TP, no attention; the Megatron sample names its groups
TENSOR_/PIPELINE_MODEL_PARALLEL_GROUP; a run with a CP group gets the CP clause."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest
from ranklens.analysis import Finding, Severity
from ranklens.analysis.advice import fix_for, tailor
from ranklens.analysis.report import build_report
from ranklens.analysis.run_profile import RECSYS, TRANSFORMER, RunProfile, group_label, profile
from ranklens.ingest import load_traces
from ranklens.ingest.schema import ddl

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
LLM_WORDS = ("context", "sequence", "token", "Megatron", "layers", "NVLink domain", "causal")


def _straggler(code: str = "STRAGGLER_RANK") -> Finding:
    return Finding(code, Severity.WARNING, "rank 3 is late", "find what rank 3 does", ranks=(3,))


def test_cp_clause_only_with_cp() -> None:
    with_cp = RunProfile(frozenset({"CP", "DP"}), TRANSFORMER)
    without = RunProfile(frozenset({"DP"}), TRANSFORMER)
    assert "context-parallel" in fix_for(_straggler(), with_cp)
    assert "context" not in fix_for(_straggler(), without)
    assert "sequence lengths" in fix_for(_straggler(), without)  # a transformer all the same
    plain = fix_for(_straggler(), RunProfile())
    assert plain == "find what rank 3 does"  # nothing run-specific to add: as written


def test_profile_reads_cp_groups_and_attention() -> None:
    con = duckdb.connect()
    con.execute(ddl())
    con.execute(
        """INSERT INTO process_groups (pg_name, pg_desc, ranks, size, parallelism) VALUES
           ('1', 'CONTEXT_PARALLEL_GROUP', [0, 1], 2, 'CP'),
           ('2', 'DATA_PARALLEL_GROUP', [0, 2], 2, 'DP'),
           ('3', 'TENSOR_MODEL_PARALLEL_GROUP', [0], 1, 'TP')"""
    )
    con.execute(
        "INSERT INTO events_plain (rank, kind, name) VALUES (0, 'compute', 'flash_fwd_kernel')"
    )
    p = profile(con)
    assert p.parallelisms == {"CP", "DP"}  # TP of one rank is no TP
    assert p.model == TRANSFORMER and p.framework == "megatron"
    assert p.group("1") == "CP [0, 1]" and p.group("9") == "group 9"
    found = tailor([_straggler("STRAGGLER_COMPUTE_IMBALANCE")], p)
    assert "context-parallel split" in found[0].fix


def test_group_label_shortens_long_groups() -> None:
    assert group_label("PP", None, [12, 0, 8, 4]) == "PP [0, 4, 8, 12]"
    assert group_label("OTHER", "MODEL_PARALLEL_GROUP", [0, 1]) == "MODEL_PARALLEL_GROUP [0, 1]"
    assert group_label("DP", None, list(range(64))) == "DP [0, 1, 2, ..., 62, 63] (64 ranks)"


def test_dlrm_findings_have_no_llm_or_cp_advice(
    shared_traces: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    db = tmp_path_factory.mktemp("dlrm") / "run.duckdb"
    load_traces([shared_traces / "param-dlrm-kineto" / "extracted"], db)
    with duckdb.connect(str(db), read_only=True) as con:
        rep = build_report(con)
    assert rep.facts["model"] == RECSYS and rep.facts["parallelisms"] == ["WORLD"]
    assert rep.findings
    for f in rep.findings:
        for word in LLM_WORDS:
            assert word not in f.fix, (f.code, word, f.fix)
    imb = next(f for f in rep.findings if f.code == "STRAGGLER_COMPUTE_IMBALANCE")
    assert "sharding plan" in imb.fix  # the advice a recommendation model can act on


def test_megatron_sample_gets_megatron_flags_but_no_cp(tmp_path: Path) -> None:
    db = tmp_path / "run.duckdb"
    load_traces([SAMPLES / "megatron_tp2_pp2_dp2" / "raw"], db, workers=1)
    with duckdb.connect(str(db), read_only=True) as con:
        rep = build_report(con)
    assert rep.facts["framework"] == "megatron" and "CP" not in rep.facts["parallelisms"]
    assert rep.facts["groups"]["11"] == "PP [0, 4]"
    fixes = {f.code: f.fix for f in rep.findings}
    assert "--overlap-grad-reduce" in fixes["PIPELINE_DP_INTO_BUBBLES"]
    assert all("context" not in fx for fx in fixes.values())
    assert not any("PP group" in f.message for f in rep.findings)  # groups by their ranks
    slow = next(f for f in rep.findings if f.code == "COLLECTIVE_SLOW")
    assert re.search(r"worst: (TP|DP|PP|WORLD) \[\d+(, \d+)*\] ", slow.message), slow.message
