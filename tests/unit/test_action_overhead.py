"""The runtime's own work per micro-batch (``Timing.runtime_work``; docs/lab.md, "Runtime
work per action"): loaded from a profile, priced by the one cost model, seen by the DP
and the exact solver the same way, and added independently by the simulator."""

from __future__ import annotations

from dataclasses import replace

import pytest
from edgepipe.planner.check.simulator import simulate
from edgepipe.planner.cost.closed_form import pipeline_closed_form_ms
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.cluster import Cluster, Device, DeviceType, Network
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import Problem, make_problem
from edgepipe.planner.inputs.profile import Block, ModelProfile, RuntimeWork, Timing
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.solvers.dp.driver import plan_dp
from edgepipe.planner.solvers.exact.solver import plan_milp

from tests.helpers.synthetic import random_problem

SPEC = DeviceType("t", "test device", 1e12, 1.0, 1.0, 1.0, "test", 1e6, {})


def with_work(problem: Problem, work: dict[str, RuntimeWork]) -> Problem:
    """``problem`` with ``work`` recorded in its model's timings (by device type)."""
    timings = {n: replace(t, runtime_work=work.get(n)) for n, t in problem.model.timings.items()}
    model = replace(problem.model, timings=timings)
    types = problem.cluster.device_types
    return make_problem(model, problem.cluster, problem.config, catalog=types)


def two_block_problem(work: RuntimeWork | None, slowdown: float = 1.0) -> Problem:
    """Two blocks of 1 ms/sample forward and 2 ms/sample backward, one device type, two
    devices (the second ``slowdown`` times slower), 8 Mbit/s point to point, latency 0."""
    cluster = Cluster(
        "c", (Device("a", "t"), Device("b", "t", slowdown=slowdown)),
        Network(8.0, 0.0, False, (), "point_to_point"), {"t": SPEC},
    )
    timing = Timing((1,), ((1.0,), (1.0,)), ((2.0,), (2.0,)), runtime_work=work)
    model = ModelProfile("m", {"kind": "analytic"}, 1.0,
                         (Block("b0", 0.0, 1000.0, 0.0), Block("b1", 0.0, 0.0, 0.0)),
                         {"t": timing})
    return make_problem(model, cluster, TrainingConfig(4, (2,)), catalog={"t": SPEC})


def test_the_profile_field_round_trips_and_is_optional():
    problem = two_block_problem(RuntimeWork(0.5, 0.75, 0.02, 4))
    doc = problem.model.to_dict()
    assert doc["timings"]["t"]["runtime_work"] == {
        "forward_ms": 0.5, "backward_ms": 0.75, "spread": 0.02, "rounds": 4}
    assert ModelProfile.from_dict(doc) == problem.model
    del doc["timings"]["t"]["runtime_work"]
    assert ModelProfile.from_dict(doc).timings["t"].runtime_work is None
    doc["timings"]["t"]["runtime_work"] = {"forward_ms": -1.0, "backward_ms": 0.0,
                                           "spread": 0.0, "rounds": 1}
    with pytest.raises(InputError, match="runtime_work"):
        ModelProfile.from_dict(doc)


def test_the_cost_model_adds_the_work_to_every_used_device_per_micro_batch():
    # blocks [0, 2) at 2 samples: forward 2 x 1 + 2 x 1 = 4 ms, backward 8 ms; the work
    # 0.5 / 0.75 ms per micro-batch; device b at slowdown 2 doubles both
    cm = CostModel(two_block_problem(RuntimeWork(0.5, 0.75)))
    assert cm.device_times(0, 2, 0, 2) == (4.5, 8.75)
    assert CostModel(two_block_problem(RuntimeWork(0.5, 0.75), 2.0)).device_times(0, 2, 1, 2) == (
        9.0, 17.5)
    assert cm.device_times(0, 1, 0, 0) == (0.0, 0.0)  # no samples, no actions
    assert CostModel(two_block_problem(None)).device_times(0, 2, 0, 2) == (4.0, 8.0)


def test_the_simulator_adds_the_work_to_each_forward_and_backward():
    # one device, both blocks, M = 2 micro-batches of 2: F 4 + 0.5, B 8 + 0.75 ms,
    # 1F1B on one stage: F0 B0 F1 B1 back to back = 2 x 13.25 ms
    problem = two_block_problem(RuntimeWork(0.5, 0.75))
    plan = Partition(2, 2, (StageAssignment(0, 2, ("a",), (2,)),))
    timeline = simulate(problem, plan)
    durations = sorted({round(i.end_ms - i.start_ms, 9) for i in timeline.devices["a"]})
    assert durations == [4.5, 8.75]
    assert timeline.makespan_ms == pytest.approx(26.5)
    assert CostModel(problem).evaluate(plan).iteration_ms == pytest.approx(26.5)


WORK = {"fast": RuntimeWork(3.0, 4.0), "slow": RuntimeWork(6.0, 8.0)}


@pytest.mark.parametrize("topology", ["point_to_point", "switched", "shared_medium"])
def test_the_dp_value_equals_the_cost_model_with_the_work(topology):
    problem = with_work(random_problem(9, 4, seed=5, global_batch=16, candidates=(2, 4),
                                       topology=topology), WORK)
    result = plan_dp(problem)
    cm = CostModel(problem)
    assert result.dp_value_ms == pytest.approx(pipeline_closed_form_ms(cm, result.partition),
                                               rel=1e-9)
    assert result.cost.iteration_ms == pytest.approx(cm.evaluate(result.partition).iteration_ms)


def test_the_work_moves_the_dp_to_fewer_micro_batches():
    # 9 blocks of 0.5-5 ms on the fast type: without the work the DP's best micro-batch
    # is 2 (8 micro-batches); 3 + 4 ms a micro-batch per device make 4 (4 of them) best
    base = random_problem(9, 4, seed=5, global_batch=16, candidates=(2, 4))
    assert plan_dp(base).partition.micro_batch_size == 2
    assert plan_dp(with_work(base, WORK)).partition.micro_batch_size == 4


def test_the_exact_solver_prices_the_work_as_the_cost_model_does():
    # a poor warm start (one slow device) so that the program's own plan is returned
    # with its value: two single-device stages point to point, where the program's rows
    # are exact (178.39 ms; with the work left out of the program it said 160.39 for the
    # same plan, which the cost model prices at 178.39)
    problem = with_work(random_problem(5, 3, seed=2, global_batch=8, candidates=(2, 4),
                                       topology="point_to_point"), WORK)
    poor = Partition(4, 2, (StageAssignment(0, 5, ("d1",), (4,)),))
    milp = plan_milp(problem, time_limit=20.0, warm_start=poor)
    assert milp.status == "optimal"
    assert milp.program_ms == pytest.approx(milp.cost.iteration_ms, rel=1e-6)
    assert milp.cost.iteration_ms == CostModel(problem).evaluate(milp.partition).iteration_ms
    assert milp.cost.iteration_ms <= plan_dp(problem).cost.iteration_ms * (1 + 1e-9)
