"""Running the installed `ranklens` as a user does, and checking what a failure may not do.

Every case runs the console script in a subprocess (real signal handling, real warnings, no
pytest filters), then checks the four promises of README's Guarantees: the exit code, a message
(`error:` naming the file and what is wrong, plus `hint:`), no traceback, and every file that
existed before (inputs, a previous output) byte for byte unchanged. A tally of the cases is
printed at the end of the session (conftest.py).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

RANKLENS = str(Path(sys.executable).with_name("ranklens"))
TALLY = {"cases": 0, "clear_errors": 0, "tracebacks": 0, "data_lost": 0}


@dataclass
class Result:
    """What one command did."""

    rc: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


def run(
    args: Sequence[str | os.PathLike[str]],
    cwd: Path,
    *,
    env: dict[str, str] | None = None,
    timeout: float = 180,
    unprivileged: bool = False,
) -> Result:
    """`ranklens ARGS` in `cwd`. `unprivileged`: without root's power to ignore file modes
    (so chmod 000 means unreadable even when the tests run as root)."""
    cmd = [RANKLENS, *map(str, args)]
    if unprivileged and os.geteuid() == 0:
        cmd = [_SETPRIV, "--bounding-set=-dac_override,-dac_read_search", *cmd]
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    done = subprocess.run(
        cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout, check=False
    )
    res = Result(done.returncode, done.stdout, done.stderr)
    TALLY["cases"] += 1
    if "Traceback" in res.text and "--debug" not in cmd:
        TALLY["tracebacks"] += 1
    return res


_SETPRIV = shutil.which("setpriv") or "setpriv"


def can_drop_privileges() -> bool:
    """Whether file modes can be made to bind (not root, or root with setpriv available)."""
    return os.geteuid() != 0 or shutil.which("setpriv") is not None


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under root (hidden ones included): a file's SHA-256, else its kind."""
    out: dict[str, str] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            st = p.lstat()
            rel = str(p.relative_to(root))
            if stat.S_ISREG(st.st_mode):
                try:
                    out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
                except OSError:
                    out[rel] = f"unreadable {st.st_size}"
            elif stat.S_ISLNK(st.st_mode):
                out[rel] = f"link -> {os.readlink(p)}"
            else:
                out[rel] = f"mode {stat.S_IFMT(st.st_mode)}"
    return out


def unchanged(before: dict[str, str], after: dict[str, str], *, new_ok: Sequence[str] = ()) -> None:
    """Nothing that existed was changed or removed; nothing appeared but `new_ok`."""
    lost = {k: v for k, v in before.items() if after.get(k) != v}
    if lost:
        TALLY["data_lost"] += 1
    assert not lost, f"changed or removed: {sorted(lost)}"
    extra = sorted(set(after) - set(before) - set(new_ok))
    assert not extra, f"left behind: {extra}"


def clear_error(res: Result, *fragments: str, rc: int = 1) -> None:
    """Exit `rc` with `error:` + `hint:`, each fragment in the message, no traceback."""
    assert "Traceback" not in res.text, res.text
    assert res.rc == rc, (res.rc, res.text)
    assert "error:" in res.err and "hint:" in res.err, res.err
    for f in fragments:
        assert f in res.err, (f, res.err)
    TALLY["clear_errors"] += 1


def ok(res: Result) -> None:
    """Exit 0 and no traceback."""
    assert "Traceback" not in res.text, res.text
    assert res.rc == 0, (res.rc, res.text)


def line_with(text: str, prefix: str) -> str:
    """The first line of `text` that starts with `prefix`."""
    return next((ln for ln in text.splitlines() if ln.startswith(prefix)), "")
