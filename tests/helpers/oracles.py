"""Brute-force oracles for the planners, independent of their search code."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.inputs.problem import Problem
from edgepipe.planner.partition import Partition, StageAssignment


def compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    """All ways to write ``total`` as ``parts`` positive integers (ordered)."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield tuple(bounds[i + 1] - bounds[i] for i in range(parts))


def ordered_groups(devices: list[str], stages: int) -> Iterator[tuple[tuple[str, ...], ...]]:
    """Every way to give each of ``stages`` stages a non-empty set of distinct devices
    (devices may stay idle); sets are sorted so each grouping appears once."""
    labels = range(-1, stages)  # -1 = idle
    for assign in itertools.product(labels, repeat=len(devices)):
        groups = tuple(
            tuple(d for d, a in zip(devices, assign, strict=True) if a == p) for p in range(stages)
        )
        if all(groups):
            yield groups


def all_partitions(problem: Problem, batch: int) -> Iterator[Partition]:
    """Every partition: stage count, layer cuts, device groups, positive sample splits."""
    n_blocks = problem.model.num_blocks
    devices = [d.id for d in problem.cluster.devices]
    m = problem.config.global_batch // batch
    for stages in range(1, min(n_blocks, len(devices)) + 1):
        for cuts in itertools.combinations(range(1, n_blocks), stages - 1):
            bounds = (0, *cuts, n_blocks)
            for groups in ordered_groups(devices, stages):
                splits = [list(compositions(batch, len(g))) for g in groups]
                for samples in itertools.product(*splits):
                    yield Partition(
                        batch,
                        m,
                        tuple(
                            StageAssignment(bounds[p], bounds[p + 1], groups[p], samples[p])
                            for p in range(stages)
                        ),
                    )


def brute_force_best(problem: Problem, figure: str = "iteration_ms"
                     ) -> tuple[float, Partition | None]:
    """Lowest exact ``figure`` of ``PlanCost`` (the isolated iteration, or ``steady_ms``)
    over every memory-feasible partition and micro-batch."""
    sizes = problem.config.micro_batch_sizes()
    cm = CostModel(problem, max(sizes))
    best: tuple[float, Partition | None] = (float("inf"), None)
    for batch in sizes:
        for part in all_partitions(problem, batch):
            cost = cm.evaluate(part)
            if cost.memory_ok and getattr(cost, figure) < best[0]:
                best = (getattr(cost, figure), part)
    return best


def best_contiguous_split(cost, n_items: int, parts: int) -> float:
    """Least largest ``cost(stage, first, end)`` over every split of ``n_items`` items
    into ``parts`` contiguous non-empty stages, by enumeration."""
    best = float("inf")
    for sizes in compositions(n_items, parts):
        bounds = [0]
        for size in sizes:
            bounds.append(bounds[-1] + size)
        best = min(best, max(cost(p, bounds[p], bounds[p + 1]) for p in range(parts)))
    return best
