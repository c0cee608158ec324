"""Small problems are cheap (issue 29): on a cluster of fewer than
``PRICED_MIN_DEVICES`` devices the DP does not compute Zp (its stage prices per device
class, :mod:`planner.solvers.dp.prices`), a bound that only skips micro-batch sizes and
skipped none on such clusters; the plan is the one the DP finds with it."""

from __future__ import annotations

import pytest
from edgepipe.planner import api
from edgepipe.planner.inputs.cluster import Cluster
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import make_problem
from edgepipe.planner.inputs.profile import ModelProfile
from edgepipe.planner.solvers.dp import sizes as dp_sizes
from edgepipe.planner.solvers.dp.driver import plan_dp


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
