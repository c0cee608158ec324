"""Replication every k > 1 steps (docs/fault-tolerance.md, "Long intervals").

The toy model of ``tests.test_recovery`` on ``d0`` alone, the replica on the standby
``d1`` (``tests.test_recovery_spare``'s plan), emulated (``--emulate``) so that a step
lasts a set wall-clock time. Real processes over gloo, real signals, deterministic
mode: every run ends bit-identical to the single-process reference trainer (losses,
samples, final weights and Adam state). Every child is reaped by PID.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from executor.worker import WorkerOptions
from tests.executor_helpers import write_plan
from tests.test_recovery import assert_matches_reference, launch_reaped
from tests.test_recovery_spare import one_device_plan, plan_of


def emulated_run(tmp_path: Path, steps: int, interval: int, step_s: float, timeout_s: float,
                 faults: str = "", devices: int = 2):
    """Run :func:`one_device_plan` emulated at a time scale that makes one step of
    ``d0`` last ``step_s`` seconds, with gloo's per-operation timeout ``timeout_s``."""
    plan = one_device_plan(devices, replication_interval=interval)
    path = write_plan(plan, tmp_path)
    scale = step_s * 1e3 / plan.cost.iteration_ms
    return plan, launch_reaped(
        WorkerOptions(str(path), steps, str(tmp_path), deterministic=True,
                      timeout_s=timeout_s, save_weights=True, faults=faults,
                      emulate=True, time_scale=scale))


@pytest.mark.slow
def test_a_standby_waits_out_an_interval_longer_than_the_gloo_timeout(tmp_path):
    # points 0, 3 and 4: the standby holds point 0 at the start and point 3 only after
    # three steps of 3 s, 9 s against a per-operation timeout of 6 s; d0 then dies in
    # step 3's forward (once point 3 is durable), so the run goes on from the standby's
    # replica of point 3, which must be exact
    plan, result = emulated_run(tmp_path, steps=4, interval=3, step_s=3.0, timeout_s=6.0,
                                faults="d0:3:forward")
    assert_matches_reference(tmp_path, plan, result, 4)
    (event,) = result.events  # d1 was never declared lost
    assert (event["cause"], event["device"], event["replay_from_step"]) == ("crash", "d0", 3)
    new = plan_of(tmp_path, event)
    assert new.partition.used_devices() == ["d1"]
    assert {t.source for t in new.migration} == {"d1"}
