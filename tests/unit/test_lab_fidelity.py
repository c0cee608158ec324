"""What the lab fidelity benchmark and the lab demo decide from plans alone
(executor/lab/fidelity.py, planner/cli/lab_demo.py): how long a plan runs, which
baseline is the best, the speed-ups, and whether the demo's DP plan is hybrid."""

from __future__ import annotations

from pathlib import Path

import pytest
from edgepipe.executor.lab.fidelity import (
    LabMeasurement,
    PlanSet,
    best_baseline,
    speedup,
    steps_for,
)
from edgepipe.planner.cli.lab_demo import LAB_CLUSTER, hybrid_note
from edgepipe.planner.inputs.cluster import Cluster
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.plan import Plan, SolverInfo, make_plan

from tests.helpers.synthetic import random_problem

PROBLEM = random_problem(4, 3, global_batch=8)


def plan_of(*stages: tuple[int, int, tuple[str, ...], tuple[int, ...]]) -> Plan:
    """A hand plan of micro-batch 4 x 2 on PROBLEM's devices d0-d2."""
    parts = tuple(StageAssignment(a, b, devs, ys) for a, b, devs, ys in stages)
    return make_plan(PROBLEM, Partition(4, 2, parts), SolverInfo("hand"))


HYBRID = plan_of((0, 2, ("d0", "d1"), (3, 1)), (2, 4, ("d2",), (4,)))


def test_a_plan_of_two_stages_on_three_devices_with_an_uneven_group_is_hybrid() -> None:
    note = hybrid_note(HYBRID)
    assert note.startswith("the DP plan is hybrid: 2 stages on 3 devices, stage 0")
    assert "(d0 3, d1 1 samples" in note


@pytest.mark.parametrize("stages", [
    # an even group is data parallelism within a stage, not the uneven split asked for
    ((0, 2, ("d0", "d1"), (2, 2)), (2, 4, ("d2",), (4,))),
    # one stage: data parallelism, however uneven
    ((0, 4, ("d0", "d1", "d2"), (2, 1, 1)),),
    # two stages on two devices
    ((0, 2, ("d0",), (4,)), (2, 4, ("d1",), (4,))),
])
def test_other_plans_are_said_not_to_be_hybrid(stages) -> None:
    assert hybrid_note(plan_of(*stages)).startswith("the DP plan is not hybrid this time")


def test_the_best_baseline_is_the_fastest_pipeline_baseline_never_data_parallelism() -> None:
    # all blocks on d0 (the fast type, 200 GFLOP/s) or on d1 (the slow one, 60)
    fast, slow = plan_of((0, 4, ("d0",), (4,))), plan_of((0, 4, ("d1",), (4,)))
    assert fast.cost.steady_ms < slow.cost.steady_ms
    plans = PlanSet(PROBLEM, {"dp": fast, "data-parallel": fast, "gpipe": slow,
                              "pipedream": fast, "hetpipe": slow})
    assert best_baseline(plans) == "pipedream"
    with pytest.raises(ValueError, match="no pipeline baseline"):
        best_baseline(PlanSet(PROBLEM, {"dp": fast, "data-parallel": fast}))


def test_a_run_lasts_about_the_seconds_asked_within_its_bounds() -> None:
    step_s = HYBRID.cost.steady_ms / 1e3
    # 9.5 steps of it round up to 10, and one more for the warm-up
    assert steps_for(HYBRID, seconds=9.5 * step_s, least=2, most=100) == 11
    assert steps_for(HYBRID, seconds=1e-9, least=6) == 6
    assert steps_for(HYBRID, seconds=1e9, most=15) == 15


def measurement(predicted: float, measured: float) -> LabMeasurement:
    return LabMeasurement("x", HYBRID, Path("."), 6, predicted, measured, 0.5, 1.5, (), ())


def test_speed_ups_are_ratios_of_steps_predicted_and_measured() -> None:
    slow, fast = measurement(200.0, 300.0), measurement(100.0, 120.0)
    assert speedup(slow, fast) == (2.0, 2.5)
    assert fast.error == pytest.approx(0.2)
    assert fast.load == 1.5 and fast.loaded(cores=1) and not fast.loaded(cores=2)


def test_the_demo_s_embedded_cluster_loads() -> None:
    cluster = Cluster.from_dict(LAB_CLUSTER, "demo", catalog=None)
    assert cluster.network.kind == "switched"
    assert [d.type for d in cluster.devices] == [
        "jetson-orin-nano", "jetson-xavier-nx", "jetson-tx2", "jetson-tx2"]
