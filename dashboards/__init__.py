"""The Dash dashboard: `app.create_app(db_path)`; it draws analysis results and computes nothing.

Dash imports its Jupyter support at import time, and with it IPython, requests and friends
(~0.35 s of a ~2 s start where IPython is installed, as it is in most ML environments). A
dashboard server never runs inside Jupyter, so outside a running IPython, dash is imported
with IPython hidden (dash then stubs its Jupyter helpers), and IPython stays importable after.
"""

import sys


def _import_dash_without_ipython() -> None:
    if "dash" in sys.modules or "IPython" in sys.modules:
        return  # already imported, or inside IPython/Jupyter: leave dash as it is
    from ranklens.ingest.lifecycle import refusing_import

    with refusing_import("IPython"):
        import dash  # noqa: F401


_import_dash_without_ipython()
