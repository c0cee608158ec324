"""The runtime's own work per micro-batch measured on a real three-stage pipeline
(:mod:`executor.lab.runtime_work`; docs/lab.md, "Runtime work per action")."""

from __future__ import annotations

import torch
from edgepipe.executor.lab import runtime_work
from edgepipe.executor.lab.profiling import _combine
from edgepipe.executor.profiling.noise import NoisePolicy
from edgepipe.planner.inputs.cluster import Cluster, Device, DeviceType, Network
from edgepipe.planner.inputs.profile import Block, LabQuota, ModelProfile, RuntimeWork, Timing


def test_the_measured_pipeline_spends_cpu_on_both_sides_of_each_micro_batch():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a lab device's process (idle pool threads spin on CPU)
    try:
        work = runtime_work.measure_until_stable(
            NoisePolicy(max_spread=0.5, window=2, max_rounds=3))
    finally:
        torch.set_num_threads(threads)
    assert 2 <= work.rounds <= 3
    # measured unconfined at load 20-22 on one thread: 0.27-0.39 ms forward,
    # 0.44-0.59 ms backward (the backward side has the step's wait for its sends);
    # 20 ms would be a step's work, not an action's
    assert 0.0 < work.forward_ms < work.backward_ms < 20.0
    assert work.spread <= 0.5 or work.rounds == 3
    # and each optimizer's step, per MiB of parameters
    assert [name for name, _ in work.step_ms_per_mib] == ["adam", "momentum", "sgd"]
    assert all(ms > 0.0 for _, ms in work.step_ms_per_mib)


def test_the_lab_profile_records_the_work_per_quota():
    # 0.1 + 0.2 ms of CPU per micro-batch under a quarter of a core: 0.4 + 0.8 ms on the
    # device, as the blocks' CPU times (0.5 ms -> 2 ms)
    spec = DeviceType("t", "test device", 1e12, 1.0, 1.0, 1.0, "test", 1e6, {})
    cluster = Cluster("c", (Device("a", "t"),), Network(8.0, 0.0, False, ()), {"t": spec})
    measured = ModelProfile("m", {"kind": "measured"}, 1.0, (Block("b0", 0.0, 1.0, 0.0),),
                            {"t": Timing((1,), ((0.5,),), ((0.5,),))})
    quota = LabQuota(0.25, None, 1, 0.25)
    profile = _combine({"t": (measured, quota, 0)}, {"t": RuntimeWork(0.1, 0.2, 0.03, 4)},
                       cluster, 0.5)
    timing = profile.timings["t"]
    assert timing.forward_ms == ((2.0,),)
    assert timing.runtime_work == RuntimeWork(0.4, 0.8, 0.03, 4)
    assert ModelProfile.from_dict(profile.to_dict()).timings["t"].runtime_work == (
        timing.runtime_work)


def test_the_optimizer_step_is_measured_per_mib_for_every_optimizer():
    # unconfined, one thread, at load 4-5: sgd 0.08-0.19, momentum 0.17-0.40, adam
    # 1.2-3.4 CPU ms per MiB (Adam updates two moments and divides by a square root per
    # element, where SGD adds the scaled gradient): measured here against each other
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        policy = NoisePolicy(max_spread=0.5, window=2, max_rounds=3)
        sgd, _ = runtime_work.measure_step("sgd", policy)
        adam, _ = runtime_work.measure_step("adam", policy)
    finally:
        torch.set_num_threads(threads)
    assert 0.0 < sgd < adam / 2
