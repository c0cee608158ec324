"""The closed-form bounds' time shares (planner.solvers.exact.solver._closed_form_bounds,
issue 29 item 3, session 21): the min-max bound tests a micro-batch size the chain bound
tested only within BOUND_SHARE of the limit, and a size the chain bound did not test
until TEST_SHARE. On the fine suite its tables (4-9 CPU s per size at 257 blocks) ran to
TEST_SHARE in every instance measured and raised no program the chain bound had left
below the incumbent."""

from __future__ import annotations

import numpy as np
import pytest
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.solvers.classes import device_classes
from edgepipe.planner.solvers.exact import chain_bound, solver
from edgepipe.planner.solvers.exact.chain_bound import chain_bounds
from edgepipe.planner.solvers.exact.stage_bounds import StageBounds
from edgepipe.planner.solvers.exact.tables import Tables
from edgepipe.planner.solvers.time_limit import Deadline

from tests.helpers.exact_instances import instances, least_of

#: the tiny identical-device instance of the chain bound's tests (micro-batches 1, 2, 4)
INDEX = 6


def at_fraction(fraction: float, limit_s: float = 1000.0) -> Deadline:
    """A wall-clock deadline of ``limit_s`` already ``fraction`` of the way through."""
    deadline = Deadline(limit_s)
    deadline.wall_start -= fraction * limit_s
    return deadline


def min_max_sizes(monkeypatch: pytest.MonkeyPatch, fraction: float) -> list[int]:
    """The micro-batch sizes whose min-max tables :func:`solver._closed_form_bounds`
    builds (the real :class:`StageBounds`, recorded) when called ``fraction`` of the way
    through its limit, with the least plan's figure as the incumbent's."""
    problem = instances()[INDEX]
    cm = CostModel(problem)
    tables = Tables(problem, cm, device_classes(problem))
    built: list[int] = []

    def recorded(tables: Tables, batch: int, *args: object) -> StageBounds:
        built.append(batch)
        return StageBounds(tables, batch, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(solver, "StageBounds", recorded)
    least = min(least_of(INDEX).values())
    best = (least, None, None, None)
    solver._closed_form_bounds(tables, problem.config.micro_batch_sizes(), 3, best,  # type: ignore[arg-type]
                               at_fraction(fraction))  # fmt: skip
    return built


def test_chain_bounds_returns_the_sizes_it_tested_at_the_ceiling() -> None:
    problem = instances()[INDEX]
    tables = Tables(problem, CostModel(problem), device_classes(problem))
    known = {b: np.zeros(4) for b in (1, 2, 4)}
    assert chain_bounds(tables, known, 3, 1e9, Deadline(60.0)) == {1, 2, 4}
    assert chain_bounds(tables, known, 3, 1e9, Deadline(1e-9)) == set()


def test_min_max_bound_tests_sizes_the_chain_bound_tested_only_within_bound_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sizes = instances()[INDEX].config.micro_batch_sizes()
    # before BOUND_SHARE: every size
    assert sorted(min_max_sizes(monkeypatch, 0.5 * solver.BOUND_SHARE)) == sorted(sizes)
    # past BOUND_SHARE, before CHAIN_SHARE (the chain bound tests every size): none
    assert solver.BOUND_SHARE < solver.CHAIN_SHARE <= solver.TEST_SHARE
    between = 0.5 * (solver.BOUND_SHARE + solver.CHAIN_SHARE)
    assert min_max_sizes(monkeypatch, between) == []


def test_min_max_bound_tests_sizes_the_chain_bound_did_not_until_test_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sizes = instances()[INDEX].config.micro_batch_sizes()
    between = 0.5 * (solver.BOUND_SHARE + solver.CHAIN_SHARE)
    monkeypatch.setattr(chain_bound, "CHAIN_BYTES", 0)  # no size's tables fit
    assert sorted(min_max_sizes(monkeypatch, between)) == sorted(sizes)


def test_a_portion_of_a_deadline_takes_its_share_of_each_clock() -> None:
    # what the chain bound gives each micro-batch size: under a CPU budget its share is
    # CPU seconds, not the wall-clock seconds those would take on an idle machine
    deadline = Deadline(100.0, 10.0)
    deadline.wall_start -= 50.0  # 50 s of wall clock and 4 CPU s gone
    deadline.cpu_start -= 4.0
    part = deadline.portion(0.5)
    assert part.wall_s == pytest.approx(25.0, abs=0.1)
    assert part.cpu_s == pytest.approx(3.0, abs=0.1)
    part.wall_start -= 10.0  # a loaded machine: 10 s of wall clock, no CPU
    assert not part.passed()
    part.cpu_start -= 3.0
    assert part.passed()
    wall_only = Deadline(100.0).portion(0.25)
    assert wall_only.cpu_s is None
    assert wall_only.wall_s == pytest.approx(25.0, abs=0.1)
