"""`--engine ray --ray-address` where nothing listens, or where the cluster refuses this
driver: a clear error with what to do, in seconds, from ranklens.

Why: Ray retries an address where nothing listens for minutes (a mistyped port ran 6 minutes
before it was killed, with nothing said), and of a cluster that refuses the driver's token it
raises only "Failed to connect to Ray cluster" (after ~20 s, its reason in its own C++ log)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from ranklens.ingest import ray_engine
from ranklens.ingest.errors import RanklensError

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "megatron_tp2_pp2_dp2" / "raw"
RANKLENS = str(Path(sys.executable).with_name("ranklens"))


@pytest.mark.parametrize(
    ("address", "want"),
    [
        ("10.0.0.5:6379", ("10.0.0.5", 6379)),
        ("ray://head.example:10001", ("head.example", 10001)),
        ("[::1]:6380", ("::1", 6380)),
        ("auto", None),
        ("local", None),
        ("head:port", None),
        (":6379", None),
    ],
)
def test_the_address_read_for_the_check(address: str, want: object) -> None:
    assert ray_engine._host_port(address) == want


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_nothing_listening_is_said_at_once(tmp_path: Path) -> None:
    """The console script, as a user runs it, on a port where nothing listens."""
    pytest.importorskip("ray", reason="Ray is part of the dev extra (CI installs it)")
    port = _free_port()
    t0 = time.monotonic()
    done = subprocess.run(
        [RANKLENS, "ingest", str(SAMPLE), "-o", str(tmp_path / "run"), "--engine", "ray",
         "--ray-address", f"127.0.0.1:{port}"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    took = time.monotonic() - t0
    assert done.returncode != 0
    assert f"error: no Ray cluster answers at 127.0.0.1:{port}" in done.stderr, done.stderr
    assert "hint: start the cluster (`ray start --head`" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists() and not list(tmp_path.glob(".run*"))
    # Ray alone was still retrying after minutes; the check gives up after _REACH_S
    assert took < 120, took


class _Ray:
    """What `_connect` asks of Ray: an init that refuses, as a cluster refusing the token."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def init(self, **kwargs: Any) -> None:
        self.calls.append(kwargs)
        raise ConnectionError(f"Failed to connect to Ray cluster at {kwargs['address']}.")


def test_a_refusal_where_something_answers_names_the_token() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        ray = _Ray()
        with pytest.raises(RanklensError) as err:
            ray_engine._connect(ray, address, 2)
    assert ray.calls and ray.calls[0]["address"] == address  # it got past the check
    assert f"cannot start or reach Ray at {address}" in err.value.message
    assert err.value.hint is not None
    assert "RAY_AUTH_TOKEN" in err.value.hint and "~/.ray/auth_token" in err.value.hint


def test_addresses_ray_resolves_itself_are_not_checked() -> None:
    ray = _Ray()
    with pytest.raises(RanklensError) as err:
        ray_engine._connect(ray, "auto", 2)
    assert ray.calls[0]["address"] == "auto"
    assert err.value.hint is not None
    assert "check --ray-address" in err.value.hint and "RAY_AUTH_TOKEN" not in err.value.hint


@pytest.mark.parametrize(
    ("present", "noted"),
    [
        ({"rfc3987_syntax"}, True),  # Jupyter's environment: jsonschema takes the slow one
        ({"rfc3987_syntax", "rfc3987"}, False),  # jsonschema prefers rfc3987
        (set(), False),
        ({"rfc3987"}, False),
    ],
)
def test_an_environment_that_slows_every_ray_process_is_named(
    monkeypatch: pytest.MonkeyPatch, present: set[str], noted: bool
) -> None:
    monkeypatch.setattr(ray_engine, "_installed", lambda name: name in present)
    notes = ray_engine.environment_notes()
    assert bool(notes) == noted
    if noted:
        assert "rfc3987_syntax" in notes[0] and "pip install rfc3987" in notes[0]


def test_the_check_reads_this_environment() -> None:
    """_installed asks the import system, without importing (jsonschema, here, is not)."""
    assert ray_engine._installed("json") and not ray_engine._installed("no_such_module_xyz")
    assert "rfc3987_syntax" not in sys.modules or ray_engine._installed("rfc3987_syntax")
