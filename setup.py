"""Build hook for the optional C accelerators (ranklens.ingest._kscan and _sqlscan,
ranklens.analysis._replay).

Why optional: ranklens reads every trace without them (the msgspec reference decoder, the
Python replay loop, SQLite itself); the scanner only makes large Kineto files decode several
times faster, the page scanner an Nsight export's big tables read several times faster, the
replay loop a deep graph (a capture without step marks) replay 13-17x faster. A machine
without a C compiler still installs ranklens.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "ranklens.ingest._kscan",
            ["ingest/_kscan.c"],
            depends=["ingest/_kscan_json.h", "ingest/_kscan_dict.h", "ingest/_kscan_events.h"],
            extra_compile_args=["-O3", "-fno-fast-math", "-ffp-contract=off"],
            optional=True,
        ),
        Extension(
            "ranklens.ingest._sqlscan",
            ["ingest/_sqlscan.c"],
            depends=["ingest/_sqlscan_pages.h"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
        Extension(
            "ranklens.analysis._replay",
            ["analysis/_replay.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
