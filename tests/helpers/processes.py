"""Processes the tests start: the interpreter, free ports, the torchrun command line of a
multi-host job, a child run inside a lab cgroup, and the checks and reaping that leave no
child behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tests.helpers import netns

if TYPE_CHECKING:  # the lab's modules only where a test runs a child in a group
    from edgepipe.executor.lab.cgroups import Cgroup

#: the interpreter running the tests, for every child process
PY = sys.executable
#: torchrun as the recipe runs it: its agents' exit barrier short (executor/agent.py)
TORCHRUN = [PY, "-m", "edgepipe.executor.agent"]


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    """Whether a process with ``pid`` still exists (a zombie counts until reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def with_timeout_reap(pid: int) -> None:
    """Reap ``pid`` (a child of this process) once it has ended, waiting at most 5 s;
    returns at once if it is not this process's child."""
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        time.sleep(0.01)


def ctrl_c_at_default() -> None:
    """``preexec_fn`` of a child that must get Ctrl-C: SIGINT at its default, which
    Python turns into KeyboardInterrupt (a background job inherits it ignored, and an
    ignored signal stays ignored across exec)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def group_gone(pgid: int) -> bool:
    """Whether every process of group ``pgid`` has ended, waiting at most 10 s; SIGKILL
    the group where not."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    os.killpg(pgid, signal.SIGKILL)
    return False


def torchrun_argv(hosts: netns.Hosts | Sequence[netns.Host], index: int, script: list[str],
                  port: int = 29400, exit_barrier_s: float | None = None) -> list[str]:
    """The documented recipe (docs/executor.md): one agent per host, c10d rendezvous at
    host 0, which hosts the store; --local-addr orders the node ranks. ``exit_barrier_s``:
    the agents' ``--exit-barrier`` (default the agent's, 10 s), how long a survivor
    waits for the agent of a lost host."""
    barrier = [] if exit_barrier_s is None else ["--exit-barrier", str(exit_barrier_s)]
    return [
        *TORCHRUN, *barrier, "--nnodes", str(len(hosts)), "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{hosts[0].address}:{port}",
        "--rdzv-id", "edgepipe-test", "--rdzv-conf", f"is_host={int(index == 0)}",
        "--local-addr", hosts[index].address, "--max-restarts", "0", *script,
    ]


def run_in_group(group: Cgroup, code: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -c code argv...`` as a member of ``group`` from its first line on:
    the child must wait for a line on stdin (it gets ``go``) before it works. The child
    is reaped (killed by pid after 60 s) whatever happens."""
    proc = subprocess.Popen(
        [PY, "-c", code, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )
    try:
        group.add(proc.pid)
        out, err = proc.communicate("go\n", timeout=60)
    finally:
        proc.kill()
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
