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

Boundary p -> p+1, the exact figure (:meth:`CostModel.link_transfer`): a micro-batch's
activations are re-sliced by sample interval (:func:`reslice_pieces`): the piece from
device i of stage p to device j of stage p+1 carries their n_ij shared samples, n_ij x
a_p bytes (a_p the boundary bytes per sample), taking n_ij a_p / bw_ij ms of channel time;
gradients travel the same pieces back. Per direction a boundary holds each channel for
its load (:func:`channel_loads`): point-to-point every piece its own pair's channel
(channel time = max over pieces), switched a sender's uplink for the sum of its pieces
and a receiver's downlink for the sum of its (= max over ports), shared medium the medium
for the sum of all pieces; delivery follows the latency max_ij lat_ij after the most
loaded channel is through.

Link step of the chain (the closed form's and the exact solver's view, Eq. 8):
``E_f = E_b = lat + B * a_p / bw``, bw the minimum pairwise bandwidth between the two
groups and lat the largest pairwise latency (the whole micro-batch over the slowest
pair, one resource for both directions). It is conservative against the exact figure.

All-reduce (§3.3): ring over the g devices of a group, ``2(g-1)/g * W_p / bw_min +
2(g-1) * lat``; on a shared medium the g concurrent transfers of each ring step share one
channel, so ``2(g-1) * W_p / bw + 2(g-1) * lat``. Zero for g = 1. It runs as the executor
runs it: once, after the stage's last backward (``REDUCE_GRAD`` of
:mod:`planner.schedule`), not in buckets overlapped with the backward.

Iteration time (what every plan reports, ``PlanCost.iteration_ms``): the stage-level
list schedule of :func:`round_makespan`: the plan's schedule (:func:`planner.schedule.build`
with the config's warm-ups) with each stage's compute as one resource and each transfer
on the channels above, first come first served, the all-reduces on a switch or a medium
filling the gaps the pipeline leaves on their channels. ``PlanCost.chain_ms`` is the
older chain recurrence (:func:`schedule_makespan`, one resource per chain step), which is
what the exact solver's program computes; ``PlanCost.closed_form_ms`` is Asteroid's closed
form over the chain (the DP's objective). The DP re-ranks its best candidates, and every
planner scores its answer, by ``iteration_ms``. docs/cost-model.md states where the
figure is exact against the independent simulator (:mod:`planner.simulator`) and where
it approximates.

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
(:mod:`planner.replicas`; reference/asteroid.md §6) also pays ``(1 + k_opt) * W_q``, that
stage's weights and optimizer state (gradients are not replicated). The total must not
exceed the device's usable memory.

Migration after a re-plan (:mod:`planner.replanning`): each transfer moves its blocks'
weights and optimizer state, ``(1 + k_opt) * W`` bytes, point to point (``transfer_ms``
over the pair's bandwidth and latency). All transfers start together and share the
network's channels as a boundary's pieces do (:func:`channel_loads`), so the migration
takes the most loaded channel plus the largest latency (:func:`migration_ms`).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from planner.cluster import Topology
from planner.partition import Partition, StageAssignment
from planner.problem import Problem
from planner.profile import Timing, batch_curve
from planner.replicas import Replica, placement, ring_load
from planner.schedule import ActionType, Schedule, build, compute_actions, compute_order
from planner.steps import Step, StepChain


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


def chain_schedule(chain: StepChain) -> list[list[tuple[str, int]]]:
    """Per chain step its compute order (:func:`planner.schedule.compute_order` with the
    step's warm-up): the action lists the exact solver's schedule constraints follow."""
    return [compute_order(chain.num_micro_batches, step.warmup) for step in chain.steps]


def schedule_makespan(chain: StepChain) -> float:
    """Exact round time of the chain's schedule: the longest path through its actions.

    Schedule: per step, 1F1B with the step's warm-up (GPipe = warm-up M), as built by
    :func:`planner.simulator.one_f_one_b`. Recurrence, each step's actions taken in order:

        end(s, a) = max(end(s, previous action of s), end(dependency of a)) + duration(a)

    with F(s, m) depending on F(s-1, m), B(s, m) on B(s+1, m) (on the last step on
    F(S-1, m)); the round ends when the last action or all-reduce ends. Actions are
    resolved in sweeps over the steps; each sweep settles at least one action, so it is
    O(S x M) actions x O(sweeps), a few per micro-batch in practice.

    Raises:
        ValueError: the warm-ups make the schedule deadlock.
    """
    actions = chain_schedule(chain)
    n_steps, m = len(chain.steps), chain.num_micro_batches
    last = n_steps - 1
    f_end: list[list[float | None]] = [[None] * m for _ in range(n_steps)]
    b_end: list[list[float | None]] = [[None] * m for _ in range(n_steps)]
    free = [0.0] * n_steps
    pos = [0] * n_steps
    remaining = sum(len(a) for a in actions)
    while remaining:
        progress = False
        for s, step in enumerate(chain.steps):
            while pos[s] < len(actions[s]):
                kind, mb = actions[s][pos[s]]
                if kind == "F":
                    dep = f_end[s - 1][mb] if s > 0 else 0.0
                else:
                    dep = b_end[s + 1][mb] if s < last else f_end[s][mb]
                if dep is None:
                    break
                end = max(free[s], dep) + (step.forward_ms if kind == "F" else step.backward_ms)
                (f_end if kind == "F" else b_end)[s][mb] = end
                free[s] = end
                pos[s] += 1
                remaining -= 1
                progress = True
        if not progress:
            raise ValueError(
                "the schedule's warm-ups deadlock; warm-ups must not grow along the chain"
            )
    return max(free[s] + step.allreduce_ms for s, step in enumerate(chain.steps))


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
class BoundaryCost:
    """One stage boundary p -> p+1 as the exact figure sees it: per direction, how long
    each channel it uses is held (``forward_load`` for activations, ``backward_load`` for
    gradients, as (channel, ms) pairs), and the latency until delivery."""

    forward_load: tuple[tuple[str, float], ...]
    backward_load: tuple[tuple[str, float], ...]
    latency_ms: float

    @property
    def occupancy_ms(self) -> float:
        """Channel time of one direction: the most loaded channel."""
        return max((ms for _, ms in self.forward_load), default=0.0)


def channel_loads(
    pieces: list[tuple[str, str, float]], topology: Topology
) -> tuple[tuple[str, float], ...]:
    """Channel time per channel of transfers ``(sender, receiver, ms at the pair's rate)``
    that start together:

        point_to_point: every piece holds its pair's channel for its own ms;
        switched:       a sender's uplink is held for the sum of its pieces, a receiver's
                        downlink for the sum of its pieces;
        shared_medium:  the one medium is held for the sum of all pieces.

    The boundary's channel time is the largest load: max over pieces (point-to-point),
    max over ports (switched), the sum (shared medium).
    """
    loads: dict[str, float] = {}
    for a, b, ms in pieces:
        if topology == "shared_medium":
            keys = ["medium"]
        elif topology == "switched":
            keys = [f"{a} up", f"{b} down"]
        else:
            keys = [f"{a}->{b}"]
        for k in keys:
            loads[k] = loads.get(k, 0.0) + ms
    return tuple(loads.items())


def round_makespan(
    schedule: Schedule,
    compute: list[tuple[float, float]],
    links: list[BoundaryCost],
    allreduce: list[tuple[float, float, tuple[str, ...]]],
    topology: Topology,
) -> float:
    """Iteration time of one round by list scheduling the stage-level schedule on the
    network's resources.

    Inputs: ``schedule`` (per stage its actions, :mod:`planner.schedule`); per stage
    ``compute[p] = (E_f, E_b)`` (its slowest device, Eq. 8) and ``allreduce[p] = (T_a,
    latency part of T_a, the group's device ids)``; per boundary p -> p+1 its
    :class:`BoundaryCost` (channel loads per direction, :func:`channel_loads`).

    Tasks: stage p runs its F/B in schedule order; ``F_p(m)`` also waits for the
    activation transfer of m from p-1, ``B_p(m)`` for the gradient transfer from p+1.
    ``SEND_F``/``SEND_B`` make a stage-level transfer (all pieces of the boundary) ready
    when the compute before it ends. It starts when every channel it uses is free, holds
    each for that channel's load and is delivered ``latency`` after the most loaded one
    is through. Channels: one per ordered device pair (point_to_point: full duplex, a
    boundary's directions never meet), an uplink and a downlink per device (switched: a
    middle stage's activations and gradients share its uplinks), or one medium
    (shared_medium). The all-reduce of stage p: point_to_point uses the group's own
    pairs (a pure delay); switched holds every member's uplink and downlink for T_a;
    shared_medium uses the medium only where the pipeline leaves it idle (its channel
    time fills the gaps after it is ready, all-reduces in ready order; the latency part
    is added at the end).

    Every channel serves transfers first come, first served (ties in the order they
    became ready); the round ends with the last compute or all-reduce. An event heap
    keyed by ready time makes the order exact: a task never becomes ready before the
    event that readies it. O(A log A) for A = O(P M) tasks (plus O(P x busy periods) for
    the shared-medium all-reduces).

    Raises:
        ValueError: the schedule deadlocks.
    """
    num_stages = len(schedule)
    orders = [compute_actions(actions) for actions in schedule]
    last = num_stages - 1
    arrived: dict[tuple[str, int, int], float] = {}  # ("F"|"B", stage, m) -> delivery
    free: dict[str, float] = {}
    busy: dict[str, list[tuple[float, float]]] = {}  # channel -> intervals held
    heap: list[tuple[float, int, str, int, int]] = []  # (ready, seq, task, stage, m)
    seq = 0
    pos = [0] * num_stages
    stage_free = [0.0] * num_stages
    waiting = [False] * num_stages
    ends = [0.0]
    ar_ready: list[tuple[float, int]] = []

    def push(ready: float, task: str, p: int, m: int) -> None:
        nonlocal seq
        heapq.heappush(heap, (ready, seq, task, p, m))
        seq += 1

    def try_compute(p: int) -> None:
        if waiting[p] or pos[p] == len(orders[p]):
            return
        action = orders[p][pos[p]]
        m = action.micro_batch
        assert m is not None
        if action.type == ActionType.F:
            dep = arrived.get(("F", p, m)) if p > 0 else 0.0
        else:
            dep = arrived.get(("B", p, m)) if p < last else 0.0
        if dep is None:
            return
        waiting[p] = True
        push(max(stage_free[p], dep), action.type.value, p, m)

    for p in range(num_stages):
        try_compute(p)
    while heap:
        ready, _, task, p, m = heapq.heappop(heap)
        if task in ("F", "B"):
            end = ready + compute[p][0 if task == "F" else 1]
            stage_free[p], waiting[p] = end, False
            pos[p] += 1
            ends.append(end)
            if task == "F" and p < last:
                push(end, "send_F", p, m)
            if task == "B" and p > 0:
                push(end, "send_B", p, m)
            if pos[p] == len(orders[p]) and allreduce[p][0] > 0:
                if topology == "point_to_point":
                    ends.append(end + allreduce[p][0])
                else:
                    ar_ready.append((end, p))
            try_compute(p)
        else:
            dst = p + 1 if task == "send_F" else p - 1
            link = links[min(p, dst)]
            loads = link.forward_load if task == "send_F" else link.backward_load
            start = max([ready] + [free.get(r, 0.0) for r, _ in loads])
            for r, ms in loads:
                free[r] = start + ms
                busy.setdefault(r, []).append((start, start + ms))
            occupancy = max((ms for _, ms in loads), default=0.0)
            arrived[(task[-1], dst, m)] = start + occupancy + link.latency_ms
            try_compute(dst)
    if any(pos[p] < len(orders[p]) for p in range(num_stages)):
        raise ValueError("the schedule deadlocks: a stage waits for a transfer never sent")
    cursor = 0.0  # shared medium: all-reduces also queue behind each other
    for ready, p in sorted(ar_ready):
        work, latency = allreduce[p][0] - allreduce[p][1], allreduce[p][1]
        if topology == "shared_medium":
            cursor = _fill_gaps(busy.get("medium", []), max(cursor, ready), work)
            ends.append(cursor + latency)
        else:  # switched: the ring needs its members' ports, disjoint between stages
            ports = [f"{d} {way}" for d in allreduce[p][2] for way in ("up", "down")]
            held = sorted(iv for r in ports for iv in busy.get(r, []))
            ends.append(_fill_gaps(held, ready, work) + latency)
    return max(ends)


def _fill_gaps(busy: list[tuple[float, float]], start: float, work: float) -> float:
    """When ``work`` ms of channel time, begun at ``start``, ends on channels that the
    ``busy`` intervals (sorted by start, possibly overlapping) already hold."""
    t = start
    for b_start, b_end in busy:
        if b_end <= t:
            continue
        if b_start > t:
            if t + work <= b_start:
                return t + work
            work -= b_start - t
        t = max(t, b_end)
    return t + work


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
        self.bw = np.array([[cluster.bytes_per_ms(i, j) for j in range(n)] for i in range(n)])
        self.lat = np.array([[cluster.latency_ms(i, j) for j in range(n)] for i in range(n)])
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

    def replicas(self, partition: Partition) -> tuple[Replica, ...]:
        """Where each stage's state is replicated (:func:`planner.replicas.placement` with
        the config's interval and :meth:`replica_bytes`)."""
        cluster = self.problem.cluster
        budget = {d.id: float(self.budget[i]) for i, d in enumerate(cluster.devices)}
        interval = self.problem.config.replication_interval
        return placement(partition, budget, interval, self.replica_bytes)

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

    def allreduce_latency_ms(self, group: list[int]) -> float:
        """The latency part of :meth:`allreduce_ms`: 2(g-1) x the group's largest latency."""
        g = len(group)
        if g <= 1:
            return 0.0
        sub = np.ix_(group, group)
        return float(2 * (g - 1) * self.lat[sub][~np.eye(g, dtype=bool)].max())

    def link_transfer(self, a: StageAssignment, b: StageAssignment) -> BoundaryCost:
        """The boundary between consecutive stages ``a`` and ``b``: the micro-batch
        re-sliced into pieces by sample interval (:func:`reslice_pieces`), each at its
        pair's rate, loaded on the topology's channels (:func:`channel_loads`); latency =
        the largest over the pieces' pairs."""
        cl = self.problem.cluster
        per_sample = float(self.boundary[a.end - 1])
        ga = [cl.index(d) for d in a.devices]
        gb = [cl.index(d) for d in b.devices]
        pieces = reslice_pieces(a.samples, b.samples)
        ms = [(i, j, n * per_sample / float(self.bw[ga[i], gb[j]])) for i, j, n in pieces]
        lat = max((float(self.lat[ga[i], gb[j]]) for i, j, _ in pieces), default=0.0)
        kind = cl.network.kind
        return BoundaryCost(
            channel_loads([(a.devices[i], b.devices[j], t) for i, j, t in ms], kind),
            channel_loads([(b.devices[j], a.devices[i], t) for i, j, t in ms], kind),
            lat,
        )

    def link_ms(self, cut: int, micro_batch: int, group_a: list[int], group_b: list[int]) -> float:
        """One direction of the chain's link step at block boundary ``cut`` (after block
        ``cut - 1``): the whole micro-batch over the slowest pair (the closed form's and
        the exact solver's link, module docstring)."""
        sub = np.ix_(group_a, group_b)
        bw = float(self.bw[sub].min())
        lat = float(self.lat[sub].max())
        return float(transfer_ms(micro_batch * float(self.boundary[cut - 1]), bw, lat))

    # -- whole partitions --------------------------------------------------------------------
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
        steps: list[Step] = []
        stage_costs: list[StageCost] = []
        links: list[BoundaryCost] = []
        ar_parts: list[tuple[float, float, tuple[str, ...]]] = []
        for p, stage in enumerate(partition.stages):
            warmup = config.warmup_depth(p, num_stages, m)
            times = [
                self.device_times(stage.first, stage.end, d, y)
                for d, y in zip(groups[p], stage.samples, strict=True)
            ]
            dev_f = tuple(t[0] for t in times)
            dev_b = tuple(t[1] for t in times)
            ar = self.allreduce_ms(stage.first, stage.end, groups[p])
            link = (
                self.link_ms(stage.end, mb, groups[p], groups[p + 1]) if p + 1 < num_stages else 0.0
            )
            if p + 1 < num_stages:
                links.append(self.link_transfer(stage, partition.stages[p + 1]))
            ar_parts.append((ar, self.allreduce_latency_ms(groups[p]), stage.devices))
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
        warmups = [s.warmup for s in stage_costs]
        total = round_makespan(
            build(config.schedule, warmups, m),  # type: ignore[arg-type]
            [(s.forward_ms, s.backward_ms) for s in stage_costs],
            links,
            ar_parts,
            topology,
        )
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


@lru_cache(maxsize=256)
def _prefix(timing: Timing, field: str, max_batch: int) -> np.ndarray:
    """Prefix table of one timing field; cached (read-only) because re-planning builds a
    cost model per call and must stay in milliseconds."""
    curves = batch_curve(timing.batch_sizes, np.asarray(getattr(timing, field)), max_batch)
    table = np.vstack([np.zeros((1, max_batch + 1)), np.cumsum(curves, axis=0)])
    table.flags.writeable = False
    return table
