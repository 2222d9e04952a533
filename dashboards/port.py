"""The dashboard's port: held before the run is read, then served without a word per request.

Why: a port is what a second `ranklens dashboard` cannot have while the first still serves
on the default one, and it was found only after the run had been read (minutes when traces
are ingested), after the URL had been printed as if it were served, and told in werkzeug's
words (exit 1, no `error:` or `hint:`). Held first, a port that is taken is a ranklens error
before any work. Served through werkzeug's server directly, not Flask's `run`: no
development-server banner and no log line for each request (dozens a page view) on the
user's terminal, and no `.env` read from the working directory (Flask's run loads one).
Held early, the port also queues a browser that connects before the run is ready. Stopped
(Ctrl+C, SIGTERM), it answers no new request and lets those being answered end before the run
they read is closed: closed under them, a query raised in its thread (a traceback on the
user's terminal) or DuckDB aborted the process at exit ("FATAL: exception not rethrown"; 3
of 7 stops while the browser loaded the timeline).

Held by the console script before its imports (`hold_early`), the port also answers at once
with the last start's page and scripts (dashboards.early_page) while the process imports dash
and reads the run; every other request waits for the app. Imports nothing of dash.
"""

from __future__ import annotations

import errno
import logging
import socket
import socketserver
import threading
import time
from typing import Any

from ranklens.dashboards import early_page
from ranklens.ingest.errors import RanklensError
from ranklens.ingest.threads import through_stops
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server


class _QuietHandler(WSGIRequestHandler):
    """werkzeug's handler without its line per request (errors are still logged)."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        return None


STOP_WAIT_S = 10.0  # at most this long for the requests being answered when the server stops
DEFAULT_HOST = "127.0.0.1"  # this machine only
DEFAULT_PORT = 8050
_EARLY: list[Port] = []  # the port hold_early took, until the server takes it (Port.take)


class Port:
    """A listening socket on (host, port), then a threaded WSGI server on it; port 0 takes
    any free port (`number` says which). Raises RanklensError when the port cannot be had."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.asked = port
        self._app: Any = None
        self._page: early_page.Page | None = None
        self._early: threading.Thread | None = None
        self._ended = threading.Event()  # the early thread's loop has returned
        self._busy = 0  # requests being answered
        self._stopping = False
        self._cond = threading.Condition()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        if not 0 <= port <= 65535:  # (bind's OverflowError would leave its socket open)
            raise port_error(host, port, OverflowError(port))
        try:
            held = socket.create_server((host, port), family=family)  # SO_REUSEADDR, as before
        except OSError as exc:
            raise port_error(host, port, exc) from None
        try:
            self._server: BaseWSGIServer = make_server(
                host, port, self._call, threaded=True, request_handler=_QuietHandler,
                fd=held.fileno(),
            )  # fmt: skip
        finally:
            held.close()  # the server holds its own duplicate of the socket
        self.number = int(self._server.socket.getsockname()[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.number}/"

    @classmethod
    def take(cls, host: str, port: int) -> Port:
        """The port hold_early took for (host, port), else a new one (an early one held for
        other values is let go)."""
        while _EARLY:
            held = _EARLY.pop()
            if (held.host, held.asked) == (host, port):
                return held
            held.close()
        return cls(host, port)

    def serve_early(self, page: early_page.Page | None) -> None:
        """Answer from now on, on a thread: `page`'s kept responses at once, anything else
        once `serve` gives the app (those requests wait for it)."""
        self._page = page

        def loop() -> None:
            try:
                socketserver.BaseServer.serve_forever(self._server)
            finally:
                self._ended.set()

        self._early = threading.Thread(target=loop, name="ranklens-port", daemon=True)
        self._early.start()

    def serve(self, wsgi_app: Any) -> None:
        """Serve `wsgi_app` (a Flask app: its error log is kept quiet once stopping) until
        interrupted. The interrupt goes on to the caller (the command ends "interrupted", as
        every other does): werkzeug's own serve_forever swallows it."""
        log: logging.Logger | None = getattr(wsgi_app, "logger", None)
        if log is not None:
            log.addFilter(lambda _record: not self._stopping)
        with self._cond:
            self._app = wsgi_app
            self._cond.notify_all()  # the requests that waited for it
        if self._early is None:
            socketserver.BaseServer.serve_forever(self._server)
            return
        while not self._ended.wait(0.5):  # served on its thread; Ctrl+C is raised here
            pass  # (an Event, not a join: a stop that lands in a join marks the thread ended)

    def stop(self, within: float = STOP_WAIT_S) -> bool:
        """Answer no new request (503) and wait, at most `within` s and through a second
        Ctrl+C, for those being answered; whether they all ended. Before the run is closed."""
        self._refuse_new()
        deadline = time.monotonic() + within

        def ended() -> bool:
            with self._cond:
                if self._busy:
                    self._cond.wait(min(0.1, max(deadline - time.monotonic(), 0.0)))
                return not self._busy or time.monotonic() >= deadline

        through_stops(ended)
        return not self._busy

    def close(self) -> None:
        self._refuse_new()
        if self._early is not None and not self._ended.is_set():
            self._server.shutdown()  # its loop ends within its poll (0.5 s)
        self._server.server_close()

    def _refuse_new(self) -> None:
        """503 for every request from now on, those waiting for an app that will not come too."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def _call(self, environ: Any, start_response: Any) -> Any:
        with self._cond:
            if self._stopping:
                return _unavailable(start_response)
            self._busy += 1
        try:
            app = self._app
            if app is None:
                kept = self._page.answer(environ) if self._page is not None else None
                if kept is not None:
                    status, headers, body = kept
                    start_response(status, headers)
                    return [body]
                with self._cond:  # the layout, a callback: the app answers, once it is there
                    while self._app is None and not self._stopping:
                        self._cond.wait()
                    app = self._app
                if app is None or self._stopping:
                    return _unavailable(start_response)
            return app(environ, start_response)
        finally:
            with self._cond:
                self._busy -= 1
                self._cond.notify_all()


def _unavailable(start_response: Any) -> list[bytes]:
    start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
    return [b"the ranklens dashboard is stopping\n"]


def hold_early(host: str, port: int) -> None:
    """Take the port now and answer from the last start's page (early_page) while the command
    loads; `Port.take` hands it to the server. A port that cannot be had is left for the
    server to report, as it would without this."""
    try:
        held = Port(host, port)
    except RanklensError:
        return
    try:
        page = early_page.load()
    except Exception:  # a cache that cannot be read is none: the start goes on as before
        page = None
    held.serve_early(page)
    _EARLY.append(held)


def port_error(host: str, port: int, exc: BaseException) -> RanklensError:
    """What a user reads when (host, port) cannot be listened on, and what to do."""
    code = getattr(exc, "errno", None)
    if isinstance(exc, OverflowError) or not 0 <= port <= 65535:
        return RanklensError(
            f"--port {port} is not a port number", "--port takes 1 to 65535 (0: any free port)"
        )
    if code == errno.EADDRINUSE:
        return RanklensError(
            f"port {port} on {host} is in use (another ranklens dashboard, or another program)",
            f"stop it, or serve on another port: --port {port + 1 if port < 65535 else 8050} "
            "(--port 0 takes any free one)",
        )
    if code == errno.EACCES:
        return RanklensError(
            f"not allowed to open port {port} on {host}",
            "ports below 1024 need privileges: use --port 8050 (the default) or another above 1024",
        )
    why = str(getattr(exc, "strerror", None) or exc).split(" (while attempting")[0]
    return RanklensError(
        f"cannot serve on {host} port {port}: {why}",
        "--host takes an address of this machine: 127.0.0.1 (the default: this machine only) "
        "or 0.0.0.0 (every interface)",
    )
