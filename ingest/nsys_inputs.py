"""Which input files are Nsight reports, and whether a run may mix them with Kineto traces.

Why here and not in the loader: these are Nsight-specific rules about a run's file list.
* `nsys stats`, `nsys recipe` and users write `X.sqlite` beside `X.nsys-rep`: the two are one
  rank, so the export is read and the report left alone (else the rank is claimed twice, or
  ingest fails for want of `nsys` although the export is right there).
* Kineto and Nsight ranks in one run differ in what they record (process groups, sequence
  numbers, CPU operators, clock base), so cross-rank numbers silently compare unlike things;
  such a run is refused unless the user says they know (`allow_mixed`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ranklens.ingest.errors import RanklensError

NSYS_SUFFIXES = (".sqlite", ".nsys-rep")


class MixedFormatsError(RanklensError):
    """One run holds both Kineto traces and Nsight reports."""


def is_nsys(path: str) -> bool:
    return path.endswith(NSYS_SUFFIXES)


def split_formats(files: Sequence[str], *, allow_mixed: bool) -> tuple[list[str], list[str]]:
    """(files to ingest, warnings): reports with an export beside them dropped, mixing checked.

    Raises:
        MixedFormatsError: Kineto and Nsight files together and allow_mixed is False.
    """
    exports = {f[: -len(".sqlite")] for f in files if f.endswith(".sqlite")}
    twins = [f for f in files if f.endswith(".nsys-rep") and f[: -len(".nsys-rep")] in exports]
    notes = (
        [
            f"{len(twins)} .nsys-rep report(s) have their .sqlite export beside them (e.g. "
            f"{twins[0]}); the exports were read"
        ]
        if twins
        else []
    )
    keep = [f for f in files if f not in set(twins)]
    kin = [f for f in keep if not is_nsys(f)]
    nsys = [f for f in keep if is_nsys(f)]
    if kin and nsys:
        if not allow_mixed:
            raise MixedFormatsError(
                f"the run mixes {len(kin)} Kineto trace(s) (e.g. {kin[0]}) and {len(nsys)} "
                f"Nsight report(s) (e.g. {nsys[0]})",
                "give the files of one profiler per run (profile every rank the same way); to "
                "ingest them together anyway pass --allow-mixed (load_traces(allow_mixed=True))",
            )
        notes.append(
            f"mixed run allowed: {len(kin)} Kineto and {len(nsys)} Nsight file(s); the Nsight "
            "ranks' collectives get no inferred communicator and clocks come from different "
            "sources, so cross-rank matching and alignment may leave them out"
        )
    return keep, notes
