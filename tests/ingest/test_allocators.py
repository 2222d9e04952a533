"""The console script asks numpy and pyarrow's allocator for ordinary pages, numpy's BLAS
for one thread and glibc for large arrays from its heap (lifecycle.settle_allocators: huge
pages' first touch was 12% of an Nsight ingest's CPU on a VM, and a fresh mapping per array
faulted every page again), for itself and its decoding workers; a user's own setting wins; a
library caller's process is left as it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ranklens.ingest.lifecycle import ALLOCATOR_DEFAULTS

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "megatron_tp2_pp2_dp2" / "raw"

# What a process reports: the variables, and numpy's own reading of its setting (numpy reads
# NUMPY_MADVISE_HUGEPAGE once, at import: True means it asks for huge pages). A module of its
# own, so a worker can run it.
# heap_arrays: whether a 64 MB array (over glibc's largest threshold of its own, 32 MB) came
# from the process' heap (the [heap] line of its maps), not from a mapping of its own.
_PROBE = (
    "def state():\n"
    "    import os\n"
    "    import numpy as np\n"
    "    import numpy._core.multiarray as m\n"
    f"    names = {sorted(ALLOCATOR_DEFAULTS)!r}\n"
    "    a = np.ones(8 << 20)\n"
    "    at = a.ctypes.data\n"
    "    heap = [l.split()[0].split('-') for l in open('/proc/self/maps') if l.rstrip()"
    ".endswith('[heap]')]\n"
    "    return {'env': {k: os.environ.get(k) for k in names},\n"
    "            'numpy_huge_pages': bool(m._get_madvise_hugepage()),\n"
    "            'heap_arrays': any(int(lo, 16) <= at < int(hi, 16) for lo, hi in heap)}\n"
)


def _run(code: str, tmp: Path, **extra: str) -> dict[str, dict[str, object]]:
    """Run `code` (which prints one JSON line last) with no allocator variable set but
    `extra`, and `probe.state` importable."""
    (tmp / "probe").mkdir(parents=True)
    (tmp / "probe" / "probe.py").write_text(_PROBE)
    env = {k: v for k, v in os.environ.items() if k not in ALLOCATOR_DEFAULTS}
    paths = [str(tmp / "probe"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**env, **extra, "PYTHONPATH": os.pathsep.join(paths)}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    out: dict[str, dict[str, object]] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def _console_script(out: Path) -> str:
    """The console script's main on the sample, then the state of this process and of a
    worker from the same pool kind the ingest uses (forked from a server it starts)."""
    return (
        "import json, sys\n"
        "from ranklens.cli.entry import main\n"
        f"sys.argv = ['ranklens', 'ingest', {str(SAMPLE)!r}, '-o', {str(out)!r}]\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as stop:\n"
        "    assert not stop.code, stop.code\n"
        "from probe import state\n"
        "from ranklens.ingest import workpool\n"
        "pool = workpool.worker_pool(1, 'ranklens.ingest.worker_boot')\n"
        "try:\n"
        "    worker = pool.submit(state).result()\n"
        "finally:\n"
        "    pool.shutdown()\n"
        "print(json.dumps({'main': state(), 'worker': worker}))\n"
    )


def test_the_console_script_and_its_workers_ask_for_ordinary_pages(tmp_path: Path) -> None:
    got = _run(_console_script(tmp_path / "r.duckdb"), tmp_path)
    for who in ("main", "worker"):
        assert got[who]["env"] == ALLOCATOR_DEFAULTS, who
        assert got[who]["numpy_huge_pages"] is False, who
        assert got[who]["heap_arrays"] is True, who


def test_a_users_own_setting_wins(tmp_path: Path) -> None:
    got = _run(
        _console_script(tmp_path / "r.duckdb"),
        tmp_path,
        NUMPY_MADVISE_HUGEPAGE="1",
        MIMALLOC_ALLOW_THP="1",
        MALLOC_MMAP_THRESHOLD_=str(1 << 20),
    )
    for who in ("main", "worker"):
        assert got[who]["numpy_huge_pages"] is True, who
        assert got[who]["env"]["MIMALLOC_ALLOW_THP"] == "1", who
        assert got[who]["heap_arrays"] is False, who  # glibc read the user's 1 MB
        assert got[who]["env"]["OPENBLAS_NUM_THREADS"] == "1", who  # the one not given


_BARE = "import json\nfrom probe import state\nprint(json.dumps({'main': state()}))\n"


def test_library_use_is_left_as_it_is(tmp_path: Path) -> None:
    code = (
        "import json\n"
        "from probe import state\n"
        "from ranklens.ingest import load_traces\n"
        f"load_traces([{str(SAMPLE)!r}], {str(tmp_path / 'r.duckdb')!r}, workers=1)\n"
        "print(json.dumps({'main': state()}))\n"
    )
    got = _run(code, tmp_path / "lib")
    bare = _run(_BARE, tmp_path)
    assert got["main"]["env"] == {k: None for k in ALLOCATOR_DEFAULTS}
    assert got["main"]["heap_arrays"] is False  # glibc's own way: a mapping per large array
    assert got == bare  # numpy's own default (True on Linux), as in a process without ranklens
