"""The last start's page and scripts, served while this start imports dash and reads the run.

Why: a first visit is mostly the browser fetching and compiling the page's ~4 MB of scripts
(~0.75 s on 2 cores), and `ranklens dashboard` opened its port after ~1.1 s of imports, so
the two came one after the other. The HTML page Dash serves and the scripts it names depend
on the installed packages and ranklens' dashboard code, not on the run: kept from the last
start (dashboards.page_record), they are answered from the port as soon as the process starts
(cli/entry.py -> port.hold_early), while the server imports; what else the browser asks for
(the layout, the callbacks) waits for the app. The browser compiles while the server imports.

Kept per `page_key()`: the Python, the dash/plotly/flask/werkzeug/AG Grid installations and
ranklens' dashboard files (their stats, no import). A start whose key has no copy serves
nothing early, and the copy is checked against the app's own page once it is ready
(page_record), so an edit that the key missed is served at most once. Standard library only:
imported before dash, numpy or pyarrow.
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

import ranklens

CACHE_ENV = "RANKLENS_CACHE_DIR"
# Where a page's own URL stands in a kept copy (Dash writes the request's URL into the page's
# twitter:url tag); replaced by each request's, escaped.
BASE = "http://ranklens-early-page.invalid"
KEEP = 4  # copies of other keys kept (other environments share the cache)
_PACKAGES = ("dash", "plotly", "dash_ag_grid", "flask", "werkzeug")
_HERE = Path(__file__).resolve().parent
_BODY = re.compile(r"[0-9]+\.body")  # the files store() names

Headers = list[tuple[str, str]]
Response = tuple[str, Headers, bytes, bool]  # status line, headers, body, is a page


def cache_dir() -> Path:
    """$RANKLENS_CACHE_DIR, else $XDG_CACHE_HOME/ranklens, else ~/.cache/ranklens; /pages."""
    root = os.environ.get(CACHE_ENV)
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(xdg, "ranklens")
    return Path(root) / "pages"


def page_key() -> str:
    """What the served page and its scripts depend on, as a digest of file stats (~1 ms)."""
    h = hashlib.sha256(f"{ranklens.__version__}\0{sys.version}\0{sys.prefix}".encode())
    files = sorted(p for p in _HERE.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for name in _PACKAGES:
        spec = PathFinder.find_spec(name)
        files.append(Path(spec.origin) if spec is not None and spec.origin else Path(name))
    for p in files:
        try:
            st = p.stat()
            h.update(f"{p}\0{st.st_mtime_ns}\0{st.st_size}\0".encode())
        except OSError:
            h.update(f"{p}\0missing\0".encode())
    return h.hexdigest()[:32]


@dataclass(frozen=True)
class Kept:
    """One response as the app gave it: status line, headers, the body's file."""

    status: str
    headers: Headers
    body: str
    index: bool  # a page (its URL to fill in), not a script


class Page:
    """The responses kept for one key, answered by path (and query) before the app is ready."""

    def __init__(self, folder: Path, kept: dict[str, Kept]) -> None:
        self.folder = folder
        self.kept = kept

    def answer(self, environ: dict[str, Any]) -> tuple[str, Headers, bytes] | None:
        """The kept response to this request (GET only), or None: the app must answer it."""
        if environ.get("REQUEST_METHOD") != "GET":
            return None
        path = environ.get("PATH_INFO") or "/"
        query = environ.get("QUERY_STRING") or ""
        k = self.kept.get(f"{path}?{query}" if query else path)
        if k is None:
            return None
        try:
            body = (self.folder / k.body).read_bytes()
        except OSError:
            return None
        if k.index:
            scheme = environ.get("wsgi.url_scheme", "http")
            host = environ.get("HTTP_HOST") or environ.get("SERVER_NAME", "")
            url = html.escape(f"{scheme}://{host}", quote=True)
            body = body.replace(BASE.encode(), url.encode())
        headers = [(n, v) for n, v in k.headers if n.lower() != "content-length"]
        return k.status, [*headers, ("Content-Length", str(len(body)))], body


def load(key: str | None = None, root: Path | None = None) -> Page | None:
    """The copy kept for `key` (this environment's page_key), or None."""
    folder = (root or cache_dir()) / (key or page_key())
    try:
        if not _private(folder):
            return None
        manifest = json.loads((folder / "manifest.json").read_text())
        kept = {
            path: Kept(str(e["status"]), [(str(n), str(v)) for n, v in e["headers"]],
                       str(e["body"]), bool(e["index"]))
            for path, e in manifest["responses"].items()
        }  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not all(_BODY.fullmatch(k.body) for k in kept.values()):
        return None  # a body named outside the copy's folder
    return Page(folder, kept)


def _private(folder: Path) -> bool:
    """Whether only this user could have written `folder` (served as the dashboard's own page,
    a copy another user planted would run in its origin)."""
    st = folder.stat()
    uid = os.getuid() if hasattr(os, "getuid") else st.st_uid  # (no owners to tell apart)
    return st.st_uid == uid and not st.st_mode & 0o022


def same(page: Page | None, responses: dict[str, Response]) -> bool:
    """Whether `page` holds exactly these responses (what page_record would write)."""
    if page is None or set(page.kept) != set(responses):
        return False
    for path, (status, headers, body, index) in responses.items():
        k = page.kept[path]
        if (k.status, k.headers, k.index) != (status, headers, index):
            return False
        try:
            if (page.folder / k.body).read_bytes() != body:
                return False
        except OSError:
            return False
    return True


def store(
    responses: dict[str, Response],
    key: str | None = None,
    root: Path | None = None,
) -> Path:
    """Keep `responses` ({path: (status, headers, body, is a page)}) for `key`, replacing its
    copy whole (written aside, then renamed: a start reading it sees the old or the new one),
    and remove all but the KEEP newest copies of other keys. Raises OSError."""
    root = root or cache_dir()
    folder = root / (key or page_key())
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    work = root / f".{folder.name}-{os.getpid()}-{time.monotonic_ns()}"
    work.mkdir(mode=0o700)
    try:
        manifest: dict[str, Any] = {}
        for i, (path, (status, headers, body, index)) in enumerate(sorted(responses.items())):
            (work / f"{i}.body").write_bytes(body)
            manifest[path] = {
                "status": status, "headers": headers, "body": f"{i}.body", "index": index
            }  # fmt: skip
        (work / "manifest.json").write_text(json.dumps({"responses": manifest}))
        old = root / f".{folder.name}-old-{os.getpid()}-{time.monotonic_ns()}"
        with contextlib.suppress(FileNotFoundError):
            folder.rename(old)
        work.rename(folder)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _prune(root, folder.name)
    return folder


def _prune(root: Path, current: str) -> None:
    """All but the KEEP newest copies of other keys removed, and abandoned work folders."""
    others: list[tuple[float, Path]] = []
    for p in root.iterdir():
        with contextlib.suppress(OSError):
            if p.name.startswith("."):
                if time.time() - p.stat().st_mtime > 3600:  # a start killed mid-write
                    shutil.rmtree(p, ignore_errors=True)
            elif p.name != current and p.is_dir():
                others.append((p.stat().st_mtime, p))
    for _t, p in sorted(others, reverse=True)[KEEP:]:
        shutil.rmtree(p, ignore_errors=True)
