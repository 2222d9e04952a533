"""Shared pytest fixtures and options for the ranklens test suite.

Groups (add new fixtures under a heading of their own):
- options: `--update-goldens`; Ctrl+C made deliverable (`pytest_configure`).
- the reliability tally: summed over pytest-xdist's workers, printed at the end.
- databases: `tmp_db`, `ingest` (build traces -> ingest -> read-only connection).
- real traces: `shared_traces` (../shared/traces/public, skipped when absent).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pytest

# The tests choose the report's width per command (CliRunner's env, the harness' COLUMNS=200).
# An exported COLUMNS (pytest-xdist's workers set 80) would instead fix the width of the CLI's
# console for the whole session, at its import during collection.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)
# The dashboard keeps its page for the next start (dashboards.early_page) in the user's cache:
# the tests' dashboards (in-process and the processes they start) keep theirs in one of this
# session's own, removed at its end.
if "RANKLENS_CACHE_DIR" not in os.environ:
    os.environ["RANKLENS_CACHE_DIR"] = tempfile.mkdtemp(prefix="rltests-page-cache-")
    atexit.register(shutil.rmtree, os.environ["RANKLENS_CACHE_DIR"], True)

# Make `tests/` importable so test modules can `from kineto_builder import ...`.
_TESTS_DIR = Path(__file__).resolve().parent
if str(_TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(_TESTS_DIR))

from kineto_builder import KinetoTrace  # noqa: E402
from ranklens.ingest import load_traces  # noqa: E402
from reliability.harness import TALLY  # noqa: E402

REPO_ROOT = _TESTS_DIR.parent


# ---------------------------------------------------------------------------------------------
# options
# ---------------------------------------------------------------------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-goldens",
        action="store_true",
        default=False,
        help="rewrite golden (expected) output files instead of comparing against them",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Tests that stop the CLI with Ctrl+C need SIGINT to reach Python. A shell without job
    control starts background commands (`pytest ... &` in a CI script) with SIGINT ignored,
    and children inherit that: `_thread.interrupt_main` then does nothing and a CLI sent
    SIGINT never stops. Python's own handler here gives this process Ctrl+C back, and its
    children the default disposition (a handler is not inherited across exec)."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def update_goldens(request: pytest.FixtureRequest) -> bool:
    """True when the run was started with --update-goldens."""
    return bool(request.config.getoption("--update-goldens"))


# ---------------------------------------------------------------------------------------------
# the reliability tests' tally of CLI runs (reliability/harness.py), printed at the end; with
# pytest-xdist each worker counts its own and the controller adds them up
# ---------------------------------------------------------------------------------------------
def pytest_sessionfinish(session: pytest.Session) -> None:
    out = getattr(session.config, "workeroutput", None)
    if out is not None:  # an xdist worker: hand the counts to the controller
        out["ranklens_tally"] = dict(TALLY)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    for key, n in getattr(node, "workeroutput", {}).get("ranklens_tally", {}).items():
        TALLY[key] += n


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TALLY["cases"]:
        terminalreporter.write_line(
            f"reliability: {TALLY['cases']} CLI runs, {TALLY['clear_errors']} clear errors, "
            f"{TALLY['tracebacks']} tracebacks, {TALLY['data_lost']} with data lost"
        )


# ---------------------------------------------------------------------------------------------
# databases built from synthetic traces
# ---------------------------------------------------------------------------------------------
IngestFn = Callable[..., duckdb.DuckDBPyConnection]


@pytest.fixture
def tmp_db(tmp_path: Path) -> Path:
    """Path of a database file that does not exist yet."""
    return tmp_path / "db" / "run.duckdb"


@pytest.fixture
def ingest(tmp_path: Path, tmp_db: Path) -> Iterator[IngestFn]:
    """`ingest(traces_or_paths, **load_traces_kwargs)` -> read-only connection.

    Accepts `KinetoTrace` objects (written as `<i>-rank<N>.json` under a fresh directory)
    and/or paths; calls `load_traces(..., workers=1)` unless told otherwise. Connections are closed
    at teardown.
    """
    cons: list[duckdb.DuckDBPyConnection] = []
    counter = iter(range(1_000_000))

    def run(
        items: Sequence[KinetoTrace | Path | str] | KinetoTrace, **kw: Any
    ) -> duckdb.DuckDBPyConnection:
        seq = [items] if isinstance(items, KinetoTrace) else list(items)
        n = next(counter)
        paths: list[str] = []
        for i, item in enumerate(seq):
            if isinstance(item, KinetoTrace):
                name = f"{i:03d}-rank{item.rank}" if item.rank is not None else f"{i:03d}-norank"
                paths.append(str(item.write(tmp_path / f"traces{n}" / f"{name}.json")))
            else:
                paths.append(str(item))
        db = tmp_db.with_name(f"run{n}.duckdb")
        db.parent.mkdir(parents=True, exist_ok=True)
        kw.setdefault("workers", 1)
        load_traces(paths, db, **kw)
        con = duckdb.connect(str(db), read_only=True)
        cons.append(con)
        return con

    yield run
    for con in cons:
        con.close()


# ---------------------------------------------------------------------------------------------
# real public traces
# ---------------------------------------------------------------------------------------------
SHARED_TRACES = REPO_ROOT.parent / "shared" / "traces" / "public"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """`../shared/traces/public` beside the repository.

    Skips the test when absent, unless RANKLENS_REQUIRE_SHARED=1 (then it fails)."""
    if SHARED_TRACES.is_dir():
        return SHARED_TRACES
    msg = f"shared traces not found at {SHARED_TRACES}"
    if os.environ.get("RANKLENS_REQUIRE_SHARED") == "1":
        pytest.fail(msg + " (RANKLENS_REQUIRE_SHARED=1)")
    pytest.skip(msg)
