"""Which plotly.js bundle the page loads (dashboards/page_speed.py), without a browser.

Why: the vendored partial bundle must be the file its README names, and must not be used with
a plotly (Python) whose figures target another major version of plotly.js; the browser tests
check the chosen bundle draws every page.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path

import plotly.offline
from ranklens.dashboards import page_speed
from ranklens.dashboards.app import create_app
from ranklens.dashboards.data import CONFIG_KEY

ASSETS = Path(page_speed.__file__).resolve().parent / "assets"


def test_version_banner_and_major_match() -> None:
    assert page_speed.js_version("/**\n* plotly.js (cartesian - minified) v4.1.1\n") == (4, 1, 1)
    assert page_speed.js_version("/**\n* plotly.js v3.0.10\n") == (3, 0, 10)
    assert page_speed.js_version("no banner") is None
    head = "* plotly.js (cartesian - minified) v4.1.1"
    assert page_speed.use_partial("4.3.0", head)
    assert not page_speed.use_partial("3.1.0", head)
    assert not page_speed.use_partial("5.0.0", head)
    assert not page_speed.use_partial("4.1.1", "")  # no bundle (or no banner): the full one


def test_vendored_bundle_is_the_one_its_readme_names() -> None:
    readme = (ASSETS / "README.md").read_text()
    data = (ASSETS / page_speed.PARTIAL_BUNDLE).read_bytes()
    assert hashlib.sha256(data).hexdigest() in readme
    version = page_speed.js_version(data[:400].decode())
    assert version is not None and "**{}.{}.{}**".format(*version) in readme
    assert "MIT" in (ASSETS / "plotly-LICENSE").read_text()
    traces = re.search(r"cartesian trace types only\s*\(([^)]*)\)", readme)
    assert traces and {t.strip() for t in traces.group(1).split(",")} == page_speed.PARTIAL_TRACES


def test_page_loads_the_chosen_bundle_and_dash_does_not_add_it(
    sample_db: Callable[[str], Path],
) -> None:
    app = create_app(sample_db("straggler_rank3"))
    html = app.server.test_client().get("/").get_data(as_text=True)
    app.server.config[CONFIG_KEY].close()  # the index page reads no figures
    url = page_speed.plotly_url(app)
    assert html.count(url) == 1  # once, by page_speed's loader; not a <script> from assets/
    data = (ASSETS / page_speed.PARTIAL_BUNDLE).read_bytes()[:400].decode()
    if page_speed.use_partial(plotly.offline.get_plotlyjs_version(), data):
        assert url.endswith("/assets/" + page_speed.PARTIAL_BUNDLE)
        served = app.server.test_client().get(url)
        size = len(served.data)
        served.close()
        assert served.status_code == 200 and size > 1_000_000
    else:
        assert url.endswith("plotly/package_data/plotly.min.js")


def test_figures_use_only_trace_types_of_the_partial_bundle() -> None:
    src = "\n".join(p.read_text() for p in Path(page_speed.__file__).parent.rglob("*.py"))
    used = {m.lower() for m in re.findall(r"\bgo\.([A-Z][A-Za-z]+)\(", src)} - {"figure"}
    assert used and used <= page_speed.PARTIAL_TRACES, used
