"""Which sharing rules the lab's network follows (issue 25 item 4; docs/lab.md "What the
network semantics follow"): real TCP transfers between lab namespaces
(:mod:`executor.lab.network`), started together, each timed from its first send to its
receiver's last byte (:func:`tests.helpers.lab_links.rates`), set against a transfer
alone on the same link in the same round.

Probes (50 Mbit/s, 3 MB a transfer unless stated; each a ratio to the transfer alone,
so the machine's load cancels):

- ``medium: both ways``: d0 -> d1 and d1 -> d0 on the shared medium (a boundary's
  activations and gradients at once): fair sharing says 2.0 each, a half-duplex
  channel that serializes says 1.0 and 2.0.
- ``switch: both ways``: the same on a switch: full-duplex ports say 1.0 each.
- ``medium: one sender two pieces``: d0 -> d1, d0 -> d2, d3 -> d1 on the medium:
  max-min fair per transfer says 3.0 each; per sender (a station's share, 802.11's
  DCF) says d3's 2.0 and d0's two 3.0.
- ``switch: one uplink``: d0 -> d1 and d0 -> d2 on a switch: d0's uplink shared, 2.0.
- ``bucket: N KB alone``: one transfer of N KB on a point-to-point link against N / (rate
  x goodput): the token bucket (32 KiB at 50 Mbit/s) lets a small piece through at once.

Run as root: ``.venv/bin/python benchmarks/network_semantics.py [--rounds 3]``. Prints
one table (median ratio over the rounds, the range, the load before and after).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgepipe.executor.lab.network import GOODPUT, LabNetwork

from tests.helpers.lab_links import cluster, rates

RATE = 50.0
NBYTES = 3_000_000

#: name, topology, devices, transfers, what fair sharing per transfer / per sender predicts
PROBES: list[tuple[str, str, int, list[tuple[str, str]], list[float], list[float]]] = [
    ("medium: both ways", "shared_medium", 2, [("d0", "d1"), ("d1", "d0")],
     [2.0, 2.0], [2.0, 2.0]),
    ("switch: both ways", "switched", 2, [("d0", "d1"), ("d1", "d0")], [1.0, 1.0], [1.0, 1.0]),
    ("medium: one sender two pieces", "shared_medium", 4,
     [("d0", "d1"), ("d0", "d2"), ("d3", "d1")], [3.0, 3.0, 3.0], [3.0, 3.0, 2.0]),
    ("switch: one uplink", "switched", 3, [("d0", "d1"), ("d0", "d2")], [2.0, 2.0], [2.0, 2.0]),
]

BUCKET_KB = (16, 64, 256, 1024)


def _ms(nbytes: int, mbps: float) -> float:
    return nbytes * 8 / mbps / 1e3


def run_probe(topology: str, n: int, transfers: list[tuple[str, str]]) -> list[float]:
    """Each transfer's time over the same link's alone, measured in one lab."""
    ids = [f"d{i}" for i in range(n)]
    with LabNetwork(cluster(n, topology, RATE), ids) as net:  # type: ignore[arg-type]
        alone = _ms(NBYTES, rates(net, [transfers[0]], NBYTES)[0])
        together = [_ms(NBYTES, r) for r in rates(net, transfers, NBYTES)]
    return [t / alone for t in together]


def run_bucket() -> list[float]:
    """Each size's time alone over its size at the link's payload rate."""
    with LabNetwork(cluster(2, "point_to_point", RATE), ["d0", "d1"]) as net:
        out = []
        for kb in BUCKET_KB:
            nbytes = kb * 1024
            out.append(_ms(nbytes, rates(net, [("d0", "d1")], nbytes)[0])
                       / _ms(nbytes, RATE * GOODPUT))
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    got: dict[tuple[str, int], list[float]] = {}
    loads = []
    for _ in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for name, topology, n, transfers, _, _ in PROBES:
            for k, r in enumerate(run_probe(topology, n, transfers)):
                got.setdefault((name, k), []).append(r)
        for k, r in enumerate(run_bucket()):
            got.setdefault((f"bucket: {BUCKET_KB[k]} KB alone", 0), []).append(r)
    loads.append(os.getloadavg()[0])
    rows = []
    for name, _, _, transfers, per_transfer, per_sender in PROBES:
        for k, (a, b) in enumerate(transfers):
            xs = got[(name, k)]
            rows.append([name, f"{a} -> {b}", f"{statistics.median(xs):.2f}",
                         f"{min(xs):.2f}-{max(xs):.2f}", f"{per_transfer[k]:.2f}",
                         f"{per_sender[k]:.2f}"])
    for kb in BUCKET_KB:
        xs = got[(f"bucket: {kb} KB alone", 0)]
        rows.append([f"bucket: {kb} KB alone", "d0 -> d1", f"{statistics.median(xs):.2f}",
                     f"{min(xs):.2f}-{max(xs):.2f}", "1.00", "1.00"])
    head = ["probe", "transfer", "measured / alone", "range", "fair per transfer",
            "fair per sender"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"{args.rounds} rounds, {RATE:g} Mbit/s, load {min(loads):.1f}-{max(loads):.1f} "
          f"(1-min average, {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
