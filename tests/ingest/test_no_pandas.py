"""pyarrow imports pandas, where it is installed, the first time it makes an array (0.2 s and
tens of MB a process). ranklens' own processes, the console script and the decoding workers,
settle that probe at start and never import pandas, while pandas stays importable; a library
user's session is left as it is. A stand-in `pandas` package records each process that
imports it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "megatron_tp2_pp2_dp2" / "raw"


def _fake_pandas(tmp: Path) -> tuple[dict[str, str], Path]:
    """An environment whose `pandas` writes the importing pid to a file, then is absent
    (ImportError, so pyarrow goes on without it)."""
    pkg = tmp / "fake" / "pandas"
    pkg.mkdir(parents=True)
    marks = tmp / "imported_by.txt"
    (pkg / "__init__.py").write_text(
        "import os\n"
        f"with open({str(marks)!r}, 'a') as f:\n"
        "    f.write(f'{os.getpid()}\\n')\n"
        "raise ImportError('stand-in pandas')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp / "fake")}
    return env, marks


def _pids(marks: Path) -> list[int]:
    return [int(x) for x in marks.read_text().split()] if marks.exists() else []


def test_the_console_script_and_its_workers_never_import_pandas(tmp_path: Path) -> None:
    env, marks = _fake_pandas(tmp_path)
    code = (
        "import sys\n"
        "from ranklens.cli.entry import main\n"
        f"sys.argv = ['ranklens', 'ingest', {str(SAMPLE)!r}, '-o', {str(tmp_path / 'r.duckdb')!r},"
        " '--workers', '2']\n"
        "main()\n"
    )
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "ingested 8 rank(s)" in res.stdout
    assert _pids(marks) == []  # neither the main process nor a worker looked for pandas


def test_library_use_keeps_its_pandas_and_workers_skip_it(tmp_path: Path) -> None:
    env, marks = _fake_pandas(tmp_path)
    code = (
        "import os\n"
        "from ranklens.ingest import load_traces\n"
        "if __name__ == '__main__':\n"
        f"    load_traces([{str(SAMPLE)!r}], {str(tmp_path / 'r.duckdb')!r}, workers=2)\n"
        "    import pyarrow as pa\n"
        "    pa.array([1])\n"
        "    print(os.getpid())\n"
    )
    script = tmp_path / "user.py"
    script.write_text(code)
    res = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    main_pid = int(res.stdout.split()[-1])
    assert set(_pids(marks)) == {main_pid}  # the user's process looked, its workers did not


def test_pandas_stays_importable_after_the_probe(tmp_path: Path) -> None:
    env, marks = _fake_pandas(tmp_path)
    code = (
        "from ranklens.ingest.lifecycle import skip_pandas_probe\n"
        "skip_pandas_probe()\n"
        "import pyarrow as pa\n"
        "pa.table({'a': [1]})\n"
        "try:\n"
        "    import pandas\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "stand-in pandas" in res.stdout  # a real import reached the package
    assert len(_pids(marks)) == 1
