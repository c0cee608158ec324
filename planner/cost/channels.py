"""The network's channels: which channels a transfer holds, the channel time transfers put
on each, the fair shares of transfers in progress at once, and what transfers started
together take (a migration after a re-plan, a replication point beside training).

Network (cluster ``network.kind``): ``point_to_point`` (a full-duplex channel per ordered
device pair), ``switched`` (a full-duplex port per device: an uplink and a downlink
channel) or ``shared_medium`` (one half-duplex channel for all transfers, Wi-Fi, shared by sender:
:func:`medium_shares`).

Migration after a re-plan (:mod:`planner.replan.incremental`): each transfer moves its
blocks' weights and optimizer state, ``(1 + k_opt) * W`` bytes, point to point
(:func:`planner.cost.formulas.transfer_ms` over the pair's bandwidth and latency). All
transfers start together and share the network's channels as a boundary's pieces do
(:func:`channel_loads`), so the migration takes the most loaded channel plus the largest
latency (:func:`migration_ms`).

Replication point (:meth:`planner.cost.model.CostModel.replica_transfer_ms`): the ring
replicas' transfers started together as a migration's, but as a background flow beside
training: each takes only the channel time the iteration's own transfers leave free on
its busiest channel (:func:`background_ms`), and the interval that hides it is
:func:`planner.cost.formulas.hiding_interval`.
"""

from __future__ import annotations

import math
from collections.abc import Hashable

from edgepipe.planner.inputs.cluster import Topology

#: relative tolerance of the fair-sharing computations: a channel with at most this much
#: left is full, and events this close together happen at once
EPS = 1e-9


def channels(src: str, dst: str, topology: Topology) -> tuple[str, ...]:
    """The channels a transfer ``src -> dst`` holds: its pair's own (point_to_point), the
    sender's uplink and the receiver's downlink (switched), or the one medium
    (shared_medium)."""
    if topology == "shared_medium":
        return ("medium",)
    if topology == "switched":
        return (f"{src} up", f"{dst} down")
    return (f"{src}->{dst}",)


def channel_ids(src: int, dst: int, topology: Topology) -> tuple[int, ...]:
    """:func:`channels` of a transfer between devices numbered ``src`` and ``dst``, as
    numbers: the medium 0; a device's uplink 2 x index + 1, its downlink 2 x index + 2;
    a pair's own channel (point to point) is never shared and has none."""
    if topology == "shared_medium":
        return (0,)
    if topology == "switched":
        return (2 * src + 1, 2 * dst + 2)
    return ()


def channel_loads(
    pieces: list[tuple[str, str, float]], topology: Topology
) -> tuple[tuple[str, float], ...]:
    """Channel time per channel of transfers ``(sender, receiver, ms at the pair's rate)``
    (:func:`channels`): the sum of the ms of the transfers on each channel. Started
    together, the transfers take at least the largest load: max over pieces
    (point-to-point), max over ports (switched), the sum (shared medium). O(T) for T
    transfers.
    """
    loads: dict[str, float] = {}
    for a, b, ms in pieces:
        for k in channels(a, b, topology):
            loads[k] = loads.get(k, 0.0) + ms
    return tuple(loads.items())


def fair_shares(held: list[tuple[Hashable, ...]]) -> list[float]:
    """Max-min fair rates of transfers in progress at once, transfer i holding the
    channels ``held[i]``: each channel gives out at most one ms of channel time per ms,
    a transfer progresses at a fraction x_i <= 1 of its own pair rate, and no x_i can
    grow without shrinking an x_k <= x_i (Bertsekas & Gallager, Data Networks, 2nd ed.,
    §6.5.2, progressive filling: raise every unfrozen x together until a channel is full,
    freeze the transfers on full channels, repeat).

    A channel used by one transfer never limits it, so when no channel is held twice
    (point-to-point pairs one transfer each) every x is 1; on one medium with n
    transfers every x is min(1, 1/n); when one channel alone is held k > 1 times (a
    port sending two pieces) its transfers get 1/k and the others 1 (the first level of
    the filling, computed as it would compute it); otherwise O(T C) per level, at most T
    levels. Channels are any hashable names (the simulation numbers them).
    """
    if held and len(held[0]) == 1 and held.count(held[0]) == len(held):  # one channel
        return [1.0 / len(held)] * len(held)
    users: dict[Hashable, list[int]] = {}
    for i, chs in enumerate(held):
        for ch in chs:
            users.setdefault(ch, []).append(i)
    contended = {ch: ids for ch, ids in users.items() if len(ids) > 1}
    x = [1.0] * len(held)
    if not contended:
        return x
    if len(contended) == 1:  # one channel shared: its k users get 1/k, the rest 1
        (ids,) = contended.values()
        for i in ids:
            x[i] = 1.0 / len(ids)
        return x
    residual = dict.fromkeys(contended, 1.0)
    active = {ch: len(ids) for ch, ids in contended.items()}
    level, frozen = 0.0, [False] * len(held)
    while active:
        step = min(1.0 - level, min(residual[ch] / n for ch, n in active.items()))
        level += step
        for ch, n in active.items():
            residual[ch] -= step * n
        full = [ch for ch in active if residual[ch] <= EPS] if level < 1.0 - EPS else list(active)
        for ch in full:
            for i in contended[ch]:
                if not frozen[i]:
                    frozen[i], x[i] = True, level
                    for other in held[i]:
                        if other in active and other != ch:
                            active[other] -= 1
                            if active[other] == 0:
                                del active[other]
            active.pop(ch, None)
    return x


def medium_shares(senders: list[Hashable]) -> list[float]:
    """Rates on the shared medium of transfers in progress at once, transfer i sent by
    ``senders[i]``: each of the k senders with a transfer in progress gets 1/k of the
    medium (a station's share: 802.11's DCF gives contending stations equal transmit
    opportunities; the lab's medium gives each sender one class of one token bucket),
    split equally among its n_s transfers, so transfer i progresses at 1/(k n_s) of its
    pair rate. One sender alone gets the whole medium. Measured in the lab
    (benchmarks/network_semantics.py, docs/decisions.md "The shared medium is shared by
    sender"): d0 -> d1, d0 -> d2 and d3 -> d1 started together took 2.0x (d3's) and 3.0x
    (d0's) a transfer alone, not 3.0x each as one share per transfer would. O(T)."""
    per: dict[Hashable, int] = {}
    for s in senders:
        per[s] = per.get(s, 0) + 1
    return [1.0 / (len(per) * per[s]) for s in senders]


def migration_ms(transfers: list[tuple[str, str, float, float]], topology: Topology) -> float:
    """Time to carry out ``(sender, receiver, ms at the pair's rate, latency ms)``
    transfers started together (module docstring): the most loaded channel
    (:func:`channel_loads`) plus the largest latency. Local moves (sender = receiver)
    take no time. O(T) for T transfers."""
    moves = [(a, b, t, lat) for a, b, t, lat in transfers if a != b]
    loads = channel_loads([(a, b, t) for a, b, t, _ in moves], topology)
    return max((ms for _, ms in loads), default=0.0) + max((m[3] for m in moves), default=0.0)


def background_ms(transfers: list[tuple[str, str, float, float]],
                  foreground: dict[str, float], iteration_ms: float,
                  topology: Topology) -> float:
    """Time of ``transfers`` ``(sender, receiver, ms at the pair's rate, latency ms)``
    started together as a **background** flow beside training (a replication point,
    docs/decisions.md "Replicas yield to the pipeline"), each iteration of
    ``iteration_ms`` holding channel c for ``foreground[c]`` ms
    (:meth:`planner.cost.model.CostModel.iteration_channel_ms`).

    A background transfer yields to the foreground: it progresses only while the
    busiest foreground channel it holds (:func:`channels`) is free, at the share
    ``s = 1 - max_c foreground[c] / iteration_ms`` of its pair's rate, so its ``ms``
    become ``ms / s``; background transfers on one channel go one after the other, as
    a migration's do (:func:`migration_ms` of the stretched transfers: the most loaded
    channel plus the largest latency). The busiest channel, not the sum over a
    transfer's channels (switched: an uplink and a downlink), is what the emulation
    counts too (executor/core/emulation.py, "Replicas"); it is exact on a shared medium and
    point to point. ``inf`` when a transfer's channel is never free (s <= 0). O(T)."""
    stretched = []
    for a, b, ms, lat in transfers:
        busy = max(foreground.get(c, 0.0) for c in channels(a, b, topology))
        share = 1.0 - busy / iteration_ms if iteration_ms > 0 else 1.0
        if ms > 0 and share <= 0:
            return math.inf
        stretched.append((a, b, ms / share if ms > 0 else 0.0, lat))
    return migration_ms(stretched, topology)
