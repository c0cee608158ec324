"""The fractional-cut bound (planner.solvers.exact.fractional) against brute force: it is
below the cost model's iteration time of every plan of its (micro-batch, stage count),
and it is not vacuous."""

from __future__ import annotations

import numpy as np
import pytest
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.solvers.classes import device_classes
from edgepipe.planner.solvers.exact.fractional import FractionalBounds, fractional_bounds
from edgepipe.planner.solvers.exact.tables import Tables
from edgepipe.planner.solvers.time_limit import Deadline

from tests.helpers.exact_instances import instances, least_of


@pytest.mark.parametrize("index", range(7))
def test_fractional_bound_is_below_every_plan_of_its_program(index):
    # below the least plan of each (micro-batch, stage count), and not vacuous: within
    # 30% of it somewhere
    problem = instances()[index]
    least = least_of(index)
    tables = Tables(problem, CostModel(problem), device_classes(problem))
    max_p = min(problem.model.num_blocks, len(problem.cluster.devices))
    ceiling = 10.0 * max(least.values())
    ratios = []
    for batch in problem.config.micro_batch_sizes():
        known = np.zeros(max_p + 1)
        fractional_bounds(tables, batch, max_p, known, ceiling, Deadline(60.0), rel_tol=1e-6)
        for p in range(1, max_p + 1):
            if (batch, p) in least:  # (no plan has more stages than devices of samples)
                assert known[p] <= least[batch, p] * (1 + 1e-9), (batch, p)
                ratios.append(known[p] / least[batch, p])
    assert max(ratios) > 0.7


def test_a_program_that_cannot_meet_the_ceiling_rises_to_it():
    # the pruning step: below every plan's figure the relaxation is infeasible, so the
    # entry rises to the ceiling; at or above the best one it stays below it
    problem = instances()[6]
    least = least_of(6)
    tables = Tables(problem, CostModel(problem), device_classes(problem))
    fb = FractionalBounds(tables, 4, 3)
    known = np.zeros(4)
    fractional_bounds(tables, 4, 3, known, 1e-3, Deadline(60.0))
    assert known[1:].tolist() == [1e-3] * 3
    assert fb.feasible(np.array([1, 2, 3]), np.array([least[4, p] for p in (1, 2, 3)])).all()


def test_a_passed_deadline_leaves_the_known_bounds():
    problem = instances()[6]
    tables = Tables(problem, CostModel(problem), device_classes(problem))
    known = np.array([0.0, 5.0, 4.0, 3.0])
    fractional_bounds(tables, 4, 3, known, 1e9, Deadline(1e-9))
    assert known.tolist() == [0.0, 5.0, 4.0, 3.0]
    with pytest.raises(TimeoutError):
        FractionalBounds(tables, 4, 3).feasible(np.array([3]), np.array([1e9]), Deadline(1e-9))
