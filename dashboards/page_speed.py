"""What the dashboard adds to the HTML page Dash serves, for the browser's time to first paint.

Why here and not in a stylesheet or script asset: these must run at precise points of the
page's loading (before Dash's scripts, between them and its renderer), which only the page
template gives, and they are a few lines that belong with the app, not a package data file.
"""

from __future__ import annotations

import dash

_PLOTLY_JS = "_dash-component-suites/plotly/package_data/plotly.min.js"

# In <head>:
# - the style of the cells of every table (components.table), once for the page;
# - a scroll bar always, so that a page growing past the window does not narrow every graph
#   right after its first drawing (each would be drawn a second time);
# - the browser's own String.prototype.trim and parseInt kept aside (see _AFTER_SCRIPTS);
# - plotly.js (4 MB) fetched and compiled while the page waits for its layout, instead of
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


def tune_index(app: dash.Dash) -> None:
    """Add the above to `app`'s page template."""
    url = f"{app.config.requests_pathname_prefix}{_PLOTLY_JS}"
    app.index_string = app.index_string.replace(
        "{%css%}", "{%css%}" + _HEAD.replace("PLOTLY_URL", url)
    ).replace("{%scripts%}", "{%scripts%}" + _AFTER_SCRIPTS)
