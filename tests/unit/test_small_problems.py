"""Small problems are cheap (issue 29): on a cluster of fewer than
``PRICED_MIN_DEVICES`` devices the DP does not compute Zp (its stage prices per device
class, :mod:`planner.solvers.dp.prices`), a bound that only skips micro-batch sizes and
skipped none on such clusters; the plan is the one the DP finds with it. On a cluster
of fewer than ``SMALL_CLUSTER_BELOW`` devices a chain of more than
``SMALL_MULTILEVEL_ABOVE`` blocks is planned coarse to fine, and the coarse view of the
coarse run's width is not planned again (its plans are the DP's)."""

from __future__ import annotations

import pytest
from edgepipe.planner import api
from edgepipe.planner.inputs.cluster import Cluster
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import make_problem
from edgepipe.planner.inputs.profile import ModelProfile
from edgepipe.planner.solvers.dp import driver as dp_driver
from edgepipe.planner.solvers.dp import sizes as dp_sizes
from edgepipe.planner.solvers.dp.driver import (
    MULTILEVEL_ABOVE,
    SMALL_CLUSTER_BELOW,
    SMALL_MULTILEVEL_ABOVE,
    plan_dp,
)
from edgepipe.planner.solvers.dp.multilevel import COARSE_BLOCKS, VIEW_WIDTHS, coarse_views

from tests.helpers.synthetic import random_problem


def test_a_five_device_cluster_of_five_types_plans_without_zp_and_the_same_plan(monkeypatch):
    # pipedream-squeezenet1_0 (57 blocks) on home-mixed-5 (5 devices, 5 types: Zp's
    # three or more classes)
    cluster = Cluster.load(api.resolve("home-mixed-5", "clusters"))
    assert len(cluster.devices) < dp_sizes.PRICED_MIN_DEVICES
    assert len({d.type for d in cluster.devices}) >= 3
    model = ModelProfile.load(api.resolve("pipedream-squeezenet1_0", "models"))
    problem = make_problem(model, cluster, TrainingConfig(32))
    priced = dp_sizes.priced_weighted_bound
    calls: list[int] = []

    def counting(tables, batch: int, target: float) -> float:
        calls.append(batch)
        return priced(tables, batch, target)

    monkeypatch.setattr(dp_sizes, "priced_weighted_bound", counting)
    without = plan_dp(problem)
    assert calls == []
    monkeypatch.setattr(dp_sizes, "PRICED_MIN_DEVICES", 0)
    with_zp = plan_dp(problem)
    assert calls  # Zp was computed, and skipped nothing the plan depends on
    assert without.partition == with_zp.partition
    assert without.cost.iteration_ms == pytest.approx(with_zp.cost.iteration_ms, rel=0, abs=0)
    assert without.candidates == with_zp.candidates


@pytest.mark.parametrize(
    ("blocks", "devices", "runs"),
    [
        (SMALL_MULTILEVEL_ABOVE, SMALL_CLUSTER_BELOW - 1, "every block"),
        (SMALL_MULTILEVEL_ABOVE + 1, SMALL_CLUSTER_BELOW - 1, "coarse to fine"),
        (MULTILEVEL_ABOVE, SMALL_CLUSTER_BELOW, "every block"),
        (MULTILEVEL_ABOVE + 1, SMALL_CLUSTER_BELOW, "coarse to fine"),
    ],
)
def test_the_chain_length_planned_coarse_to_fine_depends_on_the_cluster_size(
    monkeypatch, blocks, devices, runs
):
    # which planner runs, not its plan (test_multilevel plans both): each one stops at once
    def planner(name):
        def stop(*args, **kwargs):
            raise RuntimeError(name)

        return stop

    monkeypatch.setattr(dp_driver, "best_plan", planner("every block"))
    monkeypatch.setattr(dp_driver, "plan_multilevel", planner("coarse to fine"))
    with pytest.raises(RuntimeError, match=f"^{runs}$"):
        plan_dp(random_problem(blocks, devices))


def test_the_view_of_the_coarse_width_is_the_coarse_run_so_it_is_not_planned_again():
    # 120 blocks on 6 devices: coarse to fine on a width-2 grid (ceil(120 / 100)), which is
    # also the first coarse view's width; the views of widths 4 and 8 are still planned
    problem = random_problem(SMALL_MULTILEVEL_ABOVE + 20, 6, seed=3, global_batch=16,
                             candidates=(2, 4, 8))  # fmt: skip
    width = -(-problem.model.num_blocks // COARSE_BLOCKS)
    assert width == VIEW_WIDTHS[0]
    dp = plan_dp(problem)
    assert dp.coarse_to_fine
    every = coarse_views(problem, 600.0)
    rest = coarse_views(problem, 600.0, coarse_run=True)

    def key(f):
        return (f[1], f[0].iteration_ms, f[2])

    assert len(rest) < len(every)  # a view was left out ...
    assert {key(f) for f in rest} <= {key(f) for f in every}
    # ... and every plan it had is among the DP's, with the same figures and DP value
    assert {key(f) for f in every} <= {key(f) for f in rest} | {key(f) for f in dp.scored}
