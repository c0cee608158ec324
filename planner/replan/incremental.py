"""Incremental re-planning after devices are lost, slow down or join (issue 8 item 1).

The solver is re-entered from the old plan, not restarted (reference/asteroid.md §6,
"layer-wise re-planning"; reference/ftpipehd.md §2.3, §3.3; reference/fault-tolerance.md
§2 lesson 5).

Inputs: the old :class:`~planner.plan.Plan` (its embedded model, cluster and config),
``lost`` device ids, ``slowed`` {id: factor on the device's slowdown} and ``joined``
devices (a :class:`~planner.inputs.cluster.Cluster` whose devices, types and links are added).

State: the old stages as (block range, devices); the idle survivors; the new cluster
(lost devices and their links removed, slowdowns multiplied, joined devices added).

Fast path (a local search around the old plan; each move keeps the candidate of least
cost-model iteration time that fits memory, replicas included, the unchanged candidate
first so ties keep the old layout):

A. **Emptied stages** (every device lost), lowest first: either hand the blocks to the
   neighbours at the best cut k (stage q-1 gets [first_{q-1}, k), q+1 gets
   [k, end_{q+1}); at the chain's ends the one neighbour takes all), one stage fewer;
   or an idle survivor takes the stage over. O(b_q + idle) candidates.
B. **Touched stages** (lost a member, a member slowed, or taken over): re-split the
   stage's samples with Algorithm 1 (:mod:`planner.solvers.allocation`) - a slowed device gets
   fewer samples - and try every cut between the stage and each neighbour, so a slowed
   or shrunk stage can also give up blocks. O(b_{q-1} + b_q + b_{q+1}) candidates.
C. **Entrants** (each joined device, then - when capacity was lost or slowed - each idle
   survivor): try the device in every stage's group, keep it where it helps most, or
   leave it idle when it helps nowhere. O(P) candidates per entrant.

A stage is re-split (Algorithm 1 under per-device memory caps, Eq. 3 minus the ring
replicas the device holds) only if its devices, blocks or a device's speed changed;
otherwise its samples are kept as they were (its warm-up never grows: merging stage q
away lowers K_p for p < q and leaves it unchanged for p > q).

Decision (``FULL_SOLVE_MARGIN`` = 5%): the old plan's ``reference_ms`` - the iteration
time of the last full solve in its lineage, for a superset of today's devices, none of
them slower - bounds the survivors' full solve from below, because every plan for fewer or
slower devices is also a plan for the old cluster (devices may idle) and is no faster
there. So when the fast path is within the margin of that bound it is within the margin
of the full solve, which is then not computed (this is what keeps recovery in
milliseconds). Otherwise - the fast path infeasible, beyond the margin, devices joined
(the bound no longer holds: more devices can be faster), or ``full_solve=True`` - the
full solve runs on the new cluster, warm-started from the old plan: the exact solver gets
the fast-path plan as its MIP start, the DP as its incumbent
(:func:`planner.solvers.dp.driver.plan_dp`:
its exact figure bounds every micro-batch size's search, the first included, instead of
a guess, and the DP returns it when it finds nothing faster); the fast path is kept
unless the full solve is faster by more than the margin. The bound is exact for the
exact solver and holds for the DP up to its own heuristic gap.

Migration: every device receives the blocks of its new range it did not hold live,
from the first surviving old owner (a data-parallel peer), else from the stage's ring
replica holder (:mod:`planner.replan.replicas`); a device that held the ring replica itself
promotes it locally. Bytes are weights + optimizer state; times are the cost model's
link terms (:func:`planner.cost.channels.migration_ms`). No surviving copy of a block ->
:class:`~planner.errors.UnrecoverableError` naming the blocks.

Replication interval: the re-plan keeps its parent's choice
(:meth:`planner.inputs.config.TrainingConfig.interval_choice`): where the parent's
interval was resolved from ``auto`` (its config's ``replication_interval_auto``), ``auto``
is resolved again for the new plan (:func:`planner.plan.make_plan`: the new partition's
transfer and step, which a loss can change several-fold), so that an interval that hid
the old plan's transfer does not throttle the new one; a number the user chose is kept
as given (where it is too short for the new plan, its assumptions say so:
:func:`planner.plan.interval_note`); ``interval`` overrides either. A running job's
supervisor takes each generation's points from its own plan's interval.

Complexity of the fast path: O((L + idle + P x entrants) x (P g + S M)) - each candidate
is an Algorithm 1 run per re-split stage plus one cost-model evaluation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, overload

import numpy as np
from edgepipe.planner.cost.channels import migration_ms
from edgepipe.planner.cost.formulas import samples_that_fit, transfer_ms
from edgepipe.planner.cost.model import CostModel, PlanCost
from edgepipe.planner.errors import EdgepipeError, InfeasibleError, InputError, UnrecoverableError
from edgepipe.planner.inputs.cluster import Cluster
from edgepipe.planner.inputs.problem import Problem, make_problem
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.plan import (
    Changes,
    Plan,
    ReplanPath,
    SolverInfo,
    Transfer,
    make_plan,
    replica_placement,
)
from edgepipe.planner.replan.replicas import RING
from edgepipe.planner.solvers.allocation import allocate
from edgepipe.planner.solvers.dp.driver import plan_dp
from edgepipe.planner.solvers.exact.solver import plan_milp

#: the fast path is kept unless the full solve is faster by more than this fraction
FULL_SOLVE_MARGIN = 0.05

#: the fast path weighs a candidate's migration time spread over this many steps against
#: its iteration time: migration is paid once, a layout serves until the next change, and
#: an edge training run lasts thousands of steps (one CIFAR-10 epoch at global batch 32
#: is 1563). A move that saves less than its migration time / 1000 per step is not made.
HORIZON_STEPS = 1000.0


@dataclass(frozen=True)
class _Stage:
    """A stage under construction: blocks [first, end) on ``devices``; ``samples`` kept
    from the old plan, or ``None`` when the stage must be re-split."""

    first: int
    end: int
    devices: tuple[str, ...]
    samples: tuple[int, ...] | None


@dataclass(frozen=True)
class _Scored:
    """A candidate with its figures: ``value`` = iteration ms + migration ms / horizon."""

    stages: list[_Stage]
    partition: Partition
    cost: PlanCost
    moves: tuple[Transfer, ...]
    migration_ms: float
    value: float


class _Search:
    """Scores candidate stage layouts on the new problem, migration included."""

    def __init__(self, old: Plan, problem: Problem, lost: set[str], horizon: float) -> None:
        self.old, self.problem, self.lost, self.horizon = old, problem, lost, horizon
        self.batch = old.partition.micro_batch_size
        self.m = old.partition.num_micro_batches
        self.cm = cm = CostModel(problem, self.batch)
        self.index = {d.id: i for i, d in enumerate(problem.cluster.devices)}
        self.table = {
            d.id: (cm.fwd[d.type] + cm.bwd[d.type]) * d.slowdown for d in problem.cluster.devices
        }
        self.sources = _Sources(old, lost)
        self.evaluations = 0  # cost-model evaluations (distinct partitions scored)
        self.scored: dict[Partition, _Scored | None] = {}
        # interchangeable devices (same type, memory, speed, no per-pair link) score the
        # same anywhere, so only the first idle one of each class is tried
        linked = {x for ln in problem.cluster.network.links for x in (ln.a, ln.b)}
        self.kind = {
            d.id: d.id
            if d.id in linked
            else (d.type, d.memory_bytes, d.usable_fraction, d.slowdown)
            for d in problem.cluster.devices
        }

    def distinct(self, devices: Iterable[str]) -> list[str]:
        """The first device of each interchangeable class, in order."""
        seen: set[object] = set()
        out = []
        for d in devices:
            if self.kind[d] not in seen:
                seen.add(self.kind[d])
                out.append(d)
        return out

    def _split(
        self, stage: _Stage, p: int, num: int, held: Mapping[str, float]
    ) -> StageAssignment | None:
        """Algorithm 1 for one stage at position ``p`` of ``num`` under memory caps."""
        cm, devs = self.cm, stage.devices
        warm = self.problem.config.warmup_depth(p, num, self.m)
        budget = np.array([cm.budget[self.index[d]] - held.get(d, 0.0) for d in devs])
        caps = samples_that_fit(
            budget[None, :],
            cm.static_bytes(stage.first, stage.end),
            warm,
            cm.saved_bytes(stage.first, stage.end),
            self.batch,
        )
        table = np.stack([self.table[d] for d in devs])
        y, ok = allocate(
            table, np.array([stage.first]), np.array([stage.end]), self.batch, caps.reshape(1, -1)
        )
        if not ok[0]:
            return None
        keep = [(d, int(n)) for d, n in zip(devs, y[0], strict=True) if n > 0]
        return StageAssignment(
            stage.first, stage.end, tuple(d for d, _ in keep), tuple(n for _, n in keep)
        )

    def score(self, stages: list[_Stage]) -> _Scored | None:
        """Re-split the stages that need it and evaluate; ``None`` if anything overflows."""
        num = len(stages)
        shape = Partition(
            self.batch,
            self.m,
            tuple(
                StageAssignment(s.first, s.end, s.devices, (1,) * len(s.devices)) for s in stages
            ),
        )
        held = self.cm.replica_memory(shape)
        done = []
        for p, s in enumerate(stages):
            settled = (
                self._split(s, p, num, held)
                if s.samples is None
                else StageAssignment(s.first, s.end, s.devices, s.samples)
            )
            if settled is None:
                return None
            done.append(settled)
        partition = Partition(self.batch, self.m, tuple(done))
        if partition not in self.scored:
            self.scored[partition] = self._evaluate(partition)
        return self.scored[partition]

    def _evaluate(self, partition: Partition) -> _Scored | None:
        """Cost-model figures and migration of ``partition``; ``None`` if it overflows."""
        self.evaluations += 1
        cost = self.cm.evaluate(partition)
        if not cost.memory_ok:
            return None
        moves = self.sources.transfers(partition, self.cm)
        move_ms = _migration_ms(moves, self.cm)
        value = cost.iteration_ms + move_ms / self.horizon
        return _Scored(_settled(partition), partition, cost, moves, move_ms, value)

    @overload
    def best(self, candidates: Iterable[list[_Stage]], incumbent: _Scored) -> _Scored: ...

    @overload
    def best(self, candidates: Iterable[list[_Stage]], incumbent: None) -> _Scored | None: ...

    def best(self, candidates: Iterable[list[_Stage]], incumbent: _Scored | None) -> _Scored | None:
        """The candidate of least value that fits, if it beats ``incumbent`` (else that)."""
        best = incumbent
        for stages in candidates:
            scored = self.score(stages)
            if scored is not None and (best is None or scored.value < best.value):
                best = scored
        return best


class _Sources:
    """Who can serve each block after the loss (module docstring, "Migration")."""

    def __init__(self, old: Plan, lost: set[str]) -> None:
        self.live = {d: (s.first, s.end) for s in old.partition.stages for d in s.devices}
        self.ranges = [(s.first, s.end) for s in old.partition.stages]
        self.owners: list[list[str]] = []
        self.ring: list[str | None] = []
        # ring replicas refreshed every step are as fresh as the live state at a step
        # boundary; with a longer interval a surviving live owner is preferred (a plan's
        # interval is resolved: auto came out as 1 only where a point crosses in a step)
        self.fresh = old.problem.config.replication_interval == 1
        for s, r in zip(old.partition.stages, replica_placement(old), strict=True):
            self.owners.append([d for d in s.devices if d not in lost])
            alive = r.kind == RING and r.holders[0] not in lost
            self.ring.append(r.holders[0] if alive else None)

    def transfers(self, new: Partition, cm: CostModel) -> tuple[Transfer, ...]:
        """The migration to ``new`` (see :func:`migration`), priced by ``cm``.
        Works on block intervals: O(devices x P) per call."""
        moves: list[Transfer] = []
        missing: list[tuple[int, int]] = []
        for s in new.stages:
            for dev in s.devices:
                live = self.live.get(dev, (0, 0))
                need = [(s.first, min(s.end, live[0])), (max(s.first, live[1]), s.end)]
                for first, end in need:
                    for q, (a, b) in enumerate(self.ranges):
                        lo, hi = max(first, a), min(end, b)
                        if lo < hi:
                            self._serve(dev, q, lo, hi, moves, missing)
        if missing:
            raise UnrecoverableError(
                f"no surviving device holds blocks {missing}", tuple(missing), ()
            )
        cl = cm.problem.cluster
        priced = []
        for t in moves:
            if t.to == t.source:
                priced.append(t)
                continue
            size = cm.replica_bytes(t.first, t.end)
            i, j = cl.index(t.source), cl.index(t.to)
            ms = float(transfer_ms(size, cm.bw[i, j], cm.lat[i, j]))
            priced.append(replace(t, bytes=size, ms=ms))
        return tuple(priced)

    def _serve(
        self,
        dev: str,
        q: int,
        first: int,
        end: int,
        moves: list[Transfer],
        missing: list[tuple[int, int]],
    ) -> None:
        """Append the source of blocks [first, end) of old stage q for ``dev``."""
        ring = self.ring[q]
        if dev == ring and (self.fresh or not self.owners[q]):
            src, rep = dev, True
        elif self.owners[q]:
            src, rep = self.owners[q][0], False
        elif ring is not None:
            src, rep = ring, True
        else:
            missing.append((first, end))
            return
        last = moves[-1] if moves else None
        if last and (last.to, last.source, last.from_replica, last.end) == (dev, src, rep, first):
            moves[-1] = replace(last, end=end)
        else:
            moves.append(Transfer(dev, src, first, end, rep, 0.0, 0.0))


def _migration_ms(moves: tuple[Transfer, ...], cm: CostModel) -> float:
    """Predicted time of a migration (:func:`planner.cost.channels.migration_ms`)."""
    cl = cm.problem.cluster
    pieces = []
    for t in moves:
        if t.source != t.to:
            i, j = cl.index(t.source), cl.index(t.to)
            pieces.append((t.source, t.to, t.bytes / float(cm.bw[i, j]), float(cm.lat[i, j])))
    return migration_ms(pieces, cl.network.kind)


def migration(
    old: Plan, new: Partition, problem: Problem, lost: Iterable[str]
) -> tuple[Transfer, ...]:
    """Every block a device of ``new`` must receive, and from whom (module docstring).

    Per device, per block of its new range that it did not run in ``old``: itself, if it
    held the block's ring replica (local promotion, no bytes); else the first surviving
    device of the block's old stage (live state); else that stage's ring replica holder.
    Consecutive blocks with the same receiver, sender and kind form one transfer, priced
    by the cost model's link terms on ``problem``. O(L x devices).

    Raises:
        UnrecoverableError: no survivor holds some block.
    """
    return _Sources(old, set(lost)).transfers(new, CostModel(problem, new.micro_batch_size))


def _settled(partition: Partition) -> list[_Stage]:
    return [_Stage(s.first, s.end, s.devices, s.samples) for s in partition.stages]


def _resplit(stage: _Stage) -> _Stage:
    return replace(stage, samples=None)


def _cut_neighbours(stages: list[_Stage], q: int) -> Iterable[list[_Stage]]:
    """Stage q re-split, and each of its two cuts moved by one block either way."""
    base = list(stages)
    base[q] = _resplit(base[q])
    yield base
    for left in (q - 1, q):
        if left < 0 or left + 1 >= len(stages):
            continue
        a, b = stages[left], stages[left + 1]
        for k in (b.first - 1, b.first + 1):
            if a.first < k < b.end:
                cand = list(base)
                cand[left] = _Stage(a.first, k, a.devices, None)
                cand[left + 1] = _Stage(k, b.end, b.devices, None)
                yield cand


def _fill_empty(
    stages: list[_Stage], q: int, idle: list[str]
) -> Iterable[tuple[list[_Stage], str | None]]:
    """Candidates for the emptied stage q: neighbours absorb it at every cut, or an idle
    device takes it over. Yields (stages, idle device used or None)."""
    s = stages[q]
    if len(stages) > 1:
        if q == 0:
            nxt = stages[1]
            yield [_Stage(s.first, nxt.end, nxt.devices, None), *stages[2:]], None
        elif q == len(stages) - 1:
            prv = stages[q - 1]
            yield [*stages[: q - 1], _Stage(prv.first, s.end, prv.devices, None)], None
        else:
            prv, nxt = stages[q - 1], stages[q + 1]
            for k in range(s.first, s.end + 1):
                if k == prv.first or k == nxt.end:
                    continue
                yield (
                    [
                        *stages[: q - 1],
                        _Stage(prv.first, k, prv.devices, None),
                        _Stage(k, nxt.end, nxt.devices, None),
                        *stages[q + 2 :],
                    ],
                    None,
                )
    for dev in idle:
        cand = list(stages)
        cand[q] = _Stage(s.first, s.end, (dev,), None)
        yield cand, dev


def _fast_path(
    old: Plan, search: _Search, lost: set[str], slowed: set[str], joined: list[str]
) -> _Scored | None:
    """Steps A-C of the module docstring; ``None`` when no candidate fits."""
    used = set(old.partition.used_devices())
    idle = [d.id for d in old.problem.cluster.devices if d.id not in used | lost]
    stages = []
    for s in old.partition.stages:
        keep = [(d, y) for d, y in zip(s.devices, s.samples, strict=True) if d not in lost]
        changed = len(keep) < len(s.devices) or any(d in slowed for d, _ in keep)
        samples = None if changed else tuple(y for _, y in keep)
        stages.append(_Stage(s.first, s.end, tuple(d for d, _ in keep), samples))
    capacity_lost = bool((lost | slowed) & used)

    # A: emptied stages, lowest first
    while any(not s.devices for s in stages):
        q = next(i for i, s in enumerate(stages) if not s.devices)
        best = None
        for cand, dev in _fill_empty(stages, q, search.distinct(idle)):
            value = _score_with_holes(search, cand)
            if value is not None and (best is None or value < best[0]):
                best = (value, cand, dev)
        if best is None:
            return None
        _, stages, dev = best
        if dev is not None:
            idle.remove(dev)

    current = search.best([stages], None) or search.best([[_resplit(s) for s in stages]], None)
    if current is None:
        return None

    # B: touched stages re-split, their cuts moved one block at a time while that helps
    unchanged = {(s.first, s.end, s.devices) for s in old.partition.stages}
    touched = [
        set(s.devices)
        for s in current.partition.stages
        if (s.first, s.end, s.devices) not in unchanged or slowed & set(s.devices)
    ]
    current = _descend(search, current, touched)

    # C: entrants, each followed by B on the stage it entered
    rejected: set[object] = set()  # classes that helped nowhere in the current layout
    for dev in joined + (idle if capacity_lost else []):
        if search.kind[dev] in rejected:
            continue
        cands = []
        for q, stage in enumerate(current.stages):
            cand = list(current.stages)
            cand[q] = _Stage(stage.first, stage.end, (*stage.devices, dev), None)
            cands.append(cand)
        entered = search.best(cands, current)
        if entered is current:
            rejected.add(search.kind[dev])
            continue
        rejected.clear()
        q = next(i for i, s in enumerate(entered.stages) if s != current.stages[i])
        current = _descend(search, entered, [set(entered.stages[q].devices)])
    return current


def _descend(search: _Search, current: _Scored, touched: list[set[str]]) -> _Scored:
    """Step B: for each touched stage (found by its devices), re-split it and move its
    cuts one block at a time, steepest first, while the value falls."""
    for key in touched:
        while True:
            q = next((i for i, t in enumerate(current.stages) if key & set(t.devices)), None)
            if q is None:
                break
            step = search.best(_cut_neighbours(current.stages, q), current)
            if step is current:
                break
            current = step
    return current


def _score_with_holes(search: _Search, stages: list[_Stage]) -> float | None:
    """Value of a step-A candidate, or ``None`` if it does not fit. Stages still without
    devices (a later hole) are scored as absorbed by the next stage with devices (the
    previous one at the end); this only orders the candidates of this hole."""
    filled: list[_Stage] = []
    for i, s in enumerate(stages):
        if s.devices:
            filled.append(s)
            continue
        donor = next((t for t in stages[i + 1 :] if t.devices), None)
        if donor is None:
            if not filled:
                return None
            filled[-1] = _Stage(filled[-1].first, s.end, filled[-1].devices, None)
        else:
            filled.append(_Stage(s.first, s.end, donor.devices, None))
    merged: list[_Stage] = []
    for s in filled:
        if merged and merged[-1].devices == s.devices:
            merged[-1] = _Stage(merged[-1].first, s.end, s.devices, None)
        else:
            merged.append(s)
    scored = search.score(merged)
    return None if scored is None else scored.value


def _new_problem(
    old: Problem, lost: set[str], slowed: Mapping[str, float], joined: Cluster | None
) -> Problem:
    """The old inputs with lost devices (and their links) removed, slowdowns multiplied
    and joined devices, their types and links added. Without joined devices every type
    is an old one, so the old timings and derivation notes are reused (what
    :func:`~planner.inputs.problem.make_problem` would recompute)."""
    cl = old.cluster
    devices = [
        replace(d, slowdown=d.slowdown * slowed[d.id]) if d.id in slowed else d
        for d in cl.devices
        if d.id not in lost
    ]
    types = dict(cl.device_types)
    links = [ln for ln in cl.network.links if ln.a not in lost and ln.b not in lost]
    if joined is not None:
        devices += list(joined.devices)
        types.update(joined.device_types)
        links += list(joined.network.links)
    cluster = replace(
        cl,
        devices=tuple(devices),
        device_types=types,
        network=replace(cl.network, links=tuple(links)),
    )
    if joined is not None:
        return make_problem(old.model, cluster, old.config, catalog={})
    used = {d.type for d in devices}
    return Problem(
        old.model,
        cluster,
        old.config,
        {t: timing for t, timing in old.timings.items() if t in used},
        tuple(a for a in old.assumptions if any(a.startswith(f"times for {t} ") for t in used)),
    )


def _check_request(
    plan: Plan, lost: list[str], slowed: Mapping[str, float], joined: Cluster | None
) -> None:
    cl = plan.problem.cluster
    if not lost and not slowed and (joined is None or not joined.devices):
        raise InputError(
            "replan", "", "nothing changed; name a --lost, --slowed or --joined device"
        )
    for dev in [*lost, *slowed]:
        if not cl.has_device(dev):
            raise InputError(
                "replan",
                "",
                f"device {dev!r} is not in the plan's cluster "
                f"({', '.join(d.id for d in cl.devices)})",
            )
    if len(set(lost)) < len(lost):
        raise InputError("replan", "--lost", "a device is named twice")
    for dev, factor in slowed.items():
        if dev in lost:
            raise InputError("replan", "--slowed", f"device {dev!r} is also lost")
        if not (math.isfinite(factor) and factor > 0):
            raise InputError(
                "replan", "--slowed", f"factor for {dev!r} must be a positive number, got {factor}"
            )
    if len(lost) == len(cl.devices) and joined is None:
        raise InputError("replan", "--lost", "every device is lost; nothing is left to train on")
    for d in joined.devices if joined is not None else ():
        if cl.has_device(d.id):
            raise InputError(
                "replan",
                "--joined",
                f"device {d.id!r} is already in the plan's cluster; give it a new id",
            )


def _check_recoverable(plan: Plan, lost: set[str]) -> None:
    """Raise :class:`UnrecoverableError` unless every stage keeps a live owner or a
    replica holder (:mod:`planner.replan.replicas`)."""
    missing = []
    for stage, rep in zip(plan.partition.stages, replica_placement(plan), strict=True):
        if set(stage.devices) - lost:
            continue
        if rep.kind == RING and rep.holders[0] not in lost:
            continue
        missing.append((stage.first, stage.end, rep))
    if not missing:
        return
    why = []
    for first, end, rep in missing:
        if rep.kind == RING:
            why.append(
                f"blocks [{first}, {end}) (their ring replica holder {rep.holders[0]} is lost too)"
            )
        elif not plan.problem.config.replicated and len(plan.partition.stages) > 1:
            why.append(f"blocks [{first}, {end}) (replication_interval is 0: no replica)")
        else:
            why.append(f"blocks [{first}, {end}) (no other device can hold a replica)")
    raise UnrecoverableError(
        f"losing {', '.join(sorted(lost))} loses every copy of "
        + "; ".join(why)
        + ". Restart from the last checkpoint.",
        tuple((f, e) for f, e, _ in missing),
        tuple(sorted(lost)),
    )


def _reference_ms(plan: Plan) -> float:
    """Iteration time of the last full solve in the plan's lineage (module docstring)."""
    if plan.solver.name == "replan":
        return float(plan.solver.settings["reference_ms"])
    return plan.cost.iteration_ms


def _full_solver(plan: Plan) -> dict[str, Any]:
    if plan.solver.name == "replan":
        return dict(plan.solver.settings["full_solver"])
    if plan.solver.name == "milp":
        return {
            "name": "milp",
            "backend": plan.solver.settings.get("backend", "cpsat"),
            "time_limit_s": plan.solver.settings.get("time_limit_s", 60.0),
        }
    return {"name": "dp"}


def _full_solve(
    problem: Problem, solver: dict[str, Any], warm: Partition | None
) -> tuple[Partition, PlanCost] | None:
    """The full solve on the new cluster, warm-started from the fast-path plan (the MILP's
    start solution; the DP's incumbent, whose figure bounds its searches from the first
    on); ``None`` when nothing fits."""
    try:
        if solver["name"] == "milp":
            milp = plan_milp(problem, solver["backend"], solver["time_limit_s"], warm_start=warm)
            return milp.partition, milp.cost
        # a hand-made plan's micro-batch size may lie outside the DP's candidates
        sizes = problem.config.micro_batch_sizes()
        dp = plan_dp(problem, incumbent=warm if warm and warm.micro_batch_size in sizes
                     else None)
        return dp.partition, dp.cost
    except InfeasibleError:
        return None


def replan(
    plan: Plan,
    lost: Iterable[str] = (),
    slowed: Mapping[str, float] | None = None,
    joined: Cluster | None = None,
    *,
    full_solve: bool | None = None,
    margin: float = FULL_SOLVE_MARGIN,
    horizon_steps: float = HORIZON_STEPS,
    interval: int | str | None = None,
) -> Plan:
    """The plan after ``lost`` devices left, ``slowed`` ones slowed (id -> factor on their
    slowdown) and ``joined`` ones arrived, with its migration (module docstring).
    ``interval``: the new plan's replication interval (a number or ``auto``; None: the
    parent's choice, module docstring "Replication interval").

    ``full_solve``: ``None`` decides by the margin rule, ``True`` always runs the full
    solve to compare, ``False`` never does (fast path only). ``margin``: the fallback
    margin; ``horizon_steps``: steps over which the fast path amortises migration time.

    Raises:
        InputError: an unknown, repeated or contradictory device, or nothing changed.
        UnrecoverableError: some blocks have no surviving copy (names them).
        InfeasibleError: no plan fits the remaining devices' memory.
    """
    start = time.perf_counter()
    lost_list = list(lost)
    slowed = dict(slowed or {})
    _check_request(plan, lost_list, slowed, joined)
    lost_set = set(lost_list)
    _check_recoverable(plan, lost_set)
    config = plan.problem.config
    choice = config.interval_choice() if interval is None else interval
    inputs = replace(plan.problem, config=replace(config, replication_interval=choice,
                                                  replication_interval_auto=False))
    problem = _new_problem(inputs, lost_set, slowed, joined)
    joined_ids = [d.id for d in joined.devices] if joined is not None else []
    search = _Search(plan, problem, lost_set, horizon_steps)
    fast = _fast_path(plan, search, lost_set, set(slowed), joined_ids)
    fast_s = time.perf_counter() - start
    fast_ms = fast.cost.iteration_ms if fast is not None else None
    reference = _reference_ms(plan)
    solver = _full_solver(plan)
    if full_solve is None:
        run_full = fast_ms is None or bool(joined_ids) or fast_ms > (1 + margin) * reference
    else:
        run_full = full_solve
    full = None
    if run_full:
        full = _full_solve(problem, solver, fast.partition if fast is not None else None)
    full_ms = full[1].iteration_ms if full is not None else None
    if fast is None and full is None:
        raise InfeasibleError(
            "memory: after the change no plan fits the remaining devices' memory "
            "(fast path and full solve both infeasible); add a device or use a lighter "
            "optimizer",
            "memory",
        )
    path: ReplanPath
    if full is not None and (fast_ms is None or full[1].iteration_ms * (1 + margin) < fast_ms):
        path, (partition, cost) = "full", full
        moves = search.sources.transfers(partition, search.cm)
        reason = (
            "fast path infeasible"
            if fast_ms is None
            else f"full solve {full_ms:.1f} ms beats the fast path {fast_ms:.1f} ms by more "
            f"than {margin:.0%}"
        )
    else:
        assert fast is not None
        path, partition, cost, moves = "fast", fast.partition, fast.cost, fast.moves
        reason = (
            f"fast path {fast_ms:.1f} ms within {margin:.0%} of the full solve {full_ms:.1f} ms"
            if full_ms is not None
            else f"fast path {fast_ms:.1f} ms within {margin:.0%} of the bound "
            f"{reference:.1f} ms (the last full solve's figure)"
        )
    if full_ms is not None:
        reference = full_ms
    elif joined_ids:
        reference = cost.iteration_ms
    move_ms = _migration_ms(moves, search.cm)
    info = SolverInfo(
        name="replan",
        settings={
            "margin": margin,
            "reference_ms": reference,
            "fast_ms": fast_ms,
            "full_ms": full_ms,
            "horizon_steps": horizon_steps,
            "full_solver": solver,
            "fast_path_s": fast_s,
            "candidates": search.evaluations,
        },
        solve_time_s=time.perf_counter() - start,
        status="heuristic",
    )
    changes = Changes(
        lost=tuple(lost_list),
        slowed=tuple(sorted(slowed.items())),
        joined=tuple(joined_ids),
        path=path,
        reason=reason,
    )
    return make_plan(problem, partition, info, plan.id, cost, changes, moves, move_ms)


def precompute(plan: Plan, **kwargs: Any) -> dict[str, Plan | EdgepipeError]:
    """The re-plan for the loss of every single device of ``plan``'s cluster, so that
    recovery is a lookup; an unrecoverable or infeasible loss maps to its error.
    ``kwargs`` go to :func:`replan`. O(devices) re-plans."""
    out: dict[str, Plan | EdgepipeError] = {}
    for dev in plan.problem.cluster.devices:
        try:
            out[dev.id] = replan(plan, lost=[dev.id], **kwargs)
        except (UnrecoverableError, InfeasibleError) as exc:
            out[dev.id] = exc
    return out
