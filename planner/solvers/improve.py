"""A local improvement pass over a finished plan (issue 29): move single cuts, shift a
device between adjacent stages, move a sample inside a stage, try the neighbouring
micro-batch sizes; keep a move when the cost model prices it faster, until none helps.

Inputs: a :class:`~planner.inputs.problem.Problem`, a memory-feasible
:class:`~planner.partition.Partition` of it (the DP's plan, :func:`planner.solvers.solve.solve`
runs this pass after the DP by default), further starts, a radius k, a budget of
evaluations, a number of kicks and an optional safety stop (wall clock or a
:class:`~planner.solvers.time_limit.Deadline`).

Objective: the cost model's steady-state step (``PlanCost.steady_ms``, what plans are
ranked by, :func:`planner.solvers.dp.sizes.choose`), every candidate scored by
:meth:`CostModel.evaluate` (the one cost model: no private formula). A candidate is
accepted when it fits memory (``PlanCost.memory_ok``) and its step is below the current
one by more than ``MIN_GAIN`` (relative; float noise never counts as progress), so the
returned plan is never slower than the input.

Neighbourhood of a plan of P stages at micro-batch B:

1. cut moves: the boundary between stages p and p + 1 moved by d = 1..k blocks either
   way, and beyond k, per distance band of :func:`ladder` (k, 1.6 k], ... up to the
   stages' ends, to the position whose boundary carries the fewest bytes (a branchy
   graph imported node by node crosses cheaply at a few positions only); both stages
   keep at least one block, their devices and samples, and a stage of several device
   kinds whose blocks changed is also tried with its samples re-split by Asteroid's
   Algorithm 1 (:func:`planner.solvers.allocation.allocate`, memory caps from the cost
   model): O((k + log L) P) candidates;
2. device shifts: one device of stage p moved to stage p + 1 or back (the giving stage
   keeps a device), both stages' samples re-split by Algorithm 1; devices alike in type,
   slowdown, memory and links are tried once: O(P x kinds) candidates;
3. sample moves: one sample from one device of a stage to another of a different kind
   (Algorithm 1's split is min-max per stage, not best for the whole pipeline):
   O(P x kinds^2);
4. micro-batch sizes: the config's candidates next to B (one below, one above), with
   M = G / B' and every stage's samples re-split by Algorithm 1: at most 2;
5. merges: stages p and p + 1 as one stage on both groups (Algorithm 1): P - 1;
6. splits: one device (one per kind) of a stage of several takes the stage's tail (or
   head) as a stage of its own, cut where its compute and the rest's (at an even
   share) are most even (:meth:`_Neighbourhood.even_cut`): O(P x kinds x 2).
7. stage shifts: both cuts of an inner stage moved together by the cut distances (the
   stage slides; one neighbour grows as the other shrinks): O(P (k + log L)).

Regroupings, tried only in a round where no local move (1-7) helped:

8. swaps: one device of stage p and one of another kind of stage q > p trade places
   (one device per kind and stage), both stages' samples by Algorithm 1:
   O(P^2 x kinds^2);
9. dissolves: stage p's blocks go to its neighbours (cut where their slowest devices
   compute most evenly, :meth:`_Neighbourhood.balanced_cut`), its devices join stage
   q: O(P^2) candidates, O(P x L x g) to build. At micro-batch B a stage of B devices
   takes no device more, so two one-device stages (an Orin and a TX2 with 2 samples
   each on resnet101-like x 16 mixed) are joined only this way.

A re-split by Algorithm 1 that leaves a device idle gives it one sample of the most
loaded device (every device of a stage works; B >= devices).

The set of devices used never changes (the DP's tie rule chose it: fewer devices
within ``TIE_TOLERANCE`` of the fastest; this pass does not undo that).

Acceptance: first improvement in order of promise. The candidates not scored yet are
filtered by two figures: the compute of their busiest device, M x (forward + backward)
at its samples (:func:`busiest_device_ms`, O(P x g)), a bound the steady step is never
below, and the steady step with every transfer at its full rate
(:func:`steady_estimate_ms`, the cost model's chained rounds without channel sharing);
a candidate whose figure is at or above the current step is dropped unscored. The
first ``ROUND_WIDTH`` others in the order of the estimate are scored, and the first that
fits memory and beats the current step is kept; when none does, the regroupings (8-9)
that pass the same filters, at most ``REGROUP_WIDTH`` in estimate order (none helps:
the descent ends; the estimate, blind to channel sharing, ranks a helpful dissolve
behind a hundred cut moves, so regroupings are not mixed into that order); the round then
starts again on the new plan's neighbourhood (a descent). Scored candidates are
remembered for the whole pass, so none is evaluated twice and no descent walks back
into a plan already scored.

Restarts and kicks: the pass descends from the plan given, then from each of
``starts`` (:func:`planner.solvers.solve.solve` passes the DP's own plan: local optima
differ by start), each descent an equal share of the evaluations left; then, up to
``kicks`` times, from the best plan's scored neighbour of least steady step not used
yet (an uphill step; its descent cannot return to plans already scored). The best plan
of all descents is returned.

Termination: every descent and kick ended without a faster unscored candidate (status
``converged``), or ``max_evaluations`` candidates were scored (``evaluations``: the
budget, counted in work, so the same input gives the same plan at any load), or the
caller's safety stop ``time_limit`` passed (``time_limit``; checked before each
evaluation, so the overshoot is one evaluation and one round's ranking). Each kept move
lowers the step by more than ``MIN_GAIN``, so the moves are finite too.

Complexity: a round builds O((k + log L) P + P x kinds^2) candidates (and when they
fail O(P^2 x kinds^2) regroupings) (a re-split is
Algorithm 1 on one row, O(g) rounds of O(g) numpy work; the cut positions and a split's
cut O(L x g)), estimates those past the compute bound (O(ITERATIONS x (M x (devices +
pieces) + sum g^2)) each, about 1 ms at 16 devices) and scores them in that order, each
one :meth:`CostModel.evaluate` (O(A log A) for A computations and transfers of the plan,
``1 + steady.ITERATIONS`` rounds of the fair-sharing simulation on a switch: ~30 ms CPU
for 9 stages on 16 devices); the whole pass at most ``max_evaluations`` evaluations and
(max_evaluations + kicks + starts) rounds. The cost model is built once (O(types x L x
max micro-batch)).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
from edgepipe.planner.cost.model import CostModel, PlanCost
from edgepipe.planner.cost.steady import ITERATIONS, STEADY
from edgepipe.planner.inputs.problem import Problem
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.solvers.allocation import allocate
from edgepipe.planner.solvers.time_limit import Deadline

#: blocks a cut moves at most, either way
DEFAULT_RADIUS = 3
#: beyond the radius, each cut distance is this multiple of the previous one
LADDER_GROWTH = 1.6
#: restarts from the best plan's least-uphill neighbour once every descent converged
DEFAULT_KICKS = 3
#: candidates scored at most by one pass (its budget, in work)
DEFAULT_MAX_EVALUATIONS = 1000
#: candidates scored at most in one round, in estimate order (a round whose first this
#: many do not help ends its descent: the accepted one ranked 0-88th of 214-265 on
#: resnet101-like x 16 mixed, mostly 0-14th, docs/decisions.md)
ROUND_WIDTH = 64
#: regroupings (swaps, dissolves) scored at most in a round whose local moves did not
#: help (the estimate misjudges them: resnet101-like x 16 mixed's helpful dissolve ranked
#: 155th of 319 among the local moves, docs/decisions.md)
REGROUP_WIDTH = 16
#: a candidate is kept only when its step is below the current one by this fraction
MIN_GAIN = 1e-9


@dataclass(frozen=True)
class ImproveResult:
    """The improved plan and its figures; ``start_ms`` the input's steady step,
    ``moves`` the moves kept, ``evaluations`` the candidates scored, ``status`` why the
    pass stopped: ``converged``, ``evaluations`` or ``time_limit``."""

    partition: Partition
    cost: PlanCost
    start_ms: float
    moves: int
    evaluations: int
    status: str
    solve_time_s: float

    def summary(self) -> dict[str, float | int | str]:
        """What a plan's solver settings record of the pass."""
        return {"from_steady_ms": self.start_ms, "moves": self.moves,
                "evaluations": self.evaluations, "status": self.status,
                "time_s": self.solve_time_s}


class _Neighbourhood:
    """The candidates around one plan (module docstring's order), with the devices'
    kinds and Algorithm 1's splits read from one cost model."""

    def __init__(self, problem: Problem, cm: CostModel, radius: int) -> None:
        self.problem, self.cm, self.radius = problem, cm, radius
        cluster = problem.cluster
        linked = {d for link in cluster.network.links for d in (link.a, link.b)}
        self.kind = {
            d.id: (d.type, d.slowdown, float(cm.budget[i]), d.id if d.id in linked else "")
            for i, d in enumerate(cluster.devices)
        }
        self.sizes = sorted(problem.config.micro_batch_sizes())
        self.bytes = [blk.output_bytes_per_sample for blk in problem.model.blocks]

    def split(self, part: Partition, p: int, first: int, end: int,
              devices: tuple[str, ...], batch: int, micro_batches: int) -> tuple[int, ...] | None:
        """Algorithm 1's split of ``batch`` samples over ``devices`` for blocks
        [first, end) as stage p of ``part``'s stage count, capped by memory (Eq. 3 at
        the stage's warm-up), a device Algorithm 1 leaves idle given one sample of the
        most loaded one's; None when it cannot place them all or there are fewer samples
        than devices."""
        cm, cluster = self.cm, self.problem.cluster
        idx = [cluster.index(d) for d in devices]
        warmup = self.problem.config.warmup_depth(p, part.num_stages, micro_batches)
        rows = np.stack([
            (cm.fwd[cm.device_type[i]][[first, end]] + cm.bwd[cm.device_type[i]][[first, end]])
            * cm.slowdown[i]
            for i in idx
        ])
        caps = np.array([[
            max((y for y in range(batch + 1)
                 if cm.device_memory(first, end, y, warmup) <= cm.budget[i]), default=0)
            for i in idx
        ]])
        samples, ok = allocate(rows, np.array([0]), np.array([1]), batch, caps)
        y = [int(v) for v in samples[0]]
        if not ok[0] or batch < len(y) or min(caps[0]) < 1:
            return None
        for i in (i for i, v in enumerate(y) if v == 0):  # Algorithm 1 left it idle
            y[max(range(len(y)), key=y.__getitem__)] -= 1  # one from the most loaded
            y[i] = 1
        return tuple(y)

    def mixed(self, devices: tuple[str, ...]) -> bool:
        return len({self.kind[d] for d in devices}) > 1

    def candidates(self, part: Partition) -> Iterator[Partition]:
        yield from self._cut_moves(part)
        yield from self._device_shifts(part)
        yield from self._sample_moves(part)
        yield from self._batch_moves(part)
        yield from self._merges(part)
        yield from self._splits(part)
        yield from self._stage_shifts(part)

    def regroupings(self, part: Partition) -> Iterator[Partition]:
        """The moves that change which devices work together (tried when the local
        moves of :meth:`candidates` do not help): swaps, then dissolves."""
        yield from self._swaps(part)
        yield from self._dissolves(part)

    def balanced_cut(self, left: StageAssignment, right: StageAssignment, batch: int) -> int:
        """The cut of blocks [left.first, right.end) between ``left``'s and ``right``'s
        devices (each at an even share of ``batch``) where the slower device of each
        side computes most evenly. O((right.end - left.first) x g)."""
        cm, cluster = self.cm, self.problem.cluster

        def side(lo: int, hi: int, devices: tuple[str, ...]) -> float:
            share = -(-batch // len(devices))
            return max(sum(cm.device_times(lo, hi, cluster.index(d), share)) for d in devices)

        return min(range(left.first + 1, right.end),
                   key=lambda c: abs(side(left.first, c, left.devices)
                                     - side(c, right.end, right.devices)))

    def _dissolves(self, part: Partition) -> Iterator[Partition]:
        """Stage p dissolved: its blocks go to its neighbours (cut where they compute
        most evenly; an end stage's to its one neighbour), its devices join stage q,
        every changed stage's samples by Algorithm 1 (a stage of B devices at
        micro-batch B takes no device more, so two stages of one device each are
        joined only this way)."""
        stages, b, m = part.stages, part.micro_batch_size, part.num_micro_batches
        n = len(stages)
        if n < 3:
            return
        for p, st in enumerate(stages):
            rest = [*stages[:p], *stages[p + 1:]]
            if p == 0:
                rest[0] = replace(rest[0], first=st.first)
            elif p == n - 1:
                rest[-1] = replace(rest[-1], end=st.end)
            else:
                joined = replace(stages[p - 1], end=stages[p + 1].end)
                cut = self.balanced_cut(joined, replace(stages[p + 1], first=st.first), b)
                rest[p - 1] = replace(stages[p - 1], end=cut)
                rest[p] = replace(stages[p + 1], first=cut)
            shorter = Partition(b, m, tuple(rest))
            for q in range(n - 1):
                target = replace(rest[q], devices=(*rest[q].devices, *st.devices))
                changed = {r for r in (p - 1, p, q) if 0 <= r < n - 1}
                new = list(rest)
                for r in sorted(changed):
                    s = target if r == q else rest[r]
                    samples = self.split(shorter, r, s.first, s.end, s.devices, b, m)
                    if samples is None:
                        break
                    new[r] = replace(s, samples=samples)
                else:
                    yield Partition(b, m, tuple(new))

    def _swaps(self, part: Partition) -> Iterator[Partition]:
        """One device of stage p and one of another kind of stage q > p trade places
        (one device per kind and stage), both stages' samples re-split by Algorithm 1:
        at micro-batch B a stage of B devices cannot take a device more, so a device
        shift cannot move a fast device to where it is needed; a swap can."""
        stages, b, m = part.stages, part.micro_batch_size, part.num_micro_batches
        firsts = [{self.kind[d]: i for i, d in reversed(list(enumerate(s.devices)))}
                  for s in stages]
        for p, q in itertools.combinations(range(len(stages)), 2):
            sp, sq = stages[p], stages[q]
            for kp, i in firsts[p].items():
                for kq, j in firsts[q].items():
                    if kp == kq:
                        continue
                    dp = (*sp.devices[:i], sq.devices[j], *sp.devices[i + 1:])
                    dq = (*sq.devices[:j], sp.devices[i], *sq.devices[j + 1:])
                    samp = self.split(part, p, sp.first, sp.end, dp, b, m)
                    samq = self.split(part, q, sq.first, sq.end, dq, b, m)
                    if samp is not None and samq is not None:
                        yield _with(part, {p: replace(sp, devices=dp, samples=samp),
                                           q: replace(sq, devices=dq, samples=samq)})

    def _stage_shifts(self, part: Partition) -> Iterator[Partition]:
        """Both cuts of an inner stage moved together by the cut distances (the stage
        slides over the chain; its neighbours grow and shrink in turn)."""
        stages = part.stages
        for p in range(1, len(stages) - 1):
            prev, st, nxt = stages[p - 1], stages[p], stages[p + 1]
            for sign, room in ((-1, st.first - prev.first - 1), (1, nxt.end - st.end - 1)):
                for d in ladder(self.radius, room):
                    a, b = st.first + sign * d, st.end + sign * d
                    yield _with(part, {p - 1: replace(prev, end=a),
                                       p: replace(st, first=a, end=b),
                                       p + 1: replace(nxt, first=b)})

    def even_cut(self, first: int, end: int, rest: tuple[str, ...], dev: str, batch: int,
                 tail: bool) -> int:
        """The cut of blocks [first, end) between ``rest`` (each at its even share of
        ``batch``) and ``dev`` alone (all of it) taking the tail (or the head) where
        their compute is most even. O((end - first) x g)."""
        cm, cluster = self.cm, self.problem.cluster
        alone, many = cluster.index(dev), [cluster.index(x) for x in rest]
        share = -(-batch // len(rest))

        def gap(cut: int) -> float:
            lo, hi = (first, cut) if tail else (cut, end)
            own = (cut, end) if tail else (first, cut)
            group = max(sum(cm.device_times(lo, hi, i, share)) for i in many)
            return abs(group - sum(cm.device_times(*own, alone, batch)))

        return min(range(first + 1, end), key=gap)

    def _merges(self, part: Partition) -> Iterator[Partition]:
        """Stages p and p + 1 as one stage on both groups, samples by Algorithm 1."""
        stages, b, m = part.stages, part.micro_batch_size, part.num_micro_batches
        for p in range(len(stages) - 1):
            a, c = stages[p], stages[p + 1]
            devices = (*a.devices, *c.devices)
            shorter = Partition(b, m, (*stages[:p], a, *stages[p + 2:]))
            samples = self.split(shorter, p, a.first, c.end, devices, b, m)
            if samples is not None:
                yield _with(shorter, {p: StageAssignment(a.first, c.end, devices, samples)})

    def _splits(self, part: Partition) -> Iterator[Partition]:
        """One device (one per kind) of a stage of several leaves with the stage's tail
        (or head) as a stage of its own, cut where the two parts' compute at their
        samples is most even; the other devices' samples by Algorithm 1."""
        stages, b, m = part.stages, part.micro_batch_size, part.num_micro_batches
        for p, st in enumerate(stages):
            if len(st.devices) < 2 or st.end - st.first < 2:
                continue
            seen = set()
            for dev in reversed(st.devices):
                if self.kind[dev] in seen:
                    continue
                seen.add(self.kind[dev])
                rest = tuple(x for x in st.devices if x != dev)
                for tail in (True, False):
                    cut = self.even_cut(st.first, st.end, rest, dev, b, tail)
                    ranges = [(st.first, cut, rest), (cut, st.end, (dev,))]
                    if not tail:
                        ranges = [(st.first, cut, (dev,)), (cut, st.end, rest)]
                    longer = Partition(b, m, (*stages[:p], st, st, *stages[p + 1:]))
                    new = []
                    for q, (lo, hi, devs) in enumerate(ranges):
                        samples = self.split(longer, p + q, lo, hi, devs, b, m)
                        if samples is None:
                            break
                        new.append(StageAssignment(lo, hi, devs, samples))
                    else:
                        yield Partition(b, m, (*stages[:p], *new, *stages[p + 1:]))

    def _cut_moves(self, part: Partition) -> Iterator[Partition]:
        stages = part.stages
        b, m = part.micro_batch_size, part.num_micro_batches
        for p in range(len(stages) - 1):
            a, c = stages[p], stages[p + 1]
            for cut in self.cut_positions(a.first, c.first, c.end):
                na, nc = replace(a, end=cut), replace(c, first=cut)
                yield _with(part, {p: na, p + 1: nc})
                if self.mixed(a.devices) or self.mixed(c.devices):
                    sa = self.split(part, p, a.first, cut, a.devices, b, m)
                    sc = self.split(part, p + 1, cut, c.end, c.devices, b, m)
                    if sa is not None and sc is not None:
                        yield _with(part, {p: replace(na, samples=sa),
                                           p + 1: replace(nc, samples=sc)})

    def cut_positions(self, low: int, cut: int, high: int) -> list[int]:
        """Where the cut at ``cut`` between stages [low, cut) and [cut, high) may move:
        within ``radius`` blocks either way, and beyond, per distance band of
        :func:`ladder` and direction, the position whose boundary carries the fewest
        bytes (a branchy graph crosses cheaply at a few positions only). O(high - low)."""
        out = []
        for sign in (-1, 1):
            limit = cut - low - 1 if sign < 0 else high - cut - 1
            near = 0
            for d in ladder(self.radius, limit):
                if d <= self.radius:
                    out.append(cut + sign * d)
                else:
                    band = [cut + sign * x for x in range(near + 1, d + 1)]
                    out.append(min(band, key=lambda x: (self.bytes[x - 1], abs(x - cut))))
                near = d
        return out

    def _device_shifts(self, part: Partition) -> Iterator[Partition]:
        stages = part.stages
        b, m = part.micro_batch_size, part.num_micro_batches
        for p in range(len(stages) - 1):
            for giver, taker in ((p, p + 1), (p + 1, p)):
                g, t = stages[giver], stages[taker]
                if len(g.devices) < 2:
                    continue
                seen = set()
                for dev in reversed(g.devices):
                    if self.kind[dev] in seen:
                        continue
                    seen.add(self.kind[dev])
                    gd = tuple(x for x in g.devices if x != dev)
                    td = (*t.devices, dev) if taker > giver else (dev, *t.devices)
                    sg = self.split(part, giver, g.first, g.end, gd, b, m)
                    st = self.split(part, taker, t.first, t.end, td, b, m)
                    if sg is not None and st is not None:
                        yield _with(part, {giver: replace(g, devices=gd, samples=sg),
                                           taker: replace(t, devices=td, samples=st)})

    def _sample_moves(self, part: Partition) -> Iterator[Partition]:
        for p, stage in enumerate(part.stages):
            if not self.mixed(stage.devices):
                continue
            first_of: dict[tuple[object, ...], int] = {}
            for i, dev in enumerate(stage.devices):
                first_of.setdefault(self.kind[dev], i)
            for i in first_of.values():
                for j in first_of.values():
                    if i == j or stage.samples[i] < 2:
                        continue
                    samples = list(stage.samples)
                    samples[i] -= 1
                    samples[j] += 1
                    yield _with(part, {p: replace(stage, samples=tuple(samples))})

    def _batch_moves(self, part: Partition) -> Iterator[Partition]:
        if part.micro_batch_size not in self.sizes:  # a plan of another config's sizes
            return
        at = self.sizes.index(part.micro_batch_size)
        for batch in self.sizes[max(at - 1, 0):at] + self.sizes[at + 1:at + 2]:
            m = self.problem.config.global_batch // batch
            stages = []
            for p, s in enumerate(part.stages):
                samples = self.split(part, p, s.first, s.end, s.devices, batch, m)
                if samples is None:
                    break
                stages.append(replace(s, samples=samples))
            else:
                yield Partition(batch, m, tuple(stages))


def busiest_device_ms(cm: CostModel, part: Partition) -> float:
    """The compute one device does per step under ``part``, most over the devices:
    M x (forward + backward) at its samples. The steady step is at least this (a device
    runs its own actions one after another, every step: :mod:`planner.cost.steady`
    defines the step as the limit of T_n / n), so a candidate at or above the current
    step is skipped unscored. O(P x g)."""
    cluster, m = cm.problem.cluster, part.num_micro_batches
    return max(
        m * sum(cm.device_times(s.first, s.end, cluster.index(d), y))
        for s in part.stages
        for d, y in zip(s.devices, s.samples, strict=True)
    )


def ladder(radius: int, span: int) -> list[int]:
    """The distances a cut moves: 1..radius, then growing by ``LADDER_GROWTH`` up to
    ``span`` (the longest stage): O(radius + log span) of them, so a fine chain's cut
    can travel far in a few accepted moves and settle with the short ones."""
    steps = list(range(1, min(radius, span) + 1))
    if span < 1:
        return []
    while steps and steps[-1] < span:
        steps.append(min(span, max(steps[-1] + 1, int(steps[-1] * LADDER_GROWTH))))
    return steps


def _with(part: Partition, changed: dict[int, StageAssignment]) -> Partition:
    """``part`` with the stages of ``changed`` replaced."""
    stages = tuple(changed.get(p, s) for p, s in enumerate(part.stages))
    return replace(part, stages=stages)


def steady_estimate_ms(cm: CostModel, part: Partition) -> float:
    """The steady step of ``part`` with every transfer at its pair's full rate: the
    cost model's chained rounds by :func:`planner.cost.makespan.longest_path_ends` (its
    point-to-point rule, no channel sharing: no event queue), the difference of the
    same two iterations' ends as :func:`planner.cost.steady.steady_period_ms`. Equal to
    ``steady_ms`` point to point; on a switch or a shared medium a transfer only gets
    slower by sharing, so each chained round ends no earlier than here
    (:meth:`CostModel.round_lower_bound_ms`'s argument), and on the fine suite no scored
    candidate's step was below its estimate (docs/decisions.md), though for a difference
    of two ends this is not proven. About 30 times cheaper than ``evaluate`` on 16
    devices. O(iterations x (M x (devices + pieces) + sum_p g_p^2))."""
    ends = cm.full_rate_ends(part, ITERATIONS)
    return ends[STEADY] - ends[STEADY - 1]


class _Search:
    """The pass's state over its descents: one cost model and neighbourhood, the
    candidates scored (each plan at most once in the whole pass: a descent after a kick
    never walks back into a plan already scored), the evaluations spent and the caller's
    safety deadline."""

    def __init__(self, problem: Problem, cm: CostModel, radius: int, max_evaluations: int,
                 deadline: Deadline | None) -> None:
        self.cm, self.hood = cm, _Neighbourhood(problem, cm, radius)
        self.max_evaluations, self.deadline = max_evaluations, deadline
        self.scored: dict[Partition, PlanCost] = {}
        self.evaluations = self.moves = 0
        self.stopped = ""  # "evaluations" or "time_limit" once a budget ran out
        self.kicked: set[Partition] = set()

    def score(self, part: Partition) -> PlanCost | None:
        """``part``'s figures (memoised), or None when a budget has run out."""
        if part in self.scored:
            return self.scored[part]
        if self.evaluations >= self.max_evaluations:
            self.stopped = self.stopped or "evaluations"
            return None
        if self.deadline is not None and self.deadline.passed():
            self.stopped = "time_limit"
            return None
        self.evaluations += 1
        self.scored[part] = figures = self.cm.evaluate(part)
        return figures

    def descend(self, part: Partition, cost: PlanCost, budget: int) -> tuple[Partition, PlanCost]:
        """First improvement in estimate order from ``part`` until no unscored
        candidate is faster, ``budget`` more evaluations are spent, or a budget of the
        pass runs out (module docstring: acceptance)."""
        until = min(self.max_evaluations, self.evaluations + budget)
        improved = True
        while improved and self.evaluations < until and not self.stopped:
            bar = cost.steady_ms * (1 - MIN_GAIN)
            improved = False
            for moves, width in ((self.hood.candidates, ROUND_WIDTH),
                                 (self.hood.regroupings, REGROUP_WIDTH)):
                found = self.first_faster(moves(part), width, bar, until)
                if found is not None:
                    part, cost = found
                    improved, self.moves = True, self.moves + 1
                    break
        return part, cost

    def first_faster(self, candidates: Iterator[Partition], width: int, bar: float,
                     until: int) -> tuple[Partition, PlanCost] | None:
        """The first of ``candidates`` (unscored, bounds and estimate below ``bar``)
        in estimate order, at most ``width`` scored, that fits memory with its step
        below ``bar``; None when none does or the evaluations reach ``until``."""
        ranked = sorted(
            (estimate, i, c)
            for i, c in enumerate(candidates)
            if c not in self.scored and busiest_device_ms(self.cm, c) < bar
            and (estimate := steady_estimate_ms(self.cm, c)) < bar
        )
        for _, _, candidate in ranked[:width]:
            if self.evaluations >= until:
                return None
            figures = self.score(candidate)
            if figures is None:
                return None
            if figures.memory_ok and figures.steady_ms < bar:
                return candidate, figures
        return None

    def kicks(self, best: Partition) -> list[Partition]:
        """The scored neighbours of ``best`` that fit memory, least steady step first:
        where a kick restarts the descent (the uphill step least uphill)."""
        around = [(self.scored[c].steady_ms, i, c)
                  for i, c in enumerate(self.hood.candidates(best))
                  if c in self.scored and self.scored[c].memory_ok]
        return [c for _, _, c in sorted(around)]


def improve(
    problem: Problem,
    partition: Partition,
    *,
    max_evaluations: int = DEFAULT_MAX_EVALUATIONS,
    radius: int = DEFAULT_RADIUS,
    cost_model: CostModel | None = None,
    starts: Sequence[Partition] = (),
    kicks: int = DEFAULT_KICKS,
    time_limit: float | Deadline | None = None,
) -> ImproveResult:
    """Improve ``partition`` by local moves (module docstring: neighbourhood, acceptance,
    termination, complexity). ``max_evaluations``: candidates scored at most, the pass's
    budget (the same input gives the same plan at any load); ``radius``: blocks a cut
    moves at most; ``cost_model``: one already built for ``problem`` with tables up to
    its largest micro-batch candidate (else built here); ``starts``: further plans to
    descend from (restarts; those that do not fit memory are skipped); ``kicks``: at
    most this many restarts from the best plan's least-uphill neighbours once every
    descent converged; ``time_limit``: a safety stop (seconds of wall clock, or a
    :class:`Deadline`), not the budget: a pass it stops says ``time_limit``.

    Returns the best plan found (``partition`` itself when nothing helps, or when it
    does not fit memory: the pass only improves feasible plans).

    Raises:
        PlanMismatchError: ``partition`` or a start is not a plan of ``problem``.
        ValueError: a radius below 1 or a negative evaluation budget or kick count.
    """
    if radius < 1 or max_evaluations < 0 or kicks < 0:
        raise ValueError(f"radius must be >= 1, max_evaluations and kicks >= 0, got "
                         f"{radius}, {max_evaluations}, {kicks}")
    clock = time.perf_counter()
    deadline = Deadline(time_limit) if isinstance(time_limit, float | int) else time_limit
    cm = cost_model or CostModel(problem, max(problem.config.micro_batch_sizes()))
    search = _Search(problem, cm, radius, max_evaluations, deadline)
    cost = cm.evaluate(partition)
    search.scored[partition] = cost
    start_ms, best, best_cost = cost.steady_ms, partition, cost
    if cost.memory_ok:
        # the caller's plan, then each other start, each an equal share of what is left
        begins = [partition, *(s for s in dict.fromkeys(starts) if s != partition)]
        for n, begin in enumerate(begins):
            figures = cm.evaluate(begin) if begin not in search.scored else search.scored[begin]
            search.scored[begin] = figures
            if not figures.memory_ok or search.stopped:
                continue
            share = (max_evaluations - search.evaluations) // (len(begins) - n)
            part, figures = search.descend(begin, figures, share)
            if figures.steady_ms < best_cost.steady_ms * (1 - MIN_GAIN):
                best, best_cost = part, figures
        # kicks: restart from the best plan's least-uphill scored neighbour
        for _ in range(kicks):
            fresh = [c for c in search.kicks(best) if c not in search.kicked]
            if not fresh or search.stopped:
                break
            search.kicked.add(fresh[0])
            part, figures = search.descend(fresh[0], search.scored[fresh[0]],
                                           max_evaluations - search.evaluations)
            if figures.steady_ms < best_cost.steady_ms * (1 - MIN_GAIN):
                best, best_cost = part, figures
    return ImproveResult(best, best_cost, start_ms, search.moves, search.evaluations,
                         search.stopped or "converged", time.perf_counter() - clock)
