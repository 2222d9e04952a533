"""Run fuzz cases in a worker process: a crash (segfault, sanitizer abort) or a hang shows up as
a failed case, not as a dead or stuck test run.

The worker (this file run as a script) reads one pickled case at a time from stdin, runs it, and
answers ("ok", detail), ("error", message, hint) for a RanklensError (what the CLI prints as
`error:` / `hint:`), or ("traceback", text) for anything else. With RANKLENS_KSCAN_SO set, the
worker loads that build of the C scanner instead of the installed one (CI's ASan/UBSan build;
the parent then preloads the sanitizer runtimes into the worker only).
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

CASE_TIMEOUT_S = 30.0  # one case: far above any case's real time (~0.2 s), so only a hang hits it


class Worker:
    """One worker process; restarted after a crash or a hang (the case is then reported)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        # a file, not a pipe: a chatty worker (warnings, sanitizer reports) never blocks on it
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the worker

    def _start(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        so = env.get("RANKLENS_KSCAN_SO")
        if so:
            libs = [_gcc_lib("libasan.so"), _gcc_lib("libubsan.so")]
            env["LD_PRELOAD"] = ":".join(lib for lib in libs if lib)
            env.setdefault("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=1")
            env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
            env["PYTHONMALLOC"] = "malloc"  # so ASan sees the bounds of every bytes object
        return subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=env,
        )

    def run(self, kind: str, *args: Any, timeout: float = CASE_TIMEOUT_S) -> tuple[Any, ...]:
        """The worker's answer, or ("crash", stderr) / ("hang", seconds)."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        data = pickle.dumps((kind, args))
        try:
            proc.stdin.write(struct.pack("<Q", len(data)) + data)
            proc.stdin.flush()
            head = _read(proc, 8, timeout)
            body = _read(proc, struct.unpack("<Q", head)[0], timeout)
        except TimeoutError:
            self._stop()
            return ("hang", timeout)
        except (OSError, EOFError, struct.error):
            return ("crash", self._died())
        answer = pickle.loads(body)
        assert isinstance(answer, tuple)
        return answer

    def _died(self) -> str:
        assert self.proc is not None
        self.proc.kill()
        self.proc.communicate()
        code = self.proc.returncode
        self.proc = None
        self.stderr.seek(0)
        err = self.stderr.read()[-4000:].decode(errors="replace")
        return f"exit {code}: {err}"

    def _stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.communicate()
            self.proc = None

    def close(self) -> None:
        self._stop()
        self.stderr.close()


def check(answer: tuple[Any, ...], name: str, raw: bytes) -> None:
    """Success, or an error naming the file; never a traceback, crash or hang."""
    assert answer[0] in ("ok", "error"), f"{answer[0]} on {raw[:300]!r}:\n{answer[1]}"
    if answer[0] == "error":
        message = str(answer[1])
        assert message and "Traceback" not in message, answer
        assert name in message + str(answer[2] or ""), (message, raw[:300])


def _read(proc: subprocess.Popen[bytes], n: int, timeout: float) -> bytes:
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    out = b""
    while len(out) < n:
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            raise TimeoutError
        chunk = os.read(fd, n - len(out))
        if not chunk:
            raise EOFError
        out += chunk
    return out


def _gcc_lib(name: str) -> str:
    try:
        path = subprocess.run(
            ["gcc", f"-print-file-name={name}"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return path if os.path.isabs(path) else ""


# ------------------------------------------------------------------------------------------
# the worker side
# ------------------------------------------------------------------------------------------
def _load_scanner() -> None:
    """RANKLENS_KSCAN_SO: that build is `ranklens.ingest._kscan` for everything after."""
    so = os.environ.get("RANKLENS_KSCAN_SO")
    if not so:
        return
    import importlib.machinery
    import importlib.util

    name = "ranklens.ingest._kscan"
    loader = importlib.machinery.ExtensionFileLoader(name, so)
    spec = importlib.util.spec_from_file_location(name, so, loader=loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    sys.modules[name] = mod


def _ingest(paths: list[str], out: str, report: bool = True) -> str:
    """Ingest, then (`report`) read the run back as `report` does: success or a
    RanklensError. A report takes ~1 s even for a few events, so fuzzing asks for some."""
    from ranklens.analysis.report import build_report
    from ranklens.ingest import load_traces
    from ranklens.ingest.database import connect

    rep = load_traces(paths, out, workers=1)
    if not report:
        return f"{rep!r:.200}"
    con = connect(out)
    try:
        found = build_report(con)
    finally:
        con.close()
    return f"{rep!r:.200} / {len(found.findings)} findings"


def _scan(buf: bytes, cuts: list[tuple[int, int]]) -> str:
    """The C scanner over `buf` and some of its ranges: columns, or its ValueError."""
    from ranklens.ingest import _kscan, kineto_fast  # type: ignore[attr-defined]

    done = []
    for lo, hi in [(0, len(buf)), *cuts]:
        try:
            r = _kscan.scan(buf, lo, hi)
            kineto_fast.columns(buf, lo, hi, True, "nccl", 0, 0, 0)
            done.append(f"rows={r['rows']}")
        except ValueError as exc:
            done.append(str(exc)[:40])
        try:
            done.append(str(_kscan.skip_events(buf, lo)))
        except ValueError:
            done.append("refused")
    return ";".join(done)


def _which() -> str:
    """The file of the scanner the worker runs (the sanitizer build under CI)."""
    from ranklens.ingest import _kscan  # type: ignore[attr-defined]

    return str(_kscan.__file__)


def _die() -> None:
    """A crash, for the harness's own test."""
    os.abort()


def _stall(seconds: float) -> None:
    """A hang, for the harness's own test."""
    import time

    time.sleep(seconds)


TARGETS = {"ingest": _ingest, "scan": _scan, "which": _which, "die": _die, "stall": _stall}


def _serve() -> None:
    _load_scanner()
    from ranklens.ingest.errors import RanklensError

    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but answers on the pipe
    while True:
        head = inp.read(8)
        if len(head) < 8:
            return
        kind, args = pickle.loads(inp.read(struct.unpack("<Q", head)[0]))
        try:
            answer: tuple[Any, ...] = ("ok", TARGETS[kind](*args))
        except RanklensError as exc:
            answer = ("error", exc.message, exc.hint)
        except BaseException:  # reported to the test, which fails on it
            answer = ("traceback", traceback.format_exc())
        data = pickle.dumps(answer)
        out.write(struct.pack("<Q", len(data)) + data)
        out.flush()


if __name__ == "__main__":
    _serve()
