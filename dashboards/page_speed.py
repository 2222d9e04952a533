"""What the dashboard adds to the HTML page Dash serves, for the browser's time to first paint.

Why here and not in a stylesheet or script asset: these must run at precise points of the
page's loading (before Dash's scripts, between them and its renderer), which only the page
template gives, and they are a few lines that belong with the app, not a package data file.
"""

from __future__ import annotations

import re
from pathlib import Path

import dash

_PLOTLY_JS = "_dash-component-suites/plotly/package_data/plotly.min.js"

# plotly.js's cartesian partial bundle (assets/README.md): 1.5 MB instead of 4.8 MB, which
# the browser compiles and runs in about a third of the time (a first visit ~1 s sooner on 2
# cores). It has every trace type the dashboard draws.
PARTIAL_BUNDLE = "plotly-cartesian.min.js"
PARTIAL_TRACES = frozenset(
    {"bar", "box", "contour", "heatmap", "histogram", "histogram2d", "histogram2dcontour"}
    | {"image", "pie", "scatter", "scatterternary", "violin"}
)
_ASSETS = Path(__file__).resolve().parent / "assets"

# In <head>:
# - the style of the cells of every table (components.table), once for the page;
# - a scroll bar always, so that a page growing past the window does not narrow every graph
#   right after its first drawing (each would be drawn a second time);
# - the browser's own String.prototype.trim and parseInt kept aside (see _AFTER_SCRIPTS);
# - plotly.js (PARTIAL_BUNDLE) fetched and compiled while the page waits for its layout, not
#   after it: dcc.Graph loads plotly.js itself unless window.Plotly is set, and waits on it
#   when it is a promise; the script replaces the promise with the library when it runs.
_HEAD = """<style>
html { overflow-y: scroll; }
.ranklens-table { border-collapse: collapse; }
.ranklens-table th, .ranklens-table td {
  font-family: monospace; font-size: 12px; padding: 2px 8px; border-bottom: 1px solid #eee;
  text-align: left; white-space: nowrap; max-width: 480px; overflow: hidden;
  text-overflow: ellipsis;
}
</style>
<script>
window._ranklensNative = {trim: String.prototype.trim, parseInt: window.parseInt};
(function () {
  var s = document.createElement("script");
  s.src = "PLOTLY_URL";
  s.async = true;
  window.Plotly = new Promise(function (ok, fail) {
    s.onload = function () { ok(window.Plotly); };
    s.onerror = fail;
  });
  document.addEventListener("DOMContentLoaded", function () {
    document.head.appendChild(s);
  });
})();
</script>"""

# After Dash's scripts, before its renderer starts: the browser's own trim and parseInt back.
# The @babel/polyfill Dash loads replaces both, in every current browser, with slow versions
# (it still counts U+180E as white space, which Unicode stopped doing in 2013), and plotly.js
# calls them for every colour it parses: about a tenth of the time drawing a page takes.
_AFTER_SCRIPTS = """
<script>
String.prototype.trim = window._ranklensNative.trim;
window.parseInt = Number.parseInt = window._ranklensNative.parseInt;
</script>"""


def js_version(head: str) -> tuple[int, ...] | None:
    """The version in a plotly.js bundle's banner ("plotly.js (cartesian ...) v4.1.1")."""
    m = re.search(r"plotly\.js\b[^\n]*? v(\d+)\.(\d+)\.(\d+)", head)
    return tuple(int(g) for g in m.groups()) if m else None


def use_partial(installed: str, partial_head: str) -> bool:
    """Whether the partial bundle can draw what this plotly (Python) builds: the same major
    version of plotly.js (figures of another major may use attributes it does not know)."""
    want, have = js_version(f"plotly.js v{installed}"), js_version(partial_head)
    return want is not None and have is not None and want[0] == have[0]


def plotly_url(app: dash.Dash) -> str:
    """The plotly.js the page loads: the partial bundle, or plotly's own full one."""
    import plotly.offline

    path = _ASSETS / PARTIAL_BUNDLE
    head = ""
    if path.is_file():
        with path.open("rb") as f:
            head = f.read(400).decode("utf-8", errors="replace")
    if use_partial(plotly.offline.get_plotlyjs_version(), head):
        return str(app.get_asset_url(PARTIAL_BUNDLE))
    return f"{app.config.requests_pathname_prefix}{_PLOTLY_JS}"


def tune_index(app: dash.Dash) -> None:
    """Add the above to `app`'s page template."""
    url = plotly_url(app)
    app.index_string = app.index_string.replace(
        "{%css%}", "{%css%}" + _HEAD.replace("PLOTLY_URL", url)
    ).replace("{%scripts%}", "{%scripts%}" + _AFTER_SCRIPTS)
