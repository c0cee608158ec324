"""Specification of how a lab profile turns each device type's CPU measurements into its
timing (executor/lab/profiling.py, ``_combine``; docs/lab.md, "Lab profiles"): every CPU
time, the runtime's work per micro-batch and its optimizer steps per MiB included, is
divided by the type's CPU quota."""

from __future__ import annotations

from edgepipe.executor.lab.profiling import _combine
from edgepipe.planner.inputs.cluster import Cluster
from edgepipe.planner.inputs.profile import LabQuota, ModelProfile, RuntimeWork, Timing

from tests.helpers.paths import REPO


def test_a_quarter_core_quadruples_the_runtime_work_and_the_optimizer_steps() -> None:
    base = ModelProfile.load(REPO / "profiles/models/vgg16-cpu.json")
    name = next(iter(base.timings))
    cpu = RuntimeWork(1.0, 2.5, 0.01, 3, (("momentum", 0.5), ("sgd", 0.125)))
    quota = LabQuota(0.25, None, 1, 0.25)
    cluster = Cluster.load(REPO / "profiles/clusters/orin-pair-2.json")
    timing = _combine({name: (base, quota, 0)}, {name: cpu}, cluster, 0.5).timings[name]
    assert timing.runtime_work == RuntimeWork(4.0, 10.0, 0.01, 3,
                                              (("momentum", 2.0), ("sgd", 0.5)))
    measured: Timing = base.timings[name]
    assert timing.forward_ms[0][0] == round(measured.forward_ms[0][0] / 0.25, 4)
