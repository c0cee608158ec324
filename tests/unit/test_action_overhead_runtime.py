"""The runtime's own work per micro-batch measured on a real three-stage pipeline
(:mod:`executor.lab.runtime_work`; docs/lab.md, "Runtime work per action")."""

from __future__ import annotations

import torch
from edgepipe.executor.lab import runtime_work
from edgepipe.executor.profiling.noise import NoisePolicy


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
