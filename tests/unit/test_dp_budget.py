"""The DP's budgets count work, not seconds (issue 29): the same input gives the same
plan however busy the machine is; the time limit is only a safety stop, and a plan it
cut short says so (``timed_out``).

The case: pipedream-alexnet on the shipped jetson-testbed-6 over gigabit Ethernet, global
batch 64 with adam (benchmarks/solver_vs_dp.py's ``g64-adam``), whose plan is one of the
waiting answers that only the final re-scoring scores (without it the DP returns a plan
about 10% slower), so a re-scoring cut short by a clock changes it."""

from __future__ import annotations

import json
import time
import types
from collections.abc import Callable

import pytest
from edgepipe.planner import api
from edgepipe.planner.cost.model import CostModel, PlanCost
from edgepipe.planner.inputs.cluster import Cluster
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import Problem, make_problem
from edgepipe.planner.inputs.profile import ModelProfile
from edgepipe.planner.partition import Partition
from edgepipe.planner.solvers import time_limit as time_limit_module
from edgepipe.planner.solvers.dp import sizes as dp_sizes
from edgepipe.planner.solvers.dp.driver import plan_dp
from edgepipe.planner.solvers.dp.sizes import DPResult

from tests.helpers.load import busy_cores

#: a limit that never runs out here (seconds, also on the slow evaluations' clocks)
NEVER = 1e9
#: seconds an evaluation takes beyond its own on the slow evaluations' clocks: far more
#: than the rest of a run, so that a limit of n STALL runs out at the n-th evaluation
STALL = 1000.0


@pytest.fixture(scope="module")
def problem() -> Problem:
    doc = json.loads(api.resolve("jetson-testbed-6", "clusters").read_text())
    doc["network"] = {"bandwidth_mbps": 940, "latency_ms": 0.2, "shared_medium": False}
    cluster = Cluster.from_dict(doc, "jetson-testbed-6-ethernet")
    model = ModelProfile.load(api.resolve("pipedream-alexnet", "models"))
    return make_problem(model, cluster, TrainingConfig(64, (2, 4, 8, 16), optimizer="adam"))


@pytest.fixture(scope="module")
def idle(problem: Problem) -> DPResult:
    return plan_dp(problem, time_limit=NEVER)


def slow_evaluations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Clocks on which every exact evaluation (``CostModel.evaluate``) takes ``STALL``
    seconds more than it does: the wall clock and the CPU clock as the DP's modules and the
    time limit read them (a machine that got busy, or an evaluation that got slow,
    beside the search); the count of evaluations so far."""
    evaluations = [0]
    evaluate = CostModel.evaluate

    def slow(self: CostModel, partition: Partition) -> PlanCost:
        evaluations[0] += 1
        return evaluate(self, partition)

    def late(real: Callable[[], float]) -> Callable[[], float]:
        return lambda: real() + STALL * evaluations[0]

    fake = types.SimpleNamespace(perf_counter=late(time.perf_counter),
                                 process_time=late(time.process_time))  # fmt: skip
    monkeypatch.setattr(CostModel, "evaluate", slow)
    monkeypatch.setattr(dp_sizes, "time", fake)
    monkeypatch.setattr(time_limit_module, "time", fake)
    return evaluations


def same_plan(a: DPResult, b: DPResult) -> None:
    assert a.status == b.status == "complete"
    assert a.partition == b.partition
    assert a.cost.iteration_ms == b.cost.iteration_ms
    assert a.candidates == b.candidates


def test_the_plan_needs_the_final_rescoring(problem, idle, monkeypatch):
    # the premise of the tests below: without the waiting answers' re-scoring the plan
    # is another, slower one
    monkeypatch.setattr(dp_sizes, "RESCORE", 0)
    unscored = plan_dp(problem, time_limit=NEVER)
    assert unscored.partition != idle.partition
    assert unscored.cost.steady_ms > idle.cost.steady_ms * 1.05


def test_slow_evaluations_change_no_plan(problem, idle, monkeypatch):
    # the re-scoring's budget counted seconds (at least 0.25 s, a quarter of the time
    # since the start): on these clocks it stopped after the first and returned another,
    # slower plan
    evaluations = slow_evaluations(monkeypatch)
    same_plan(plan_dp(problem, time_limit=NEVER), idle)
    assert evaluations[0] > 10


def test_both_cores_busy_change_no_plan(problem, idle):
    with busy_cores(2):
        same_plan(plan_dp(problem, time_limit=NEVER), idle)


def test_a_limit_that_cuts_anything_short_says_timed_out(problem, idle, monkeypatch):
    # on those clocks a limit of n STALL runs out at the n-th evaluation: whatever it
    # cuts, the plan is the idle one or says timed_out. The limits: half way, and
    # within the re-scoring (which stopped there and said complete, with another plan)
    evaluations = slow_evaluations(monkeypatch)
    began: list[int] = []
    rescore = dp_sizes._Sizes.rescore

    def spy(self: dp_sizes._Sizes) -> None:
        began.append(evaluations[0])
        rescore(self)

    monkeypatch.setattr(dp_sizes._Sizes, "rescore", spy)
    plan_dp(problem, time_limit=NEVER)
    assert evaluations[0] > began[0] + 2  # the re-scoring evaluated some
    for limit in (evaluations[0] // 2, began[0] + 1.5):
        evaluations[0] = 0  # each run's from 0 (its limit counts from its start)
        result = plan_dp(problem, time_limit=limit * STALL)
        if result.status == "complete":
            same_plan(result, idle)
        else:
            assert result.status == "timed_out"
