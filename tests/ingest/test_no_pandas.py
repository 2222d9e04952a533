"""pyarrow imports pandas, where it is installed, the first time it makes an array (0.2 s and
tens of MB a process). ranklens' own processes, the console script and the decoding workers,
settle that probe at start and never import pandas, while pandas stays importable; a library
caller's process and its workers are left as they are. A stand-in `pandas` package records
each process that imports it."""

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
    paths = [str(tmp / "fake"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    return env, marks


def _ok(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run `cmd`; it must succeed."""
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return res


def _pids(marks: Path) -> list[int]:
    return [int(x) for x in marks.read_text().split()] if marks.exists() else []


def test_the_console_script_never_imports_pandas(tmp_path: Path) -> None:
    env, marks = _fake_pandas(tmp_path)
    out = str(tmp_path / "r.duckdb")
    code = (
        "import sys\n"
        "from ranklens.cli.entry import main\n"
        f"sys.argv = ['ranklens', 'ingest', {str(SAMPLE)!r}, '-o', {out!r}]\n"
        "main()\n"
    )
    res = _ok([sys.executable, "-c", code], env)
    assert "ingested 8 rank(s)" in res.stdout
    assert _pids(marks) == []


# The sample is small enough to be decoded in-process: these make the ingest use its workers
# and print how many processes the pool started.
_POOLED = (
    "import ranklens.ingest.workpool as workpool\n"
    "workpool.SERIAL_BELOW_BYTES = 0\n"
    "_real = workpool.worker_pool\n"
    "pools = []\n"
    "def _pool(*a):\n"
    "    pools.append(_real(*a))\n"
    "    return pools[-1]\n"
    "workpool.worker_pool = _pool\n"
)


def test_the_console_scripts_workers_never_import_pandas(tmp_path: Path) -> None:
    """As the console script: the probe first, then the CLI. Run with -c, so the workers do
    not re-run a main module (the console script's own does nothing at import)."""
    env, marks = _fake_pandas(tmp_path)
    out = str(tmp_path / "r.duckdb")
    code = (
        "import sys\n"
        "from ranklens.ingest.lifecycle import skip_pandas_probe\n"
        "skip_pandas_probe()\n" + _POOLED + "from ranklens.cli.entry import main\n"
        f"sys.argv = ['ranklens', 'ingest', {str(SAMPLE)!r}, '-o', {out!r}, '--workers', '2']\n"
        "try:\n"
        "    main()\n"
        "finally:\n"
        "    print(len(pools))\n"
    )
    res = _ok([sys.executable, "-c", code], env)
    assert res.stdout.split()[-1] == "1"  # the workers did decode
    assert _pids(marks) == []  # and neither they nor the main process looked for pandas


def test_library_use_and_its_workers_are_left_as_they_are(tmp_path: Path) -> None:
    """A library caller's workers re-run its main module, which may hand pyarrow pandas
    objects: there, as in the caller's own process, pyarrow still looks for pandas."""
    env, marks = _fake_pandas(tmp_path)
    code = (
        "import os\n" + _POOLED + "from ranklens.ingest import load_traces\n"
        "if __name__ == '__main__':\n"
        f"    load_traces([{str(SAMPLE)!r}], {str(tmp_path / 'r.duckdb')!r}, workers=2)\n"
        "    print(len(pools), os.getpid())\n"
    )
    script = tmp_path / "user.py"
    script.write_text(code)
    res = _ok([sys.executable, str(script)], env)
    n_pools, main_pid = (int(x) for x in res.stdout.split()[-2:])
    pids = set(_pids(marks))
    assert n_pools == 1 and main_pid in pids
    assert len(pids - {main_pid}) >= 1  # its workers looked too, as before


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
    res = _ok([sys.executable, "-c", code], env)
    assert "stand-in pandas" in res.stdout  # a real import reached the package
    assert len(_pids(marks)) == 1
