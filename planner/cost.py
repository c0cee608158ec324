"""The cost model: time and memory of a partition. The one place these formulas live.

Every planner, the simulator input, the comparison and the executor's report use this
module. Formulas follow the Asteroid reconstruction (reference/asteroid.md §3); the
decisions it leaves open are fixed here and recorded in docs/decisions.md.

Time of blocks at a batch size (§2, "non-linear batch scaling"): per device type and
block, times are known at measured batch sizes b_1 < ... < b_k. Between them time is
interpolated linearly; below b_1 it falls proportionally to 0 at batch 0; above b_k it
grows with the last segment's slope (proportionally when k = 1). A device's time is its
type's time x its ``slowdown``.

Stage compute step (Eq. 8): ``E_f = max_d t_f(stage, d, y_d)``, ``E_b = max_d t_b(...)``
over the devices d of the group with their samples y_d per micro-batch.

Link step p -> p+1 (Eq. 8): ``E_f = E_b = lat + B * a_p / bw``, a_p the boundary bytes
per sample, bw the minimum pairwise bandwidth between the two groups and lat the
largest pairwise latency (one transfer of the micro-batch's activations forward and of
its gradients back).

All-reduce (§3.3): ring over the g devices of a group, ``2(g-1)/g * W_p / bw_min +
2(g-1) * lat``; on a shared medium the g concurrent transfers of each ring step share one
channel, so ``2(g-1) * W_p / bw + 2(g-1) * lat``. Zero for g = 1.

Round latency. The reported iteration time is the exact makespan of the schedule (1F1B
with the steps' warm-ups, or GPipe) over these step times, by a longest-path recurrence
over the schedule's actions (:func:`schedule_makespan`, O(S x M)). The planners' search
objective is Asteroid's closed form (Eqs. 4-6, 11 with the aligned dominant step),
O(S), which is slightly optimistic (docs/benchmarks.md gives its error against the
simulator); the DP re-ranks its best candidates by the exact makespan. Closed form:
writing c_i = E_f^i + E_b^i,
C_c = sum_{i<c} c_i and PB_s = sum_{i<s} E_b^i, the closed form simplifies to

    T_round = max_c (M c_c + C_c) + max_s (T_a^s - PB_s)

because every step's finishing time T_w^s + T_e^s equals D - PB_s with D = max_c(M c_c +
C_c) (substitute Eq. 5 into both branches of Eq. 6). The dominant step is the argmax c.

Memory per device (Eq. 3): ``(2 + k_opt) * W_p + K_p * y_d * A_p`` - weights, gradients
and k_opt optimizer buffers per parameter (SGD 0, momentum 1, Adam 2), plus the saved
activations of its y_d samples for each of the stage's K_p in-flight micro-batches
(A_p = sum of the stage's saved bytes per sample; K_p from
:meth:`TrainingConfig.warmup_depth`). It must not exceed the device's usable memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.partition import Partition
from planner.problem import Problem
from planner.profile import Timing
from planner.simulator import one_f_one_b
from planner.steps import Step, StepChain


def batch_curve(batch_sizes: tuple[int, ...], times: np.ndarray, max_batch: int) -> np.ndarray:
    """Times at every integer batch 0..max_batch from times measured at ``batch_sizes``.

    ``times`` has shape (blocks, len(batch_sizes)); the result (blocks, max_batch + 1).
    Rule in the module docstring. O(blocks x max_batch).
    """
    sizes = np.asarray(batch_sizes, dtype=float)
    ys = np.arange(max_batch + 1, dtype=float)
    out = np.empty((times.shape[0], max_batch + 1))
    for r, row in enumerate(times):
        curve = np.interp(ys, sizes, row)
        low = ys < sizes[0]
        curve[low] = row[0] * ys[low] / sizes[0]
        high = ys > sizes[-1]
        if len(sizes) == 1:
            slope = row[0] / sizes[0]
        else:
            slope = max((row[-1] - row[-2]) / (sizes[-1] - sizes[-2]), 0.0)
        curve[high] = row[-1] + slope * (ys[high] - sizes[-1])
        out[r] = curve
    return out


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


@dataclass(frozen=True)
class PlanCost:
    """Prediction for a partition: iteration time, throughput, bottleneck, memory."""

    iteration_ms: float
    closed_form_ms: float
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
    :func:`planner.simulator.one_f_one_b`. Recurrence, each step's actions taken in order:

        end(s, a) = max(end(s, previous action of s), end(dependency of a)) + duration(a)

    with F(s, m) depending on F(s-1, m), B(s, m) on B(s+1, m) (on the last step on
    F(S-1, m)); the round ends when the last action or all-reduce ends. Actions are
    resolved in sweeps over the steps; each sweep settles at least one action, so it is
    O(S x M) actions x O(sweeps), a few per micro-batch in practice.

    Raises:
        ValueError: the warm-ups make the schedule deadlock.
    """
    actions = one_f_one_b(chain)
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

    def link_ms(self, cut: int, micro_batch: int, group_a: list[int], group_b: list[int]) -> float:
        """One direction of link step at block boundary ``cut`` (after block ``cut - 1``)."""
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
        steps: list[Step] = []
        stage_costs: list[StageCost] = []
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
                    link_out_ms=link,
                    warmup=warmup,
                    device_forward_ms=dev_f,
                    device_backward_ms=dev_b,
                    memory_bytes=tuple(
                        self.device_memory(stage.first, stage.end, y, warmup) for y in stage.samples
                    ),
                    budget_bytes=tuple(float(self.budget[d]) for d in groups[p]),
                )
            )
        chain = StepChain(tuple(steps), m)
        closed, dominant = closed_form_latency(chain)
        total = schedule_makespan(chain)
        return PlanCost(
            iteration_ms=total,
            closed_form_ms=closed,
            samples_per_s=mb * m / total * 1e3 if total > 0 else float("inf"),
            dominant_step=dominant,
            bottleneck=describe_step(dominant),
            stages=tuple(stage_costs),
            chain=chain,
        )


def _prefix(timing: Timing, field: str, max_batch: int) -> np.ndarray:
    curves = batch_curve(timing.batch_sizes, np.asarray(getattr(timing, field)), max_batch)
    return np.vstack([np.zeros((1, max_batch + 1)), np.cumsum(curves, axis=0)])
