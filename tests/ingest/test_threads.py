"""ingest/threads.py: a stop that lands while the starter waits leaves the thread's state
true (threading's own join() says a running thread has ended, up to Python 3.12)."""

from __future__ import annotations

import _thread
import threading

import pytest
from ranklens.ingest.threads import Helper


def _interrupt_main_after(seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, _thread.interrupt_main)
    timer.start()
    return timer


def test_ctrl_c_while_waiting_leaves_the_thread_running() -> None:
    release = threading.Event()
    helper = Helper(lambda: release.wait(30), name="test-helper").start()
    _interrupt_main_after(0.2)
    with pytest.raises(KeyboardInterrupt):
        helper.wait()
    assert helper.running  # it is still waiting for `release`
    assert not helper.wait(0.1)  # a timeout is not its end
    release.set()
    assert helper.wait(10)
    assert not helper.running


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_an_error_ends_it_too() -> None:
    def fail() -> None:
        raise ValueError("boom")

    helper = Helper(fail, name="test-helper-error")
    assert not helper.running  # not started: nothing to wait for
    assert helper.wait(0)
    helper.start()
    assert helper.wait(10)
    assert helper.done
    # the error reaches threading's excepthook after the flag: let it, inside this test
    helper.thread.join(10)
