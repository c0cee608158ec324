"""Runs in which a device slows down (executor/ft/slowdown.py): the emulation's time
scale, the careful profile whose times set the emulated budgets, and the work a plan
gives a device (what a re-partition must move off a slowed one)."""

from __future__ import annotations

import torch
from edgepipe.executor.profiling import zoo
from edgepipe.executor.profiling.profiler import profile_model
from edgepipe.planner.inputs.profile import BuildSpec

#: emulated times x this: budgets far above real compute on a loaded machine, so that only
#: the emulated slowdown makes a device slow
TIME_SCALE = 40.0


def work(plan, device: str) -> int:
    """Samples x blocks that ``device`` computes per micro-batch under ``plan``."""
    return sum(y * (s.end - s.first) for s in plan.partition.stages
               for d, y in zip(s.devices, s.samples, strict=True) if d == device)


def careful_profile(spec: BuildSpec, batch_sizes: list[int]):
    """``spec``'s zoo model profiled on this machine, warmed up, 5 rounds, one thread."""
    torch.set_num_threads(1)
    model = zoo.build_model(spec.zoo, seed=spec.seed, **spec.sizes)
    return profile_model(model, lambda b: zoo.example_input(spec.zoo, b, **spec.sizes),
                         batch_sizes, "host-cpu", name=spec.zoo, warmup=3, repeats=5,
                         build=spec)
