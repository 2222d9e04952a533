"""Loaded at interpreter start under `ranklens capture`: hooks optimizer steps in rank
processes, then runs any sitecustomize this one shadows."""

import os
import sys


def _ranklens_capture() -> None:
    if not os.environ.get("RANKLENS_CAPTURE_DIR"):
        return
    if "RANK" not in os.environ and "RANKLENS_CAPTURE_ALL" not in os.environ:
        return  # launcher processes (torchrun itself) are not ranks
    try:
        from ranklens.capture import auto_capture

        auto_capture()
    except Exception as exc:  # never break the user's job because profiling could not start
        print(f"ranklens capture: not profiling this process ({exc})", file=sys.stderr)


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        path = os.path.join(entry or ".", "sitecustomize.py")
        if os.path.abspath(entry or ".") != here and os.path.isfile(path):
            with open(path) as f:
                exec(compile(f.read(), path, "exec"), {"__name__": "sitecustomize"})
            return


_ranklens_capture()
_chain()
