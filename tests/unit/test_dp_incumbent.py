"""Warm starts. The DP's (``plan_dp(..., incumbent=...)``): a known plan's exact figure
bounds every micro-batch size's search, the first included, and the plan competes in
the final choice (planner/solvers/dp/sizes.py, "Bound U"). Re-planning's full solve gets its
fast-path plan as the DP's incumbent or the exact solver's start solution."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from edgepipe.planner.cost.closed_form import pipeline_closed_form_ms
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.errors import InfeasibleError, InputError, PlanMismatchError
from edgepipe.planner.plan import SolverInfo, make_plan
from edgepipe.planner.replan import incremental as replanning
from edgepipe.planner.replan.incremental import replan
from edgepipe.planner.solvers.dp import search as dp_search
from edgepipe.planner.solvers.dp import sizes as dp_sizes
from edgepipe.planner.solvers.dp.driver import plan_dp
from edgepipe.planner.solvers.dp.sizes import TIE_TOLERANCE
from edgepipe.planner.solvers.exact.solver import plan_milp

from tests.helpers.dp_cases import hand_plan, identical, tiny
from tests.helpers.oracles import all_partitions, brute_force_best


def worst_feasible(problem):
    """The slowest memory-feasible plan of the whole space (an incumbent to beat)."""
    sizes = problem.config.micro_batch_sizes()
    cm = CostModel(problem, max(sizes))
    scored = ((cm.evaluate(p), p) for b in sizes for p in all_partitions(problem, b))
    return max(((c.iteration_ms, p) for c, p in scored if c.memory_ok), key=lambda x: x[0])


@pytest.mark.parametrize("seed", range(0, 24, 3))
def test_a_slow_incumbent_does_not_keep_the_search_from_the_optimum(seed):
    problem = tiny(seed)
    oracle, _ = brute_force_best(problem)
    assert np.isfinite(oracle)  # every instance of these seeds has a plan
    worst_ms, worst = worst_feasible(problem)
    result = plan_dp(problem, incumbent=worst)
    assert result.cost.iteration_ms >= oracle * (1 - 1e-9)
    assert result.cost.iteration_ms <= oracle * (1 + TIE_TOLERANCE)
    assert result.cost.iteration_ms <= worst_ms


@pytest.mark.parametrize("seed", range(1, 24, 3))
def test_the_optimum_as_incumbent_is_what_comes_back(seed):
    problem = tiny(seed)
    oracle, best = brute_force_best(problem)
    assert best is not None  # every instance of these seeds has a plan
    result = plan_dp(problem, incumbent=best)
    assert oracle * (1 - 1e-9) <= result.cost.iteration_ms <= oracle * (1 + TIE_TOLERANCE)


def guessed_searches(monkeypatch) -> list[bool]:
    """Records, for every micro-batch search the DP starts, whether its bound is a guess."""
    seen: list[bool] = []
    original = dp_search._BatchSearch.__init__

    def spy(self, *args, **kwargs):
        seen.append(bool(kwargs.get("guessed", args[7] if len(args) > 7 else False)))
        original(self, *args, **kwargs)

    monkeypatch.setattr(dp_search._BatchSearch, "__init__", spy)
    return seen


def test_with_an_incumbent_no_search_runs_under_a_guess(monkeypatch):
    # a guess below every plan: the cold DP's first search finds nothing and runs again
    monkeypatch.setattr(dp_sizes, "FIRST_GUESS", 0.5)
    problem = identical(16, 12, types=2)
    seen = guessed_searches(monkeypatch)
    cold = plan_dp(problem)
    assert seen[0] is True and len(seen) >= 2
    seen.clear()
    warm = plan_dp(problem, incumbent=cold.partition)
    assert seen and not any(seen)
    assert warm.cost.iteration_ms <= cold.cost.iteration_ms


def test_the_incumbent_is_returned_when_nothing_beats_it():
    problem = identical(16, 12, types=2)
    cold = plan_dp(problem)
    warm = plan_dp(problem, incumbent=cold.partition)
    assert warm.cost.iteration_ms <= cold.cost.iteration_ms * (1 + TIE_TOLERANCE)
    assert warm.status == "complete"


def merge_case():
    """The plan of test_replan's full-solve case: a [0,1), b,c [1,2) on 8 Mbit/s; losing
    a, the fast path merges [0,2) onto b,c (2000 ms of all-reduce) and the full solve
    pipelines b | c."""
    return hand_plan([1, 1], [(0, 1, ("a",), (4,)), (1, 2, ("b", "c"), (2, 2))],
                     ["a", "b", "c"], bandwidth_mbps=8.0)  # fmt: skip


def test_replanning_warm_starts_the_dp_with_its_fast_path_plan(monkeypatch):
    old = merge_case()
    given = []

    def recording(problem, *args, **kwargs):
        given.append(kwargs.get("incumbent"))
        return plan_dp(problem, *args, **kwargs)

    monkeypatch.setattr(replanning, "plan_dp", recording)
    fast = replan(old, lost=["a"], full_solve=False)
    assert given == []
    new = replan(old, lost=["a"])
    assert given == [fast.partition]
    assert new.changes.path == "full" and new.cost.iteration_ms < fast.cost.iteration_ms


def test_replanning_warm_starts_the_exact_solver_with_its_fast_path_plan(monkeypatch):
    # the same case under an exact-solver lineage: the full solve is the MILP, given the
    # fast-path plan as its start solution
    hand = merge_case()
    old = make_plan(hand.problem, hand.partition,
                    SolverInfo("milp", {"backend": "cpsat", "time_limit_s": 20.0}))
    given = []

    def recording(problem, backend, time_limit, warm_start=None, **kwargs):
        given.append((backend, time_limit, warm_start))
        return plan_milp(problem, backend, time_limit, warm_start=warm_start, **kwargs)

    monkeypatch.setattr(replanning, "plan_milp", recording)
    fast = replan(old, lost=["a"], full_solve=False)
    new = replan(old, lost=["a"])
    assert given == [("cpsat", 20.0, fast.partition)]
    assert new.changes.path == "full" and new.cost.iteration_ms < fast.cost.iteration_ms


def test_when_no_search_beats_it_the_incumbent_comes_back_with_its_closed_form(monkeypatch):
    # every search answers nothing: the result is the incumbent itself, its DP value the
    # cost model's closed form of it
    problem = identical(16, 12, types=2)
    cold = plan_dp(problem)
    monkeypatch.setattr(dp_search._BatchSearch, "run", lambda self: [])
    warm = plan_dp(problem, incumbent=cold.partition)
    assert warm.partition == cold.partition
    cm = CostModel(problem, max(problem.config.micro_batch_sizes()))
    assert warm.dp_value_ms == pipeline_closed_form_ms(cm, cold.partition)
    with pytest.raises(InfeasibleError):
        plan_dp(problem)  # the same searches without the warm start find nothing


def test_an_incumbent_outside_the_dps_space_is_refused_in_one_line():
    problem = identical(16, 12, types=2)
    cold = plan_dp(problem)
    others = tuple(b for b in (4, 8, 16) if b != cold.partition.micro_batch_size)
    narrower = dataclasses.replace(problem, config=dataclasses.replace(
        problem.config, micro_batch_candidates=others))
    with pytest.raises(InputError, match=r"not one of the config's candidates"):
        plan_dp(narrower, incumbent=cold.partition)
    stranger = dataclasses.replace(cold.partition, stages=tuple(
        dataclasses.replace(s, devices=tuple(f"x{d}" for d in s.devices))
        for s in cold.partition.stages))
    with pytest.raises(PlanMismatchError, match="not in cluster"):
        plan_dp(problem, incumbent=stranger)
