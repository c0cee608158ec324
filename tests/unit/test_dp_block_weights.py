"""Zw, the weighted bound with block weights raised by subgradient ascent
(planner.solvers.dp.block_weights): a lower bound on every plan's closed form (against the
brute-force enumeration of tests/helpers/oracles.py), above Z where one stage's term stands out,
and the micro-batch sizes it skips change no plan."""

from __future__ import annotations

import numpy as np
import pytest
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.inputs.problem import Problem
from edgepipe.planner.solvers.classes import device_classes
from edgepipe.planner.solvers.dp import bounds as dp_bounds
from edgepipe.planner.solvers.dp import sizes as dp_sizes
from edgepipe.planner.solvers.dp.block_weights import _simplex
from edgepipe.planner.solvers.dp.bounds import (
    reweighted_bound,
    staged_weighted_bound,
    weighted_bound,
)
from edgepipe.planner.solvers.dp.driver import plan_dp
from edgepipe.planner.solvers.dp.tables import _Tables

from benchmarks.planner_scaling import synthetic
from tests.helpers.dp_cases import best_per_size, mixed, searched_sizes, tiny
from tests.helpers.synthetic import random_problem


def hidden_all_reduce(seed: int) -> Problem:
    """3 blocks on 4 devices of two types on gigabit Ethernet, micro-batches 2, 4, 8."""
    return random_problem(3, 4, seed=seed, global_batch=8, candidates=(2, 4, 8),
                          bandwidth_mbps=1000.0)  # fmt: skip


def test_the_projection_lands_on_the_simplex():
    # by hand: (0.8, 0.6, -1) -> theta = 0.2 -> (0.6, 0.4, 0); a point on it stays
    assert np.allclose(_simplex(np.array([0.8, 0.6, -1.0])), [0.6, 0.4, 0.0])
    assert np.allclose(_simplex(np.array([0.25, 0.75])), [0.25, 0.75])
    assert np.allclose(_simplex(np.array([5.0, 5.0])), [0.5, 0.5])


@pytest.mark.parametrize(
    ("build", "seed"),
    [(tiny, seed) for seed in range(0, 24, 3)]
    + [(lambda seed: mixed(1, 3, 3, seed), seed) for seed in range(3)]
    # an all-reduce that the stages before it hide (without X's PB term Zw passes it)
    + [(hidden_all_reduce, 3)],
)
def test_reweighted_bound_never_exceeds_the_best_plans_closed_form(build, seed):
    # the least closed form D + X over every memory-feasible plan of the full space (the
    # oracle's enumeration), per micro-batch size; the ascent aims at twice it, so it
    # moves the weights as far as it goes
    tables, best = best_per_size(build(seed))
    for batch, least in best.items():
        zw = reweighted_bound(tables, batch, 2 * least)
        assert weighted_bound(tables, batch) <= zw <= least * (1 + 1e-9)


def test_reweighted_bound_lifts_z_above_the_search_bound_where_one_stage_stands_out():
    # 100 blocks x 64 identical devices (benchmarks/planner_scaling.py) at micro-batch 16:
    # Z 1,625.2 ms and Zs 1,650.7 lie below the bound the search would run under there,
    # 1.06 x the fastest figure of micro-batch 2 (1,577.6 ms): 1,672.2; the best plan
    # the DP finds at 16 has the value 1,984. The ascent passes the bound
    problem = synthetic(100, 64, 1)
    sizes = problem.config.micro_batch_sizes()
    tables = _Tables(problem, CostModel(problem, max(sizes)), device_classes(problem))
    target = 1577.6 * 1.06
    assert weighted_bound(tables, 16) < staged_weighted_bound(tables, 16) < target
    assert reweighted_bound(tables, 16, target) > target


def test_reweighted_bound_is_not_computed_beyond_its_work_cap(monkeypatch):
    problem = synthetic(20, 16, 1)
    tables = _Tables(problem, CostModel(problem, 64), device_classes(problem))
    assert reweighted_bound(tables, 16, 1e9) > 0.0
    monkeypatch.setattr(dp_bounds, "REWEIGHT_WORK", 1.0)
    assert reweighted_bound(tables, 16, 1e9) == 0.0


def test_sizes_skipped_by_the_reweighted_bound_change_no_plan(monkeypatch):
    # 100 blocks x 64 identical devices: Zw exceeds the bound at micro-batch 16, whose
    # Z and Zs do not: its relaxed tables are not built and it is not searched. With a
    # Zw of 0 it is, and the plan, its value and the per-size figures are the same (Zw
    # only skips sizes that could return nothing to re-score); the re-scoring is bounded
    # by count and margin only, so that both runs re-score the same answers
    monkeypatch.setattr(dp_sizes, "RESCORE_MIN_ACTIONS", float("inf"))
    problem = synthetic(100, 64, 1)
    searched = searched_sizes(monkeypatch)
    skipped = plan_dp(problem)
    assert 16 not in searched
    searched.clear()
    monkeypatch.setattr(dp_sizes, "reweighted_bound", lambda tables, batch, target: 0.0)
    every = plan_dp(problem)
    assert 16 in searched
    assert every.partition == skipped.partition
    assert every.dp_value_ms == skipped.dp_value_ms
    assert every.candidates == skipped.candidates
