"""The lab's network: one network namespace per device, linked in the cluster's topology
by links shaped with ``tc tbf`` to the cluster's bandwidths (docs/lab.md, "Network").

:class:`LabNetwork` ``(cluster, device_ids)`` is a context manager that builds, for the
devices ``device_ids`` of ``cluster``:

- **a namespace per device** ``edgepipe-<pid>-<rand>-d<i>`` holding the device's data
  address ``198.18.0.<i+1>`` (the interface gloo binds, :attr:`LabDevice.interface`);
- **the data network**, by the cluster's topology (:attr:`Network.kind`, the cost model's
  channels: planner/cost/channels.py):

  - ``point_to_point``: a veth link per device pair, ``p<j>`` in device i's namespace and
    ``p<i>`` in j's, both ends carrying their device's address (/32) and a route to the
    peer's address over the link; each end's egress is shaped to the pair's bandwidth
    (:meth:`Cluster.bandwidth_mbps`, per-pair links included), so each direction of
    each pair is its own channel;
  - ``switched``: a bridge in a switch namespace ``...-sw``; device i's ``eth0`` is joined
    to it by port ``p<i>``; ``eth0``'s egress (the uplink) and ``p<i>``'s egress (the
    downlink) are both shaped to the device's port rate, min(network bandwidth, the
    type's interface bandwidth), each shared fairly among the peers of the moment
    (:meth:`LabNetwork._shape_fair`: one FIFO bucket gave two transfers into one device
    28.1 and 23.9 Mbit/s of 50; per-peer classes give 23.9 each, the cost model's
    halves);
  - ``shared_medium``: a bridge in a hub namespace ``...-hub`` whose every port's ingress
    is redirected (``tc ... u32 ... mirred``) through one ``ifb`` device ``air``, shaped
    to the medium's rate: every frame of every transfer, both directions, crosses that
    one bucket (a half-duplex channel), shared equally among the senders of the moment
    (by source address, :meth:`LabNetwork._shape_fair`), as Wi-Fi's stations share air
    time (one tbf FIFO gave the first of two transfers 41.6 and the second 23.7 Mbit/s
    of 50). A
    device whose port rate is below the medium's gets its ``eth0`` and its port shaped
    too.

- **the control network** ``...-ctl``: a bridge with an unshaped veth ``ctl0`` to every
  device namespace (``198.19.0.<i+2>``; the bridge holds :data:`STORE_ADDRESS`), which
  carries the launcher's store and the heartbeats, never the data.

Every address is in 198.18.0.0/15 (RFC 2544) and no interface is in this machine's own
namespace, so nothing leaves the lab. tc has no ``netem`` here: the lab runs latency 0,
and a cluster with latency gets a note (:attr:`LabNetwork.notes`) saying so.

A thread enters a namespace with :func:`entered` (``setns(2)``: namespaces are per thread
in Linux); a socket keeps the namespace it was created in.

Teardown (:meth:`LabNetwork.close`, idempotent): SIGKILL every process still in one of
the lab's namespaces (never this process), then delete the namespaces (their veths,
bridges, the ``ifb`` and every qdisc go with them). It runs on leaving the ``with``
(also on an exception or Ctrl-C), on SIGTERM (turned into ``SystemExit`` while the
network is up, from the main thread), on garbage collection and at interpreter exit
(``weakref.finalize``). :func:`remove_stale` deletes the namespaces of dead processes
(a run killed by SIGKILL).

Cost: O(n) ``ip``/``tc`` commands for n devices (O(n^2) point to point), a few ms each.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import FrameType

from edgepipe.executor.lab.errors import LabError, LabUnavailable
from edgepipe.planner.inputs.cluster import Cluster, Topology

PREFIX = "edgepipe-"
#: the data network's addresses: device i is DATA_NET.(i+1)
DATA_NET = "198.18.0"
#: the control network: the bridge (the launcher's store) .1, device i .(i+2)
CONTROL_NET = "198.19.0"
STORE_ADDRESS = f"{CONTROL_NET}.1"
#: at most this many devices (one /24 per network)
MAX_DEVICES = 250
#: token-bucket size floor; the bucket also holds at least BURST_MS of the rate
BURST_BYTES = 32 * 1024
BURST_MS = 2.0
#: packets queued longer than this in a bucket are dropped (TCP retransmits)
QUEUE_LATENCY_MS = 400
#: TCP payload per Ethernet frame under the shaper: MSS 1448 (1500 MTU less IP, TCP and
#: its timestamp option) of 1514 bytes on the wire; tbf counts the wire bytes, so a link
#: shaped to R carries R x GOODPUT of payload (docs/lab.md)
GOODPUT = 1448 / 1514
_NAME = re.compile(rf"^{PREFIX}(\d+)-[0-9a-f]+-(ctl|sw|hub|d\d+)$")
_NETNS_DIR = "/var/run/netns"
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def check_available() -> None:
    """Raise :class:`LabUnavailable` (one line: what is missing, and ``--emulate``) when
    this machine cannot build the lab's network: not root, or no ``ip`` / ``tc``."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (network namespaces and tc need it)")
    missing += [f"the `{tool}` command (iproute2)" for tool in ("ip", "tc")
                if shutil.which(tool) is None]
    if not os.path.exists("/proc/thread-self/ns/net"):
        missing.append("network namespaces (/proc/thread-self/ns/net)")
    if missing:
        raise LabUnavailable(
            f"the lab cannot run here: it needs {', '.join(missing)}; run the plan with "
            "--emulate instead (emulated devices and links)")


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LabError(f"{' '.join(argv)}: {exc}") from None
    if check and proc.returncode != 0:
        raise LabError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.returncode}")
    return proc


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(["ip", *args], check)


def list_namespaces() -> list[str]:
    """Names of every network namespace on this machine."""
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def leftover_namespaces(pid: int | None = None) -> list[str]:
    """The lab's namespaces created by process ``pid`` (default: this process)."""
    owner = os.getpid() if pid is None else pid
    return [n for n in list_namespaces() if (m := _NAME.match(n)) and int(m[1]) == owner]


def _setns(fd: int, what: str) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise LabError(f"setns into {what}: {os.strerror(err)}")


def enter(namespace: str) -> None:
    """Move the calling thread into ``namespace`` for good (a spawned device process
    does this first thing, before it opens any socket)."""
    fd = os.open(os.path.join(_NETNS_DIR, namespace), os.O_RDONLY)
    try:
        _setns(fd, namespace)
    finally:
        os.close(fd)


@contextlib.contextmanager
def entered(namespace: str) -> Iterator[None]:
    """Run the body with the calling thread in ``namespace``, then back where it was.
    Sockets opened in the body stay in ``namespace``; threads started in it inherit it."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        enter(namespace)
        try:
            yield
        finally:
            _setns(home, "this thread's own network namespace")
    finally:
        os.close(home)


def _pids_in(namespace: str) -> list[int]:
    out = _ip("netns", "pids", namespace, check=False).stdout
    return [int(p) for p in out.split()]


def _teardown(namespaces: list[str]) -> None:
    """SIGKILL every process left in ``namespaces`` (never this one), delete them."""
    for ns in reversed(namespaces):
        for _ in range(50):
            pids = [p for p in _pids_in(ns) if p != os.getpid()]
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        _ip("netns", "delete", ns, check=False)
    namespaces.clear()


def remove_stale() -> list[str]:
    """Delete the lab's namespaces whose creating process is gone; returns their names."""
    stale = [n for n in list_namespaces()
             if (m := _NAME.match(n)) and not os.path.exists(f"/proc/{m[1]}")]
    _teardown(list(stale))
    return stale


@dataclass(frozen=True)
class LabDevice:
    """One device's place in the lab: its namespace, its data address and the interface
    holding it (gloo's ``GLOO_SOCKET_IFNAME``), its control-network address."""

    id: str
    namespace: str
    address: str
    interface: str
    control_address: str


@dataclass(frozen=True)
class ShapedLink:
    """One token bucket: interface ``dev`` in ``namespace`` shaped to ``rate_mbps``
    (its egress), standing for ``channel`` (planner/cost/channels.py's name)."""

    namespace: str
    dev: str
    rate_mbps: float
    channel: str


def _burst(rate_mbps: float) -> int:
    return max(BURST_BYTES, int(rate_mbps * 1e6 / 8 * BURST_MS / 1e3))


class LabNetwork:
    """The lab's namespaces and links for ``device_ids`` of ``cluster`` (module
    docstring); a context manager. ``devices`` maps each id to its :class:`LabDevice`,
    ``shaped`` lists every token bucket, ``notes`` what the lab does not reproduce."""

    def __init__(self, cluster: Cluster, device_ids: Sequence[str]) -> None:
        check_available()
        if not 1 <= len(device_ids) <= MAX_DEVICES:
            raise LabError(f"the lab runs 1 to {MAX_DEVICES} devices, not {len(device_ids)}")
        unknown = [d for d in device_ids if not cluster.has_device(d)]
        if unknown:
            raise LabError(f"device(s) {', '.join(unknown)} are not in cluster {cluster.name}")
        self.cluster, self.ids = cluster, list(device_ids)
        self.topology: Topology = cluster.network.kind
        tag = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
        self.control_namespace = f"{tag}-ctl"
        self._hub = f"{tag}-{'sw' if self.topology == 'switched' else 'hub'}"
        single = len(device_ids) == 1
        self.devices = {
            d: LabDevice(
                d, f"{tag}-d{i}", f"{DATA_NET}.{i + 1}",
                "lo" if single else "p1" if self.topology == "point_to_point" and i == 0
                else "p0" if self.topology == "point_to_point" else "eth0",
                f"{CONTROL_NET}.{i + 2}")
            for i, d in enumerate(device_ids)
        }
        self.shaped: list[ShapedLink] = []
        self.notes = self._notes()
        self._namespaces: list[str] = []
        self._finalizer = weakref.finalize(self, _teardown, self._namespaces)
        self._previous_sigterm: object = None

    # -- what the lab reproduces -------------------------------------------------------
    def _index(self, device: str) -> int:
        return self.cluster.index(device)

    def port_mbps(self, device: str) -> float:
        """A device's port rate (switched, shared medium): the network's bandwidth capped
        by its interface's."""
        return min(self.cluster.network.bandwidth_mbps,
                   self.cluster.type_of(self._index(device)).bandwidth_mbps)

    def medium_mbps(self) -> float:
        """The shared medium's rate: the fastest port's (a pair's rate alone is the
        slower of its two ports)."""
        return max(self.port_mbps(d) for d in self.ids)

    def _notes(self) -> list[str]:
        """What the cluster asks that the lab does not reproduce (module docstring)."""
        c, notes = self.cluster, []
        pairs = [(a, b) for k, a in enumerate(self.ids) for b in self.ids[k + 1:]]
        lat = max((c.latency_ms(self._index(a), self._index(b)) for a, b in pairs),
                  default=0.0)
        if lat > 0:
            notes.append(f"the lab runs latency 0 (tc has no netem here); cluster "
                         f"{c.name}'s links have up to {lat:g} ms, which predictions count")
        if self.topology != "point_to_point":
            off = [(a, b, c.bandwidth_mbps(self._index(a), self._index(b)))
                   for a, b in pairs]
            off = [(a, b, want) for a, b, want in off
                   if want != min(self.port_mbps(a), self.port_mbps(b))]
            if off:
                a, b, want = off[0]
                notes.append(
                    f"the lab shapes ports, not pairs, on a {self.topology} network: pair "
                    f"{a}-{b} runs at {min(self.port_mbps(a), self.port_mbps(b)):g} Mbit/s, "
                    f"not its link's {want:g} ({len(off)} such pair(s))")
        return notes

    # -- building ----------------------------------------------------------------------
    def __enter__(self) -> LabNetwork:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.signal(signal.SIGTERM, _sigterm)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill what is left in the lab's namespaces and delete them (idempotent)."""
        if self._previous_sigterm is not None:
            with contextlib.suppress(ValueError):  # not the main thread
                signal.signal(signal.SIGTERM, self._previous_sigterm)  # type: ignore[arg-type]
            self._previous_sigterm = None
        _teardown(self._namespaces)

    def sent_bytes(self) -> dict[str, int]:
        """Bytes (whole frames) each shaped link has sent so far, by its channel: what
        crossed the data network (the control network is not shaped, not counted).
        One ``tc -s -j`` command per link."""
        sent = {}
        for link in self.shaped:
            out = _run(["tc", "-n", link.namespace, "-s", "-j", "qdisc", "show", "dev",
                        link.dev, "root"]).stdout
            sent[link.channel] = sum(int(q.get("bytes", 0)) for q in json.loads(out))
        return sent

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._namespaces.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _bridge(self, namespace: str) -> None:
        _ip("-n", namespace, "link", "add", "br0", "type", "bridge")
        _ip("-n", namespace, "link", "set", "br0", "up")

    def _veth(self, ns_a: str, dev_a: str, ns_b: str, dev_b: str) -> None:
        _ip("link", "add", dev_a, "netns", ns_a, "type", "veth", "peer", "name", dev_b,
            "netns", ns_b)
        _ip("-n", ns_a, "link", "set", dev_a, "up")
        _ip("-n", ns_b, "link", "set", dev_b, "up")

    def _shape(self, namespace: str, dev: str, rate_mbps: float, channel: str) -> None:
        _run(["tc", "-n", namespace, "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
              f"{rate_mbps:g}mbit", "burst", str(_burst(rate_mbps)), "latency",
              f"{QUEUE_LATENCY_MS}ms"])
        self.shaped.append(ShapedLink(namespace, dev, rate_mbps, channel))

    def _build(self) -> None:
        self._add_namespace(self.control_namespace)
        self._bridge(self.control_namespace)
        _ip("-n", self.control_namespace, "addr", "add", f"{STORE_ADDRESS}/24", "dev", "br0")
        for i, dev in enumerate(self.devices.values()):
            self._add_namespace(dev.namespace)
            self._veth(dev.namespace, "ctl0", self.control_namespace, f"c{i}")
            _ip("-n", self.control_namespace, "link", "set", f"c{i}", "master", "br0")
            _ip("-n", dev.namespace, "addr", "add", f"{dev.control_address}/24", "dev", "ctl0")
        if len(self.ids) == 1:
            _ip("-n", self.devices[self.ids[0]].namespace, "addr", "add",
                f"{self.devices[self.ids[0]].address}/32", "dev", "lo")
        elif self.topology == "point_to_point":
            self._point_to_point()
        else:
            self._star()

    def _point_to_point(self) -> None:
        """A veth per pair, each end shaped to the pair's rate (module docstring)."""
        devs = list(self.devices.values())
        for i, a in enumerate(devs):
            for j in range(i + 1, len(devs)):
                b = devs[j]
                self._veth(a.namespace, f"p{j}", b.namespace, f"p{i}")
                rate = self.cluster.bandwidth_mbps(self._index(a.id), self._index(b.id))
                for me, peer, dev in ((a, b, f"p{j}"), (b, a, f"p{i}")):
                    _ip("-n", me.namespace, "addr", "add", f"{me.address}/32", "dev", dev)
                    _ip("-n", me.namespace, "route", "add", f"{peer.address}/32", "dev", dev,
                        "src", me.address)
                    self._shape(me.namespace, dev, rate, f"{me.id}->{peer.id}")

    def _star(self) -> None:
        """Every device's ``eth0`` on one bridge: a switch, or a hub whose ports' ingress
        all crosses one shaped ``ifb`` (module docstring)."""
        hub = self._hub
        self._add_namespace(hub)
        self._bridge(hub)
        medium = self.topology == "shared_medium"
        if medium:
            _ip("-n", hub, "link", "add", "air", "type", "ifb")
            _ip("-n", hub, "link", "set", "air", "up")
            self._shape_fair(hub, "air", self.medium_mbps(), "medium", "src")
        for i, dev in enumerate(self.devices.values()):
            port = f"p{i}"
            self._veth(dev.namespace, "eth0", hub, port)
            _ip("-n", hub, "link", "set", port, "master", "br0")
            _ip("-n", dev.namespace, "addr", "add", f"{dev.address}/24", "dev", "eth0")
            rate = self.port_mbps(dev.id)
            if medium:
                _run(["tc", "-n", hub, "qdisc", "add", "dev", port, "handle", "ffff:",
                      "ingress"])
                _run(["tc", "-n", hub, "filter", "add", "dev", port, "parent", "ffff:",
                      "protocol", "all", "u32", "match", "u32", "0", "0", "action", "mirred",
                      "egress", "redirect", "dev", "air"])
            if not medium or rate < self.medium_mbps():
                self._shape_fair(dev.namespace, "eth0", rate, f"{dev.id} up", "dst")
                self._shape_fair(hub, port, rate, f"{dev.id} down", "src")


    def _shape_fair(self, namespace: str, dev: str, rate_mbps: float, channel: str,
                    by: str) -> None:
        """Shape ``dev``'s egress to ``rate_mbps`` under HTB with one class per lab device,
        matched by its address as the frame's ``by`` (``src``: per sender; ``dst``: per
        receiver), each guaranteed 1/(n+1) of the rate and allowed all of it, so the
        peers of the moment share the channel equally (HTB's round robin: the cost
        model's fair shares); frames of no device (ARP) share one more class. O(n)
        commands."""
        tc, burst = ["tc", "-n", namespace], str(_burst(rate_mbps))
        _run([*tc, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default",
              "ffff"])
        _run([*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb",
              "rate", f"{rate_mbps:g}mbit", "burst", burst])
        peers = list(self.devices.values())
        share = f"{rate_mbps / (len(peers) + 1):g}mbit"
        for i, peer in enumerate([*peers, None]):
            classid = f"1:{i + 16 if peer else 0xffff:x}"
            _run([*tc, "class", "add", "dev", dev, "parent", "1:1", "classid", classid, "htb",
                  "rate", share, "ceil", f"{rate_mbps:g}mbit", "burst", burst, "cburst",
                  burst])
            if peer is not None:
                _run([*tc, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip",
                      "u32", "match", "ip", by, f"{peer.address}/32", "flowid", classid])
        self.shaped.append(ShapedLink(namespace, dev, rate_mbps, channel))


def _sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM while the lab is up: unwind (the ``with`` blocks tear the lab down)."""
    raise SystemExit(128 + signum)
