"""The steady-state step (``PlanCost.steady_ms``, planner/cost/steady.py): a device starts
step t+1 once its own step t (its actions and its ring all-reduce) is done, so where a
later stage's all-reduce ends after stage 0 has finished, consecutive steps overlap.
Hand-worked on two plans, and the independent simulator's several steps in a row
(planner/check/simulator.py) against the cost model on overlapping shapes over the
shipped profiles and clusters and on random plans.

Hand-worked model (bytes; ms on type "t" at batch 1 and 2, backward = 2 x forward):

    block  params W  out/sample  forward ms (b=1, 2)
    b0     1000      10          1, 2
    b1     2000      20          2, 4
    b2     3000      30          3, 6

on a point-to-point network of 8 Mbit/s (1000 bytes/ms) and 1 ms latency, global batch
2, one micro-batch of 2 (M = 1), 1F1B.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from edgepipe.planner import api
from edgepipe.planner.check.report import build_report
from edgepipe.planner.check.simulator import simulate, steady_step_ms
from edgepipe.planner.cli.plan_views import plan_heading
from edgepipe.planner.cost.makespan import round_ends
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.inputs.cluster import Cluster, Device, Network
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import Problem, make_problem
from edgepipe.planner.inputs.profile import ModelProfile
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.plan import SolverInfo, make_plan, plan_from_dict, plan_to_dict

from tests.helpers.hand_model import MODEL, T
from tests.helpers.runs import write_run
from tests.helpers.synthetic import random_plans, random_problem


def hand_problem() -> Problem:
    devices = (Device("A", "t"), Device("B", "t"), Device("C", "t"))
    cluster = Cluster("hand", devices, Network(8.0, 1.0, False, (), "point_to_point"), {"t": T})
    return make_problem(MODEL, cluster, TrainingConfig(2, (2,)), catalog={"t": T})


def test_steps_overlap_when_a_later_stage_all_reduces_after_stage_0_has_finished():
    # stage 0: A, b0 at 2 samples (F 2, B 4); stage 1: B and C, b1-b2 at 1 sample each
    # (F 2 + 3 = 5, B 10), ring over B, C of W = 5000 bytes: 2 steps of a 2500-byte chunk,
    # 2.5 ms + 1 ms latency each. Pieces A -> B, A -> C: 10 bytes, 0.01 ms + 1 ms.
    prob = hand_problem()
    part = Partition(2, 1, (StageAssignment(0, 1, ("A",), (2,)),
                            StageAssignment(1, 3, ("B", "C"), (1, 1))))  # fmt: skip
    cost = CostModel(prob, 2).evaluate(part)
    # one isolated step: A F [0, 2]; delivered 3.01; B, C F [3.01, 8.01], B [8.01, 18.01];
    # gradients delivered 19.02; A B [19.02, 23.02]; ring from 18.01: step 0 delivered
    # 18.01 + 3.5 = 21.51, step 1 delivered 25.01: the step ends at 25.01
    assert cost.iteration_ms == pytest.approx(25.01)
    # in a run A starts step t+1 at the end of its own step t (it has no ring), 1.99 ms
    # before B and C have all-reduced; B, C wait for A's activations (3.01 ms after A's
    # start) > their ring (1.99): A's cycle is the period:
    # F_A 2 + piece 1.01 + F 5 + B 10 + piece 1.01 + B_A 4 = 23.02
    assert cost.steady_ms == pytest.approx(23.02)
    assert cost.samples_per_s == pytest.approx(2 / 23.02 * 1e3)
    assert steady_step_ms(prob, part) == pytest.approx(23.02)


def test_the_steady_step_is_the_iteration_when_stage_0_ends_the_step():
    # stage 0: A and B, b0 at 1 sample each (F 1, B 2), ring of W = 1000 bytes: 2 steps of
    # a 500-byte chunk, 0.5 + 1 ms; stage 1: C, b1-b2 at 2 samples (F 4 + 6 = 10, B 20)
    prob = hand_problem()
    part = Partition(2, 1, (StageAssignment(0, 1, ("A", "B"), (1, 1)),
                            StageAssignment(1, 3, ("C",), (2,))))  # fmt: skip
    cost = CostModel(prob, 2).evaluate(part)
    # A, B F [0, 1]; delivered 2.01; C F [2.01, 12.01], B [12.01, 32.01]; gradients
    # delivered 33.02; A, B B [33.02, 35.02]; ring delivered 36.52 and 38.02
    assert cost.iteration_ms == pytest.approx(38.02)
    # C is free at 32.01 but its next forward needs A's and B's, which start when their
    # ring ends at 38.02, the end of the step: every step is the isolated one, shifted
    assert cost.steady_ms == cost.iteration_ms
    assert steady_step_ms(prob, part) == pytest.approx(38.02)


def test_the_simulator_runs_steps_in_a_row_one_after_another_per_device():
    # the overlapping plan above: step 1 starts on A at 23.02 and ends at 48.03
    # (A F [23.02, 25.02], delivered 26.03, B/C F [26.03, 31.03], B [31.03, 41.03],
    # ring 41.03 + 7 = 48.03); step 2 ends 23.02 later, at 71.05
    prob = hand_problem()
    part = Partition(2, 1, (StageAssignment(0, 1, ("A",), (2,)),
                            StageAssignment(1, 3, ("B", "C"), (1, 1))))  # fmt: skip
    timeline = simulate(prob, part, iterations=3)
    assert timeline.iteration_ends() == pytest.approx([25.01, 48.03, 71.05])
    assert [iv.start_ms for iv in timeline.devices["A"] if iv.kind == "F"] == pytest.approx(
        [0.0, 23.02, 46.04])


def overlapping_plan():
    part = Partition(2, 1, (StageAssignment(0, 1, ("A",), (2,)),
                            StageAssignment(1, 3, ("B", "C"), (1, 1))))  # fmt: skip
    return make_plan(hand_problem(), part, SolverInfo("hand", {}, 0.0, "heuristic"))


def test_plan_and_show_print_the_steady_step_beside_the_iteration():
    heading = plan_heading(overlapping_plan())
    assert "iteration 25.0 ms, steady step 23.0 ms (steps overlap), 86.88 samples/s" in heading


def test_a_plan_file_carries_the_steady_step_and_an_older_file_without_it_loads():
    plan = overlapping_plan()
    doc = plan_to_dict(plan)
    assert doc["prediction"]["steady_ms"] == pytest.approx(23.02)
    del doc["prediction"]["steady_ms"]  # as written before the figure existed
    assert plan_from_dict(doc).cost.steady_ms == pytest.approx(23.02)


def test_report_sets_the_measured_steps_against_the_steady_step(tmp_path: Path):
    plan = write_run(tmp_path, time_scale=4.0)
    report = build_report(tmp_path)
    assert report.steady_predicted_ms == 4.0 * plan.cost.steady_ms
    assert report.samples_per_s_predicted == pytest.approx(4 / (4.0 * plan.cost.steady_ms) * 1e3)


#: plans over the shipped profiles and clusters whose steps overlap or contend: the
#: DP's scored plans (benchmarks/solver_vs_dp.py instances) where steady != iteration;
#: the cluster names with -ethernet / -8 are that benchmark's variants of
#: jetson-testbed-6 (gigabit switch; two more devices). Ratio steady / iteration.
SHAPES = [
    ("gpt2-small-analytic", "jetson-testbed-6", "g32", 2, 16,
     "0-10:orin-0=2;10-14:tx2-0,nx-0=1,1"),  # 1.0015
    ("pipedream-alexnet", "pi-lab-4", "g64-adam", 2, 32,
     "0-10:laptop-0=2;10-11:pi4-0,pi4-1=1,1;11-18:pi5-0=2"),  # 0.9999
    ("bert-small-analytic", "jetson-testbed-6-ethernet", "g32", 4, 8,
     "0-3:orin-0=4;3-4:nx-0=4;4-5:tx2-0,tx2-1=2,2;5-6:nano-0,nano-1=2,2"),  # 0.9499
    ("bert-small-analytic", "jetson-testbed-6-ethernet", "g32", 4, 8,
     "0-3:orin-0=4;3-4:nx-0=4;4-5:tx2-0,tx2-1=2,2;5-6:nano-1=4"),  # 0.9499
    ("pipedream-squeezenet1_0", "jetson-testbed-8", "g64-adam", 4, 16,
     "0-48:orin-0,orin-1=2,2;48-56:nx-0,nx-1=2,2;56-57:tx2-0=4"),  # 0.9917
    ("pipedream-squeezenet1_0", "jetson-testbed-8", "g64-adam", 4, 16,
     "0-48:orin-0,orin-1=2,2;48-57:nx-0,nx-1=2,2"),  # 0.9883
    ("bert-small-analytic", "jetson-testbed-8-ethernet", "g32", 4, 8,
     "0-2:orin-0=4;2-3:orin-1=4;3-4:tx2-0,tx2-1=2,2;4-5:nx-0,nx-1=2,2;5-6:nano-0,nano-1=2,2"),
     # 0.9836
    ("bert-small-analytic", "jetson-testbed-8-ethernet", "g32", 2, 16,
     "0-2:orin-0=2;2-3:tx2-0,tx2-1=1,1;3-4:orin-1=2;4-5:nx-0,nx-1=1,1;5-6:nano-0,nano-1=1,1"),
     # 1.0368
    ("pipedream-vgg16", "jetson-testbed-8-ethernet", "g32", 2, 16,
     "0-10:orin-0,orin-1=1,1;10-19:tx2-0,tx2-1=1,1;19-24:nx-0=2;24-36:nx-1=2"),  # 0.9867
]

CONFIGS = {"g32": TrainingConfig(32),
           "g64-adam": TrainingConfig(64, (2, 4, 8, 16), optimizer="adam")}  # fmt: skip


def shipped_problem(model: str, cluster: str, config: str) -> Problem:
    """The shipped model on the shipped cluster, or on the benchmark's variant of
    jetson-testbed-6 its name says (-8: orin-1 and nx-1 added; -ethernet: gigabit)."""
    doc = json.loads(api.resolve(cluster.removesuffix("-ethernet").replace("-8", "-6"),
                                 "clusters").read_text())
    if "-8" in cluster:
        doc["devices"] += [{"id": "orin-1", "type": "jetson-orin-nano"},
                           {"id": "nx-1", "type": "jetson-xavier-nx"}]
    if cluster.endswith("-ethernet"):
        doc["network"] = {"bandwidth_mbps": 940, "latency_ms": 0.2, "shared_medium": False}
    profile = ModelProfile.load(api.resolve(model, "models"))
    return make_problem(profile, Cluster.from_dict(doc, cluster), CONFIGS[config])


def stage_of(text: str) -> StageAssignment:
    """``first-end:dev,dev=y,y`` as a stage."""
    blocks, group = text.split(":")
    devices, samples = group.split("=")
    first, end = blocks.split("-")
    return StageAssignment(int(first), int(end), tuple(devices.split(",")),
                           tuple(int(y) for y in samples.split(",")))


@pytest.mark.parametrize(("model", "cluster", "config", "batch", "count", "stages"), SHAPES)
def test_the_simulator_agrees_on_the_overlapping_shapes_of_the_shipped_profiles(
    model, cluster, config, batch, count, stages
):
    prob = shipped_problem(model, cluster, config)
    part = Partition(batch, count, tuple(stage_of(s) for s in stages.split(";")))
    cost = CostModel(prob, batch).evaluate(part)
    assert cost.steady_ms != cost.iteration_ms  # the shape: steps overlap or contend
    assert steady_step_ms(prob, part) == pytest.approx(cost.steady_ms, rel=1e-9)


def test_the_simulator_agrees_on_random_plans():
    differ = 0
    for prob, part in random_plans(150, 28):
        cost = CostModel(prob, part.micro_batch_size).evaluate(part)
        assert steady_step_ms(prob, part) == pytest.approx(cost.steady_ms, rel=1e-9)
        differ += cost.steady_ms != cost.iteration_ms
    assert differ == 23  # overlapping (or contending) shapes among them: the check bites


def test_the_period_has_converged_by_the_steps_it_reads():
    # steady.py reads e[3] - e[2] of 5 chained steps where it equals e[2] - e[1] (else a
    # mean over 4 of 10); over 8 the difference is the same (plan 47 here, 5 stages on a
    # shared medium, settles only at e[3] - e[2], and reads the mean)
    for prob, part in random_plans(150, 29):
        cm = CostModel(prob, part.micro_batch_size)
        ends = round_ends(*cm._round_inputs(part), prob.cluster.network.kind, 8)
        steps = np.diff(ends)
        assert steps[2:-1] == pytest.approx([steps[2]] * 4, rel=1e-9)


def test_a_step_alternating_on_a_shared_medium_is_read_over_a_whole_cycle():
    # 10 Mbit/s = 1250 bytes/ms on one shared medium, 4 micro-batches of 4 samples. The
    # bytes one iteration puts on the medium: boundary 7 (block 6's 120,000 bytes/sample
    # x 4 = 480,000: 384 ms) forward and back, 4 micro-batches: 3,072 ms; boundary 9
    # (block 8's 50,000 bytes/sample to d3's 3 and d0's 1 samples: 120 + 40 ms) forward
    # and back: 1,280 ms; stage 2's ring (block 9, W = 3,100,000 bytes, 2 devices): 2
    # steps of both devices sending a 1,550,000-byte chunk, 4 x 1,240 = 4,960 ms. Total
    # 9,312 ms: the medium is busy every step, so the period is its time. Chained steps
    # alternate 8,959.8 / 9,664.2 ms; their mean is the medium's time.
    prob = random_problem(10, 4, seed=133, global_batch=16, candidates=(1, 2, 4, 8),
                          shared=True, bandwidth_mbps=10.0)  # fmt: skip
    part = Partition(4, 4, (StageAssignment(0, 7, ("d2",), (4,)),
                            StageAssignment(7, 9, ("d1",), (4,)),
                            StageAssignment(9, 10, ("d3", "d0"), (3, 1))))  # fmt: skip
    assert CostModel(prob, 4).evaluate(part).steady_ms == pytest.approx(9312.0, rel=1e-12)
    assert steady_step_ms(prob, part) == pytest.approx(9312.0, rel=1e-12)


#: plans of ``random_plans(1295, 2)`` whose chained steps alternate: period 2 on a
#: shared medium, point to point and a switch (659, 660, 1273, 1294), period 4 after a
#: transient on a shared medium (815); one difference is off the mean by 0.03-1.6%
ALTERNATING = (659, 660, 815, 1273, 1294)


def test_the_steady_step_is_the_long_run_mean_where_steps_alternate():
    plans = random_plans(max(ALTERNATING) + 1, 2)
    for i in ALTERNATING:
        prob, part = plans[i]
        ends = simulate(prob, part, iterations=16).iteration_ends()
        mean = (ends[14] - ends[2]) / 12  # 12 steps with a successor after a transient
        cost = CostModel(prob, part.micro_batch_size).evaluate(part)
        assert cost.steady_ms == pytest.approx(mean, rel=1e-9)
        assert steady_step_ms(prob, part) == pytest.approx(cost.steady_ms, rel=1e-9)
