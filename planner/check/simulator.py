"""An independent event simulator of one training iteration, written from the hardware's
semantics: the reference the cost model (:mod:`planner.cost.model`) is measured against.

It shares with the cost model only its inputs: the schedule (:mod:`planner.schedule`),
the cluster's pair bandwidths, latencies and topology (:mod:`planner.inputs.cluster`) and the
profile's time curves (:func:`planner.inputs.profile.batch_curve`). It imports nothing from
:mod:`planner.cost.model`, and it never aggregates a stage: every device and every transfer is
its own actor.

Model:
    * **Devices.** Every device of stage p runs the stage's action list (``schedule[p]``)
      over its own slice of each micro-batch, in order, one action at a time. ``F m`` /
      ``B m`` keep it busy for its own forward / backward time of the stage's blocks at
      its sample count (type time x slowdown), plus the runtime's own work per action
      where the device's type records it (``Timing.runtime_work``: the executor's CPU
      time per micro-batch beyond the blocks, measured by ``edgepipe lab profile``;
      docs/lab.md, "Runtime work per action"): ``F m`` its forward part, ``B m`` its
      backward part, on every device with samples. ``RECV_F m`` / ``RECV_B m`` wait until
      every piece addressed to it has been delivered. ``SEND_F m`` / ``SEND_B m`` post its
      pieces and return at once (asynchronous sends, as ``isend``). ``REDUCE_GRAD`` joins
      the stage's ring all-reduce and waits until the ring has delivered its last chunk.
    * **Optimizer step.** After its step's ``REDUCE_GRAD`` (its ring's last chunk
      received; at once without a ring) a device runs ``optimizer.step()`` over its
      stage's parameters, busy for (its type's measured ms per MiB for the config's
      optimizer, ``RuntimeWork.step_ms_per_mib``) x (the stage's parameter bytes / 2^20)
      x its slowdown, before anything of the next step (executor/core/loop.py: compute,
      then the optimizer step). Unmeasured: no time, and no record.
    * **Re-slicing.** Micro-batch samples are numbered 0..B-1 and every stage's devices
      take consecutive intervals in plan order. The piece from device i of stage p to
      device j of stage p+1 carries the samples of both intervals (their overlap) x the
      boundary bytes per sample of the stage's last block; gradients travel the same
      pieces backward.
    * **Ring all-reduce** over the g devices of a stage in plan order: the gradient bytes
      W are cut into g chunks; in each of the 2(g-1) ring steps member r sends one chunk
      (W / g bytes) to member r+1 (mod g). Step 0 of a member starts once all g members
      have joined; step k > 0 once the member has received step k-1 from member r-1.
    * **Transfers and channels.** A transfer of ``n`` bytes between devices a and b needs
      ``n / bw(a, b)`` ms of exclusive use of its channels and is delivered
      ``lat(a, b)`` ms after its last byte left (latency does not hold the channel).
      Channels by topology (``cluster.network.kind``):

        - ``point_to_point``: one channel per ordered pair (a -> b): full duplex, no two
          pairs interfere;
        - ``switched``: a transfer a -> b uses a's uplink and b's downlink: full duplex
          ports, but one device's sends (or receives) share its port;
        - ``shared_medium``: one half-duplex channel that every transfer uses, shared
          by sender: each device sending at the moment gets an equal part of the air
          time (a station's share under 802.11's DCF), which it splits equally among
          its transfers (measured in the lab: docs/decisions.md, "The shared medium
          is shared by sender").

      Messages between one ordered pair go one after the other in posting order (one
      connection per pair, as gloo keeps). The transfers at the head of their pairs share
      their channels max-min fairly (progressive filling): each channel gives out at most
      one unit of time per unit of time, a transfer progresses at the fraction ``x <= 1``
      of its own pair rate that it gets on its tightest channel, and no transfer can grow
      without shrinking one that is not larger. On the shared medium the filling is
      over senders instead: with k devices sending, each gets 1/k of the medium, and a
      sender's n heads progress at 1/(k n) each.

    * **Steps in a row** (``iterations`` > 1): step i+1's actions are each device's
      action list again, micro-batch m of step i numbered i x M + m. Nothing separates
      steps but what a rank of the executor waits for (executor/core/loop.py): a device
      starts step i+1 when it has ended its own step i, its ``REDUCE_GRAD`` and its
      optimizer step included, so
      a stage whose all-reduce ends early runs ahead while later stages still
      all-reduce; pairs keep their messages in order across steps. The steady-state
      step (:func:`steady_step_ms`) is the difference between the ends of two steps in
      a row once it no longer changes, the mean over 4 steps where it alternates.

Event loop: the clock jumps to the next compute end, delivery or transfer completion
under the current rates; rates are recomputed after every event. Complexity: with E
events (O(n M) compute actions and sends for n devices and M micro-batches, plus the ring
transfers) and at most T transfers in flight over C channels, O(E (n + T C)) time.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

import numpy as np
from edgepipe.planner.inputs.cluster import Topology
from edgepipe.planner.inputs.problem import Problem, check_partition
from edgepipe.planner.inputs.profile import batch_curve
from edgepipe.planner.partition import Partition
from edgepipe.planner.schedule import Action, ActionType, Schedule, build

#: what a device or a transfer is doing: a forward, a backward, or an all-reduce
WorkKind = Literal["F", "B", "AR"]

_EPS = 1e-9


@dataclass(frozen=True)
class Interval:
    """A device busy (``F``/``B``: computing micro-batch ``micro_batch``; ``AR``: inside
    its all-reduce, micro-batch -1) from ``start_ms`` to ``end_ms``."""

    kind: WorkKind
    micro_batch: int
    start_ms: float
    end_ms: float

    @property
    def duration_ms(self) -> float:
        return self.end_ms - self.start_ms


@dataclass(frozen=True)
class Transfer:
    """One message: ``F`` (a piece of activations), ``B`` (a piece of gradients) or
    ``AR`` (a ring chunk; ``micro_batch`` is then the ring step). Posted at
    ``posted_ms``, on its channels from ``start_ms`` (when its pair's earlier messages
    were through) to ``end_ms``, delivered at ``delivered_ms``."""

    kind: WorkKind
    micro_batch: int
    src: str
    dst: str
    num_bytes: float
    channels: tuple[str, ...]
    posted_ms: float
    start_ms: float
    end_ms: float
    delivered_ms: float


@dataclass(frozen=True)
class Timeline:
    """The simulated iteration.

    Attributes:
        topology: the network kind simulated.
        stages: per stage, its device ids in plan order.
        devices: per device id, its busy intervals in time order.
        transfers: every transfer, in the order they completed.
        makespan_ms: when the last device finished (all-reduces and optimizer steps
            included).
        num_micro_batches: M (of one step).
        iterations: steps simulated in a row.
        optimizer: per device id, the (start, end) of each step's optimizer step, in
            step order (empty where the profile has no step time).
    """

    topology: Topology
    stages: tuple[tuple[str, ...], ...]
    devices: dict[str, tuple[Interval, ...]]
    transfers: tuple[Transfer, ...]
    makespan_ms: float
    num_micro_batches: int
    iterations: int = 1
    optimizer: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)

    def iteration_ends(self) -> list[float]:
        """When each step ended: its last compute, delivery of a piece, all-reduce or
        optimizer step (a device's k-th all-reduce, and its k-th optimizer step, are of
        step k). O(intervals + transfers)."""
        ends = [0.0] * self.iterations
        for ivs in self.devices.values():
            rings = 0
            for iv in ivs:
                if iv.kind == "AR":
                    step, rings = rings, rings + 1
                else:
                    step = iv.micro_batch // self.num_micro_batches
                ends[step] = max(ends[step], iv.end_ms)
        for t in self.transfers:
            if t.kind != "AR":
                step = t.micro_batch // self.num_micro_batches
                ends[step] = max(ends[step], t.delivered_ms)
        for steps in self.optimizer.values():
            for step, (_, end) in enumerate(steps):
                ends[step] = max(ends[step], end)
        return ends

    def channel_intervals(self) -> dict[str, tuple[tuple[float, float], ...]]:
        """Per channel, the (start, end) of every transfer that used it, by start time."""
        out: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for t in self.transfers:
            for ch in t.channels:
                out[ch].append((t.start_ms, t.end_ms))
        return {ch: tuple(sorted(v)) for ch, v in sorted(out.items())}


def default_schedule(problem: Problem, partition: Partition) -> Schedule:
    """The schedule the plan's config names, with the config's warm-up depths."""
    config, stages, m = problem.config, partition.num_stages, partition.num_micro_batches
    warmups = [config.warmup_depth(p, stages, m) for p in range(stages)]
    return build(config.schedule, warmups, m)


def simulate(problem: Problem, partition: Partition, schedule: Schedule | None = None,
             iterations: int = 1) -> Timeline:
    """Simulate ``iterations`` steps in a row (one by default) of ``partition`` on
    ``problem``'s cluster (module docstring).

    ``schedule`` defaults to :func:`default_schedule`. Raises
    :class:`~planner.errors.PlanMismatchError` when ``partition`` does not fit ``problem``
    (:func:`planner.inputs.problem.check_partition`), ``ValueError`` when the schedule
    does not have one action list per stage, or deadlocks (the message names each
    blocked device and the action it waits on).
    """
    check_partition(problem, partition)
    if schedule is None:
        schedule = default_schedule(problem, partition)
    if len(schedule) != partition.num_stages:
        raise ValueError(
            f"the schedule has {len(schedule)} stages, the partition {partition.num_stages}"
        )
    m = partition.num_micro_batches
    steps = tuple(
        tuple(
            a if a.micro_batch is None else Action(a.stage, a.type, a.micro_batch + i * m)
            for i in range(iterations)
            for a in lane
        )
        for lane in schedule
    )
    return _Simulation(problem, partition, steps, iterations).run()


#: steps simulated for :func:`steady_step_ms`
STEADY_STEPS = 5
#: steps whose mean is the steady step where the last two differences disagree, and
#: the steps simulated then (a transient of ``CYCLE_STEPS``, the span, the last one)
CYCLE_STEPS = 4
LONG_STEPS = 2 * CYCLE_STEPS + 2


def steady_step_ms(problem: Problem, partition: Partition) -> float:
    """The steady-state step: ``STEADY_STEPS`` steps in a row (:func:`simulate`), the
    difference between the ends of the last two steps that have a successor (the last
    step shares its channels with no following one, so it is left out) where it equals
    the difference before it (within 1e-9 relative). Where it does not, the steps have
    not settled or alternate (period 2 or 4 on a shared channel): ``LONG_STEPS`` steps
    in a row, and the mean of the ``CYCLE_STEPS`` steps before the last, a whole number
    of cycles of period 1, 2 or 4 after a transient of ``CYCLE_STEPS`` steps (a longer
    cycle or transient is averaged over a part: within the differences' spread).
    O(STEADY_STEPS) simulations' work, O(LONG_STEPS) more where they differ."""
    ends = simulate(problem, partition, iterations=STEADY_STEPS).iteration_ends()
    last, before = ends[-2] - ends[-3], ends[-3] - ends[-4]
    if abs(last - before) <= 1e-9 * last:
        return last
    ends = simulate(problem, partition, iterations=LONG_STEPS).iteration_ends()
    return (ends[-2] - ends[-2 - CYCLE_STEPS]) / CYCLE_STEPS


@dataclass
class _Flow:
    kind: WorkKind
    micro_batch: int
    src: str
    dst: str
    num_bytes: float
    channels: tuple[str, ...]
    posted_ms: float
    remaining_ms: float  # channel time still needed at full pair rate
    latency_ms: float
    on_delivery: Callable[[], None]
    start_ms: float | None = None


class _Simulation:
    def __init__(self, problem: Problem, partition: Partition, schedule: Schedule,
                 iterations: int) -> None:
        cluster, model = problem.cluster, problem.model
        self.cluster = cluster
        self.topology: Topology = cluster.network.kind
        self.schedule = schedule
        self.m = partition.num_micro_batches
        self.iterations = iterations
        self.stages = tuple(s.devices for s in partition.stages)
        self.stage_of = {d: p for p, devs in enumerate(self.stages) for d in devs}
        batch = partition.micro_batch_size
        curves: dict[tuple[str, str], np.ndarray] = {}
        for name, timing in problem.timings.items():
            for column in ("forward_ms", "backward_ms"):
                curves[(name, column)] = batch_curve(
                    timing.batch_sizes, np.asarray(getattr(timing, column)), batch
                )
        self.compute: dict[tuple[str, ActionType], float] = {}
        self.step_ms: dict[str, float] = {}  # per device: its optimizer step
        self.interval: dict[str, tuple[int, int]] = {}
        for stage in partition.stages:
            offset = 0
            for dev, y in zip(stage.devices, stage.samples, strict=True):
                i = cluster.index(dev)
                kind, slow = cluster.devices[i].type, cluster.devices[i].slowdown
                work = problem.timings[kind].runtime_work
                for action, column in ((ActionType.F, "forward_ms"), (ActionType.B, "backward_ms")):
                    rows = curves[(kind, column)][stage.first : stage.end, y]
                    extra = getattr(work, column) if work is not None and y > 0 else 0.0
                    self.compute[(dev, action)] = (float(rows.sum()) + extra) * slow
                per_mib = 0.0 if work is None else work.step_ms(problem.config.optimizer)
                mib = sum(b.param_bytes for b in model.blocks[stage.first : stage.end]) / 2**20
                self.step_ms[dev] = per_mib * mib * slow
                self.interval[dev] = (offset, offset + y)
                offset += y
        # pieces[p]: (sender in stage p, receiver in stage p+1, bytes)
        self.pieces: list[list[tuple[str, str, float]]] = []
        for p in range(len(self.stages) - 1):
            per_sample = model.blocks[partition.stages[p].end - 1].output_bytes_per_sample
            out = []
            for a in self.stages[p]:
                for b in self.stages[p + 1]:
                    lo = max(self.interval[a][0], self.interval[b][0])
                    hi = min(self.interval[a][1], self.interval[b][1])
                    if hi > lo:
                        out.append((a, b, (hi - lo) * per_sample))
            self.pieces.append(out)
        self.grad_bytes = [
            float(sum(b.param_bytes for b in model.blocks[s.first : s.end]))
            for s in partition.stages
        ]

        self.now = 0.0
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = 0
        self.flows: list[_Flow] = []
        self.done_transfers: list[Transfer] = []
        self.position = {d: 0 for d in self.stage_of}
        self.busy = dict.fromkeys(self.stage_of, False)
        self.intervals: dict[str, list[Interval]] = {d: [] for d in self.stage_of}
        self.arrived: dict[tuple[str, str, int], int] = defaultdict(int)  # (dst, F|B, m)
        self.expected: dict[tuple[str, str, int], int] = {}
        for pieces in self.pieces:
            for a, b, _ in pieces:
                for m in range(self.m * iterations):
                    self.expected[(b, "F", m)] = self.expected.get((b, "F", m), 0) + 1
                    self.expected[(a, "B", m)] = self.expected.get((a, "B", m), 0) + 1
        self.ring_joined: dict[int, set[str]] = defaultdict(set)
        self.ring_received: dict[str, int] = {}  # member -> ring steps received
        self.ring_entered: dict[str, float] = {}
        self.optimizer: dict[str, list[tuple[float, float]]] = {d: [] for d in self.stage_of}

    # -- transfers ---------------------------------------------------------------------------
    def _channels(self, a: str, b: str) -> tuple[str, ...]:
        if self.topology == "shared_medium":
            return ("medium",)
        if self.topology == "switched":
            return (f"{a} up", f"{b} down")
        return (f"{a}->{b}",)

    def _post(
        self,
        kind: WorkKind,
        m: int,
        a: str,
        b: str,
        n: float,
        then: Callable[[], None],
    ) -> None:
        i, j = self.cluster.index(a), self.cluster.index(b)
        self.flows.append(
            _Flow(
                kind,
                m,
                a,
                b,
                n,
                self._channels(a, b),
                self.now,
                n / self.cluster.bytes_per_ms(i, j),
                self.cluster.latency_ms(i, j),
                then,
            )
        )

    def _rates(self) -> list[float]:
        """Max-min fair fractions by progressive filling over the flows at the head of
        their pairs (the others get 0): raise every unfrozen flow's fraction together
        until a channel is full (its flows freeze) or the fraction reaches 1. O(T C) per
        round, at most T + 1 rounds. On a shared medium: :meth:`_medium_rates`."""
        heads: dict[tuple[str, str], int] = {}
        for f, flow in enumerate(self.flows):
            heads.setdefault((flow.src, flow.dst), f)
        for f in heads.values():
            if self.flows[f].start_ms is None:
                self.flows[f].start_ms = self.now
        if self.topology == "shared_medium":
            return self._medium_rates(heads)
        rate = [0.0] * len(self.flows)
        residual: dict[str, float] = defaultdict(lambda: 1.0)
        unfrozen = set(heads.values())
        level = 0.0
        while unfrozen:
            users: dict[str, int] = defaultdict(int)
            for f in unfrozen:
                for ch in self.flows[f].channels:
                    users[ch] += 1
            step = min([1.0 - level] + [residual[ch] / c for ch, c in users.items()])
            level += step
            for ch, c in users.items():
                residual[ch] -= step * c
            full = {ch for ch in users if residual[ch] <= _EPS}
            frozen = {
                f
                for f in unfrozen
                if level >= 1.0 - _EPS or any(ch in full for ch in self.flows[f].channels)
            }
            for f in frozen:
                rate[f] = level
            unfrozen -= frozen
        return rate

    def _medium_rates(self, heads: dict[tuple[str, str], int]) -> list[float]:
        """The medium's air time by sender: each sending device 1 / (number sending),
        split equally among its heads; the flows behind a head get 0. O(T)."""
        rate = [0.0] * len(self.flows)
        per_sender: dict[str, list[int]] = defaultdict(list)
        for (src, _), f in heads.items():
            per_sender[src].append(f)
        for fs in per_sender.values():
            for f in fs:
                rate[f] = 1.0 / (len(per_sender) * len(fs))
        return rate

    # -- devices -------------------------------------------------------------------------------
    def _push(self, at: float, what: Callable[[], None]) -> None:
        heapq.heappush(self.events, (at, self.seq, what))
        self.seq += 1

    def _advance(self, dev: str) -> bool:
        """Run ``dev``'s zero-time actions and start its next compute; True if it moved."""
        moved = False
        p = self.stage_of[dev]
        actions = self.schedule[p]
        while not self.busy[dev] and self.position[dev] < len(actions):
            a = actions[self.position[dev]]
            t = a.type
            if t in (ActionType.RECV_F, ActionType.RECV_B):
                key = (dev, "F" if t == ActionType.RECV_F else "B", _mb(a))
                if self.arrived[key] < self.expected.get(key, 0):
                    return moved
            elif t in (ActionType.F, ActionType.B):
                duration = self.compute[(dev, t)]
                kind: Literal["F", "B"] = "F" if t == ActionType.F else "B"
                self.intervals[dev].append(Interval(kind, _mb(a), self.now, self.now + duration))
                self.busy[dev] = True
                self._push(self.now + duration, partial(self._compute_done, dev))
            elif t in (ActionType.SEND_F, ActionType.SEND_B):
                self._send(dev, a)
            else:  # REDUCE_GRAD: busy until the ring delivers its last chunk, then stepping
                if len(self.stages[p]) > 1:
                    self.busy[dev] = True
                    self._join_ring(dev, p)
                else:
                    self._step(dev)
            self.position[dev] += 1
            moved = True
        return moved

    def _compute_done(self, dev: str) -> None:
        self.busy[dev] = False

    def _step(self, dev: str) -> None:
        """``dev``'s optimizer step: busy for its step time from now (none: nothing)."""
        ms = self.step_ms[dev]
        if ms > 0:
            self.busy[dev] = True
            self.optimizer[dev].append((self.now, self.now + ms))
            self._push(self.now + ms, partial(self._compute_done, dev))

    def _send(self, dev: str, a: Action) -> None:
        p, m = self.stage_of[dev], _mb(a)
        if a.type == ActionType.SEND_F:
            for src, dst, n in self.pieces[p]:
                if src == dev:
                    self._post("F", m, src, dst, n, partial(self._arrive, dst, "F", m))
        else:
            for src, dst, n in self.pieces[p - 1]:
                if dst == dev:
                    self._post("B", m, dst, src, n, partial(self._arrive, src, "B", m))

    def _arrive(self, dev: str, kind: str, m: int) -> None:
        self.arrived[(dev, kind, m)] += 1

    def _join_ring(self, dev: str, p: int) -> None:
        group = self.stages[p]
        self.ring_entered[dev] = self.now
        self.ring_joined[p].add(dev)
        if len(self.ring_joined[p]) == len(group):
            self.ring_joined[p] = set()  # the next step's ring
            for r in range(len(group)):
                self.ring_received[group[r]] = 0
                self._ring_send(p, r, 0)

    def _ring_send(self, p: int, r: int, step: int) -> None:
        group = self.stages[p]
        g = len(group)
        src, dst = group[r], group[(r + 1) % g]
        self._post(
            "AR", step, src, dst, self.grad_bytes[p] / g, lambda: self._ring_arrive(p, (r + 1) % g)
        )

    def _ring_arrive(self, p: int, r: int) -> None:
        group = self.stages[p]
        member = group[r]
        self.ring_received[member] += 1
        steps = 2 * (len(group) - 1)
        if self.ring_received[member] < steps:
            self._ring_send(p, r, self.ring_received[member])
        else:
            self.busy[member] = False
            self.intervals[member].append(Interval("AR", -1, self.ring_entered[member], self.now))
            self._step(member)

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> Timeline:
        devices = list(self.stage_of)
        while True:
            while any([self._advance(d) for d in devices]):
                pass
            if not self.flows and not self.events:
                break
            rates = self._rates()
            horizon = self.events[0][0] if self.events else np.inf
            for f, x in zip(self.flows, rates, strict=True):
                if x > 0:
                    horizon = min(horizon, self.now + f.remaining_ms / x)
            elapsed = horizon - self.now
            still: list[_Flow] = []
            for f, x in zip(self.flows, rates, strict=True):
                f.remaining_ms -= elapsed * x
                if f.remaining_ms <= _EPS * max(1.0, horizon):
                    delivered = horizon + f.latency_ms
                    self.done_transfers.append(
                        Transfer(
                            f.kind,
                            f.micro_batch,
                            f.src,
                            f.dst,
                            f.num_bytes,
                            f.channels,
                            f.posted_ms,
                            self.now if f.start_ms is None else f.start_ms,
                            horizon,
                            delivered,
                        )
                    )
                    self._push(delivered, f.on_delivery)
                else:
                    still.append(f)
            self.flows = still
            self.now = horizon
            while self.events and self.events[0][0] <= self.now + _EPS * max(1.0, self.now):
                _, _, what = heapq.heappop(self.events)
                what()

        for p, devs in enumerate(self.stages):
            for d in devs:
                if self.position[d] < len(self.schedule[p]) or self.busy[d]:
                    raise ValueError(self._deadlock_message())
        ends = [iv.end_ms for ivs in self.intervals.values() for iv in ivs]
        ends += [t.delivered_ms for t in self.done_transfers]
        ends += [end for steps in self.optimizer.values() for _, end in steps]
        return Timeline(
            topology=self.topology,
            stages=self.stages,
            devices={d: tuple(ivs) for d, ivs in self.intervals.items()},
            transfers=tuple(self.done_transfers),
            makespan_ms=max(ends, default=0.0),
            num_micro_batches=self.m,
            iterations=self.iterations,
            optimizer={d: tuple(v) for d, v in self.optimizer.items() if v},
        )

    def _deadlock_message(self) -> str:
        blocked = []
        for p, devs in enumerate(self.stages):
            for d in devs:
                if self.position[d] < len(self.schedule[p]):
                    blocked.append(f"{d} (stage {p}) waits at {self.schedule[p][self.position[d]]}")
                elif self.busy[d]:
                    blocked.append(f"{d} (stage {p}) waits in its all-reduce")
        return "the schedule deadlocks: " + "; ".join(blocked)


def _mb(action: Action) -> int:
    assert action.micro_batch is not None
    return action.micro_batch
