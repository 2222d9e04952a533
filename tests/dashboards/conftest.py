"""Fixtures for the dashboard tests: sample runs as databases, a live server, a real browser.

- `sample_db(name)`: a bundled sample scenario ingested once per session.
- `live_app(db)`: the dashboard served on 127.0.0.1 (a free port) in a thread.
- `browser`: headless Debian chromium through selenium; skipped when absent, unless
  RANKLENS_REQUIRE_SHARED=1 (CI), where a missing browser fails.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dash
import pytest
from ranklens.dashboards.data import RunData
from ranklens.ingest import load_traces
from ranklens.sample_traces.gpu_job import GpuJob, write_job

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "artifacts" / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def job_db(root: Path, job: GpuJob) -> Path:
    """A generated job's run: its traces under root/raw, ingested into root/run.duckdb."""
    write_job(job, root / "raw")
    load_traces([str(root / "raw")], root / "run.duckdb", workers=1)
    return root / "run.duckdb"


def run_data(app: dash.Dash) -> RunData:
    """The run a dashboard app serves."""
    d = app.server.config["RANKLENS_RUN"]
    assert isinstance(d, RunData)
    return d


@pytest.fixture(scope="session")
def sample_db(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """`sample_db("straggler_rank3")` -> path of that scenario's database (ingested once)."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            db = tmp_path_factory.mktemp(f"db-{name}") / "run.duckdb"
            load_traces([str(REPO / "sample_traces" / name / "raw")], db, workers=1)
            made[name] = db
        return made[name]

    return get


class LiveApp:
    """A dashboard served in a thread; `url(path)` addresses it."""

    def __init__(self, db: Path, data: Any = None, baseline: Path | None = None) -> None:
        from ranklens.dashboards.app import create_app, warm_pages
        from ranklens.dashboards.data import RunData
        from ranklens.dashboards.data_compare import Baseline
        from werkzeug.serving import make_server

        self.data = data if data is not None else RunData(db)
        self.data.warm()
        self.base = None if baseline is None else Baseline(RunData(baseline), str(baseline))
        self.app = create_app(db, data=self.data, baseline=self.base)
        warm_pages(self.app)  # as `ranklens dashboard` does before it opens its port
        self.server = make_server("127.0.0.1", 0, self.app.server, threaded=True)
        self.port = self.server.server_port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=10)
        self.data.close()
        if self.base is not None:
            self.base.data.close()


@pytest.fixture(scope="module")
def live_app() -> Iterator[Callable[[Path], LiveApp]]:
    """`live_app(db)` -> a running LiveApp (one per database per module)."""
    apps: dict[Path, LiveApp] = {}

    def get(db: Path) -> LiveApp:
        if db not in apps:
            apps[db] = LiveApp(db)
        return apps[db]

    yield get
    for a in apps.values():
        a.stop()


# Headless, no network beyond localhost, nothing in the background that competes for the CPU.
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
)


def chromium(profile: str | os.PathLike[str]) -> Any:
    """Debian's headless chromium through selenium with a fresh profile: the tests' browser,
    and the benchmarks' (benchmarks/bench_dashboard*.py)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def _no_browser(reason: str) -> None:
    if os.environ.get("RANKLENS_REQUIRE_SHARED") == "1":
        pytest.fail(
            f"{reason} (RANKLENS_REQUIRE_SHARED=1: the browser tests must run; "
            "install Debian's chromium and chromium-driver)"
        )
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Headless chromium driven by selenium, a fresh profile, no network beyond localhost."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        _no_browser("selenium is not installed (pip install -e '.[dev]')")
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        _no_browser(f"chromium/chromedriver not found ({CHROMIUM}, {CHROMEDRIVER})")
    driver = chromium(tmp_path_factory.mktemp("chromium-profile"))
    driver.set_page_load_timeout(60)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()
