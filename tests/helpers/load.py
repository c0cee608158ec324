"""Load that a test makes itself, to show that a timing verdict holds on a busy machine
(docs/testing.md, "Timing verdicts"): :func:`busy_cores` keeps ``n`` cores busy with
child processes that spin, for the duration of a ``with`` block."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

#: a child that spins until killed (pure Python: one core each)
SPIN = "while True: pass"


@contextmanager
def busy_cores(n: int = 2) -> Iterator[list[int]]:
    """``n`` child processes, each spinning on a core, for the ``with`` block (their
    pids); each is SIGKILLed and reaped by its pid afterwards, whatever the block did."""
    procs = [subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.DEVNULL)
             for _ in range(n)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=10)


def wakeup_lateness_s(tries: int = 20, interval_s: float = 0.01) -> float:
    """The reference for a verdict on a poll or a heartbeat: how late, at most, this
    process wakes from ``tries`` sleeps of ``interval_s`` on this machine now (a loaded
    machine wakes pollers late; an idle one within a millisecond). O(tries) sleeps."""
    late = 0.0
    for _ in range(tries):
        start = time.monotonic()
        time.sleep(interval_s)
        late = max(late, time.monotonic() - start - interval_s)
    return late
