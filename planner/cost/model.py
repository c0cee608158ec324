"""The cost model: time and memory of a partition. The one place these formulas live.

Every planner, the plan file, the comparison and the executor's report use this module
(the simulator does not: it is the independent reference the figures are checked
against). Formulas follow the Asteroid reconstruction (reference/asteroid.md §3); the
decisions it leaves open are fixed here and recorded in docs/decisions.md.

Time of blocks at a batch size (§2, "non-linear batch scaling"): per device type and
block, times are known at measured batch sizes b_1 < ... < b_k. Between them time is
interpolated linearly; below b_1 it falls proportionally to 0 at batch 0; above b_k it
grows with the last segment's slope (proportionally when k = 1). A device's time is its
type's time x its ``slowdown``.

Stage compute step (Eq. 8): ``E_f = max_d t_f(stage, d, y_d)``, ``E_b = max_d t_b(...)``
over the devices d of the group with their samples y_d per micro-batch.

Network (cluster ``network.kind``): ``point_to_point`` (a full-duplex channel per
ordered device pair), ``switched`` (a full-duplex port per device: an uplink and a
downlink channel) or ``shared_medium`` (one half-duplex channel for all transfers, Wi-Fi).

Boundary p -> p+1 (:meth:`CostModel.link_transfer`): a micro-batch's activations are
re-sliced by sample interval (:func:`reslice_pieces`): the piece from device i of stage p
to device j of stage p+1 carries their n_ij shared samples, n_ij x a_p bytes (a_p the
boundary bytes per sample), taking n_ij a_p / bw_ij ms of channel time at its pair's rate
and delivered lat_ij after its last byte; gradients travel the same pieces back. Alone
on their channels, pieces started together take the most loaded channel
(:func:`channel_loads`: max over pieces point-to-point, max over ports switched, the sum
on a shared medium) plus the latency: ``StageCost.link_out_ms``.

Link step of the chain (the closed form's and the exact solver's view, Eq. 8):
``E_f = E_b = lat + B * a_p / bw``, bw the minimum pairwise bandwidth between the two
groups and lat the largest pairwise latency (the whole micro-batch over the slowest
pair, one resource for both directions). It is conservative against the exact figure.

All-reduce (§3.3): ring over the g devices of a group, ``2(g-1)/g * W_p / bw_min +
2(g-1) * lat`` (:meth:`CostModel.allreduce_ms`, the closed form's T_a); on a shared
medium the g concurrent transfers of each ring step share one channel, so ``2(g-1) *
W_p / bw + 2(g-1) * lat``. Zero for g = 1. It runs as the executor runs it: once, after
the stage's last backward (``REDUCE_GRAD`` of :mod:`planner.schedule`), not in buckets
overlapped with the backward. The iteration time prices it as its transfers
(:meth:`CostModel.ring`): 2(g-1) steps, in each member r sends r+1 a chunk of W_p / g.

Iteration time (what every plan reports, ``PlanCost.iteration_ms``,
:func:`round_makespan`): the plan's schedule (:func:`planner.schedule.build` with the
config's warm-ups) run by every device on its own samples, every piece and ring chunk a
transfer on the channels of the topology, transfers in progress at once sharing their
channels max-min fairly (:func:`fair_shares`; one connection per ordered pair, messages
on it in order). ``PlanCost.chain_ms`` is the older chain recurrence
(:func:`schedule_makespan`, one resource per chain step), which is what the exact
solver's program computes; ``PlanCost.closed_form_ms`` is Asteroid's closed form over
the chain (the DP's objective). The DP re-ranks its best candidates, and every planner
scores its answer, by ``iteration_ms``. docs/cost-model.md states where the figure is
exact against the independent simulator (:mod:`planner.check.simulator`) and where it
approximates.

Closed form: writing c_i = E_f^i + E_b^i,
C_c = sum_{i<c} c_i and PB_s = sum_{i<s} E_b^i, the closed form simplifies to

    T_round = max_c (M c_c + C_c) + max_s (T_a^s - PB_s)

because every step's finishing time T_w^s + T_e^s equals D - PB_s with D = max_c(M c_c +
C_c) (substitute Eq. 5 into both branches of Eq. 6). The dominant step is the argmax c.

Memory per device (Eq. 3): ``(2 + k_opt) * W_p + K_p * y_d * A_p`` - weights, gradients
and k_opt optimizer buffers per parameter (SGD 0, momentum 1, Adam 2), plus the saved
activations of its y_d samples for each of the stage's K_p in-flight micro-batches
(A_p = sum of the stage's saved bytes per sample; K_p from
:meth:`TrainingConfig.warmup_depth`). A device holding the ring replica of a stage q
(:mod:`planner.replan.replicas`; reference/asteroid.md §6) also pays ``(1 + k_opt) * W_q``, that
stage's weights and optimizer state (gradients are not replicated). The total must not
exceed the device's usable memory.

Migration after a re-plan (:mod:`planner.replan.incremental`): each transfer moves its blocks'
weights and optimizer state, ``(1 + k_opt) * W`` bytes, point to point (``transfer_ms``
over the pair's bandwidth and latency). All transfers start together and share the
network's channels as a boundary's pieces do (:func:`channel_loads`), so the migration
takes the most loaded channel plus the largest latency (:func:`migration_ms`).

Replication point (:meth:`CostModel.replica_transfer_ms`): the ring replicas' transfers
started together as a migration's, but as a background flow beside training: each
takes only the channel time the iteration's own transfers leave free on its busiest
channel (:func:`background_ms`), and the interval that hides it is
:func:`hiding_interval`.
"""

from __future__ import annotations

import heapq
import itertools
import math
import sys
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from edgepipe.planner import schedule as schedule_module
from edgepipe.planner.cost.steps import Step, StepChain
from edgepipe.planner.inputs.cluster import Cluster, Topology
from edgepipe.planner.inputs.problem import Problem
from edgepipe.planner.inputs.profile import Timing, batch_curve
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.replan.replicas import RING, Replica, placement, refusal, ring_load, standbys
from edgepipe.planner.schedule import ActionType, Schedule, compute_actions, compute_order


@dataclass(frozen=True)
class StageCost:
    """Figures of one stage under its assignment (ms and bytes)."""

    forward_ms: float
    backward_ms: float
    allreduce_ms: float
    link_out_ms: float
    warmup: int
    device_forward_ms: tuple[float, ...]
    device_backward_ms: tuple[float, ...]
    memory_bytes: tuple[float, ...]
    budget_bytes: tuple[float, ...]
    replica_bytes: tuple[float, ...] = ()  # of memory_bytes: ring replicas held


@dataclass(frozen=True)
class PlanCost:
    """Prediction for a partition: iteration time, throughput, bottleneck, memory."""

    iteration_ms: float
    closed_form_ms: float
    chain_ms: float
    samples_per_s: float
    dominant_step: int
    bottleneck: str
    stages: tuple[StageCost, ...]
    chain: StepChain

    def memory_fractions(self) -> list[float]:
        """Each used device's memory as a fraction of its usable memory."""
        return [
            m / b for s in self.stages for m, b in zip(s.memory_bytes, s.budget_bytes, strict=True)
        ]

    @property
    def memory_ok(self) -> bool:
        return max(self.memory_fractions()) <= 1.0

    @property
    def peak_memory_fraction(self) -> float:
        return max(self.memory_fractions())


def ring_allreduce_ms(grad_bytes, group_size, bw_min, lat_max, shared_medium: bool):
    """Ring all-reduce time (§3.3) of ``grad_bytes`` over ``group_size`` devices whose
    slowest pair moves ``bw_min`` bytes/ms with latency ``lat_max`` ms. Works on numpy
    arrays elementwise; 0 where the group has one device."""
    g = np.asarray(group_size, dtype=float)
    per_byte = 2 * (g - 1) if shared_medium else 2 * (g - 1) / np.maximum(g, 1)
    t = per_byte * np.asarray(grad_bytes) / bw_min + 2 * (g - 1) * lat_max
    return np.where(g > 1, t, 0.0)


def transfer_ms(num_bytes, bw, lat):
    """Point-to-point transfer of ``num_bytes`` at ``bw`` bytes/ms after ``lat`` ms."""
    return lat + num_bytes / bw


def stage_memory_bytes(static_bytes, warmup, samples, saved_per_sample):
    """Eq. 3: static state + ``warmup`` in-flight micro-batches of ``samples`` samples."""
    return static_bytes + warmup * samples * saved_per_sample


def samples_that_fit(budget, static_bytes, warmup, saved_per_sample, batch: int):
    """Eq. 3 solved for y: the most samples (<= ``batch``) a device of ``budget`` bytes can
    take with ``warmup`` micro-batches in flight; 0 if even the static state does not fit.
    Elementwise on numpy arrays."""
    room = np.asarray(budget) - static_bytes
    per = warmup * np.asarray(saved_per_sample, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        most = np.where(per > 0, np.floor(room / np.where(per > 0, per, 1)), batch)
    return np.clip(np.where(room < 0, 0, most), 0, batch).astype(np.int64)


def warmup_that_fits(budget, static_bytes, samples, saved_per_sample):
    """Eq. 3 solved for K: the deepest warm-up at which a device taking ``samples`` fits
    (inf when it holds no activations, -inf when the static state alone overflows)."""
    room = np.asarray(budget) - static_bytes
    per = np.asarray(samples) * np.asarray(saved_per_sample, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        depth = np.where(per > 0, np.floor(room / np.where(per > 0, per, 1)), np.inf)
    return np.where(room < 0, -np.inf, depth)


def migration_ms(transfers: list[tuple[str, str, float, float]], topology: Topology) -> float:
    """Time to carry out ``(sender, receiver, ms at the pair's rate, latency ms)``
    transfers started together (module docstring): the most loaded channel
    (:func:`channel_loads`) plus the largest latency. Local moves (sender = receiver)
    take no time."""
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
    (:meth:`CostModel.iteration_channel_ms`).

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


def hiding_interval(transfer_ms: float, iteration_ms: float) -> int:
    """The smallest replication interval k whose k steps hide a replication point's
    transfer: a point travels beside the steps of its interval (docs/fault-tolerance.md,
    "Points in flight"), so the commit that makes the next point waits
    max(0, transfer - k x iteration); k = max(1, ceil(transfer / iteration)). A transfer
    that never ends (``inf``, :func:`background_ms` on a channel never free) is hidden by
    no interval: ``sys.maxsize`` (``make_plan`` caps it at the config's maximum)."""
    if not iteration_ms > 0:
        return 1
    if math.isinf(transfer_ms):
        return sys.maxsize
    return max(1, math.ceil(transfer_ms / iteration_ms))


@lru_cache(maxsize=256)
def build(name: str, warmups: tuple[int, ...], num_micro_batches: int) -> Schedule:
    """The plan's schedule, :func:`planner.schedule.build`, cached per (name, warm-ups,
    M): a schedule is immutable and building one is O(P x M) objects, which a planner
    evaluating thousands of plans of the same shape would rebuild each time."""
    return schedule_module.build(name, warmups, num_micro_batches)  # type: ignore[arg-type]


def closed_form_latency(chain: StepChain) -> tuple[float, int]:
    """Asteroid's HPP-Round latency and dominant step (module docstring; Eqs. 4-6, 11).

    O(S) for S steps.
    """
    m = chain.num_micro_batches
    best_d, dominant, prefix_c = -np.inf, 0, 0.0
    best_x, prefix_b = -np.inf, 0.0
    for s, step in enumerate(chain.steps):
        c = step.forward_ms + step.backward_ms
        if m * c + prefix_c > best_d:
            best_d, dominant = m * c + prefix_c, s
        best_x = max(best_x, step.allreduce_ms - prefix_b)
        prefix_c += c
        prefix_b += step.backward_ms
    return best_d + best_x, dominant


def schedule_makespan(chain: StepChain) -> float:
    """Exact round time of the chain's schedule: the longest path through its actions.

    Schedule: per step, 1F1B with the step's warm-up (GPipe = warm-up M), as built by
    :func:`planner.schedule.one_f_one_b`. Recurrence, each step's actions taken in order:

        end(s, a) = max(end(s, previous action of s), end(dependency of a)) + duration(a)

    with F(s, m) depending on F(s-1, m), B(s, m) on B(s+1, m) (on the last step on
    F(S-1, m)); the round ends when the last action or all-reduce ends. Actions are
    taken in a topological order (:func:`_topological`, cached per warm-ups and M), so
    it is O(S x M).

    Raises:
        ValueError: the warm-ups make the schedule deadlock.
    """
    n_steps, m = len(chain.steps), chain.num_micro_batches
    order = _chain_order(tuple(step.warmup for step in chain.steps), m)
    last = n_steps - 1
    f_end = [[0.0] * m for _ in range(n_steps)]
    b_end = [[0.0] * m for _ in range(n_steps)]
    free = [0.0] * n_steps
    forward_ms = [step.forward_ms for step in chain.steps]
    backward_ms = [step.backward_ms for step in chain.steps]
    for s, forward, mb in order:
        end = free[s]
        if forward:
            dep = f_end[s - 1][mb] if s > 0 else 0.0
            end = (dep if dep > end else end) + forward_ms[s]
            f_end[s][mb] = end
        else:
            dep = b_end[s + 1][mb] if s < last else f_end[s][mb]
            end = (dep if dep > end else end) + backward_ms[s]
            b_end[s][mb] = end
        free[s] = end
    return max(free[s] + step.allreduce_ms for s, step in enumerate(chain.steps))


@lru_cache(maxsize=256)
def _chain_order(warmups: tuple[int, ...], num_micro_batches: int) -> list[tuple[int, bool, int]]:
    """:func:`_topological` order of the chain's steps with these warm-ups (each step's
    lane its :func:`planner.schedule.compute_order`). Raises ValueError if the warm-ups
    deadlock."""
    order = _topological(
        [
            [(kind == "F", mb) for kind, mb in compute_order(num_micro_batches, w)]
            for w in warmups
        ]
    )
    if order is None:
        raise ValueError(
            "the schedule's warm-ups deadlock; warm-ups must not grow along the chain"
        )
    return order


def reslice_pieces(
    samples_a: tuple[int, ...], samples_b: tuple[int, ...]
) -> list[tuple[int, int, int]]:
    """The pieces of a micro-batch re-sliced from a group with per-device samples
    ``samples_a`` to one with ``samples_b`` (consecutive sample intervals in group order):
    ``(i, j, n)`` for every sender i and receiver j whose intervals share n > 0 samples.
    O(|a| + |b|) pieces."""
    pieces = []
    i = j = 0
    lo_a = lo_b = 0
    while i < len(samples_a) and j < len(samples_b):
        hi_a, hi_b = lo_a + samples_a[i], lo_b + samples_b[j]
        n = min(hi_a, hi_b) - max(lo_a, lo_b)
        if n > 0:
            pieces.append((i, j, n))
        if hi_a <= hi_b:
            i, lo_a = i + 1, hi_a
        if hi_b <= hi_a:
            j, lo_b = j + 1, hi_b
    return pieces


@dataclass(frozen=True)
class Piece:
    """One transfer: ``ms`` of channel time at the pair's rate from device ``src`` to
    device ``dst``, delivered ``latency_ms`` after its last byte."""

    src: str
    dst: str
    ms: float
    latency_ms: float


@dataclass(frozen=True)
class BoundaryCost:
    """One stage boundary p -> p+1: the re-sliced pieces of a micro-batch's activations
    (``forward``, stage p to p+1) and of its gradients (``backward``, the same pieces
    reversed), on the network ``topology``."""

    forward: tuple[Piece, ...]
    backward: tuple[Piece, ...]
    topology: Topology

    @property
    def latency_ms(self) -> float:
        """The largest latency over the boundary's pairs."""
        return max((x.latency_ms for x in self.forward), default=0.0)

    @property
    def forward_load(self) -> tuple[tuple[str, float], ...]:
        """Channel time per channel of the activations (:func:`channel_loads`)."""
        return channel_loads([(x.src, x.dst, x.ms) for x in self.forward], self.topology)

    @property
    def backward_load(self) -> tuple[tuple[str, float], ...]:
        """Channel time per channel of the gradients (:func:`channel_loads`)."""
        return channel_loads([(x.src, x.dst, x.ms) for x in self.backward], self.topology)

    @property
    def occupancy_ms(self) -> float:
        """Channel time of one direction: the most loaded channel (the time the pieces
        take when they start together and nothing else is on their channels)."""
        return max((ms for _, ms in self.forward_load), default=0.0)


@dataclass(frozen=True)
class RingCost:
    """A stage's ring all-reduce as transfers: ``chunks[r]`` is what member r sends member
    r+1 (mod g) in each of the 2(g-1) ring steps, W_p / g bytes (§3.3). Empty for g = 1."""

    chunks: tuple[Piece, ...] = ()


def channel_loads(
    pieces: list[tuple[str, str, float]], topology: Topology
) -> tuple[tuple[str, float], ...]:
    """Channel time per channel of transfers ``(sender, receiver, ms at the pair's rate)``
    (:func:`channels`): the sum of the ms of the transfers on each channel. Started
    together, the transfers take at least the largest load: max over pieces
    (point-to-point), max over ports (switched), the sum (shared medium).
    """
    loads: dict[str, float] = {}
    for a, b, ms in pieces:
        for k in channels(a, b, topology):
            loads[k] = loads.get(k, 0.0) + ms
    return tuple(loads.items())


def channels(src: str, dst: str, topology: Topology) -> tuple[str, ...]:
    """The channels a transfer ``src -> dst`` holds: its pair's own (point_to_point), the
    sender's uplink and the receiver's downlink (switched), or the one medium
    (shared_medium)."""
    if topology == "shared_medium":
        return ("medium",)
    if topology == "switched":
        return (f"{src} up", f"{dst} down")
    return (f"{src}->{dst}",)


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
        full = [ch for ch in active if residual[ch] <= _EPS] if level < 1.0 - _EPS else list(active)
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


_EPS = 1e-9


def round_makespan(
    schedule: Schedule,
    devices: list[list[tuple[str, float, float]]],
    links: list[BoundaryCost],
    rings: list[RingCost],
    topology: Topology,
) -> float:
    """Iteration time of one round: every device runs its stage's schedule on its own
    slice, and every transfer shares its channels fairly with those in progress beside it
    (the semantics, inputs and errors: :func:`fair_sharing_makespan`).

    Point to point no two transfers ever hold one channel at once (every ordered pair
    is its own channel and carries its messages one at a time), so no transfer is ever
    slowed and the round is the longest path through the actions
    (:func:`longest_path_makespan`: one pass in topological order, no event queue). On a
    switch or a shared medium the fair-sharing event simulation runs.
    """
    if topology == "point_to_point":
        return longest_path_makespan(schedule, devices, links, rings)
    return fair_sharing_makespan(schedule, devices, links, rings, topology)


def _stage_order(schedule: Schedule) -> tuple[list[list[tuple[bool, int]]], list | None, int]:
    """Per stage its forwards and backwards as ``(is forward, micro-batch)`` in schedule
    order, every stage's actions in an order where each comes after what it waits for
    (:func:`_topological`; None if the schedule deadlocks), and 1 + the largest
    micro-batch number. Every device of a stage runs
    the stage's actions and waits only for devices of the neighbouring stages, so the
    order is topological for every device's actions too. Cached per schedule object
    (schedules are immutable; the entry keeps its schedule alive, so its id is not
    reused while cached)."""
    hit = _STAGE_ORDERS.get(id(schedule))
    if hit is not None and hit[0] is schedule:
        return hit[1], hit[2], hit[3]
    lanes = [
        [(a.type is ActionType.F, a.micro_batch) for a in compute_actions(actions)]
        for actions in schedule
    ]
    order = _topological(lanes)  # type: ignore[arg-type]
    m_count = 1 + max((m for lane in lanes for _, m in lane), default=0)
    if len(_STAGE_ORDERS) >= 64:
        _STAGE_ORDERS.clear()
    _STAGE_ORDERS[id(schedule)] = (schedule, lanes, order, m_count)
    return lanes, order, m_count  # type: ignore[return-value]


_DEADLOCK = "the schedule deadlocks: a device waits for a transfer never sent"


def _topological(lanes: list[list[tuple[bool, int]]]) -> list[tuple[int, bool, int]] | None:
    """Lanes p = 0..P-1 (stages or chain steps), each a list of ``(is forward,
    micro-batch)`` run in order; ``F m`` of lane p waits for ``F m`` of lane p-1 and
    ``B m`` for ``B m`` of lane p+1. Returns every action as ``(lane, is forward,
    micro-batch)`` in an order that respects both, or None if none exists (a deadlock).
    Worklist: a lane advances while its next action's dependency is done and wakes the
    lane that waits for what it did; O(actions)."""
    last = len(lanes) - 1
    m_count = 1 + max((m for lane in lanes for _, m in lane), default=0)
    done = [(bytearray(m_count), bytearray(m_count)) for _ in lanes]  # backward, forward
    pos = [0] * len(lanes)
    order: list[tuple[int, bool, int]] = []
    work = list(range(len(lanes)))
    while work:  # a lane runs as far as it can, then wakes the lanes that wait for it
        p = work.pop()
        lane, k = lanes[p], pos[p]
        before = done[p - 1][1] if p > 0 else None
        after = done[p + 1][0] if p < last else None
        mine_b, mine_f = done[p]
        sent_f = sent_b = False
        while k < len(lane):
            forward, m = lane[k]
            if forward:
                if before is not None and not before[m]:
                    break
                mine_f[m] = sent_f = True
            else:
                if after is not None and not after[m]:
                    break
                mine_b[m] = sent_b = True
            order.append((p, forward, m))
            k += 1
        pos[p] = k
        if sent_f and p < last:
            work.append(p + 1)
        if sent_b and p > 0:
            work.append(p - 1)
    if any(pos[p] < len(lane) for p, lane in enumerate(lanes)):
        return None
    return order


_STAGE_ORDERS: dict[int, tuple[Schedule, list, list | None, int]] = {}


def longest_path_makespan(
    schedule: Schedule,
    devices: list[list[tuple[str, float, float]]],
    links: list[BoundaryCost],
    rings: list[RingCost],
) -> float:
    """The round of :func:`fair_sharing_makespan` (inputs as there) when every transfer
    runs at its pair's full rate, as it does point to point, where no two transfers ever
    hold one channel: each time is then the latest of what it waits for plus its
    duration, a longest path through the actions, with no event queue:

        compute of device d:  start = max(end of d's previous action, delivery of the
                              last piece it waits for), end = start + t_f(d) or t_b(d)
        transfer i -> j posted at t (when its sender's action ends):
                              start = max(t, end of the pair's previous message),
                              end = start + ms, delivered end + latency
        ring step k of member r: posted when every member has ended its last action
                              (k = 0), else when r has received step k-1 from r-1

    Devices' actions are taken in :func:`_stage_order`, each ring after its stage's last
    action. The round ends with the last compute end or delivery.

    Complexity: O(P x M) for the order (cached per schedule), then O(M x (devices +
    pieces) + sum_p g_p^2), one pass.

    Raises:
        ValueError: the schedule deadlocks.
    """
    order, m_count = _stage_order(schedule)[1:]
    if order is None:
        raise ValueError(_DEADLOCK)
    index: dict[str, int] = {}
    f_ms: list[float] = []
    b_ms: list[float] = []
    members: list[list[int]] = []
    for devs in devices:
        members.append([])
        for d, f, b in devs:
            index[d] = len(f_ms)
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
    free = [0.0] * n
    pair_end = [0.0] * len(pairs)
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
    return end


def _channel_ids(src: int, dst: int, topology: Topology) -> tuple[int, ...]:
    """:func:`channels` of a transfer between devices numbered ``src`` and ``dst``, as
    numbers: the medium 0; a device's uplink 2 x index + 1, its downlink 2 x index + 2;
    a pair's own channel (point to point) is never shared and has none."""
    if topology == "shared_medium":
        return (0,)
    if topology == "switched":
        return (2 * src + 1, 2 * dst + 2)
    return ()


def fair_sharing_makespan(
    schedule: Schedule,
    devices: list[list[tuple[str, float, float]]],
    links: list[BoundaryCost],
    rings: list[RingCost],
    topology: Topology,
) -> float:
    """Iteration time of one round as a fluid event simulation (what
    :func:`round_makespan` computes; it runs this where a channel is shared).

    Inputs: ``schedule`` (per stage its actions, :mod:`planner.schedule`); per stage
    ``devices[p]``, each device's id and its forward and backward ms for its samples
    (Eq. 8 before the max), and ``rings[p]`` (the ring all-reduce's chunks, §3.3); per
    boundary p -> p+1 its re-sliced pieces (:class:`BoundaryCost`).

    Devices: a device of stage p runs the stage's F/B in schedule order; its ``F m``
    waits until every activation piece of m addressed to it is delivered, its ``B m``
    every gradient piece. When its ``F m`` ends it posts its activation pieces
    (``SEND_F``), when its ``B m`` ends its gradient pieces (``SEND_B``). After its last
    backward it joins the ring (``REDUCE_GRAD``): once all g members have joined, every
    member r posts its chunk to r+1 (step 0), a member posts step k+1 when it has
    received step k, and it is done when it has received step 2(g-1)-1.

    Transfers: a transfer holds :func:`channels` of the topology; transfers between one
    ordered pair go one at a time in posting order (one connection per pair); those at
    the head of their pairs progress at :func:`fair_shares` of their pair rates, so a
    piece of ms channel time alone ends ms after it starts; each is delivered its
    latency after its last byte. Between two events (a compute end, a delivery, a
    transfer's end) the rates are constant, so the clock jumps from event to event.

    The round ends with the last compute, delivery or ring step. E events (O(M x
    (devices + pieces)) plus 2(g-1)g per ring), each O(T C) for T transfers in progress
    over C channels.

    Raises:
        ValueError: the schedule deadlocks.
    """
    lanes, _, m_count = _stage_order(schedule)
    last = len(lanes) - 1
    index: dict[str, int] = {}
    stage_of: list[int] = []
    dur: list[tuple[float, float]] = []  # per device: (B ms, F ms), indexed by is-forward
    for p, devs in enumerate(devices):
        for d, f, b in devs:
            index[d] = len(dur)
            stage_of.append(p)
            dur.append((b, f))
    n = len(dur)
    pairs: dict[tuple[int, int], int] = {}
    chans: list[tuple[int, ...]] = []  # per pair: the channels its transfers hold

    def pair_of(src: str, dst: str) -> int:
        key = (index[src], index[dst])
        if key not in pairs:
            pairs[key] = len(chans)
            chans.append(_channel_ids(key[0], key[1], topology) or (-1 - len(chans),))
        return pairs[key]

    # per device and is-forward: its pieces (pair, ms, latency, receiver)
    sends: list[tuple[list, list]] = [([], []) for _ in range(n)]
    need = [[0, 0] for _ in range(n)]
    for link in links:
        for forward, pieces in ((1, link.forward), (0, link.backward)):
            for x in pieces:
                dst = index[x.dst]
                sender = sends[index[x.src]][forward]
                sender.append((pair_of(x.src, x.dst), x.ms, x.latency_ms, dst))
                need[dst][forward] += 1
    ring_chunks = [
        [(pair_of(x.src, x.dst), x.ms, x.latency_ms) for x in ring.chunks] for ring in rings
    ]
    # per device and is-forward, per micro-batch: pieces whose last byte has left, and
    # the latest delivery among them
    got = [([0] * m_count, [0] * m_count) for _ in range(n)]
    ready = [([0.0] * m_count, [0.0] * m_count) for _ in range(n)]
    pos = [0] * n  # the next action not yet scheduled
    done = [0] * n  # actions ended
    free = [0.0] * n  # end of the last action scheduled
    joined = [0] * len(rings)
    received = [[0] * len(r) for r in ring_chunks]
    # events: (time, seq, kind, a, b, c); kind 0: device a ends action (b: forward, c:
    # micro-batch); kind 1: member b of stage a's ring receives a chunk
    events: list[tuple[float, int, int, int, int, int]] = []
    seq = 0
    # a transfer: [channel ms left at since, since, rate, version, channels, queue,
    # latency, tag, id]; tag (0, receiver, forward, m) a piece, (1, stage, member, 0) a
    # ring chunk
    queues: list[deque[list]] = [deque() for _ in chans]  # per pair: transfers in order
    holders: dict[int, set[int]] = {ch: set() for held in chans for ch in held}
    held_by: dict[int, list] = {}  # id -> transfer, of those in progress
    ends: list[tuple[float, int, int]] = []  # (end, id, version); stale once re-rated
    dirty: set[int] = set()  # channels whose transfers in progress changed
    shared = topology == "shared_medium"
    in_flight = serial = 0
    now = end = 0.0
    push, pop = heapq.heappush, heapq.heappop
    inf = float("inf")

    def post(pair: int, ms: float, lat: float, tag: tuple[int, int, int, int]) -> None:
        nonlocal in_flight, serial
        queue = queues[pair]
        x = [ms, now, 0.0, 0, chans[pair], queue, lat, tag, serial]
        serial += 1
        queue.append(x)
        in_flight += 1
        if len(queue) == 1:
            begin(x)

    def begin(x: list) -> None:  # x reaches the head of its pair: it holds its channels
        x[1] = now
        key = x[8]
        held_by[key] = x
        alone = True
        for ch in x[4]:
            held = holders[ch]
            if held:
                alone = False
                dirty.add(ch)
            held.add(key)
        if alone:  # nothing shares its channels: full rate until something joins
            x[2] = 1.0
            x[3] += 1
            push(ends, (now + x[0], key, x[3]))

    def schedule(d: int) -> None:  # every action of d whose inputs are all on their way
        nonlocal seq
        lane = lanes[stage_of[d]]
        k = pos[d]
        while k < len(lane):
            forward, m = lane[k]
            if got[d][forward][m] < need[d][forward]:
                break
            t = free[d]
            arrive = ready[d][forward][m]
            free[d] = (arrive if arrive > t else t) + dur[d][forward]
            push(events, (free[d], seq, 0, d, forward, m))
            seq += 1
            k += 1
        pos[d] = k

    def rerate(changed: list[int]) -> None:  # new fair shares around changed channels
        if shared:  # one channel: everything in progress shares it
            group = [held_by[key] for key in holders[0]]
        else:  # the connected transfers and channels around the changed ones
            todo, seen, group = changed, set(changed), []
            members: set[int] = set()
            while todo:
                for key in holders[todo.pop()]:
                    if key not in members:
                        members.add(key)
                        x = held_by[key]
                        group.append(x)
                        for ch in x[4]:
                            if ch not in seen:
                                seen.add(ch)
                                todo.append(ch)
        shares = fair_shares([x[4] for x in group]) if len(group) > 1 else [1.0]
        for x, share in zip(group, shares, strict=False):
            x[0] -= (now - x[1]) * x[2]
            x[1], x[2] = now, share
            x[3] += 1
        if shared:  # every transfer in progress is re-rated: a new heap
            ends[:] = [(now + x[0] / x[2], x[8], x[3]) for x in group]
            heapq.heapify(ends)
        else:
            for x in group:
                push(ends, (now + x[0] / x[2], x[8], x[3]))

    for d in range(n):
        schedule(d)
    while events or in_flight:
        if dirty:
            rerate(list(dirty))
            dirty.clear()
        while ends:  # drop entries of ended or re-rated transfers
            x = held_by.get(ends[0][1])
            if x is not None and x[3] == ends[0][2]:
                break
            pop(ends)
        first_end = ends[0][0] if ends else inf
        now = events[0][0] if events else inf
        if first_end < now:
            now = first_end
        limit = now + _EPS * (now if now > 1.0 else 1.0)
        if first_end <= now:
            while ends and ends[0][0] <= limit:
                _, key, ver = pop(ends)
                x = held_by.get(key)
                if x is None or ver != x[3]:
                    continue
                del held_by[key]
                in_flight -= 1
                queue = x[5]
                queue.popleft()
                for ch in x[4]:
                    held = holders[ch]
                    held.discard(key)
                    if held:
                        dirty.add(ch)
                if queue:
                    begin(queue[0])
                kind, a, b, c = x[7]
                arrive = now + x[6]
                if kind == 0:  # a piece for device a's action (b, c)
                    if arrive > end:
                        end = arrive
                    count = got[a][b]
                    count[c] += 1
                    if arrive > ready[a][b][c]:
                        ready[a][b][c] = arrive
                    if count[c] == need[a][b]:
                        schedule(a)
                else:  # a ring chunk for member b of stage a
                    push(events, (arrive, seq, 1, a, b, 0))
                    seq += 1
        while events and events[0][0] <= limit:
            _, _, kind, a, b, c = pop(events)
            if now > end:
                end = now
            if kind == 0:  # device a ended its action (b: forward, c: micro-batch)
                p = stage_of[a]
                done[a] += 1
                if (b and p < last) or (not b and p > 0):
                    for pair, ms, lat, dst in sends[a][b]:
                        post(pair, ms, lat, (0, dst, b, c))
                chunks = ring_chunks[p]
                if chunks and done[a] == len(lanes[p]):
                    joined[p] += 1
                    if joined[p] == len(chunks):
                        for r, (pair, ms, lat) in enumerate(chunks):
                            post(pair, ms, lat, (1, p, (r + 1) % len(chunks), 0))
            else:  # member b of stage a's ring received a chunk
                received[a][b] += 1
                chunks = ring_chunks[a]
                if received[a][b] < 2 * (len(chunks) - 1):
                    pair, ms, lat = chunks[b]
                    post(pair, ms, lat, (1, a, (b + 1) % len(chunks), 0))
    if any(done[d] < len(lanes[stage_of[d]]) for d in range(n)):
        raise ValueError(_DEADLOCK)
    return end


def describe_step(s: int) -> str:
    """Human name of chain step ``s``: ``stage p`` or ``link p->p+1``."""
    p = s // 2
    return f"stage {p}" if s % 2 == 0 else f"link {p}->{p + 1}"


class CostModel:
    """Cost model of one :class:`Problem`, with per-type prefix tables for O(1) range times.

    Tables: for device type t, ``fwd[t][i, y]`` = summed forward ms of blocks ``[0, i)`` at
    batch y (same for ``bwd``), for y up to ``max_batch`` (the largest micro-batch
    candidate). Building them is O(types x blocks x max_batch).
    """

    def __init__(self, problem: Problem, max_batch: int | None = None) -> None:
        self.problem = problem
        cluster, model, config = problem.cluster, problem.model, problem.config
        if max_batch is None:
            max_batch = max(config.micro_batch_sizes())
        self.max_batch = max_batch
        self.fwd: dict[str, np.ndarray] = {}
        self.bwd: dict[str, np.ndarray] = {}
        for name, timing in problem.timings.items():
            self.fwd[name] = _prefix(timing, "forward_ms", max_batch)
            self.bwd[name] = _prefix(timing, "backward_ms", max_batch)
        blocks = model.blocks
        self.param_prefix = np.concatenate([[0.0], np.cumsum([b.param_bytes for b in blocks])])
        self.saved_prefix = np.concatenate(
            [[0.0], np.cumsum([b.saved_bytes_per_sample for b in blocks])]
        )
        self.boundary = np.array([b.output_bytes_per_sample for b in blocks])
        self.state_factor = 2 + config.optimizer_state_factor
        n = len(cluster.devices)
        self.device_type = [d.type for d in cluster.devices]
        self.slowdown = np.array([d.slowdown for d in cluster.devices])
        self.budget = np.array([cluster.budget_bytes(i) for i in range(n)])
        self.bw, self.lat = _pair_tables(cluster)
        self.shared_medium = cluster.network.shared_medium

    # -- per-stage pieces ------------------------------------------------------------------
    def device_times(self, first: int, end: int, dev: int, samples: int) -> tuple[float, float]:
        """Forward and backward ms of blocks ``[first, end)`` on device ``dev`` at ``samples``."""
        t = self.device_type[dev]
        f = self.fwd[t][end, samples] - self.fwd[t][first, samples]
        b = self.bwd[t][end, samples] - self.bwd[t][first, samples]
        return float(f * self.slowdown[dev]), float(b * self.slowdown[dev])

    def static_bytes(self, first: int, end: int) -> float:
        """Weights + gradients + optimizer state of blocks ``[first, end)``."""
        return float(self.state_factor * (self.param_prefix[end] - self.param_prefix[first]))

    def replica_bytes(self, first: int, end: int) -> float:
        """Weights + optimizer state of blocks ``[first, end)``: what a replica holds and a
        migration moves."""
        return float((self.state_factor - 1) * (self.param_prefix[end] - self.param_prefix[first]))

    def replica_transfer_ms(self, partition: Partition) -> float:
        """Predicted time of one replication point's transfers under ``partition``,
        beside training: every ring replica (:meth:`replica_bytes` of its stage) from
        the stage's device to its holder, all started together as a background flow
        that takes only the channel time the iteration's own transfers
        (:meth:`iteration_channel_ms`) leave free (:func:`background_ms`, at the
        partition's predicted iteration; the emulation paces replicas so,
        executor/core/emulation.py, "Replicas"). 0 without ring replicas (a data-parallel
        stage's peers are its replicas; interval 0); ``inf`` when a replica's channel is
        never free. O(P x g) plus one :meth:`evaluate`."""
        cluster = self.problem.cluster
        transfers = []
        for r in self.replicas(partition):
            if r.kind != RING:
                continue
            owner, holder = partition.stages[r.stage].devices[0], r.holders[0]
            i, j = cluster.index(owner), cluster.index(holder)
            transfers.append((owner, holder,
                              self.replica_bytes(r.first, r.end) / cluster.bytes_per_ms(i, j),
                              cluster.latency_ms(i, j)))
        if not transfers:
            return 0.0
        return background_ms(transfers, self.iteration_channel_ms(partition),
                             self.evaluate(partition).iteration_ms, cluster.network.kind)

    def iteration_channel_ms(self, partition: Partition) -> dict[str, float]:
        """Channel time per channel (:func:`channels`) of one iteration's own transfers
        under ``partition``: each boundary's activation and gradient pieces once per
        micro-batch (:meth:`link_transfer`) and each ring all-reduce's chunks once per
        ring step, 2(g - 1) (:meth:`ring`). O(P x g)."""
        cluster, stages = self.problem.cluster, partition.stages
        m = partition.num_micro_batches
        pieces = []
        for a, b in itertools.pairwise(stages):
            link = self.link_transfer(a, b)
            pieces += [(x.src, x.dst, m * x.ms) for x in (*link.forward, *link.backward)]
        for stage in stages:
            ring = self.ring(stage.first, stage.end, [cluster.index(d) for d in stage.devices])
            steps = 2 * (len(ring.chunks) - 1)
            pieces += [(x.src, x.dst, steps * x.ms) for x in ring.chunks]
        return dict(channel_loads(pieces, cluster.network.kind))

    def replicas(self, partition: Partition) -> tuple[Replica, ...]:
        """Where each stage's state is replicated (:func:`planner.replan.replicas.placement` with
        whether the config replicates and :meth:`replica_bytes`)."""
        return placement(partition, self._budgets(), self.problem.config.replicated,
                         self.replica_bytes)

    def replica_standbys(self, partition: Partition) -> tuple[str, ...]:
        """The idle devices able to hold a one-device plan's replica, best first
        (:func:`planner.replan.replicas.standbys`)."""
        return standbys(partition, self._budgets(), self.problem.config.replicated,
                        self.replica_bytes)

    def replica_refusal(self, partition: Partition) -> str | None:
        """Why a one-device plan has no replica although it has idle devices
        (:func:`planner.replan.replicas.refusal`), else None."""
        return refusal(partition, self._budgets(), self.problem.config.replicated,
                       self.replica_bytes)

    def _budgets(self) -> dict[str, float]:
        """Usable memory of every device of the cluster, by id, in cluster order."""
        return {d.id: float(self.budget[i]) for i, d in enumerate(self.problem.cluster.devices)}

    def replica_memory(self, partition: Partition) -> dict[str, float]:
        """Bytes of ring replicas each device holds under ``partition``."""
        return {
            dev: sum(self.replica_bytes(r.first, r.end) for r in held)
            for dev, held in ring_load(self.replicas(partition)).items()
        }

    def saved_bytes(self, first: int, end: int) -> float:
        """Saved activation bytes per sample of blocks ``[first, end)`` (A_p)."""
        return float(self.saved_prefix[end] - self.saved_prefix[first])

    def device_memory(self, first: int, end: int, samples: int, warmup: int) -> float:
        """Memory of a device holding blocks ``[first, end)`` with ``samples`` per micro-batch
        and ``warmup`` micro-batches in flight (Eq. 3)."""
        return float(
            stage_memory_bytes(
                self.static_bytes(first, end), warmup, samples, self.saved_bytes(first, end)
            )
        )

    def allreduce_ms(self, first: int, end: int, group: list[int]) -> float:
        """Ring all-reduce of the stage's gradients inside ``group`` (§3.3)."""
        g = len(group)
        if g <= 1:
            return 0.0
        sub = np.ix_(group, group)
        mask = ~np.eye(g, dtype=bool)
        bw = float(self.bw[sub][mask].min())
        lat = float(self.lat[sub][mask].max())
        grad = float(self.param_prefix[end] - self.param_prefix[first])
        return float(ring_allreduce_ms(grad, g, bw, lat, self.shared_medium))

    def link_transfer(self, a: StageAssignment, b: StageAssignment) -> BoundaryCost:
        """The boundary between consecutive stages ``a`` and ``b``: the micro-batch
        re-sliced into pieces by sample interval (:func:`reslice_pieces`), each at its
        pair's rate and latency, activations from ``a`` to ``b`` and gradients back."""
        cl = self.problem.cluster
        per_sample = float(self.boundary[a.end - 1])
        ga = [cl.index(d) for d in a.devices]
        gb = [cl.index(d) for d in b.devices]
        forward, backward = [], []
        for i, j, n in reslice_pieces(a.samples, b.samples):
            ms = n * per_sample / float(self.bw[ga[i], gb[j]])
            forward.append(Piece(a.devices[i], b.devices[j], ms, float(self.lat[ga[i], gb[j]])))
            ms = n * per_sample / float(self.bw[gb[j], ga[i]])
            backward.append(Piece(b.devices[j], a.devices[i], ms, float(self.lat[gb[j], ga[i]])))
        return BoundaryCost(tuple(forward), tuple(backward), cl.network.kind)

    def ring(self, first: int, end: int, group: list[int]) -> RingCost:
        """The ring all-reduce of blocks ``[first, end)`` over ``group`` (device indices in
        plan order) as transfers: member r sends r+1 (mod g) a chunk of W / g bytes at
        their pair's rate and latency (§3.3). Empty for one device."""
        g = len(group)
        if g <= 1:
            return RingCost()
        ids = [d.id for d in self.problem.cluster.devices]
        chunk = float(self.param_prefix[end] - self.param_prefix[first]) / g
        nxt = [group[(r + 1) % g] for r in range(g)]
        return RingCost(
            tuple(
                Piece(ids[a], ids[b], chunk / float(self.bw[a, b]), float(self.lat[a, b]))
                for a, b in zip(group, nxt, strict=True)
            )
        )

    def link_ms(self, cut: int, micro_batch: int, group_a: list[int], group_b: list[int]) -> float:
        """One direction of the chain's link step at block boundary ``cut`` (after block
        ``cut - 1``): the whole micro-batch over the slowest pair (the closed form's and
        the exact solver's link, module docstring)."""
        if len(group_a) == 1 and len(group_b) == 1:  # one pair: no sub-table
            bw = float(self.bw[group_a[0], group_b[0]])
            lat = float(self.lat[group_a[0], group_b[0]])
        else:
            sub = np.ix_(group_a, group_b)
            bw = float(self.bw[sub].min())
            lat = float(self.lat[sub].max())
        return float(transfer_ms(micro_batch * float(self.boundary[cut - 1]), bw, lat))

    # -- whole partitions --------------------------------------------------------------------
    def _round_inputs(
        self, partition: Partition
    ) -> tuple[Schedule, list[list[tuple[str, float, float]]], list[BoundaryCost], list[RingCost]]:
        """What one round's makespan reads (:func:`round_makespan`): the schedule at the
        stages' warm-ups, per stage each device's id and forward and backward ms for its
        samples, the boundaries' re-sliced pieces and the stages' rings. O(P x g)."""
        config = self.problem.config
        cluster = self.problem.cluster
        num_stages = partition.num_stages
        m = partition.num_micro_batches
        warmups = tuple(config.warmup_depth(p, num_stages, m) for p in range(num_stages))
        devices: list[list[tuple[str, float, float]]] = []
        rings: list[RingCost] = []
        for stage in partition.stages:
            group = [cluster.index(d) for d in stage.devices]
            devices.append(
                [
                    (d, *self.device_times(stage.first, stage.end, i, y))
                    for d, i, y in zip(stage.devices, group, stage.samples, strict=True)
                ]
            )
            rings.append(self.ring(stage.first, stage.end, group))
        links = [
            self.link_transfer(a, b)
            for a, b in zip(partition.stages, partition.stages[1:], strict=False)
        ]
        return build(config.schedule, warmups, m), devices, links, rings  # type: ignore[arg-type]

    def round_lower_bound_ms(self, partition: Partition) -> float:
        """A lower bound on ``evaluate(partition).iteration_ms``, about ten times cheaper
        on a switch or a shared medium (equal point to point): the round with every
        transfer at its pair's full rate, :func:`longest_path_makespan` on the inputs of
        :func:`round_makespan`. Why it is a lower bound: :func:`fair_sharing_makespan`
        runs the same actions in the same orders (each device its stage's schedule; each
        ordered pair its messages in posting order, which is its sender's action order
        for a boundary and the step order for a ring; rings after their stage's last
        action), with the same compute times and latencies, and a transfer at the head of
        its pair progresses at a fair share <= 1 of its rate, so it lasts at least its
        ``ms``. Every start is the latest end of what it waits for, so by induction
        along that common order no action ends earlier than in the longest path."""
        return longest_path_makespan(*self._round_inputs(partition))

    def evaluate(self, partition: Partition) -> PlanCost:
        """All figures of ``partition``: step chain, round latency, per-stage costs, memory.

        O(P x g) plus O(S) for the round latency.
        """
        config = self.problem.config
        cluster = self.problem.cluster
        num_stages = partition.num_stages
        m = partition.num_micro_batches
        mb = partition.micro_batch_size
        groups = [[cluster.index(d) for d in s.devices] for s in partition.stages]
        held = self.replica_memory(partition)
        schedule, devices, links, rings = self._round_inputs(partition)
        steps: list[Step] = []
        stage_costs: list[StageCost] = []
        for p, stage in enumerate(partition.stages):
            warmup = config.warmup_depth(p, num_stages, m)
            dev_f = tuple(t[1] for t in devices[p])
            dev_b = tuple(t[2] for t in devices[p])
            ar = self.allreduce_ms(stage.first, stage.end, groups[p])
            link = (
                self.link_ms(stage.end, mb, groups[p], groups[p + 1]) if p + 1 < num_stages else 0.0
            )
            steps.append(
                Step("stage", p, max(dev_f), max(dev_b), ar, warmup, stage.devices, dev_f, dev_b)
            )
            if p + 1 < num_stages:
                # a link relays what its downstream stage consumes: its warm-up sits between
                # the two stages' (Asteroid: S - s for step s; classic: the downstream K)
                link_warmup = (
                    min(m, 2 * (num_stages - p) - 2)
                    if config.warmup == "asteroid" and config.schedule == "1f1b"
                    else config.warmup_depth(p + 1, num_stages, m)
                )
                steps.append(Step("link", p, link, link, 0.0, link_warmup))
            stage_costs.append(
                StageCost(
                    forward_ms=max(dev_f),
                    backward_ms=max(dev_b),
                    allreduce_ms=ar,
                    link_out_ms=(
                        links[p].occupancy_ms + links[p].latency_ms if p + 1 < num_stages else 0.0
                    ),
                    warmup=warmup,
                    device_forward_ms=dev_f,
                    device_backward_ms=dev_b,
                    memory_bytes=tuple(
                        self.device_memory(stage.first, stage.end, y, warmup) + held.get(d, 0.0)
                        for d, y in zip(stage.devices, stage.samples, strict=True)
                    ),
                    budget_bytes=tuple(float(self.budget[d]) for d in groups[p]),
                    replica_bytes=tuple(held.get(d, 0.0) for d in stage.devices),
                )
            )
        topology = cluster.network.kind
        chain = StepChain(tuple(steps), m, topology)
        closed, dominant = closed_form_latency(chain)
        total = round_makespan(schedule, devices, links, rings, topology)
        return PlanCost(
            iteration_ms=total,
            closed_form_ms=closed,
            chain_ms=schedule_makespan(chain),
            samples_per_s=mb * m / total * 1e3 if total > 0 else float("inf"),
            dominant_step=dominant,
            bottleneck=describe_step(dominant),
            stages=tuple(stage_costs),
            chain=chain,
        )


def _pair_tables(cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """(N, N) bytes per ms and latency ms of every device pair: the cluster's own
    :meth:`Cluster.bytes_per_ms` and :meth:`Cluster.latency_ms`, computed for the pairs of
    a per-pair link only; every other pair reads the network default capped by both
    types' interfaces (the same arithmetic, vectorised: O(N^2) numpy, not N^2 calls)."""
    n = len(cluster.devices)
    iface = np.array([cluster.type_of(i).bandwidth_mbps for i in range(n)])
    mbps = np.minimum(cluster.network.bandwidth_mbps, np.minimum.outer(iface, iface))
    bw = mbps * 1e6 / 8 / 1e3
    lat = np.full((n, n), float(cluster.network.latency_ms))
    for link in cluster.network.links:
        if not (cluster.has_device(link.a) and cluster.has_device(link.b)):
            continue
        for a, b in ((link.a, link.b), (link.b, link.a)):
            i, j = cluster.index(a), cluster.index(b)
            bw[i, j], lat[i, j] = cluster.bytes_per_ms(i, j), cluster.latency_ms(i, j)
    return bw, lat


@lru_cache(maxsize=256)
def _prefix(timing: Timing, field: str, max_batch: int) -> np.ndarray:
    """Prefix table of one timing field; cached (read-only) because re-planning builds a
    cost model per call and must stay in milliseconds."""
    curves = batch_curve(timing.batch_sizes, np.asarray(getattr(timing, field)), max_batch)
    table = np.vstack([np.zeros((1, max_batch + 1)), np.cumsum(curves, axis=0)])
    table.flags.writeable = False
    return table


# -- the planners' closed form (added for the DP's objective; self-contained) --------------
def boundary_occupancy_ms(per_sample_bytes, sent_max, received_max, batch, bw_min, topology):
    """Closed-form channel time of one direction of a stage boundary (the exact figure's
    :meth:`CostModel.link_transfer` when every pair has the slowest pair's rate
    ``bw_min``): a sender's pieces sum to its samples and a receiver's to its, so

        switched:       max(sent_max, received_max) x a / bw   (the most loaded port)
        point_to_point: min(sent_max, received_max) x a / bw   (bounds the largest piece)
        shared_medium:  batch x a / bw                         (all pieces, one medium)

    ``sent_max`` / ``received_max``: the largest per-device samples of the two groups;
    ``a``: the boundary's bytes per sample. Elementwise on numpy arrays. Exact for
    switched and shared medium with uniform bandwidth, an upper bound otherwise."""
    if topology == "shared_medium":
        samples = np.asarray(batch, dtype=float)
    elif topology == "switched":
        samples = np.maximum(sent_max, received_max)
    else:
        samples = np.minimum(sent_max, received_max)
    return np.asarray(per_sample_bytes) * samples / bw_min


def link_period_ms(occupancy, downstream, topology):
    """Channel time per micro-batch on the busiest channel a boundary uses, in steady
    state: point-to-point, activations and gradients travel on separate channels
    (``occupancy``); switched, a device's uplink carries its stage's activations out and
    its gradients back, so the receiving stage's ports also carry the next boundary
    (``occupancy + downstream``, downstream = that boundary's occupancy, 0 after the
    last stage); a shared medium carries both directions of this and every later
    boundary (``2 x occupancy + downstream``, downstream = the later boundaries' medium
    time). Elementwise on numpy arrays."""
    occupancy = np.asarray(occupancy)
    if topology == "point_to_point":
        return occupancy
    return occupancy * (2.0 if topology == "shared_medium" else 1.0) + downstream


def link_downstream_ms(occupancy, downstream, topology):
    """What :func:`link_period_ms` reads as ``downstream`` for the boundary before this
    one: this boundary's occupancy (switched), the medium time of this and every later
    boundary (shared medium: ``2 x occupancy + downstream``), 0 point to point."""
    occupancy = np.asarray(occupancy)
    if topology == "switched":
        return occupancy
    if topology == "shared_medium":
        return 2.0 * occupancy + downstream
    return np.zeros_like(occupancy)


def pipeline_closed_form_ms(cm: CostModel, partition: Partition,
                            cost: PlanCost | None = None) -> float:
    """The planners' closed-form round time of ``partition`` (the DP's objective): steps
    i = stage 0, link 0->1, stage 1, ... with traversal tau_i (stage: E_f + E_b; link:
    2 (occupancy + latency), :func:`boundary_occupancy_ms` over the groups' slowest pair
    and largest latency), steady-state period pi_i (stage: E_f + E_b; link:
    :func:`link_period_ms`, which on a switch adds the next boundary's occupancy and on a
    shared medium every later boundary's medium time), warm-up K_i and E_f^i:

        T = max_i [C_i + max((M - 1) pi_i + tau_i + w_i, W_i)] + max_s (T_a^s - PB_s)

    with C_i = sum_{j<i} tau_j, PB_s the summed backward traversal (E_b; a link's
    occupancy + latency) before stage s, and the warm-up bubble of a stage
    w_i = max(0, R_i - (min(K_i, M) - 1) E_f^i), R_i = sum_{j>i} tau_j: its first
    backward waits for the first micro-batch's round trip downstream while it runs only
    K_i forwards (0 for links and the last stage). W_i = ceil(M / min(K_i, M)) (tau_i +
    R_i) is a stage's warm-up window (0 for links): 1F1B starts its forward of
    micro-batch j + K_i only after the backward of j, which ends a whole round trip
    tau_i + R_i after that forward began, so M micro-batches take at least
    ceil(M / K_i) round trips (it binds when few micro-batches are in flight over slow
    links: pipedream-resnet18 on orin-pair-2 at micro-batch 1, a plan priced 298 ms
    without it that the schedule runs in 353 ms). With half-duplex links (pi = tau),
    w = 0 and no window it is Asteroid's closed form (:func:`closed_form_latency`).
    O(P + g); ``cost``: ``cm.evaluate(partition)`` when the caller has it already."""
    cost = cost if cost is not None else cm.evaluate(partition)
    cluster = cm.problem.cluster
    topology = cluster.network.kind
    m = partition.num_micro_batches
    occs: list[tuple[float, float]] = []  # per boundary: occupancy, latency
    for stage, nxt in zip(partition.stages, partition.stages[1:], strict=False):
        ga = [cluster.index(d) for d in stage.devices]
        gb = [cluster.index(d) for d in nxt.devices]
        sub = np.ix_(ga, gb)
        occ = float(boundary_occupancy_ms(cm.boundary[stage.end - 1], max(stage.samples),
                                          max(nxt.samples), partition.micro_batch_size,
                                          cm.bw[sub].min(), topology))  # fmt: skip
        occs.append((occ, float(cm.lat[sub].max())))
    periods, downstream = [0.0] * len(occs), 0.0
    for q in range(len(occs) - 1, -1, -1):
        periods[q] = float(link_period_ms(occs[q][0], downstream, topology))
        downstream = float(link_downstream_ms(occs[q][0], downstream, topology))
    steps: list[tuple[float, float, float, float, float, int]] = []  # tau, pi, f, b, T_a, K
    for p, sc in enumerate(cost.stages):
        steps.append((sc.forward_ms + sc.backward_ms, sc.forward_ms + sc.backward_ms,
                      sc.forward_ms, sc.backward_ms, sc.allreduce_ms, sc.warmup))  # fmt: skip
        if p < len(occs):
            one_way = occs[p][0] + occs[p][1]
            steps.append((2 * one_way, periods[p], one_way, one_way, 0.0, 0))
    total_tau = sum(s[0] for s in steps)
    best_d, best_x, before, before_b = -np.inf, -np.inf, 0.0, 0.0
    for i, (tau, pi, f, b, ar, k) in enumerate(steps):
        bubble = window = 0.0
        if i % 2 == 0:
            rest = total_tau - before - tau
            bubble = max(0.0, rest - (min(k, m) - 1) * f)
            window = -(-m // min(k, m)) * (tau + rest)
            best_x = max(best_x, ar - before_b)
        best_d = max(best_d, before + max((m - 1) * pi + tau + bubble, window))
        before += tau
        before_b += b
    return best_d + best_x
