"""The cost model's iteration time against the independent simulator on a grid of 2,100
random plans, and proof that the comparison has teeth: five broken cost models fail it."""

from __future__ import annotations

import dataclasses
import functools

import edgepipe.planner.cost.fair_sharing as fair_sharing_module
import edgepipe.planner.cost.model as model_module
import numpy as np
import pytest
from edgepipe.planner.check.simulator import simulate
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.cost.transfers import RingCost
from edgepipe.planner.inputs.problem import Problem
from edgepipe.planner.partition import Partition
from edgepipe.planner.schedule import build

from tests.helpers.synthetic import random_plans

#: the mutation tests need only show a failure: the first 600 plans (200 per kind)
SAMPLE = 600


@functools.cache
def plans() -> list[tuple[Problem, Partition]]:
    """The grid: 2,100 random plans, 700 per network kind."""
    return random_plans(2100, seed=11)


@functools.cache
def simulated(index: int) -> float:
    """The simulator's makespan of the grid's plan ``index``. Both are built on first use,
    plan by plan, so that collecting or deselecting these tests costs nothing and a
    mutation test simulates only its SAMPLE (each xdist worker builds its own: a worker
    running only mutation tests simulated all 2,100 plans for 600 of them)."""
    problem, part = plans()[index]
    return simulate(problem, part).makespan_ms


def violations(count: int = 2100) -> list[str]:
    """What the cost model gets wrong against the simulator on the first ``count`` plans
    of the grid, per network kind, against the issue's targets: median |error| above 1% or
    worst above 5% (measured figures in docs/benchmarks.md)."""
    errors: dict[str, list[float]] = {}
    for index, (problem, part) in enumerate(plans()[:count]):
        sim = simulated(index)
        predicted = CostModel(problem).evaluate(part).iteration_ms
        errors.setdefault(problem.cluster.network.kind, []).append(abs(predicted / sim - 1))
    out = []
    for kind, errs in errors.items():
        e = np.array(errs)
        for name, value, limit in (("median", np.median(e), 0.01), ("worst", e.max(), 0.05)):
            if value > limit:
                out.append(f"{kind}: {name} error {value:.1%} > {limit:.0%}")
    return out


def test_cost_model_matches_the_independent_simulator():
    assert violations() == []


def test_links_ten_times_too_cheap_are_caught(monkeypatch):
    real = CostModel.link_transfer

    def cheap(self, a, b):
        link = real(self, a, b)
        return dataclasses.replace(
            link,
            forward=tuple(dataclasses.replace(x, ms=x.ms / 10) for x in link.forward),
            backward=tuple(dataclasses.replace(x, ms=x.ms / 10) for x in link.backward),
        )

    monkeypatch.setattr(CostModel, "link_transfer", cheap)
    assert violations(SAMPLE) != []


def test_a_dropped_all_reduce_is_caught(monkeypatch):
    monkeypatch.setattr(CostModel, "ring", lambda self, first, end, group: RingCost())
    assert violations(SAMPLE) != []


def test_gpipe_instead_of_1f1b_is_caught(monkeypatch):
    monkeypatch.setattr(
        model_module, "cached_schedule", lambda name, warmups, m: build("gpipe", warmups, m)
    )
    assert violations(SAMPLE) != []


def test_ignoring_channel_contention_is_caught(monkeypatch):
    # every transfer at its full pair rate, as if nothing shared a port or the medium
    monkeypatch.setattr(fair_sharing_module, "fair_shares", lambda held: [1.0] * len(held))
    assert violations(SAMPLE) != []


def test_a_stage_priced_as_its_slowest_device_is_caught(monkeypatch):
    # the previous rule: every device of a stage waits for the slowest, so a fast
    # device's pieces leave late and it waits for pieces addressed to its peers
    real = model_module.round_makespan

    def stage_level(schedule, devices, links, rings, topology, optim=None):
        slowest = [
            [(d, max(f for _, f, _ in stage), max(b for _, _, b in stage)) for d, _, _ in stage]
            for stage in devices
        ]
        return real(schedule, slowest, links, rings, topology, optim)

    monkeypatch.setattr(model_module, "round_makespan", stage_level)
    assert violations(SAMPLE) != []


@pytest.mark.parametrize("kind", ["point_to_point", "switched", "shared_medium"])
def test_every_network_kind_is_in_the_grid(kind):
    assert sum(p.cluster.network.kind == kind for p, _ in plans()) == len(plans()) // 3

