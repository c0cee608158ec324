"""The iteration time of one round (``PlanCost.iteration_ms``, what every plan reports):
the plan's schedule (:func:`planner.schedule.build` with the config's warm-ups) run by
every device on its own samples, every piece and ring chunk a transfer on the channels of
the topology (:mod:`planner.cost.transfers`), transfers in progress at once sharing their
channels max-min fairly (:func:`planner.cost.channels.fair_shares`; one connection per
ordered pair, messages on it in order).

Two computations give it: point to point no transfer is ever slowed, and the round is a
longest path (:func:`longest_path_makespan`); on a switch or a shared medium the fluid
event simulation runs (:func:`planner.cost.fair_sharing.fair_sharing_makespan`).
:func:`round_makespan` picks. docs/cost-model.md states where the figure is exact against
the independent simulator (:mod:`planner.check.simulator`) and where it approximates.
"""

from __future__ import annotations

from edgepipe.planner.cost.fair_sharing import fair_sharing_ends, fair_sharing_makespan
from edgepipe.planner.cost.order import DEADLOCK, Order, stage_order
from edgepipe.planner.cost.transfers import BoundaryCost, RingCost
from edgepipe.planner.inputs.cluster import Topology
from edgepipe.planner.schedule import Schedule


def round_makespan(schedule: Schedule, devices: list[list[tuple[str, float, float]]],
                   links: list[BoundaryCost], rings: list[RingCost], topology: Topology,
                   optim: list[list[float]] | None = None) -> float:
    """Iteration time of one round: every device runs its stage's schedule on its own
    slice, and every transfer shares its channels fairly with those in progress beside it,
    then each device its optimizer step (the semantics, inputs and errors:
    :func:`fair_sharing_makespan`).

    Point to point no two transfers ever hold one channel at once (every ordered pair
    is its own channel and carries its messages one at a time), so no transfer is ever
    slowed and the round is the longest path through the actions
    (:func:`longest_path_makespan`: one pass in topological order, no event queue). On a
    switch or a shared medium the fair-sharing event simulation runs.
    """
    if topology == "point_to_point":
        return longest_path_makespan(schedule, devices, links, rings, optim)
    return fair_sharing_makespan(schedule, devices, links, rings, topology, optim)


def round_ends(schedule: Schedule, devices: list[list[tuple[str, float, float]]],
               links: list[BoundaryCost], rings: list[RingCost], topology: Topology,
               iterations: int, optim: list[list[float]] | None = None) -> list[float]:
    """When each of ``iterations`` chained rounds ends (:mod:`planner.cost.steady`): the
    chained form of :func:`round_makespan`, picked the same way."""
    if topology == "point_to_point":
        return longest_path_ends(schedule, devices, links, rings, iterations, optim)
    return fair_sharing_ends(schedule, devices, links, rings, topology, iterations, optim)


def longest_path_makespan(
    schedule: Schedule,
    devices: list[list[tuple[str, float, float]]],
    links: list[BoundaryCost],
    rings: list[RingCost],
    optim: list[list[float]] | None = None,
) -> float:
    """The round of :func:`fair_sharing_makespan` (inputs as there) when every transfer
    runs at its pair's full rate, as it does point to point: the first of
    :func:`longest_path_ends` (one iteration)."""
    return longest_path_ends(schedule, devices, links, rings, 1, optim)[0]


def longest_path_ends(
    schedule: Schedule,
    devices: list[list[tuple[str, float, float]]],
    links: list[BoundaryCost],
    rings: list[RingCost],
    iterations: int,
    optim: list[list[float]] | None = None,
) -> list[float]:
    """When each of ``iterations`` chained rounds ends (inputs as
    :func:`fair_sharing_makespan`) when every transfer runs at its pair's full rate, as
    it does point to point, where no two transfers ever hold one channel: each time is
    then the latest of what it waits for plus its duration, a longest path through the
    actions, with no event queue:

        compute of device d:  start = max(end of d's previous action, delivery of the
                              last piece it waits for), end = start + t_f(d) or t_b(d)
        transfer i -> j posted at t (when its sender's action ends):
                              start = max(t, end of the pair's previous message),
                              end = start + ms, delivered end + latency
        ring step k of member r: posted when every member has ended its last action
                              (k = 0), else when r has received step k-1 from r-1
        optimizer step of d:  start = max(end of d's last action, delivery of d's last
                              ring chunk), end = start + optim[p][d]
        next iteration:       a device's first action waits for its own previous
                              iteration: its last action, its ring (the delivery of
                              its last chunk) and its optimizer step, as the executor's
                              loop does (:mod:`planner.cost.steady`)

    Devices' actions are taken in :func:`planner.cost.order.stage_order`, each ring after
    its stage's last action, iteration after iteration (pairs keep their order across
    iterations). Iteration i ends with its last compute end, delivery or optimizer
    step end.

    Complexity: O(P x M) for the order (cached per schedule), then per iteration
    O(M x (devices + pieces) + sum_p g_p^2), one pass.

    Raises:
        ValueError: the schedule deadlocks.
    """
    order, m_count = stage_order(schedule)[1:]
    if order is None:
        raise ValueError(DEADLOCK)
    index: dict[str, int] = {}
    f_ms: list[float] = []
    b_ms: list[float] = []
    members: list[list[int]] = []
    for devs in devices:
        members.append([])
        for dev, f, b in devs:
            index[dev] = len(f_ms)
            members[-1].append(len(f_ms))
            f_ms.append(f)
            b_ms.append(b)
    n = len(f_ms)
    # per device and is-forward, per micro-batch: the latest delivery of its pieces
    arrival = ([[0.0] * m_count for _ in range(n)], [[0.0] * m_count for _ in range(n)])
    pairs: dict[tuple[int, int], int] = {}
    # per device and is-forward: its pieces (pair, ms, latency, the receiver's arrivals)
    sends: tuple[list[list], list[list]] = ([[] for _ in range(n)], [[] for _ in range(n)])
    for link in links:
        for forward, pieces in ((1, link.forward), (0, link.backward)):
            for x in pieces:
                src, dst = index[x.src], index[x.dst]
                pair = pairs.setdefault((src, dst), len(pairs))
                sends[forward][src].append((pair, x.ms, x.latency_ms, arrival[forward][dst]))
    ring_pairs = [
        [pairs.setdefault((index[x.src], index[x.dst]), len(pairs)) for x in r.chunks]
        for r in rings
    ]
    # per device its optimizer step, in the order of f_ms (None: none)
    step_ms = None if optim is None else [ms for row in optim for ms in row]
    free = [0.0] * n
    pair_end = [0.0] * len(pairs)
    ends: list[float] = []
    for _ in range(iterations):
        for got in (*arrival[0], *arrival[1]):
            got[:] = [0.0] * m_count
        ends.append(_one_round(order, members, f_ms, b_ms, sends, arrival, free, pair_end))
        ends[-1] = max(ends[-1], _rings(rings, ring_pairs, members, free, pair_end))
        if step_ms is not None:
            for d, ms in enumerate(step_ms):
                free[d] += ms
            ends[-1] = max(ends[-1], *free)
    return ends


def _one_round(order: Order, members: list[list[int]],
               f_ms: list[float], b_ms: list[float], sends: tuple[list[list], list[list]],
               arrival: tuple[list[list[float]], list[list[float]]], free: list[float],
               pair_end: list[float]) -> float:
    """The devices' actions of one round in ``order`` (:func:`longest_path_ends`),
    advancing ``free`` (per device) and ``pair_end`` (per pair) and filling ``arrival``;
    the round's last compute end or delivery."""
    for p, forward, m in order:
        ms_of = f_ms if forward else b_ms
        out = sends[forward]
        waits = arrival[forward]
        for d in members[p]:
            t = free[d]
            ready = waits[d][m]
            t = (ready if ready > t else t) + ms_of[d]
            free[d] = t
            for pair, ms, lat, got in out[d]:
                start = pair_end[pair]
                stop = (t if t > start else start) + ms
                pair_end[pair] = stop
                if stop + lat > got[m]:
                    got[m] = stop + lat
    end = max(free, default=0.0)
    for per_device in arrival:
        for got in per_device:
            end = max(end, *got)
    return end


def _rings(rings: list[RingCost], ring_pairs: list[list[int]], members: list[list[int]],
           free: list[float], pair_end: list[float]) -> float:
    """The stages' ring all-reduces after their last actions (:func:`longest_path_ends`):
    each member is free again when its last chunk is delivered; the last delivery."""
    end = 0.0
    for p, ring in enumerate(rings):
        g = len(ring.chunks)
        if g == 0:
            continue
        posted = [max(free[d] for d in members[p])] * g
        for _ in range(2 * (g - 1)):
            delivered = [0.0] * g
            for r, x in enumerate(ring.chunks):
                pair = ring_pairs[p][r]
                stop = max(posted[r], pair_end[pair]) + x.ms
                pair_end[pair] = stop
                delivered[(r + 1) % g] = stop + x.latency_ms
            posted = delivered
            end = max(end, *delivered)
        for r, d in enumerate(members[p]):
            free[d] = max(free[d], posted[r])
    return end
