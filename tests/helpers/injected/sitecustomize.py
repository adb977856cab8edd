"""Faults a test injects into a real worker process from its start (this folder goes first
on the process's ``PYTHONPATH``, so Python imports this module before anything else).

- ``TEST_FAULT_CLOCK_SKEW_S``: the process's wall clock (``time.time``) runs this many
  seconds ahead (negative: behind), as on a host whose clock is off; monotonic clocks
  are left alone, as they are by a skewed host clock.
- ``TEST_FAULT_KILL_THREAD`` and ``TEST_FAULT_KILL_WHEN``: once the file named by the
  second exists, the thread named by the first gets an exception raised inside it (at its
  next Python instruction, wherever it is in its loop), as an error nothing catches would.

Nothing here is a stand-in for the code under test: the worker runs as in production,
with its clock or one of its threads broken.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time


class InjectedThreadFault(RuntimeError):
    """Raised inside a worker thread by ``TEST_FAULT_KILL_THREAD``."""


def _skew_clock(skew_s: float) -> None:
    real_time, real_time_ns = time.time, time.time_ns
    time.time = lambda: real_time() + skew_s
    time.time_ns = lambda: real_time_ns() + int(skew_s * 1e9)


def _kill_thread_when(name: str, trigger: str) -> None:
    def watch() -> None:
        while not os.path.exists(trigger):
            time.sleep(0.02)
        while True:
            target = next((t for t in threading.enumerate() if t.name == name), None)
            if target is not None and target.ident is not None:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(target.ident), ctypes.py_object(InjectedThreadFault))
                return
            time.sleep(0.02)

    threading.Thread(target=watch, name="test-fault-injector", daemon=True).start()


if os.environ.get("TEST_FAULT_CLOCK_SKEW_S"):
    _skew_clock(float(os.environ["TEST_FAULT_CLOCK_SKEW_S"]))
if os.environ.get("TEST_FAULT_KILL_THREAD") and os.environ.get("TEST_FAULT_KILL_WHEN"):
    _kill_thread_when(os.environ["TEST_FAULT_KILL_THREAD"], os.environ["TEST_FAULT_KILL_WHEN"])
