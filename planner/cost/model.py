"""The cost model of one problem: :class:`CostModel` prices a partition (time and memory),
:class:`PlanCost` and :class:`StageCost` hold its figures. The overview of the cost model,
its three figures and where each formula lives: :mod:`planner.cost`.

Time of blocks at a batch size (reference/asteroid.md §2, "non-linear batch scaling"): per
device type and block, times are known at measured batch sizes b_1 < ... < b_k. Between
them time is interpolated linearly; below b_1 it falls proportionally to 0 at batch 0;
above b_k it grows with the last segment's slope (proportionally when k = 1). A device's
time is its type's time x its ``slowdown``.

The runtime's own work (docs/lab.md, "Runtime work per action"): a device type whose
timing carries :class:`~planner.inputs.profile.RuntimeWork` pays, on every stage it
runs with at least one sample, ``w_f`` more per micro-batch forward and ``w_b`` more
backward (x its slowdown), whatever the stage's blocks and samples: the executor's CPU
time per action (slicing, stamps, torch's dispatch, gloo's calls) that the lab measured
under the device's quota, and that made plans of 32 micro-batches run +41% to +212% over
a model without it. Absent: 0, every figure as before.

The optimizer step (docs/cost-model.md, "The optimizer step"): a device d of stage p
whose type's ``RuntimeWork`` carries ``step_ms_per_mib`` for the config's optimizer pays,
once per iteration, O_d = s_type(d) x W_p / 2^20 x slowdown_d (W_p: the stage's
parameter bytes; s: ms per MiB measured in the lab), after its last action and its
stage's ring all-reduce have ended, before its next iteration's first action, as the
executor's loop runs ``optimizer.step()``; the iteration ends with the last of them.
Absent: 0, every figure as before.

Stage compute step (Eq. 8): ``E_f = max_d t_f(stage, d, y_d)``, ``E_b = max_d t_b(...)``
over the devices d of the group with their samples y_d per micro-batch.

Memory per device: Eq. 3 (:mod:`planner.cost.formulas`). A device holding the ring replica
of a stage q (:mod:`planner.replan.replicas`; reference/asteroid.md §6) also pays
``(1 + k_opt) * W_q``, that stage's weights and optimizer state (gradients are not
replicated).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from edgepipe.planner.cost.chain import closed_form_latency, describe_step, schedule_makespan
from edgepipe.planner.cost.channels import background_ms, channel_loads
from edgepipe.planner.cost.fair_sharing import stage_transfer_ms
from edgepipe.planner.cost.formulas import ring_allreduce_ms, stage_memory_bytes, transfer_ms
from edgepipe.planner.cost.makespan import (
    longest_path_ends,
    longest_path_makespan,
    round_makespan,
)
from edgepipe.planner.cost.order import cached_schedule
from edgepipe.planner.cost.steady import ITERATIONS, STEADY, steady_period_ms
from edgepipe.planner.cost.steps import Step, StepChain
from edgepipe.planner.cost.transfers import BoundaryCost, Piece, RingCost, reslice_pieces
from edgepipe.planner.errors import PlanMismatchError
from edgepipe.planner.inputs.cluster import Cluster
from edgepipe.planner.inputs.problem import Problem, check_partition
from edgepipe.planner.inputs.profile import Timing, batch_curve
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.replan.replicas import RING, Replica, placement, refusal, ring_load, standbys
from edgepipe.planner.schedule import Schedule


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
    #: each device's optimizer step per iteration (CostModel.optimizer_ms; 0 unmeasured)
    device_optimizer_ms: tuple[float, ...] = ()


@dataclass(frozen=True)
class PlanCost:
    """Prediction for a partition: iteration time, throughput, bottleneck, memory.

    ``iteration_ms`` is one isolated iteration from a cold start; ``steady_ms`` the
    step of a long run, where consecutive steps may overlap (:mod:`planner.cost.steady`);
    ``samples_per_s`` is of the steady step."""

    iteration_ms: float
    steady_ms: float
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
        #: per device type the runtime's forward and backward ms per micro-batch (module
        #: docstring; 0 without a measurement)
        self.work: dict[str, tuple[float, float]] = {}
        #: per device type the optimizer step's ms per parameter MiB for the config's
        #: optimizer (module docstring; 0 without a measurement)
        self.step_per_mib: dict[str, float] = {}
        for name, timing in problem.timings.items():
            self.fwd[name] = _prefix(timing, "forward_ms", max_batch)
            self.bwd[name] = _prefix(timing, "backward_ms", max_batch)
            w = timing.runtime_work
            self.work[name] = (0.0, 0.0) if w is None else (w.forward_ms, w.backward_ms)
            self.step_per_mib[name] = 0.0 if w is None else w.step_ms(config.optimizer)
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
        """Forward and backward ms of blocks ``[first, end)`` on device ``dev`` at
        ``samples``, with the runtime's work per micro-batch when ``samples`` > 0 (module
        docstring)."""
        t = self.device_type[dev]
        f = self.fwd[t][end, samples] - self.fwd[t][first, samples]
        b = self.bwd[t][end, samples] - self.bwd[t][first, samples]
        if samples > 0:
            f, b = f + self.work[t][0], b + self.work[t][1]
        return float(f * self.slowdown[dev]), float(b * self.slowdown[dev])

    def optimizer_ms(self, first: int, end: int, dev: int) -> float:
        """The optimizer step of blocks ``[first, end)`` on device ``dev``, once per
        iteration: O_d = s x W / 2^20 x slowdown (module docstring). O(1)."""
        mib = float(self.param_prefix[end] - self.param_prefix[first]) / 2**20
        return self.step_per_mib[self.device_type[dev]] * mib * float(self.slowdown[dev])

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
        """Channel time per channel (:func:`planner.cost.channels.channels`) of one
        iteration's own transfers under ``partition``: each boundary's activation and
        gradient pieces once per micro-batch (:meth:`link_transfer`) and each ring
        all-reduce's chunks once per ring step, 2(g - 1) (:meth:`ring`). O(P x g)."""
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
        the exact solver's link, :mod:`planner.cost.chain`)."""
        if len(group_a) == 1 and len(group_b) == 1:  # one pair: no sub-table
            bw = float(self.bw[group_a[0], group_b[0]])
            lat = float(self.lat[group_a[0], group_b[0]])
        else:
            sub = np.ix_(group_a, group_b)
            bw = float(self.bw[sub].min())
            lat = float(self.lat[sub].max())
        return float(transfer_ms(micro_batch * float(self.boundary[cut - 1]), bw, lat))

    # -- whole partitions --------------------------------------------------------------------
    def _optimizer_inputs(self, partition: Partition) -> list[list[float]] | None:
        """Per stage, each device's optimizer step ms (:meth:`optimizer_ms`), in the
        order of :meth:`_round_inputs`' devices; None when every one is 0, so a plan
        without the measurement runs the rounds exactly as before. O(P x g)."""
        cluster = self.problem.cluster
        return _any_steps([[self.optimizer_ms(s.first, s.end, cluster.index(d))
                            for d in s.devices] for s in partition.stages])

    def _round_inputs(
        self, partition: Partition
    ) -> tuple[Schedule, list[list[tuple[str, float, float]]], list[BoundaryCost], list[RingCost]]:
        """What one round's makespan reads (:func:`round_makespan`): the schedule at the
        stages' warm-ups, per stage each device's id and forward and backward ms for its
        samples, the boundaries' re-sliced pieces and the stages' rings (the optimizer
        steps, also read: :meth:`_optimizer_inputs`). O(P x g)."""
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
        return cached_schedule(config.schedule, warmups, m), devices, links, rings

    def stage_transfer_ms(self, partition: Partition) -> list[tuple[float, float]]:
        """Per stage, its outgoing link and its all-reduce under the plan's own traffic
        (the ``link ms`` and ``ar ms`` a plan prints): each boundary's pieces from post to
        delivery per micro-batch and direction, and each ring from its start to its end,
        in the steady step, the next-to-last of ``steady.ITERATIONS`` chained rounds
        (:func:`planner.cost.fair_sharing.stage_transfer_ms`; docs/decisions.md, "The
        per-stage link and all-reduce columns"). O(one steady-state evaluation)."""
        return stage_transfer_ms(*self._round_inputs(partition), self.problem.cluster.network.kind,
                                 ITERATIONS, STEADY, self._optimizer_inputs(partition))

    def round_lower_bound_ms(self, partition: Partition) -> float:
        """A lower bound on ``evaluate(partition).iteration_ms``, about ten times cheaper
        on a switch or a shared medium (equal point to point): the round with every
        transfer at its pair's full rate, :func:`longest_path_makespan` on the inputs of
        :func:`round_makespan`. Why it is a lower bound:
        :func:`planner.cost.fair_sharing.fair_sharing_makespan` runs the same actions in
        the same orders (each device its stage's schedule; each ordered pair its messages
        in posting order, which is its sender's action order for a boundary and the step
        order for a ring; rings after their stage's last action), with the same compute
        times and latencies, and a transfer at the head of its pair progresses at a fair
        share <= 1 of its rate, so it lasts at least its ``ms``. Every start is the latest
        end of what it waits for, so by induction along that common order no action ends
        earlier than in the longest path (the optimizer steps are the same fixed
        durations in both)."""
        return longest_path_makespan(*self._round_inputs(partition),
                                     self._optimizer_inputs(partition))

    def full_rate_ends(self, partition: Partition, iterations: int) -> list[float]:
        """When each of ``iterations`` chained rounds ends with every transfer at its
        pair's full rate (no channel sharing, no event queue):
        :func:`planner.cost.makespan.longest_path_ends` on the inputs of
        :meth:`evaluate`'s rounds; exact point to point, no later than the shared rounds
        elsewhere (:meth:`round_lower_bound_ms`'s argument)."""
        return longest_path_ends(*self._round_inputs(partition), iterations,
                                 self._optimizer_inputs(partition))

    def evaluate(self, partition: Partition) -> PlanCost:
        """All figures of ``partition``: step chain, round latency, the steady-state step,
        per-stage costs, memory.

        O(P x g) plus the round latency's cost, ``1 + steady.ITERATIONS`` times.

        Raises:
            PlanMismatchError: ``partition`` does not fit the problem
                (:func:`planner.inputs.problem.check_partition`), or its micro-batch is
                larger than this model's tables (``max_batch``).
        """
        check_partition(self.problem, partition)
        if partition.micro_batch_size > self.max_batch:
            raise PlanMismatchError(
                f"micro-batch size {partition.micro_batch_size} is above this cost model's "
                f"max_batch {self.max_batch}; build it as CostModel(problem, "
                f"{partition.micro_batch_size})"
            )
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
                    device_optimizer_ms=tuple(
                        self.optimizer_ms(stage.first, stage.end, d) for d in groups[p]),
                )
            )
        topology = cluster.network.kind
        chain = StepChain(tuple(steps), m, topology)
        closed, dominant = closed_form_latency(chain)
        optim = _any_steps([list(c.device_optimizer_ms) for c in stage_costs])
        total = round_makespan(schedule, devices, links, rings, topology, optim)
        steady = steady_period_ms(schedule, devices, links, rings, topology, total, optim)
        return PlanCost(
            iteration_ms=total,
            steady_ms=steady,
            closed_form_ms=closed,
            chain_ms=schedule_makespan(chain),
            samples_per_s=mb * m / steady * 1e3 if steady > 0 else float("inf"),
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


def _any_steps(steps: list[list[float]]) -> list[list[float]] | None:
    """Per stage each device's optimizer step ms, or None when every one is 0 (a plan
    without the measurement runs the rounds exactly as before)."""
    return steps if any(x > 0 for row in steps for x in row) else None
