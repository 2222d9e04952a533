"""The dashboard's start does not pay for dash's Jupyter support (IPython), yet leaves IPython
importable: a fake IPython package on the path records whether anything imported it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROBE = """
import sys
import ranklens.dashboards.server  # what `ranklens dashboard` imports
hidden = "IPython" not in sys.modules
import IPython  # still importable afterwards
print(hidden, IPython.MARK)
"""

INSIDE_IPYTHON = """
import sys
import IPython  # a running IPython/Jupyter: dash keeps its Jupyter support
import ranklens.dashboards.server
print(sys.modules["IPython"] is IPython)
"""


def _fake_ipython(root: Path) -> dict[str, str]:
    pkg = root / "IPython"
    pkg.mkdir()
    # Enough of IPython for dash._jupyter's imports to succeed when it is allowed to import it.
    (pkg / "__init__.py").write_text("MARK = 'fake'\ndef get_ipython():\n    return None\n")
    (pkg / "display.py").write_text("IFrame = display = Javascript = object\n")
    core = pkg / "core"
    core.mkdir()
    (core / "__init__.py").write_text("")
    (core / "display.py").write_text("HTML = object\n")
    (core / "ultratb.py").write_text("FormattedTB = object\n")
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }


def test_dash_is_imported_without_ipython_and_ipython_still_works(tmp_path: Path) -> None:
    env = _fake_ipython(tmp_path)
    res = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    assert res.stdout.split() == ["True", "fake"]


def test_inside_ipython_dash_is_left_as_it_is(tmp_path: Path) -> None:
    env = _fake_ipython(tmp_path)
    res = subprocess.run(
        [sys.executable, "-c", INSIDE_IPYTHON], env=env, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["True"]  # the running IPython was neither hidden nor replaced
