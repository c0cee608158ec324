"""The plans of issue 28's short runs (tests/integration/test_replication_stall.py,
benchmarks/replication_stall.py): replicas whose transfer lasts about :data:`SPAN` of
their predicted steps, at the default interval (``auto``), with
:func:`~tests.helpers.recovery_runs.fixed_profile`'s times so that the plans do not
depend on this machine's load; and a run's wall time against its steps' time."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.plan import Plan, SolverInfo, make_plan

from tests.helpers.executor_helpers import emulated_plan
from tests.helpers.recovery_runs import fixed_profile, one_device_plan

#: the replica's transfer, in predicted steps, of :func:`one_device`
SPAN = 21.0


def transfer_ms(plan: Plan) -> float:
    """One replication point's predicted transfer (the cost model's)."""
    return CostModel(plan.problem, plan.partition.micro_batch_size).replica_transfer_ms(
        plan.partition)


def one_device() -> Plan:
    """The toy model on ``d0`` alone in a cluster of 3 (the launcher starts the standbys
    ``d1`` and ``d2``: the demo's kind of plan), on a link (the standbys' only traffic)
    over which its replica's transfer lasts :data:`SPAN` steps."""
    base = one_device_plan(3, model_profile=fixed_profile(), replication_interval="auto")
    need = CostModel(base.problem, 2).replica_bytes(0, base.problem.model.num_blocks)
    mbps = need / (SPAN * base.cost.iteration_ms) * 8e3 / 1e6  # bytes per ms -> Mbit/s
    return one_device_plan(3, model_profile=fixed_profile(),
                           network={"bandwidth_mbps": mbps, "latency_ms": 0.0},
                           replication_interval="auto")


def two_stages() -> Plan:
    """Blocks [0, 3) on d0 and [3, 6) on d1, each holding the other's ring replica, on a
    0.024 Mbit/s link: the link also carries the activations, and the replicas take the
    channel time they leave, about 21 steps."""
    plan = emulated_plan(fixed_profile(), [(0, 3, [2]), (3, 6, [2])], 2, 2, [1, 1],
                         bandwidth_mbps=0.024)
    config = replace(plan.problem.config, replication_interval="auto")
    return make_plan(replace(plan.problem, config=config), plan.partition, SolverInfo("hand"))


def wall_and_steps(out: Path, end: float, steps: int) -> tuple[float, float]:
    """The run in ``out`` (``metrics.jsonl``, ``steps`` steps) that returned at ``end``
    (wall clock): its wall time from its first step's start, and its steps' time (each
    step's ``wall_ms`` less the largest wait of a device for a replication point)."""
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().split("\n") if x.strip()]
    measured = [m for m in lines if "type" not in m]
    assert [m["step"] for m in measured] == list(range(steps))
    start = min(d["started_at"] for d in measured[0]["devices"].values())
    waits = [max(d.get("replication_ms", 0.0) for d in m["devices"].values()) for m in measured]
    return end - start, sum(m["wall_ms"] - w for m, w in zip(measured, waits, strict=True)) / 1e3
