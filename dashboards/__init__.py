"""The Dash dashboard: `app.create_app(db_path)`; it draws analysis results and computes nothing.

Dash imports its Jupyter support at import time, and with it IPython, requests and friends
(~0.35 s of a ~2 s start where IPython is installed, as it is in most ML environments). A
dashboard server never runs inside Jupyter, so outside a running IPython, dash is imported
with IPython hidden (dash then stubs its Jupyter helpers), and IPython stays importable after.

The package itself imports nothing heavy: dash is hidden from IPython when something first
imports it (a one-shot import hook), not here, so that `early_page` and `port` can serve the
last start's page while the rest of the dashboard (dash, plotly, the analyses) is imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any


class _DashWithoutIPython(importlib.abc.MetaPathFinder):
    """Finds `dash` as the path finder does, and runs its import with IPython refused, unless
    IPython is already imported then (a running IPython/Jupyter: dash keeps its support).
    Removes itself at its first use."""

    def find_spec(
        self, name: str, path: Any = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != "dash":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or "IPython" in sys.modules:
            return spec
        spec.loader = _Quiet(spec.loader)
        return spec


class _Quiet(importlib.abc.Loader):
    """A loader that runs another's `exec_module` with IPython refused."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        made: ModuleType | None = self.real.create_module(spec)
        return made

    def exec_module(self, module: ModuleType) -> None:
        from ranklens.ingest.lifecycle import refusing_import

        try:
            with refusing_import("IPython"):
                self.real.exec_module(module)
        finally:  # dash's own loader from here on (pkgutil.get_data serves its bundles)
            module.__loader__ = self.real
            if module.__spec__ is not None:
                module.__spec__.loader = self.real

    def __getattr__(self, name: str) -> Any:  # get_data, get_resource_reader, ... meanwhile
        return getattr(self.real, name)


if "dash" not in sys.modules and "IPython" not in sys.modules:
    sys.meta_path.insert(0, _DashWithoutIPython())
