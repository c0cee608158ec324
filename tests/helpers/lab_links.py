"""Measuring the lab's links: real TCP transfers between device namespaces, timed here.

:func:`rates` starts the transfers ``(sender, receiver)`` at once, each ``nbytes`` over
its own TCP connection, from threads of this process that enter the devices'
namespaces (a socket stays in the namespace it was made in), and returns each
transfer's goodput in Mbit/s: payload bits over the time from its first ``send`` to the
receiver's last byte. Shares no code with the lab's shaping (it reads only the
namespaces and addresses a :class:`~executor.lab.network.LabNetwork` gives).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence

from edgepipe.executor.lab.network import LabNetwork, entered
from edgepipe.planner.inputs.cluster import Cluster, Topology

#: seconds any one transfer may take before the measurement fails
DEADLINE_S = 60.0


def cluster(n: int, topology: Topology, bandwidth_mbps: float = 50.0,
            latency_ms: float = 0.0, links: Sequence[tuple[str, str, float]] = ()) -> Cluster:
    """``n`` Jetson Nanos ``d0..`` (1 Gbit/s interfaces) on a ``bandwidth_mbps`` network,
    with per-pair ``links`` ``(a, b, Mbit/s)``."""
    return Cluster.from_dict({
        "schema_version": 1, "kind": "edgepipe.cluster", "name": f"lab-{topology}-{n}",
        "devices": [{"id": f"d{i}", "type": "jetson-nano"} for i in range(n)],
        "network": {"bandwidth_mbps": bandwidth_mbps, "latency_ms": latency_ms,
                    "topology": topology,
                    "links": [{"a": a, "b": b, "bandwidth_mbps": r} for a, b, r in links]},
    })


def _receive(listener: socket.socket, nbytes: int, ends: dict[int, float],
             key: int) -> None:
    conn, _ = listener.accept()
    with conn:
        conn.settimeout(DEADLINE_S)
        got = 0
        while got < nbytes:
            chunk = conn.recv(1 << 20)
            if not chunk:
                break
            got += len(chunk)
        ends[key] = time.monotonic()
        conn.sendall(b"k")


def rates(net: LabNetwork, transfers: Sequence[tuple[str, str]], nbytes: int) -> list[float]:
    """Goodput (Mbit/s) of each transfer ``(sender, receiver)``, all started together."""
    listeners, conns = [], []
    ends: dict[int, float] = {}
    try:
        for _, dst in transfers:
            with entered(net.devices[dst].namespace):
                lis = socket.create_server((net.devices[dst].address, 0))
            listeners.append(lis)
        threads = [threading.Thread(target=_receive, args=(lis, nbytes, ends, k))
                   for k, lis in enumerate(listeners)]
        for t in threads:
            t.start()
        for (src, _), lis in zip(transfers, listeners, strict=True):
            with entered(net.devices[src].namespace):
                conns.append(socket.create_connection(lis.getsockname()[:2],
                                                      timeout=DEADLINE_S))
        starts: dict[int, float] = {}
        senders = [threading.Thread(target=_send, args=(c, nbytes, starts, k))
                   for k, c in enumerate(conns)]
        for t in senders:
            t.start()
        for t in [*senders, *threads]:
            t.join(DEADLINE_S)
        return [nbytes * 8 / (ends[k] - starts[k]) / 1e6 for k in range(len(transfers))]
    finally:
        for s in [*conns, *listeners]:
            s.close()


def _send(conn: socket.socket, nbytes: int, starts: dict[int, float], key: int) -> None:
    block = bytes(1 << 16)
    starts[key] = time.monotonic()
    sent = 0
    while sent < nbytes:
        sent += conn.send(block[: min(len(block), nbytes - sent)])
    conn.recv(1)
