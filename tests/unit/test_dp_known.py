"""Plans scored on one merging of a chain are not evaluated again on another
(planner/solvers/dp/multilevel.py ``known_figures``, :func:`best_plan`'s ``known``): the
coarse run's plans in the fine run, the DP's plans in the coarse views. Merging prices a
plan whose cuts it keeps as the full chain does, so the figures are the same and the
runs plan what they planned before."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from edgepipe.planner.cost.model import CostModel, PlanCost
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.solvers.dp import multilevel
from edgepipe.planner.solvers.dp.driver import plan_dp
from edgepipe.planner.solvers.dp.multilevel import (
    coarse_cuts,
    coarse_views,
    expand,
    known_figures,
    merge_blocks,
)
from edgepipe.planner.solvers.dp.sizes import best_plan

from tests.helpers.synthetic import random_problem


def test_a_plan_of_a_merged_chain_is_looked_up_by_its_original_blocks():
    problem = random_problem(6, 2, seed=1, global_batch=8, candidates=(2, 4))
    plan = Partition(4, 2, (StageAssignment(0, 2, ("d0",), (4,)),
                            StageAssignment(2, 6, ("d1",), (4,))))  # fmt: skip
    cost = CostModel(problem).evaluate(plan)
    known = known_figures([(cost, plan, 0.0)], [0, 2, 4, 6])
    # blocks [0, 1) and [1, 3) of the chain merged at 0, 2, 4, 6 are [0, 2) and [2, 6)
    merged = Partition(4, 2, (StageAssignment(0, 1, ("d0",), (4,)),
                              StageAssignment(1, 3, ("d1",), (4,))))  # fmt: skip
    assert known(merged) is cost
    # another cut ([0, 4) | [4, 6)) or other devices: not known
    other_cut = Partition(4, 2, (StageAssignment(0, 2, ("d0",), (4,)),
                                 StageAssignment(2, 3, ("d1",), (4,))))  # fmt: skip
    swapped = Partition(4, 2, (StageAssignment(0, 1, ("d1",), (4,)),
                               StageAssignment(1, 3, ("d0",), (4,))))  # fmt: skip
    assert known(other_cut) is None
    assert known(swapped) is None


def test_a_run_told_its_own_plans_evaluates_none_again_and_plans_the_same():
    problem = random_problem(16, 3, seed=7, global_batch=16, candidates=(2, 4))
    grid = coarse_cuts(problem, 2)
    merged = merge_blocks(problem, grid)
    first = best_plan(merged, time_limit=600.0)
    assert first is not None
    lookups: list[bool] = []
    known = known_figures([(c, expand(p, grid), v) for c, p, v in first.scored], grid)

    def looked_up(partition: Partition) -> PlanCost | None:
        cost = known(partition)
        lookups.append(cost is not None)
        return cost

    again = best_plan(merged, time_limit=600.0, known=looked_up)
    assert again is not None
    assert lookups and all(lookups)  # every plan it scored was known: none evaluated
    assert again.partition == first.partition
    assert [(p, c.steady_ms, v) for c, p, v in again.scored] == [
        (p, c.steady_ms, v) for c, p, v in first.scored
    ]


def test_views_told_the_dps_plans_take_their_figures_and_plan_what_they_planned_without(
    monkeypatch,
):
    problem = random_problem(20, 3, seed=11, global_batch=16, candidates=(2, 4))
    dp = plan_dp(problem)
    alone = coarse_views(problem, 600.0)
    hits: list[Partition] = []

    def recorded(found: Sequence[tuple[PlanCost, Partition, float]], cuts: list[int]
                 ) -> Callable[[Partition], PlanCost | None]:
        lookup = known_figures(found, cuts)

        def looked_up(partition: Partition) -> PlanCost | None:
            cost = lookup(partition)
            if cost is not None:
                hits.append(partition)
            return cost

        return looked_up

    monkeypatch.setattr(multilevel, "known_figures", recorded)
    told = coarse_views(problem, 600.0, known=dp.scored)
    assert hits  # some view plan was the DP's (or an earlier view's): not evaluated again
    assert [p for _, p, _ in told] == [p for _, p, _ in alone]
    for (a, _, va), (b, _, vb) in zip(told, alone, strict=True):
        assert a.steady_ms == pytest.approx(b.steady_ms, rel=1e-12)
        assert a.iteration_ms == pytest.approx(b.iteration_ms, rel=1e-12)
        assert va == vb
