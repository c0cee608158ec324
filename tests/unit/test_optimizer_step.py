"""The optimizer step (``RuntimeWork.step_ms_per_mib``; docs/cost-model.md, "The optimizer
step"): a profile field that round-trips and is optional, priced by the cost model once
per iteration per device after its last action and its ring, and by the independent
simulator by its own code; the two agree with it on."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
from edgepipe.planner.check.simulator import simulate, steady_step_ms
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.cluster import Cluster, Device, DeviceType, Network, Topology
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import Problem, make_problem
from edgepipe.planner.inputs.profile import Block, ModelProfile, RuntimeWork, Timing
from edgepipe.planner.partition import Partition, StageAssignment

from tests.helpers.synthetic import random_plans

SPEC = DeviceType("t", "test device", 1e12, 1.0, 1.0, 1.0, "test", 1e6, {})
MIB = 2.0**20


def two_stage_problem(step: RuntimeWork | None, stage1_mib: float,
                      topology: Topology = "point_to_point",
                      optimizer: str = "momentum") -> Problem:
    """Block 0 of 1 MiB of parameters and block 1 of ``stage1_mib``, each 1 ms/sample
    forward and 2 ms/sample backward; devices a and b of one type, 8 Mbit/s (1000 bytes
    per ms), latency 0; 1000 boundary bytes per sample; global batch 4 in micro-batches
    of 2 (M = 2)."""
    cluster = Cluster("c", (Device("a", "t"), Device("b", "t")),
                      Network(8.0, 0.0, False, (), topology), {"t": SPEC})
    timing = Timing((1,), ((1.0,), (1.0,)), ((2.0,), (2.0,)), runtime_work=step)
    model = ModelProfile("m", {"kind": "analytic"}, 1.0,
                         (Block("b0", MIB, 1000.0, 0.0), Block("b1", stage1_mib * MIB, 0.0, 0.0)),
                         {"t": timing})
    config = TrainingConfig(4, (2,), optimizer=optimizer)  # type: ignore[arg-type]
    return make_problem(model, cluster, config, catalog={"t": SPEC})


#: stage 0 (block 0) on a, stage 1 (block 1) on b, 2 samples each
PLAN = Partition(2, 2, (StageAssignment(0, 1, ("a",), (2,)), StageAssignment(1, 2, ("b",), (2,))))
#: 2 ms per MiB of parameters for momentum, nothing else measured
STEP = RuntimeWork(0.0, 0.0, step_ms_per_mib=(("momentum", 2.0),))

# By hand, without the step (1F1B; F 2 ms, B 4 ms, every piece 2 ms, latency 0):
#   a: F0 [0, 2], F1 [2, 4]; activations 0 on the pair [2, 4], 1 [4, 6]
#   b: F0 [4, 6], B0 [6, 10], F1 [10, 12], B1 [12, 16]; gradients 0 [10, 12], 1 [16, 18]
#   a: B0 [12, 16], B1 [18, 22]: iteration 22 ms
# The optimizer steps: a's O_a = 2 x 1 MiB = 2 ms after 22, b's O_b = 2 x W_1 after 16.


@pytest.mark.parametrize("topology", ["point_to_point", "switched"])
def test_the_last_device_to_finish_adds_its_step_to_the_iteration(topology):
    # W_1 = 2 MiB: O_b = 4 ends at 20, O_a = 2 at 24: the iteration grows by O_a
    cost = CostModel(two_stage_problem(STEP, 2.0, topology)).evaluate(PLAN)
    assert CostModel(two_stage_problem(None, 2.0, topology)).evaluate(PLAN).iteration_ms == 22.0
    assert cost.iteration_ms == 24.0
    assert [s.device_optimizer_ms for s in cost.stages] == [(2.0,), (4.0,)]
    # chained, a starts step t+1 at 24 instead of 22, and everything follows it
    assert cost.steady_ms == 24.0


@pytest.mark.parametrize("topology", ["point_to_point", "switched"])
def test_a_step_that_ends_the_iteration_can_hide_in_the_steady_step(topology):
    # W_1 = 5 MiB: O_b = 10 ms from 16 ends the iteration at 26 (a's at 24); chained, b
    # is free at 26 but its next F0 waits for a's activations until 24 + 4 = 28, so the
    # steady step is a's own cycle, 24
    cost = CostModel(two_stage_problem(STEP, 5.0, topology)).evaluate(PLAN)
    assert (cost.iteration_ms, cost.steady_ms) == (26.0, 24.0)


def test_the_simulator_prices_the_same_steps_by_its_own_code():
    problem = two_stage_problem(STEP, 5.0)
    timeline = simulate(problem, PLAN)
    assert timeline.optimizer == {"a": ((22.0, 24.0),), "b": ((16.0, 26.0),)}
    assert timeline.makespan_ms == 26.0
    assert steady_step_ms(problem, PLAN) == 24.0


def test_a_step_not_measured_for_the_configs_optimizer_costs_nothing():
    for problem in (two_stage_problem(STEP, 5.0, optimizer="adam"),
                    two_stage_problem(RuntimeWork(0.0, 0.0), 5.0)):
        assert CostModel(problem).evaluate(PLAN).iteration_ms == 22.0
        assert simulate(problem, PLAN).optimizer == {}


def test_a_slower_device_steps_slower_and_the_profile_scales_with_it():
    assert STEP.scaled(3.0).step_ms("momentum") == 6.0
    base = two_stage_problem(STEP, 2.0)
    slow = replace(base.cluster, devices=(Device("a", "t"), Device("b", "t", slowdown=2.0)))
    cm = CostModel(make_problem(base.model, slow, base.config, catalog={"t": SPEC}))
    assert cm.optimizer_ms(1, 2, 1) == 2.0 * 2.0 * 2.0  # 2 ms/MiB x 2 MiB x slowdown 2


def with_step(problem: Problem, per_mib: dict[str, float]) -> Problem:
    """``problem`` with the config's optimizer's step measured per device type."""
    timings = {
        name: replace(t, runtime_work=RuntimeWork(
            0.0, 0.0, step_ms_per_mib=((problem.config.optimizer, per_mib[name]),)))
        for name, t in problem.model.timings.items()
    }
    return make_problem(replace(problem.model, timings=timings), problem.cluster,
                        problem.config, catalog=problem.cluster.device_types)


def test_the_cost_model_matches_the_simulator_with_the_step_on_random_plans():
    # 18 plans, every topology; 2 and 5 ms per MiB on stages of 0.1-40 MiB: the step is
    # from a fraction of the iteration to most of it
    moved = 0
    for problem, plan in random_plans(18, seed=25):
        stepped = with_step(problem, {"fast": 2.0, "slow": 5.0})
        cost = CostModel(stepped).evaluate(plan)
        assert cost.iteration_ms == pytest.approx(simulate(stepped, plan).makespan_ms, rel=1e-12)
        assert cost.steady_ms == pytest.approx(steady_step_ms(stepped, plan), rel=1e-12)
        moved += cost.iteration_ms > CostModel(problem).evaluate(plan).iteration_ms
    assert moved == 18


def test_the_profile_field_round_trips_and_the_schema_checks_it():
    step = RuntimeWork(0.5, 0.75, 0.02, 4, (("adam", 6.5), ("momentum", 2.25), ("sgd", 1.0)))
    problem = two_stage_problem(step, 1.0)
    doc = problem.model.to_dict()
    assert doc["timings"]["t"]["runtime_work"]["step_ms_per_mib"] == {
        "adam": 6.5, "momentum": 2.25, "sgd": 1.0}
    assert ModelProfile.from_dict(doc) == problem.model
    # a profile without it writes and reads what it did before
    bare = two_stage_problem(RuntimeWork(0.5, 0.75, 0.02, 4), 1.0).model.to_dict()
    assert "step_ms_per_mib" not in bare["timings"]["t"]["runtime_work"]
    for bad in ({"sgd": -1.0}, {"rmsprop": 1.0}, {"adam": "fast"}):
        broken = copy.deepcopy(doc)
        broken["timings"]["t"]["runtime_work"]["step_ms_per_mib"] = bad
        with pytest.raises(InputError, match="step_ms_per_mib"):
            ModelProfile.from_dict(broken)
