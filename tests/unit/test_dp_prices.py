"""Zp, the weighted bound with a price per device class (planner.solvers.dp.prices): a lower bound
on
every plan's closed form (against the brute-force enumeration of tests/helpers/oracles.py), and
the micro-batch sizes it skips change no plan."""

from __future__ import annotations

import numpy as np
import pytest
from edgepipe.planner.cost.closed_form import pipeline_closed_form_ms
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.inputs.problem import Problem
from edgepipe.planner.solvers.classes import device_classes
from edgepipe.planner.solvers.dp import driver as dp_module
from edgepipe.planner.solvers.dp.driver import _relax_levels, _Tables, plan_dp, weighted_bound
from edgepipe.planner.solvers.dp.prices import priced_bound

from benchmarks.planner_scaling import synthetic
from tests.helpers.oracles import all_partitions
from tests.unit.test_dp import mixed, tiny


def zp(tables: _Tables, batch: int, target: float) -> float:
    """Zp on any number of classes (the DP computes it on three or more)."""
    m, warmups, _ = _relax_levels(tables, batch)
    costs = tables.priced_costs(batch, m, warmups[0])
    return priced_bound(costs, tables.rows_first, tables.rows_end, tables.counts, target)


def least_closed_form(cm: CostModel, problem: Problem, batch: int) -> float:
    """The least closed form D + X over every memory-feasible plan of the full space at
    micro-batch size ``batch`` (the oracle's enumeration), inf where none fits."""
    return min(
        (
            pipeline_closed_form_ms(cm, part)
            for part in all_partitions(problem, batch)
            if cm.evaluate(part).memory_ok
        ),
        default=np.inf,
    )


def best_per_size(problem: Problem) -> tuple[_Tables, dict[int, float]]:
    """The DP's tables of ``problem`` and, per micro-batch size where some plan fits
    memory, the least closed form of :func:`least_closed_form`."""
    sizes = problem.config.micro_batch_sizes()
    cm = CostModel(problem, max(sizes))
    tables = _Tables(problem, cm, device_classes(problem))
    best = {batch: least_closed_form(cm, problem, batch) for batch in sizes}
    return tables, {batch: v for batch, v in best.items() if np.isfinite(v)}


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
    monkeypatch.setattr(dp_module, "RESCORE_MIN_S", float("inf"))  # no time share
    problem = synthetic(30, 48, 4)
    searched: list[int] = []
    built: list[int] = []
    batch_search, relaxed_bounds = dp_module._BatchSearch, dp_module.relaxed_bounds

    def recording(tables, graph, batch, *args, **kwargs):
        searched.append(batch)
        return batch_search(tables, graph, batch, *args, **kwargs)

    def building(tables, batch):
        built.append(batch)
        return relaxed_bounds(tables, batch)

    monkeypatch.setattr(dp_module, "_BatchSearch", recording)
    monkeypatch.setattr(dp_module, "relaxed_bounds", building)
    skipped = plan_dp(problem)
    assert 32 not in searched and 32 not in built
    searched.clear()
    monkeypatch.setattr(dp_module, "priced_weighted_bound", lambda tables, batch, target: 0.0)
    every = plan_dp(problem)
    assert 32 in searched and 32 in built
    assert every.partition == skipped.partition
    assert every.dp_value_ms == skipped.dp_value_ms
    assert every.candidates == skipped.candidates
