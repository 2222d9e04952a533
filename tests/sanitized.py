"""The sanitizer build of a C accelerator, for a test file to use instead of the installed one.

Why: `.ci/kscan-asan` builds each C extension with AddressSanitizer + UBSan and runs its tests
against that build (the path in an environment variable), so an out-of-bounds access in any
test case aborts with the sanitizer's report instead of passing by luck.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
from types import ModuleType


def sanitizer_build(env: str, name: str) -> ModuleType | None:
    """The extension module `name` loaded from the file $env names, or None when it is unset."""
    so = os.environ.get(env)
    if not so:
        return None
    loader = importlib.machinery.ExtensionFileLoader(name, so)
    spec = importlib.util.spec_from_file_location(name, so, loader=loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod
