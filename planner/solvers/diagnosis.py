"""Why no plan fits memory: the first violated necessary condition, measured.

Used by every planner when it finds nothing feasible, so the user gets one message that
names the binding figure and the fix instead of a bare "infeasible".
"""

from __future__ import annotations

from dataclasses import replace

from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.errors import InfeasibleError
from edgepipe.planner.inputs.problem import Problem
from edgepipe.planner.solvers.dp.sizes import DPResult, best_plan
from edgepipe.planner.units import human_bytes


def diagnose_infeasible(problem: Problem) -> InfeasibleError:
    """Explain why no plan fits memory: the first violated necessary condition.

    Checks, in order: (1) some block's weights + gradients + optimizer state exceed the
    largest device's usable memory; (2) the whole model's static state exceeds all usable
    memory together; (3) otherwise activations of the in-flight micro-batches bind: the
    smallest factor by which every device's memory must grow for the DP to find a plan
    (bisection to 2%), and that plan's largest overflow. When that plan overflows no
    device (a positive shortfall is never reached: the search failed for a reason other
    than memory), the error's constraint is ``search``, not ``memory``, and it has no
    shortfall. Every ``memory`` error's shortfall is positive (or None: not measurable).
    Cost: (3) runs the DP O(log 1000 + log_1.02 2) = O(10) times.
    """
    cm = CostModel(problem, max(problem.config.micro_batch_sizes()))
    cluster = problem.cluster
    n = len(cluster.devices)
    budgets = [cluster.budget_bytes(i) for i in range(n)]
    largest = max(range(n), key=lambda i: budgets[i])
    for i, block in enumerate(problem.model.blocks):
        need = cm.static_bytes(i, i + 1)
        if need > budgets[largest]:
            short = need - budgets[largest]
            return InfeasibleError(
                f"memory: block {i} ({block.name}) alone needs {human_bytes(need)} for "
                f"weights, gradients and {problem.config.optimizer} state, but the largest "
                f"device ({cluster.devices[largest].id}) has "
                f"{human_bytes(budgets[largest])} usable: short by "
                f"{human_bytes(short)}. Use a device with more memory, "
                "a lighter optimizer (sgd), or a smaller model.",
                "memory",
                short,
            )
    total = cm.static_bytes(0, problem.model.num_blocks)
    if total > sum(budgets):
        short = total - sum(budgets)
        return InfeasibleError(
            f"memory: the model's weights, gradients and {problem.config.optimizer} state "
            f"need {human_bytes(total)} but all devices together have "
            f"{human_bytes(sum(budgets))} usable: short by {human_bytes(short)}. Add "
            "devices, use a lighter optimizer (sgd), or a smaller model.",
            "memory",
            short,
        )
    smallest = min(problem.config.micro_batch_sizes())
    scale, plan = _memory_scale_to_fit(problem, smallest)
    if plan is None:
        return InfeasibleError(
            "memory: no stage layout fits even with 1000x the devices' memory at "
            f"micro-batch {smallest}; check the profile's byte figures",
            "memory",
            None,
        )
    device, over = max(
        (
            (d, mem - cluster.budget_bytes(cluster.index(d)))
            for stage, sc in zip(plan.partition.stages, plan.cost.stages, strict=True)
            for d, mem in zip(stage.devices, sc.memory_bytes, strict=True)
        ),
        key=lambda t: t[1],
    )
    if over <= 0:
        # a plan fits at (within 2% of) the devices' own memory: the search that gave up
        # did so for another reason, and memory must not be blamed for it
        return InfeasibleError(
            "no plan was found, though memory does not rule one out: with micro-batch "
            f"{smallest} a {plan.partition.num_stages}-stage plan fits every device's usable "
            f"memory (the fullest, {device}, has {human_bytes(-over)} to spare), so the "
            "search missed it (the exact solver's relaxed model, or the DP's search, which "
            "prices ring replicas only after it). Try the other solver (--solver dp or "
            "milp), or replication_interval 0.",
            "search",
            None,
        )
    return InfeasibleError(
        "memory: no stage layout fits; the activations of in-flight micro-batches bind. "
        f"With micro-batch {smallest} the best plan needs {scale:.2f}x the usable memory: "
        f"device {device} is short by {human_bytes(over)} "
        f"({plan.partition.num_stages} stages). Try smaller micro_batch_candidates, "
        "warmup 'classic' (fewer micro-batches in flight), or more devices.",
        "memory",
        over,
    )


def _memory_scale_to_fit(problem: Problem, batch: int) -> tuple[float, DPResult | None]:
    """Smallest factor (to 2%) by which every device's memory must grow for the DP to find
    a plan at micro-batch ``batch``, and that plan (scored on the scaled cluster)."""

    def attempt(factor: float) -> DPResult | None:
        cl = problem.cluster
        devices = tuple(
            replace(d, memory_bytes=cl.memory_bytes(i) * factor) for i, d in enumerate(cl.devices)
        )
        scaled = replace(
            problem,
            cluster=replace(cl, devices=devices),
            config=replace(problem.config, micro_batch_candidates=(batch,)),
        )
        return best_plan(scaled)

    low, high, found = 1.0, 2.0, attempt(2.0)
    while found is None and high < 1000:
        low, high = high, high * 4
        found = attempt(high)
    if found is None:
        return high, None
    while high / low > 1.02:
        mid = (low * high) ** 0.5
        plan = attempt(mid)
        if plan is None:
            low = mid
        else:
            high, found = mid, plan
    return high, found
