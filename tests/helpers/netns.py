"""Emulated hosts for multi-host tests: Linux network namespaces on this machine.

``with Hosts(3, rate_mbit=100) as hosts:`` creates three host namespaces and a switch
namespace holding a bridge; each host is joined to the bridge by a veth pair (``eth0``
inside the host, ``h<i>`` on the switch) and gets address ``198.18.0.<i+1>/24``, from the
198.18.0.0/15 benchmarking range (RFC 2544), so no traffic can leave the namespaces: none
of the interfaces is in the root namespace and nothing routes between them and it. Every
host has its own loopback and network stack but shares this machine's filesystem, so
``hosts.start(i, argv)`` runs any local program (the venv's ``torchrun``) inside host
``i`` through ``ip netns exec``.

Bandwidth is shaped with a token-bucket filter (``tc qdisc ... tbf``) on both ends of a
host's link (the host's egress and the switch port's egress towards it), so the host's
NIC rate caps what it sends and what it receives. ``netem`` is unavailable here, so
there is no added latency or loss.

Teardown, in this order, on ``__exit__`` (also when the body raised), on garbage
collection and at interpreter exit (``weakref.finalize``): SIGKILL the process group of
every process started through :meth:`Hosts.start`, then every process still inside one
of the namespaces (``ip netns pids``: descendants of ours, such as torchrun's workers),
then delete the namespaces. Names are ``ep-<pid>-<random>-<role>``, so parallel runs never
clash, :func:`leftover_namespaces` finds those of a process, and :func:`remove_stale`
clears namespaces whose creating process no longer exists (a run killed by SIGKILL).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

PREFIX = "ep-"
SUBNET = "198.18.0"
#: token-bucket size: large enough for line-rate bursts at the rates tests use, small
#: enough that a 1 MB transfer is dominated by the shaped rate
BURST_BYTES = 32 * 1024
#: packets queued longer than this in the bucket are dropped (TCP retransmits)
QUEUE_LATENCY_MS = 400
_NAME = re.compile(rf"^{PREFIX}(\d+)-[0-9a-f]+-(sw|h\d+)$")


class NetnsError(RuntimeError):
    """A namespace command failed; the message carries the command and its stderr."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def list_namespaces() -> list[str]:
    """Names of every network namespace on this machine."""
    out = _ip("netns", "list").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def leftover_namespaces(pid: int | None = None) -> list[str]:
    """Namespaces created by this harness in process ``pid`` (default: this process)."""
    owner = os.getpid() if pid is None else pid
    return [n for n in list_namespaces() if (m := _NAME.match(n)) and int(m[1]) == owner]


def _pids_in(namespace: str) -> list[int]:
    out = _ip("netns", "pids", namespace, check=False).stdout
    return [int(p) for p in out.split()]


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _teardown(namespaces: list[str], procs: list[subprocess.Popen[Any]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _kill(proc.pid)
    for ns in namespaces:
        for _ in range(50):
            pids = _pids_in(ns)
            if not pids:
                break
            for pid in pids:
                _kill(pid)
            time.sleep(0.05)
        _ip("netns", "delete", ns, check=False)
    procs.clear()
    namespaces.clear()


def remove_stale() -> list[str]:
    """Tear down harness namespaces whose creating process is gone; returns their names."""
    stale = []
    for n in list_namespaces():
        m = _NAME.match(n)
        if m and not os.path.exists(f"/proc/{m[1]}"):
            stale.append(n)
    _teardown(list(stale), [])
    return stale


@dataclass(frozen=True)
class Host:
    """One emulated host: its namespace and its address on the bridge."""

    index: int
    namespace: str
    address: str


class Hosts:
    """``n`` hosts on one bridge, each NIC shaped to ``rate_mbit`` (None: unshaped).

    A context manager; see the module docstring for the topology and the teardown.
    """

    def __init__(self, n: int, *, rate_mbit: float | None = None) -> None:
        if not 1 <= n <= 250:
            raise ValueError(f"1..250 hosts, got {n}")
        tag = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
        self.switch = f"{tag}-sw"
        self.hosts = [Host(i, f"{tag}-h{i}", f"{SUBNET}.{i + 1}") for i in range(n)]
        self._namespaces: list[str] = []
        self._procs: list[subprocess.Popen[Any]] = []
        self._finalizer = weakref.finalize(self, _teardown, self._namespaces, self._procs)
        self._rate = rate_mbit

    def __enter__(self) -> Hosts:
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getitem__(self, index: int) -> Host:
        return self.hosts[index]

    def __len__(self) -> int:
        return len(self.hosts)

    def _create(self) -> None:
        sw = self.switch
        _ip("netns", "add", sw)
        self._namespaces.append(sw)
        _ip("-n", sw, "link", "add", "br0", "type", "bridge")
        _ip("-n", sw, "link", "set", "br0", "up")
        for h in self.hosts:
            _ip("netns", "add", h.namespace)
            self._namespaces.append(h.namespace)
            port = f"h{h.index}"
            _ip("link", "add", "eth0", "netns", h.namespace, "type", "veth",
                "peer", "name", port, "netns", sw)
            _ip("-n", sw, "link", "set", port, "master", "br0")
            _ip("-n", sw, "link", "set", port, "up")
            _ip("-n", h.namespace, "addr", "add", f"{h.address}/24", "dev", "eth0")
            _ip("-n", h.namespace, "link", "set", "eth0", "up")
            _ip("-n", h.namespace, "link", "set", "lo", "up")
            if self._rate is not None:
                self.shape(h.index, self._rate)

    def shape(self, index: int, rate_mbit: float) -> None:
        """Cap host ``index``'s link at ``rate_mbit`` in both directions (tbf)."""
        h = self.hosts[index]
        for ns, dev in ((h.namespace, "eth0"), (self.switch, f"h{h.index}")):
            subprocess.run(
                ["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root",
                 "tbf", "rate", f"{rate_mbit}mbit", "burst", str(BURST_BYTES),
                 "latency", f"{QUEUE_LATENCY_MS}ms"],
                check=True, capture_output=True, timeout=30,
            )

    def set_link(self, index: int, up: bool) -> None:
        """Take host ``index``'s link down or up (from the switch side)."""
        _ip("-n", self.switch, "link", "set", f"h{index}", "up" if up else "down")

    def start(self, index: int, argv: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside host ``index`` in a new session (its own process group,
        killed as a group at teardown). ``popen`` goes to ``subprocess.Popen``."""
        if not self._namespaces:
            raise NetnsError("hosts are not set up (use them inside 'with')")
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.hosts[index].namespace, *argv],
            start_new_session=True, **popen,
        )
        self._procs.append(proc)
        return proc

    def run(self, index: int, argv: Sequence[str], timeout: float = 60) -> (
        subprocess.CompletedProcess[str]
    ):
        """Run ``argv`` in host ``index`` to completion; returns stdout/stderr as text."""
        proc = self.start(index, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise NetnsError(f"{argv} in host {index} ran past {timeout} s") from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def close(self) -> None:
        """Kill every process and delete every namespace (idempotent)."""
        _teardown(self._namespaces, self._procs)
