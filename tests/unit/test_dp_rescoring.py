"""The DP's final re-scoring skips plans that a cheap lower bound on their exact figure
(planner.cost.model.CostModel.round_lower_bound_ms) proves can change nothing."""

from __future__ import annotations

import pytest
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.solvers.dp import sizes as dp_sizes
from edgepipe.planner.solvers.dp.driver import plan_dp

from tests.helpers.dp_cases import NON_UNIFORM, identical
from tests.helpers.oracles import all_partitions
from tests.helpers.synthetic import random_problem


@pytest.mark.parametrize("topology", ["point_to_point", "switched", "shared_medium"])
@pytest.mark.parametrize("seed", range(2))
def test_the_round_lower_bound_never_exceeds_the_exact_figure(seed, topology):
    # every plan of the full space (3 blocks, 4 devices, per-pair bandwidths and mixed
    # latencies): the round with every transfer at its pair's full rate is at most the
    # fair-sharing figure, and equal to it point to point (no channel is ever shared)
    problem = random_problem(3, 4, seed=seed, global_batch=8, candidates=(2, 4),
                             links=NON_UNIFORM, topology=topology)  # fmt: skip
    cm = CostModel(problem)
    below = 0
    for batch in problem.config.micro_batch_sizes():
        for part in all_partitions(problem, batch):
            exact = cm.evaluate(part).iteration_ms
            bound = cm.round_lower_bound_ms(part)
            assert bound <= exact * (1 + 1e-12)
            if topology == "point_to_point":
                assert bound == exact
            below += bound < exact * (1 - 1e-6)
    # sharing slows some plans' transfers: the bound is strict on them
    assert (below > 0) == (topology != "point_to_point")


def test_plans_the_bound_skips_change_no_plan_and_no_figure(monkeypatch):
    # 24 blocks on 24 identical devices: with the bound, fewer plans are scored exactly,
    # and the plan, its figure and every micro-batch size's best figure are those of
    # the re-scoring that scores every waiting answer (both re-scorings bounded by count
    # and margin, not by their work share, as in tests/unit/test_dp.py's untimed_rescoring)
    monkeypatch.setattr(dp_sizes, "RESCORE_MIN_ACTIONS", float("inf"))
    problem = identical(24, 24)
    scored = []
    evaluate = CostModel.evaluate

    def counting(self, partition):
        scored.append(partition)
        return evaluate(self, partition)

    monkeypatch.setattr(CostModel, "evaluate", counting)
    skipping = plan_dp(problem)
    with_bound = len(scored)
    scored.clear()
    monkeypatch.setattr(CostModel, "round_lower_bound_ms", lambda self, partition: 0.0)
    every = plan_dp(problem)
    assert with_bound < len(scored)
    assert skipping.partition == every.partition
    assert skipping.cost.iteration_ms == every.cost.iteration_ms
    assert skipping.candidates == every.candidates

