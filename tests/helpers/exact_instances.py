"""Tiny problems whose every plan brute force prices, for the exact solver's closed-form
bounds (tests/unit/test_exact_fractional.py, tests/unit/test_exact_chain.py): the
problems and their least iteration time per (micro-batch, stage count)."""

from __future__ import annotations

import functools
import math

import numpy as np
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.inputs.cluster import Link

from tests.helpers.oracles import all_partitions
from tests.helpers.synthetic import knob_mix_problem, random_problem


def instances():
    """Tiny problems over the knobs: two device types or one, shared or switched, a slow
    per-pair link, warm-ups, 1F1B / GPipe, memory that binds (the bound ignores memory,
    so every plan counts, fitting or not)."""
    out = []
    for seed in range(6):
        rng = np.random.default_rng(seed)
        devices = int(rng.integers(2, 5))
        links = (Link("d0", "d1", bandwidth_mbps=50.0, latency_ms=3.0),) if seed == 3 else ()
        out.append(knob_mix_problem(rng, int(rng.integers(2, 6)), devices, seed, links))
    # identical devices, many samples per micro-batch, slow network (ring and fill weigh)
    out.append(
        random_problem(
            5,
            3,
            seed=7,
            global_batch=8,
            candidates=(1, 2, 4),
            memory=(8e9, 8e9),
            bandwidth_mbps=20.0,
            topology="switched",
        )
    )
    return out


def least_per_program(problem) -> dict[tuple[int, int], float]:
    """Brute force: the least iteration time per (micro-batch, stage count)."""
    cm = CostModel(problem)
    least: dict[tuple[int, int], float] = {}
    for batch in problem.config.micro_batch_sizes():
        for plan in all_partitions(problem, batch):
            key = (batch, plan.num_stages)
            least[key] = min(least.get(key, math.inf), cm.evaluate(plan).iteration_ms)
    return least


@functools.cache
def least_of(index: int) -> dict[tuple[int, int], float]:
    """:func:`least_per_program` of ``instances()[index]``, once per process (the brute
    force is most of a test's time)."""
    return least_per_program(instances()[index])
