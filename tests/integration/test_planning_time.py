"""The DP's wall-clock limit on a large cluster (serial: a wall-clock verdict needs the
machine to itself)."""

from __future__ import annotations

import time

import pytest
from edgepipe.planner.solvers.dp.driver import plan_dp

from tests.helpers.dp_cases import identical


@pytest.mark.serial  # wall-clock verdict: the DP's 10 s limit plus 5 s of scoring
def test_a_1024_device_cluster_plans_within_the_time_limit():
    problem = identical(1024, 30, types=4)
    start = time.perf_counter()
    result = plan_dp(problem, time_limit=10.0)
    elapsed = time.perf_counter() - start
    assert result.status in ("complete", "timed_out")
    assert result.cost.memory_ok
    assert elapsed <= 10.0 * 1.5  # the limit, plus scoring the plans found in time
