"""Device classes: groups of interchangeable devices, and the network between classes.

Two devices are interchangeable when they have the same type, usable memory and
slowdown and neither has a per-pair link override: every figure of the cost model
(:mod:`planner.cost.model`: block times, memory budget, bandwidth and latency to any other
device) is then the same for both, so a planner may count devices per class instead of
naming them. A device with a per-pair link override is a class of its own, which keeps
every network figure a function of the classes involved. Both planners
(:mod:`planner.solvers.dp.driver`
and :mod:`planner.solvers.exact.solver`) key their search by these classes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.inputs.problem import Problem


@dataclass(frozen=True)
class DeviceClass:
    """Interchangeable devices: same type, usable memory and slowdown, no link override.

    ``members`` are cluster indices in cluster order."""

    type: str
    budget: float
    slowdown: float
    members: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.members)


def device_classes(problem: Problem) -> list[DeviceClass]:
    """Group the cluster's devices into classes of interchangeable devices (see the
    module docstring), in order of first appearance. O(N + links)."""
    cluster = problem.cluster
    linked = {end for link in cluster.network.links for end in (link.a, link.b)}
    # (type, budget, slowdown, id of a device with a link override, else "")
    groups: dict[tuple[str, float, float, str], list[int]] = {}
    for i, dev in enumerate(cluster.devices):
        key = (dev.type, cluster.budget_bytes(i), dev.slowdown, dev.id if dev.id in linked else "")
        groups.setdefault(key, []).append(i)
    return [DeviceClass(k[0], k[1], k[2], tuple(v)) for k, v in groups.items()]


def representative_pair(a: DeviceClass, b: DeviceClass) -> tuple[int, int] | None:
    """Two distinct devices, one of each class (None when a = b has one member)."""
    if a is b:
        return (a.members[0], a.members[1]) if a.count >= 2 else None
    return (a.members[0], b.members[0])


def class_network(cm: CostModel, classes: list[DeviceClass]) -> tuple[np.ndarray, np.ndarray]:
    """(K, K) bandwidth (bytes/ms) and latency (ms) between a device of class a and a
    distinct device of class b, from the cost model's pair tables; bandwidth inf and
    latency 0 where no such pair exists (a class of one device with itself). O(K^2)."""
    n = len(classes)
    bw = np.full((n, n), np.inf)
    lat = np.zeros((n, n))
    for a, ca in enumerate(classes):
        for b, cb in enumerate(classes):
            pair = representative_pair(ca, cb)
            if pair is not None:
                bw[a, b] = cm.bw[pair]
                lat[a, b] = cm.lat[pair]
    return bw, lat
