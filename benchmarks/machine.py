"""This machine's speed now, printed above a benchmark's figures.

Why: docs/scale.md and this folder's README compare figures across days and virtualenvs, and on
this 2-core VM nearly the same code's figures moved by 2x between sessions (2026-11-29: the
dashboard's port opened at 2.0-2.4 s, at 1.0 s the day before), with the machine's speed or the
dependencies' releases. A fixed piece of work timed just before the benchmark, the CPU time the
host took back meanwhile (steal) and the releases installed tell a reader whether a figure moved
because the code did or because the machine or a dependency did.

Usage: python benchmarks/machine.py (or machine_line() from a benchmark)
"""

from __future__ import annotations

import os
import time


def _cpu_ticks() -> tuple[int, int]:
    """(all ticks, stolen ticks) of every CPU so far (Linux /proc/stat; zeros elsewhere)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return sum(fields), fields[7] if len(fields) > 7 else 0


def _python_loop(n: int = 5_000_000) -> float:
    t = time.perf_counter()
    total = 0
    for i in range(n):
        total += i
    return time.perf_counter() - t


def _numpy_sort(n: int = 4_000_000) -> float:
    import numpy as np

    data = np.random.default_rng(0).integers(0, 2**62, n)
    t = time.perf_counter()
    np.sort(data)
    return time.perf_counter() - t


def _first_touch(mb: int = 256) -> float:
    """Seconds to write `mb` MB of memory the process never touched (the kernel zeroes each new
    page first; on this VM that cost moved between sessions: docs/scale.md, session 30)."""
    import mmap

    t = time.perf_counter()
    with mmap.mmap(-1, mb << 20) as mem:
        for off in range(0, mb << 20, mmap.PAGESIZE):
            mem[off] = 1
    return time.perf_counter() - t


def _stat_files() -> tuple[int, float]:
    """(files, seconds) to list and stat every file of the installed numpy: what an import's
    search of the file system costs (the dashboard's start is ~1,500 imports)."""
    import numpy as np

    t = time.perf_counter()
    n = 0
    for root, _dirs, files in os.walk(os.path.dirname(np.__file__)):
        for name in files:
            os.stat(os.path.join(root, name))
            n += 1
    return n, time.perf_counter() - t


PACKAGES = ("duckdb", "pyarrow", "polars", "numpy", "msgspec", "dash", "plotly")


def versions() -> str:
    """The installed releases a benchmark's figures depend on (read from their metadata: no
    import), so that a figure that moved with a dependency can be told from one the code moved."""
    from importlib import metadata

    found = []
    for name in PACKAGES:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} -")
    return ", ".join(found)


def machine_line() -> str:
    """One line: the best of 3 of a pure-Python loop (one core, the interpreter), a numpy sort
    (one core, memory), a stat of every file of numpy (the file system, as imports use it) and
    the first touch of fresh memory (every new process, every new buffer), the share of CPU time
    stolen by the host meanwhile, and the load; then the dependencies' releases."""
    all0, steal0 = _cpu_ticks()
    loop = min(_python_loop() for _ in range(3))
    sort = min(_numpy_sort() for _ in range(3))
    files, stat = min((_stat_files() for _ in range(3)), key=lambda r: r[1])
    touch = min(_first_touch() for _ in range(3))
    all1, steal1 = _cpu_ticks()
    steal = (steal1 - steal0) / (all1 - all0) if all1 > all0 else 0.0
    return (
        f"machine: python loop of 5 M adds {loop:.2f} s, numpy sort of 4 M int64 {sort:.2f} s, "
        f"stat of numpy's {files:,} files {stat * 1e6 / max(files, 1):.0f} us each, first touch "
        f"of 256 MB {touch:.2f} s (best of 3); "
        f"{steal:.0%} of CPU time stolen by the host meanwhile; load "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n  with {versions()}"
    )


if __name__ == "__main__":
    print(machine_line())
