"""This start's page and the scripts it names, kept for the next start's early page.

Why the first step of the warming (server.Warmer, once the browser has drawn the first page):
the next `ranklens dashboard` answers these from its port while it imports
(dashboards.early_page), so what is kept must be what this app serves, byte for byte, asked
of the app itself (Flask's test client: no socket, no browser), and a start that is soon
stopped must have kept it. Written only when the kept copy differs (a first start, an
upgrade, an edit the key missed), so a start reads ~5 MB of its own responses and writes
nothing.
"""

from __future__ import annotations

import re

import dash
from ranklens.dashboards import early_page
from ranklens.dashboards.app import page_paths
from werkzeug.datastructures import Headers

# What a page names that is the same at every start: Dash's component bundles (their URLs
# carry the package version), the dashboard's assets (plotly.js's bundle), the favicon.
_STATIC = re.compile(
    r"""["'](/(?:_dash-component-suites|assets)/[^"'?]+(?:\?[^"']*)?"""
    r"""|/_favicon\.ico\?[^"']*)["']"""
)
_DROP = {"date", "server", "content-length", "set-cookie"}
# Dash signs a fresh id into each page for background callbacks (none here), with a secret
# of this process: a kept one would not verify in the next, and would differ at every start.
_END_ID = re.compile(rb'"end_id":\s*"[^"]*"')


def responses(app: dash.Dash) -> dict[str, early_page.Response]:
    """Every page's HTML (its URL replaced by early_page.BASE) and each script, stylesheet
    and icon any of them names, as the app answers them."""
    client = app.server.test_client()
    out: dict[str, early_page.Response] = {}
    named: set[str] = set()
    for path in page_paths():
        with client.get(path, base_url=early_page.BASE) as got:
            if got.status_code != 200:
                continue
            body = _END_ID.sub(b'"end_id":null', got.get_data())
            out[path] = (got.status, _kept_headers(got.headers), body, True)
        named.update(_STATIC.findall(body.decode("utf-8", errors="replace")))
    for url in sorted(named):
        with client.get(url) as got:  # (a file's response holds it open until closed)
            if got.status_code == 200:
                out[url] = (got.status, _kept_headers(got.headers), got.get_data(), False)
    return out


def record(app: dash.Dash) -> bool:
    """Keep this app's responses for the next start under this environment's key, unless
    they are kept already; whether anything was written. A cache that cannot be written
    is no error (the next start serves nothing early, as before)."""
    now = responses(app)
    key = early_page.page_key()
    if not now or early_page.same(early_page.load(key), now):
        return False
    try:
        early_page.store(now, key)
    except OSError:
        return False
    return True


def _kept_headers(headers: Headers) -> early_page.Headers:
    return [(str(n), str(v)) for n, v in headers.items() if str(n).lower() not in _DROP]
