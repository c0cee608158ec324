"""Zp, the weighted bound with a price per device class (planner.solvers.dp.prices): a lower bound
on
every plan's closed form (against the brute-force enumeration of tests/helpers/oracles.py), and
the micro-batch sizes it skips change no plan."""

from __future__ import annotations

import pytest
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.solvers.classes import device_classes
from edgepipe.planner.solvers.dp import search as dp_search
from edgepipe.planner.solvers.dp import sizes as dp_sizes
from edgepipe.planner.solvers.dp.bounds import _relax_levels, priced_costs, weighted_bound
from edgepipe.planner.solvers.dp.driver import plan_dp
from edgepipe.planner.solvers.dp.prices import priced_bound
from edgepipe.planner.solvers.dp.tables import _Tables

from benchmarks.planner_scaling import synthetic
from tests.helpers.dp_cases import best_per_size, least_closed_form, mixed, tiny


def zp(tables: _Tables, batch: int, target: float) -> float:
    """Zp on any number of classes (the DP computes it on three or more)."""
    m, warmups, _ = _relax_levels(tables, batch)
    costs = priced_costs(tables, batch, m, warmups[0])
    return priced_bound(costs, tables.rows_first, tables.rows_end, tables.counts, target)


@pytest.mark.parametrize(
    ("build", "seed"),
    [(tiny, seed) for seed in (1, 5, 6, 9, 12, 15, 18)]  # three or four device classes
    + [(lambda seed: mixed(1, 3, 3, seed), seed) for seed in range(3)],  # one fast device
)
def test_priced_bound_never_exceeds_the_best_plans_closed_form(build, seed):
    # the least closed form D + X over every memory-feasible plan of the full space (the
    # oracle's enumeration: any devices in any stage, any positive split), per
    # micro-batch size; Zp's ascent aims at twice it, so it pushes the prices as far as
    # they go
    tables, best = best_per_size(build(seed))
    for batch, least in best.items():
        assert zp(tables, batch, 2 * least) <= least * (1 + 1e-9)


def test_priced_bound_sees_the_fast_device_run_out():
    # one fast and three slow devices, three blocks: the prices make the stages compete
    # for the one fast device, so Zp lies above Z (which gives every stage fast
    # devices) and at or below the brute-force optimum, on each size
    problem = mixed(1, 3, 3, 0)
    sizes = problem.config.micro_batch_sizes()
    cm = CostModel(problem, max(sizes))
    tables = _Tables(problem, cm, device_classes(problem))
    for batch in sizes:
        best = least_closed_form(cm, problem, batch)
        z, priced = weighted_bound(tables, batch), zp(tables, batch, 2 * best)
        assert 1.05 * z < priced <= best * (1 + 1e-9)


def test_sizes_skipped_by_the_priced_bound_change_no_plan(monkeypatch):
    # 30 blocks on 48 devices of 4 types (benchmarks/planner_scaling's synthetic
    # family): after the first search, Zp exceeds the bound at micro-batch 32 (772.5
    # against 768.2), whose Z does not (and Zc is not computed on four classes): its
    # relaxed tables are not built and it is not searched. With a Zp of 0 it is, and the
    # plans are the same (Zp only skips sizes that could return nothing to re-score)
    monkeypatch.setattr(dp_sizes, "RESCORE_MIN_ACTIONS", float("inf"))  # no work share
    problem = synthetic(30, 48, 4)
    searched: list[int] = []
    built: list[int] = []
    batch_search, relaxed_bounds = dp_search._BatchSearch, dp_sizes.relaxed_bounds

    def recording(tables, graph, batch, *args, **kwargs):
        searched.append(batch)
        return batch_search(tables, graph, batch, *args, **kwargs)

    def building(tables, batch):
        built.append(batch)
        return relaxed_bounds(tables, batch)

    monkeypatch.setattr(dp_sizes, "_BatchSearch", recording)
    monkeypatch.setattr(dp_sizes, "relaxed_bounds", building)
    skipped = plan_dp(problem)
    assert 32 not in searched and 32 not in built
    searched.clear()
    monkeypatch.setattr(dp_sizes, "priced_weighted_bound", lambda tables, batch, target: 0.0)
    every = plan_dp(problem)
    assert 32 in searched and 32 in built
    assert every.partition == skipped.partition
    assert every.dp_value_ms == skipped.dp_value_ms
    assert every.candidates == skipped.candidates
