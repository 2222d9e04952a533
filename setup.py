"""Build hook for the optional C accelerator (ranklens.ingest._kscan).

Why optional: ranklens reads every trace without it (the msgspec reference decoder); the
scanner only makes large Kineto files decode several times faster. A machine without a C
compiler still installs ranklens.
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
        )
    ]
)
