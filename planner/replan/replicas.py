"""Replica placement: which devices hold a copy of each stage's committed state.

The rule (issue 8 item 3; reference/fault-tolerance.md §2 lesson 4, reference/asteroid.md
§6 "topology-driven replication"; docs/fault-tolerance.md): after every
``replication_interval``-th committed step, every stage's weights and optimizer state
live on at least one device other than each of its owners.

- A stage whose group has two or more devices is covered by its **data-parallel peers**:
  synchronous data parallelism leaves every member of the group with identical weights
  and optimizer state after each step, so each member's working copy *is* the replica.
  It costs no memory and no traffic, and it is always fresh (whatever the interval).
- A stage run by one device is replicated to the **next stage in a ring**: stage q's
  state goes to stage (q + 1) mod P, onto that stage's device with the largest usable
  memory (ties: the one listed first). That holder pays stage q's weights + optimizer
  state in memory (:meth:`planner.cost.model.CostModel.replica_bytes`).
- A plan of one stage on one device has no next stage: its replica goes to the idle
  device with the most usable memory among those that can hold it (ties: the one listed
  first in the cluster), which pays the same memory; with no such device, none. An idle
  device whose usable memory is below the replica's size is never chosen
  (:func:`standbys`); :func:`refusal` says so in one line when that leaves none. The
  other fitting idle devices are the **standbys**: the executor runs a process on each
  (executor/launch.py), so that the loss of the holder re-places the replica on the next
  one.
- ``replication_interval = 0`` turns ring replication off (DP peers still cover their
  stages, since that copy is free).

Pure function of the partition, the devices' usable memory, the replica sizes and
whether the config replicates (``replicated``: any interval but 0; the interval itself
changes only how often a replica is refreshed): O(P + number of devices).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from edgepipe.planner.partition import Partition
from edgepipe.planner.units import human_bytes

DP_PEER = "dp_peer"
RING = "ring"
NONE = "none"


@dataclass(frozen=True)
class Replica:
    """Where stage ``stage``'s (blocks ``[first, end)``) committed state survives the loss
    of any one of its owners: on ``holders``. ``kind``: ``dp_peer`` (holders are the
    group itself; any surviving member serves), ``ring`` (one holder on the next stage,
    which pays the memory; on a one-stage plan an idle device) or ``none``."""

    stage: int
    first: int
    end: int
    kind: str
    holders: tuple[str, ...]


def placement(
    partition: Partition,
    budget: Mapping[str, float],
    replicated: bool,
    size: Callable[[int, int], float],
) -> tuple[Replica, ...]:
    """The replica of every stage of ``partition`` under the rule of the module docstring.

    Args:
        partition: the plan's decision (devices listed per stage are those with samples).
        budget: usable memory in bytes of every device of the cluster, in cluster order
            (those the partition does not use are the idle ones).
        replicated: the config's ``replicated`` (False: ``replication_interval`` 0, ring
            replication off).
        size: bytes of a replica of blocks [first, end) (weights + optimizer state).
    """
    stages = partition.stages
    out = []
    for q, stage in enumerate(stages):
        if len(stage.devices) >= 2:
            out.append(Replica(q, stage.first, stage.end, DP_PEER, stage.devices))
            continue
        if not replicated:
            out.append(Replica(q, stage.first, stage.end, NONE, ()))
            continue
        if len(stages) == 1:
            fit = standbys(partition, budget, replicated, size)
            kind, holders = (RING, fit[:1]) if fit else (NONE, ())
            out.append(Replica(q, stage.first, stage.end, kind, holders))
            continue
        ring = stages[(q + 1) % len(stages)].devices
        holder = max(ring, key=lambda d: (budget[d], -ring.index(d)))
        out.append(Replica(q, stage.first, stage.end, RING, (holder,)))
    return tuple(out)


def standbys(
    partition: Partition,
    budget: Mapping[str, float],
    replicated: bool,
    size: Callable[[int, int], float],
) -> tuple[str, ...]:
    """The idle devices that can hold the replica of a plan of one stage on one device,
    best first: most usable memory, ties in cluster order (the first is the holder).
    Empty for every other plan and without ``replicated``. Arguments as :func:`placement`'s.
    O(devices log devices)."""
    stages = partition.stages
    if len(stages) != 1 or len(stages[0].devices) != 1 or not replicated:
        return ()
    need = size(stages[0].first, stages[0].end)
    order = {d: i for i, d in enumerate(budget)}
    idle = [d for d in order if d not in stages[0].devices and budget[d] >= need]
    return tuple(sorted(idle, key=lambda d: (-budget[d], order[d])))


def refusal(
    partition: Partition,
    budget: Mapping[str, float],
    replicated: bool,
    size: Callable[[int, int], float],
) -> str | None:
    """One line when a plan of one stage on one device has idle devices but none can
    hold its replica (each is refused: its usable memory is below the replica's size),
    else None. Arguments as :func:`placement`'s. O(devices)."""
    stages = partition.stages
    if len(stages) != 1 or len(stages[0].devices) != 1 or not replicated:
        return None
    (owner,) = stages[0].devices
    idle = [d for d in budget if d != owner]
    if not idle or standbys(partition, budget, replicated, size):
        return None
    need = size(stages[0].first, stages[0].end)
    best = max(idle, key=lambda d: budget[d])
    return (f"stage 0 (blocks [{stages[0].first}, {stages[0].end})) is not replicated: its "
            f"weights and optimizer state take {human_bytes(need)} ({need:.0f} bytes) and "
            f"no idle device can hold them (the largest, {best}, has "
            f"{human_bytes(budget[best])} usable, {budget[best]:.0f} bytes); losing {owner} "
            "stops the run")


def ring_load(replicas: tuple[Replica, ...]) -> dict[str, list[Replica]]:
    """The ring replicas each holder keeps (what its memory pays for), by device id."""
    load: dict[str, list[Replica]] = {}
    for r in replicas:
        if r.kind == RING:
            load.setdefault(r.holders[0], []).append(r)
    return load
