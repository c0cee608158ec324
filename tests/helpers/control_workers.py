"""Worker bodies for tests/integration/test_control.py (module level, so spawned processes
import them).

Each worker connects to the coordinator's store, starts its heartbeat thread and runs a
loop that calls ``WorkerControl.check`` every 10 ms; what it sees is written back into the
store under ``t/`` (wall-clock seconds), and its exit code says why it stopped:
0 generation aborted, 3 fenced, 4 coordinator lost.
"""

from __future__ import annotations

import os
import sys
import time

import torch
from edgepipe.executor.ft.control import (
    CoordinatorLost,
    Fenced,
    GenerationAborted,
    WorkerControl,
    connect_store,
)

EXIT_ABORTED, EXIT_FENCED, EXIT_LOST = 0, 3, 4
#: the heartbeat connection's store timeout: how long a lost coordinator takes to notice
LOST_AFTER_S = 2.0
#: the reporting connection's (``t/`` keys) time-out: it only stops a hung test (a 2 s
#: connect to the pytest process's store timed out once on a quiet machine, 2026-12-07)
REPORT_TIMEOUT_S = 60.0


def beat_and_check(
    port: int, device: str, interval_s: float, busy: bool = False, host: str = "127.0.0.1"
) -> None:
    """Beat, check every 10 ms (``busy``: between 50 ms matrix products, a slow device)."""
    torch.set_num_threads(1)
    store = connect_store(host, port, timeout_s=REPORT_TIMEOUT_S)
    control = WorkerControl(
        lambda: connect_store(host, port, timeout_s=LOST_AFTER_S), device, interval_s
    )
    control.start()
    store.set(f"t/ready/{device}", str(os.getpid()))
    a = torch.randn(256, 256)
    try:
        while True:
            control.check(generation=1)
            if busy:
                deadline = time.perf_counter() + 0.05
                while time.perf_counter() < deadline:
                    a = torch.tanh(a @ a)
            else:
                time.sleep(0.01)
    except GenerationAborted:
        store.set(f"t/aborted/{device}", repr(time.time()))
        sys.exit(EXIT_ABORTED)
    except Fenced:
        sys.exit(EXIT_FENCED)
    except CoordinatorLost:
        sys.exit(EXIT_LOST)


def host_and_wait(port_file: str) -> None:
    """A stand-alone coordinator: host the store, publish its port, wait to be killed."""
    from edgepipe.executor.ft.control import host_store

    store = host_store(0)
    with open(port_file + ".tmp", "w") as f:
        f.write(str(store.port))
    os.replace(port_file + ".tmp", port_file)
    while True:
        time.sleep(1)
