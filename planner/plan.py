"""Plan: a partition plus everything needed to use it alone, and its JSON form.

A plan file embeds the model profile, the cluster and the training config it was solved
for, so ``simulate``, ``show``, ``replan`` and ``run`` need nothing else. On load, the
decision (micro-batch size and count, stages, samples) and the inputs are authoritative;
every predicted figure is recomputed by :mod:`planner.cost.model`. Loading re-checks everything
``edgepipe plan`` guarantees and raises :class:`~planner.errors.PlanMismatchError` where
a check fails:

1. the decision fits the inputs (:func:`check_partition`: stages tile the blocks, devices
   exist and serve one stage each, samples add up, micro-batches x size = global batch);
2. every device's memory under the plan (cost model, Eq. 3) fits its usable memory
   (:func:`check_memory`; the message names the device, the need and the limit);
3. the id is the content hash of inputs and decision (:func:`content_id`): a plan edited
   after planning is refused unless the caller asks to re-identify it (``rehash=True``,
   ``edgepipe validate --rehash``), which gives it the id of its new content.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from edgepipe.planner.cost.formulas import PointSchedule, hiding_interval, point_schedule
from edgepipe.planner.cost.model import CostModel, PlanCost
from edgepipe.planner.errors import PlanMismatchError
from edgepipe.planner.inputs.cluster import Cluster
from edgepipe.planner.inputs.config import AUTO, MAX_REPLICATION_INTERVAL, TrainingConfig
from edgepipe.planner.inputs.problem import (
    Problem,
    batch_range_notes,
    check_partition,
    make_problem,
)
from edgepipe.planner.inputs.profile import ModelProfile
from edgepipe.planner.inputs.schema import load_document, validate, write_text_atomic
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.replan.replicas import Replica
from edgepipe.planner.units import human_bytes

KIND = "edgepipe.plan"


@dataclass(frozen=True)
class SolverInfo:
    """Which planner produced the plan, how, and how sure it is."""

    name: str
    settings: dict[str, Any] = field(default_factory=dict)
    solve_time_s: float = 0.0
    status: str = "heuristic"
    objective_bound_ms: float | None = None
    gap: float | None = None


@dataclass(frozen=True)
class Transfer:
    """One move of a migration: device ``to`` gets blocks ``[first, end)`` (weights and
    optimizer state, ``bytes``) from device ``source``, predicted to take ``ms``.
    ``from_replica``: the source serves its replica copy (:mod:`planner.replan.replicas`), not
    its live stage. ``source == to`` is a local promotion of a replica: no bytes move."""

    to: str
    source: str
    first: int
    end: int
    from_replica: bool
    bytes: float
    ms: float


#: how a re-plan was made: the local repair around the old plan, or a full solve
ReplanPath = Literal["fast", "full"]


@dataclass(frozen=True)
class Changes:
    """What a re-plan (:mod:`planner.replan.incremental`) changed from its parent plan:
    devices lost, slowed (id -> factor on the parent's slowdown) and joined; ``path``
    ``fast`` (the local repair) or ``full`` (a full solve), and why."""

    lost: tuple[str, ...] = ()
    slowed: tuple[tuple[str, float], ...] = ()
    joined: tuple[str, ...] = ()
    path: ReplanPath = "fast"
    reason: str = ""


@dataclass(frozen=True)
class Plan:
    """A validated plan. ``cost`` holds the cost model's figures for ``partition``.
    A re-planned plan also says what changed from ``parent_id`` and which blocks move."""

    id: str
    parent_id: str | None
    created: str
    solver: SolverInfo
    problem: Problem
    partition: Partition
    cost: PlanCost
    changes: Changes | None = None
    migration: tuple[Transfer, ...] = ()
    migration_ms: float = 0.0

    @property
    def assumptions(self) -> tuple[str, ...]:
        """The problem's assumptions plus this plan's batch-range notes
        (:func:`planner.inputs.problem.batch_range_notes`), for a one-device plan whose
        replica no idle device can hold, why (:func:`planner.replan.replicas.refusal`), and
        when its replication interval is too short to hide a point's transfer, by how
        much (:func:`replication_note`)."""
        refused = CostModel(self.problem, self.partition.micro_batch_size).replica_refusal(
            self.partition)
        return (self.problem.assumptions + batch_range_notes(self.problem, self.partition)
                + tuple(n for n in (refused, interval_note(self)) if n))


def interval_note(plan: Plan) -> str | None:
    """:func:`replication_note` for ``plan``'s interval, predicted transfer
    (:meth:`CostModel.replica_transfer_ms`) and iteration time; ``edgepipe plan`` shows
    it among the assumptions, ``edgepipe run`` as a warning of a recovering run."""
    return replication_note(_interval(plan), _transfer_ms(plan), plan.cost.iteration_ms)


def short_run_note(plan: Plan, steps: int) -> str | None:
    """:func:`interval_note`, else, for a replicating plan, one line when a run of
    ``steps`` steps skips or defers replication points or sends no replica of its final state
    (:func:`replication_schedule`: a point's transfer outlasts the steps left after it,
    docs/fault-tolerance.md, "Short runs"), naming the points, why, what a failure then
    replays from, and how to turn replicas off. ``edgepipe run`` shows it as a warning,
    ``edgepipe demo`` runs such a short run without replicas. O(P + steps / interval)."""
    if note := interval_note(plan):
        return note
    schedule = replication_schedule(plan, 0, steps)
    if _interval(plan) == 0 or (not schedule.skipped and schedule.final_sent):
        return None
    transfer, step = _transfer_ms(plan), plan.cost.iteration_ms
    what = []
    if schedule.skipped:
        s = "s" if len(schedule.skipped) > 1 else ""
        named = ", ".join(map(str, schedule.skipped))
        what.append(f"defers replication point{s} {named} to its end (point {steps})"
                    if schedule.final_sent else f"skips replication point{s} {named}")
    if not schedule.final_sent:
        what.append(f"sends no replica of its final state (point {steps})")
    return (f"a run of {steps} steps {' and '.join(what)}: a point's transfer takes "
            f"{transfer:.0f} ms on the modelled links, {transfer / step:.1f} steps of "
            f"{step:.1f} ms, more than the steps the run has left after it; a failure "
            "replays from the last point taken or the start state (plan with "
            "--replication-interval 0 to turn replicas off)")


def replication_schedule(plan: Plan, resume: int, steps: int) -> PointSchedule:
    """The replication points a generation of ``plan`` from step ``resume`` takes and
    sends in a run of ``steps`` steps (:func:`planner.cost.formulas.point_schedule` at the
    plan's interval, predicted replica transfer and step). Deterministic: the
    coordinator and every worker compute it from the same plan. O(P + steps /
    interval)."""
    return point_schedule(resume, steps, _interval(plan), _transfer_ms(plan),
                          plan.cost.iteration_ms)


def _interval(plan: Plan) -> int:
    """The plan's replication interval: always a whole number (:func:`make_plan`
    resolves ``auto``, :func:`plan_from_dict` refuses it)."""
    k = plan.problem.config.replication_interval
    assert isinstance(k, int)
    return k


def _transfer_ms(plan: Plan) -> float:
    return CostModel(plan.problem, plan.partition.micro_batch_size).replica_transfer_ms(
        plan.partition)


def replication_note(interval: int, transfer_ms: float, iteration_ms: float) -> str | None:
    """One line when ``interval`` (> 0) steps of ``iteration_ms`` do not hide a
    replication point's transfer of ``transfer_ms`` (:meth:`CostModel.replica_transfer_ms`):
    the commit that makes each next point then waits for the rest, so throughput falls
    to interval x iteration / transfer of the unreplicated run; it names the smallest
    interval that hides it (:func:`planner.cost.formulas.hiding_interval`) and what that costs
    a loss (a replay of up to 2k - 1 steps, docs/fault-tolerance.md, "Points in
    flight"). None when the interval hides it or replication is off. O(1)."""
    k = hiding_interval(transfer_ms, iteration_ms)
    if interval == 0 or interval >= k:
        return None
    return (f"a replication point's transfer takes {transfer_ms:.0f} ms on the modelled "
            f"links, {transfer_ms / iteration_ms:.1f} steps of {iteration_ms:.1f} ms: at "
            f"replication_interval {interval} throughput falls to about "
            f"{interval * iteration_ms / transfer_ms:.1%} of an unreplicated run; "
            f"replication_interval {k} hides it (a loss then replays up to {2 * k - 1} "
            "steps)")


def check_memory(problem: Problem, partition: Partition, cost: PlanCost) -> None:
    """Raise :class:`PlanMismatchError` naming the first device whose memory under the
    plan (``cost``, Eq. 3 plus the ring replicas it holds) exceeds its usable memory."""
    for p, (stage, sc) in enumerate(zip(partition.stages, cost.stages, strict=True)):
        replicas = sc.replica_bytes or (0.0,) * len(stage.devices)
        for dev, need, limit, held in zip(
            stage.devices, sc.memory_bytes, sc.budget_bytes, replicas, strict=True
        ):
            if need > limit:
                note = (
                    f", {human_bytes(held)} of it ring replicas of another stage "
                    "(replication_interval 0 turns them off)"
                    if held > 0
                    else ""
                )
                raise PlanMismatchError(
                    f"device {_excerpt(dev)} (stage {p}) needs {human_bytes(need)}{note} but "
                    f"has {human_bytes(limit)} usable ({need:.0f} > {limit:.0f} bytes); the "
                    "plan does not fit this cluster, re-plan for it"
                )


def content_id(problem: Problem, partition: Partition) -> str:
    """The plan id: ``plan-`` and a hash of the inputs and the decision. The config is
    hashed without a replication interval of 1, so the plans written before the
    interval was a field (every one of them replicating every step) keep their ids."""
    return f"plan-{_digest(problem, partition)}"


def _digest(problem: Problem, partition: Partition) -> str:
    config = problem.config.to_dict()
    if config["replication_interval"] == 1:
        del config["replication_interval"]
    payload = json.dumps(
        _numbers_as_floats(
            {
                "model": problem.model.to_dict(),
                "cluster": problem.cluster.to_dict(),
                "config": config,
                "decision": _decision_dict(partition),
            }
        ),
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _numbers_as_floats(value: Any) -> Any:
    """``value`` with every int (not bool) as a float, so the hash is of the values: a
    profile built in Python with ``1`` hashes as the same profile loaded back as ``1.0``."""
    if isinstance(value, dict):
        return {k: _numbers_as_floats(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_numbers_as_floats(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _decision_dict(partition: Partition) -> dict[str, Any]:
    return {
        "micro_batch_size": partition.micro_batch_size,
        "num_micro_batches": partition.num_micro_batches,
        "stages": [[s.first, s.end, list(s.devices), list(s.samples)] for s in partition.stages],
    }


def make_plan(
    problem: Problem,
    partition: Partition,
    solver: SolverInfo,
    parent_id: str | None = None,
    cost: PlanCost | None = None,
    changes: Changes | None = None,
    migration: tuple[Transfer, ...] = (),
    migration_ms: float = 0.0,
) -> Plan:
    """Check ``partition`` against ``problem``, score it and wrap it as a :class:`Plan`.

    A config whose ``replication_interval`` is ``auto`` is resolved here, after the
    search, to :func:`planner.cost.formulas.hiding_interval` of the partition's predicted
    replication transfer and iteration: the search depends only on whether replicas
    are kept (their memory is the same at every interval > 0), so the partition is the
    same whatever the interval, and the plan holds the integer (at most
    :data:`planner.inputs.config.MAX_REPLICATION_INTERVAL`: a transfer that spans more steps
    leaves the plan's :func:`interval_note` among its assumptions). The id is a content
    hash of inputs (the resolved config) and decision, so the same plan has the same id.

    Raises:
        PlanMismatchError: the partition does not fit ``problem`` or overflows memory.
    """
    check_partition(problem, partition)
    cm = CostModel(problem, partition.micro_batch_size)
    if cost is None:
        cost = cm.evaluate(partition)
    check_memory(problem, partition, cost)
    if problem.config.replication_interval == AUTO:
        # capped at the schema's maximum: a slower link then shows in interval_note
        k = min(hiding_interval(cm.replica_transfer_ms(partition), cost.iteration_ms),
                MAX_REPLICATION_INTERVAL)
        problem = replace(problem, config=replace(problem.config, replication_interval=k,
                                                  replication_interval_auto=True))
    return Plan(
        id=content_id(problem, partition),
        parent_id=parent_id,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        solver=solver,
        problem=problem,
        partition=partition,
        cost=cost,
        changes=changes,
        migration=migration,
        migration_ms=migration_ms,
    )


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The plan's JSON document (schema ``plan/1``)."""
    part, cost, problem = plan.partition, plan.cost, plan.problem
    stages = []
    for p, (stage, sc) in enumerate(zip(part.stages, cost.stages, strict=True)):
        devices = [
            {
                "id": dev,
                "samples": y,
                "forward_ms": f,
                "backward_ms": b,
                "memory_bytes": mem,
                "memory_limit_bytes": lim,
                "replica_bytes": rep,
            }
            for dev, y, f, b, mem, lim, rep in zip(
                stage.devices,
                stage.samples,
                sc.device_forward_ms,
                sc.device_backward_ms,
                sc.memory_bytes,
                sc.budget_bytes,
                sc.replica_bytes,
                strict=True,
            )
        ]
        stages.append(
            {
                "index": p,
                "layers": [stage.first, stage.end],
                "warmup": sc.warmup,
                "forward_ms": sc.forward_ms,
                "backward_ms": sc.backward_ms,
                "allreduce_ms": sc.allreduce_ms,
                "link_out_ms": sc.link_out_ms,
                "devices": devices,
            }
        )
    used = set(part.used_devices())
    solver: dict[str, Any] = {
        "name": plan.solver.name,
        "settings": dict(plan.solver.settings),
        "solve_time_s": plan.solver.solve_time_s,
        "status": plan.solver.status,
    }
    if plan.solver.objective_bound_ms is not None:
        solver["objective_bound_ms"] = plan.solver.objective_bound_ms
    if plan.solver.gap is not None:
        solver["gap"] = plan.solver.gap
    return {
        "schema_version": 1,
        "kind": KIND,
        "id": plan.id,
        "parent_id": plan.parent_id,
        "created": plan.created,
        "solver": solver,
        "inputs": {
            "model": problem.model.to_dict(),
            "cluster": problem.cluster.to_dict(),
            "config": problem.config.to_dict(),
        },
        "micro_batch_size": part.micro_batch_size,
        "num_micro_batches": part.num_micro_batches,
        "stages": stages,
        "idle_devices": [d.id for d in problem.cluster.devices if d.id not in used],
        "prediction": {
            "iteration_ms": cost.iteration_ms,
            "steady_ms": cost.steady_ms,
            "samples_per_s": cost.samples_per_s if math.isfinite(cost.samples_per_s) else None,
            "bottleneck": cost.bottleneck,
            "dominant_step": cost.dominant_step,
            "peak_memory_fraction": cost.peak_memory_fraction,
        },
        "assumptions": list(plan.assumptions),
        "replicas": [
            {
                "stage": r.stage,
                "layers": [r.first, r.end],
                "kind": r.kind,
                "holders": list(r.holders),
            }
            for r in replica_placement(plan)
        ],
        **_lineage_dict(plan),
    }


def replica_placement(plan: Plan) -> tuple[Replica, ...]:
    """Where each stage's committed state is replicated (:mod:`planner.replan.replicas`)."""
    return CostModel(plan.problem, plan.partition.micro_batch_size).replicas(plan.partition)


def replica_standbys(plan: Plan) -> tuple[str, ...]:
    """The idle devices that can hold a one-device plan's replica, best first; the first
    holds it (:func:`planner.replan.replicas.standbys`). Empty for every other plan."""
    return CostModel(plan.problem, plan.partition.micro_batch_size).replica_standbys(
        plan.partition)


def _lineage_dict(plan: Plan) -> dict[str, Any]:
    """``changes`` and ``migration`` of a re-planned plan (nothing for a fresh one)."""
    if plan.changes is None:
        return {}
    ch = plan.changes
    return {
        "changes": {
            "lost": list(ch.lost),
            "slowed": {d: f for d, f in ch.slowed},
            "joined": list(ch.joined),
            "path": ch.path,
            "reason": ch.reason,
        },
        "migration": {
            "bytes": sum(t.bytes for t in plan.migration),
            "predicted_ms": plan.migration_ms,
            "transfers": [
                {
                    "to": t.to,
                    "from": t.source,
                    "layers": [t.first, t.end],
                    "from_replica": t.from_replica,
                    "bytes": t.bytes,
                    "ms": t.ms,
                }
                for t in plan.migration
            ],
        },
    }


def plan_from_dict(doc: Any, source: str = "<plan>", *, rehash: bool = False) -> Plan:
    """Validate a plan document, rebuild its inputs, re-score its decision and re-check
    it (module docstring: decision, memory, id). ``rehash=True`` accepts a plan whose
    content no longer matches its id and gives it the id of its content.

    Raises:
        InputError: the document does not validate (schema, loaders' semantic checks).
        PlanMismatchError: a check of the module docstring fails.
    """
    validate(doc, KIND, source)
    inputs = doc["inputs"]
    model = ModelProfile.from_dict(inputs["model"], f"{source}: inputs.model")
    cluster = Cluster.from_dict(inputs["cluster"], f"{source}: inputs.cluster", catalog={})
    # a plan holds its resolved interval; one written before the key existed replicated
    # every step
    config = TrainingConfig.from_dict(inputs["config"], f"{source}: inputs.config", interval=1)
    if config.replication_interval == AUTO:
        raise PlanMismatchError(
            f"{source}: inputs.config.replication_interval is 'auto', but a plan holds the "
            "interval it resolved to (a whole number); re-plan with `edgepipe plan`"
        )
    problem = make_problem(model, cluster, config, catalog={})
    for p, stage in enumerate(doc["stages"]):
        if stage["index"] != p:
            raise PlanMismatchError(f"{source}: stage at position {p} has index {stage['index']}")
    partition = Partition(
        micro_batch_size=doc["micro_batch_size"],
        num_micro_batches=doc["num_micro_batches"],
        stages=tuple(
            StageAssignment(
                first=s["layers"][0],
                end=s["layers"][1],
                devices=tuple(d["id"] for d in s["devices"]),
                samples=tuple(d["samples"] for d in s["devices"]),
            )
            for s in doc["stages"]
        ),
    )
    try:
        check_partition(problem, partition)
    except PlanMismatchError as exc:
        raise PlanMismatchError(f"{source}: {exc}") from None
    s = doc["solver"]
    solver = SolverInfo(
        name=s["name"],
        settings=dict(s["settings"]),
        solve_time_s=s["solve_time_s"],
        status=s["status"],
        objective_bound_ms=s.get("objective_bound_ms"),
        gap=s.get("gap"),
    )
    cost = CostModel(problem, partition.micro_batch_size).evaluate(partition)
    try:
        check_memory(problem, partition, cost)
    except PlanMismatchError as exc:
        raise PlanMismatchError(f"{source}: {exc}") from None
    expected = content_id(problem, partition)
    if doc["id"] != expected and not rehash:
        raise PlanMismatchError(
            f"{source}: the plan's id {_excerpt(doc['id'])} is not the hash of its content "
            f"({expected}): the file was edited after planning. Re-plan, or accept the edit "
            f"with `edgepipe validate --rehash {source}`"
        )
    changes: Changes | None = None
    migration: tuple[Transfer, ...] = ()
    migration_ms = 0.0
    if "changes" in doc:
        ch = doc["changes"]
        changes = Changes(
            lost=tuple(ch["lost"]),
            slowed=tuple(sorted(ch["slowed"].items())),
            joined=tuple(ch["joined"]),
            path=ch["path"],
            reason=ch["reason"],
        )
        mig = doc["migration"]
        migration = tuple(
            Transfer(
                to=t["to"],
                source=t["from"],
                first=t["layers"][0],
                end=t["layers"][1],
                from_replica=t["from_replica"],
                bytes=t["bytes"],
                ms=t["ms"],
            )
            for t in mig["transfers"]
        )
        migration_ms = mig["predicted_ms"]
    return Plan(
        expected,
        doc["parent_id"],
        doc["created"],
        solver,
        problem,
        partition,
        cost,
        changes,
        migration,
        migration_ms,
    )


def _excerpt(value: str, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def save_plan(plan: Plan, path: str | Path) -> None:
    """Write the plan as indented JSON, atomically
    (:func:`planner.inputs.schema.write_text_atomic`). Raises ``TypeError`` naming the
    expected type when ``plan`` is not a :class:`Plan` or ``path`` not a path."""
    if not isinstance(plan, Plan):
        raise TypeError(f"save_plan() takes a Plan (api.solve, api.load_plan), got a "
                        f"{type(plan).__name__}")
    if not isinstance(path, str | Path):
        raise TypeError(f"save_plan() writes to a path (str or pathlib.Path), got a "
                        f"{type(path).__name__}")
    write_text_atomic(path, json.dumps(plan_to_dict(plan), indent=1) + "\n")


def load_plan(path: str | Path, *, rehash: bool = False) -> Plan:
    """Read and check a plan file (:func:`plan_from_dict`)."""
    return plan_from_dict(load_document(path, KIND), str(path), rehash=rehash)
