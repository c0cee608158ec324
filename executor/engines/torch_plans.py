"""Which plans torch.distributed.pipelining can express (no torch): the torch-pipelining
engine's refusals of a plan, shared by the engine (:mod:`executor.engines.torch_pipelining`)
and its ranks under torchrun (:mod:`executor.engines.torch_worker`)."""

from __future__ import annotations

from edgepipe.planner.plan import Plan

#: the pytorch issue on per-replica batch shares (uneven data parallelism)
UNEVEN_ISSUE = "pytorch#126600"
_EDGEPIPE = "run it with --engine edgepipe"


def refusal(plan: Plan) -> str | None:
    """None when torch pipelining can express ``plan`` (module docstring), else why not,
    in one line that names the engine that can. O(devices)."""
    stages = plan.partition.stages
    widths = [len(s.devices) for s in stages]
    if len(set(widths)) > 1:
        return (f"its stages have different numbers of devices ({', '.join(map(str, widths))}):"
                " torch pipelining runs one pipeline per data-parallel replica, so every stage "
                f"needs the same number; edgepipe's runtime re-slices between widths: {_EDGEPIPE}")
    for p, s in enumerate(stages):
        if len(set(s.samples)) > 1:
            return (f"stage {p} splits each micro-batch unevenly ({'/'.join(map(str, s.samples))}"
                    f" samples on {', '.join(s.devices)}): torch's data parallelism gives every "
                    f"replica the same batch ({UNEVEN_ISSUE}); {_EDGEPIPE}")
    m, stages_n = plan.partition.num_micro_batches, len(stages)
    if plan.problem.config.schedule == "1f1b" and m < stages_n:
        return (f"torch's Schedule1F1B needs at least as many micro-batches as stages ({m} < "
                f"{stages_n}); plan with schedule gpipe, or {_EDGEPIPE}")
    return None
