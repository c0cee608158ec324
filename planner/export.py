"""Export a plan as another framework's pipeline configuration: torchtitan or DeepSpeed.

Both frameworks run a pipeline of ``P`` stages, each replicated the same number of times
(one data-parallel degree ``D``, ranks laid out pipeline-outermost: rank ``p x D + j`` is
replica ``j`` of stage ``p``, as torchtitan's device mesh ``["pp", "dp_replicate", ...]``
and DeepSpeed's ``PipeDataParallelTopology(num_pp, num_dp)`` order them), with every
replica taking the same share of each micro-batch. So a plan is exportable when every
stage has the same number of devices and, in each stage, every device takes the same
samples; otherwise :func:`export` refuses with one line (a
:class:`~planner.errors.PlanMismatchError`) naming the stage and saying why. edgepipe's
own runtime runs every plan (uneven shares, mixed widths).

What each target gets (inputs: the plan alone; O(blocks + devices)):

* **torchtitan** -- a TOML ``[parallelism]`` / ``[training]`` snippet for the TOML job
  config (``torchtitan/config/job_config.py``, to Feb 2026: ``pipeline_parallel_degree``,
  ``pipeline_parallel_split_points``, ``pipeline_parallel_schedule``,
  ``pipeline_parallel_microbatch_size``, ``data_parallel_replicate_degree``,
  ``training.local_batch_size`` / ``global_batch_size``), and the same plan in the
  Python configuration that replaced it (``torchtitan/config/configs.py``,
  ``ParallelismConfig`` at pytorch/torchtitan b5bcd76, 2026-08-21:
  ``module_fqns_per_model_part``, ``num_pp_microbatches``). Split points are the module
  FQNs where stages 1..P-1 begin; a part lists the modules its stage runs. For a model
  split by :mod:`executor.profiling.split` they come from its build spec (``split``,
  ``modules``); for a chain they are the block names (its children's FQNs). A module
  cut inside (a split inside a layer) cannot be a whole part: refused.
* **deepspeed** -- ``PipelineModule(layers, num_stages, partition_method=...)`` and the
  batch settings of its config. DeepSpeed has no explicit-boundaries method; its
  ``"type:REGEX"`` method weighs layers whose class name matches 1 and balances the
  sums (``deepspeed/runtime/pipe/module.py`` ``_partition_layers`` with
  ``runtime/utils.py`` ``partition_balanced``). With one marked layer at each stage's
  start it returns exactly those starts (its tie-break keeps the last best split:
  checked against DeepSpeed 38327e0's function for every stage set of up to 12 layers),
  so the export wraps each stage's first block in a marker class. DeepSpeed's pipeline
  engine has one schedule (its ``TrainSchedule``, 1F1B): a GPipe plan is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pprint import pformat

from edgepipe.planner.errors import PlanMismatchError
from edgepipe.planner.inputs.profile import BuildSpec
from edgepipe.planner.plan import Plan

#: the ``package.module:callable`` that rebuilds a model split by module boundaries
#: (executor/profiling/split.py, ``BUILDER``)
SPLIT_BUILDER = "edgepipe.executor.profiling.split:chain"
#: edgepipe's schedule names in torch pipelining's (and torchtitan's) spelling
TORCH_SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe"}
#: the class DeepSpeed's ``type:`` partition method is pointed at
MARKER = "EdgepipeStageStart"


@dataclass(frozen=True)
class Pipeline:
    """A plan in the terms both targets share: ``stages`` pipeline stages of
    ``degree`` replicas each; per replica, ``micro_batches`` micro-batches of
    ``micro_batch`` samples per step; ``starts[p]`` stage p's first block;
    ``ranks`` the plan's devices in rank order (pipeline outermost)."""

    plan_id: str
    title: str
    stages: int
    degree: int
    micro_batch: int
    micro_batches: int
    global_batch: int
    schedule: str
    starts: tuple[int, ...]
    ranks: tuple[str, ...]

    def header(self, target: str) -> list[str]:
        """The comment lines every export starts with."""
        ranks = ", ".join(f"{r} {d}" for r, d in enumerate(self.ranks))
        devices = "1 device" if self.degree == 1 else f"{self.degree} devices"
        return [
            f"# {target}: plan {self.plan_id} ({self.title})",
            f"# {self.stages} stages of {devices} each; per device {self.micro_batches} "
            f"micro-batches of {self.micro_batch} samples, schedule {self.schedule}",
            f"# ranks (pipeline outermost): {ranks}",
        ]


def _refuse(plan: Plan, target: str, why: str) -> PlanMismatchError:
    return PlanMismatchError(f"{target} cannot express plan {plan.id}: {why}")


def pipeline(plan: Plan, target: str) -> Pipeline:
    """``plan`` as a :class:`Pipeline`, or a one-line refusal: stages of different
    widths (mixed groups) or uneven shares inside a stage. O(devices)."""
    stages = plan.partition.stages
    widths = [len(s.devices) for s in stages]
    if len(set(widths)) > 1:
        raise _refuse(
            plan, target, f"its stages have {widths} devices; {target} replicates every "
            "stage the same number of times (run it with edgepipe run)"
        )
    for p, s in enumerate(stages):
        if len(set(s.samples)) > 1:
            shares = ", ".join(f"{d} {y}" for d, y in zip(s.devices, s.samples, strict=True))
            raise _refuse(
                plan, target, f"stage {p}'s devices take uneven shares of each micro-batch "
                f"({shares}); {target} gives every data-parallel replica the same share "
                "(run it with edgepipe run)"
            )
    problem = plan.problem
    return Pipeline(
        plan_id=plan.id,
        title=f"{problem.model.name} on {problem.cluster.name}",
        stages=len(stages),
        degree=widths[0],
        micro_batch=stages[0].samples[0],
        micro_batches=plan.partition.num_micro_batches,
        global_batch=problem.config.global_batch,
        schedule=TORCH_SCHEDULES[problem.config.schedule],
        starts=tuple(s.first for s in stages),
        ranks=tuple(plan.partition.used_devices()),
    )


def _build(plan: Plan, target: str) -> BuildSpec:
    build = plan.problem.model.build
    if build is None:
        raise _refuse(
            plan, target, f"its profile {plan.problem.model.name!r} has no build spec, so "
            "its blocks name no modules (profile the model with edgepipe profile)"
        )
    return build


def block_modules(plan: Plan, target: str) -> list[list[str]]:
    """Per block of the plan's model, the module FQNs it runs (module docstring)."""
    build = _build(plan, target)
    if build.callable != SPLIT_BUILDER:
        return [[b.name] for b in plan.problem.model.blocks]
    if "modules" not in build.kwargs:
        raise _refuse(
            plan, target, "its profile does not list the modules of its blocks (profiled "
            "before edgepipe recorded them): profile the model again and re-plan"
        )
    return [list(m) for m in build.kwargs["modules"]]


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{i}"' for i in items) + "]"


def to_torchtitan(plan: Plan) -> str:
    """The torchtitan configuration of ``plan`` (module docstring). O(blocks)."""
    pipe = pipeline(plan, "torchtitan")
    modules = block_modules(plan, "torchtitan")
    ends = [*pipe.starts[1:], len(modules)]
    parts = [
        [m for block in modules[a:b] for m in block] for a, b in zip(pipe.starts, ends, strict=True)
    ]
    for p in range(1, len(parts)):
        shared = [m for m in parts[p] if m in parts[p - 1]]
        if shared:
            raise _refuse(
                plan, "torchtitan", f"module {shared[0]} runs in stages {p - 1} and {p} (the "
                "model was cut inside it); torchtitan's model parts hold whole modules"
            )
    split_points = [part[0] for part in parts[1:]]
    degree = pipe.degree
    lines = [
        *pipe.header("torchtitan"),
        "",
        "# TOML job config (torchtitan/config/job_config.py, until 2026-02)",
        "[parallelism]",
        f"pipeline_parallel_degree = {pipe.stages}",
        f"pipeline_parallel_split_points = {_toml_list(split_points)}",
        f'pipeline_parallel_schedule = "{pipe.schedule}"',
        f"pipeline_parallel_microbatch_size = {pipe.micro_batch}",
        f"data_parallel_replicate_degree = {degree}",
        "data_parallel_shard_degree = 1",
        "",
        "[training]",
        f"local_batch_size = {pipe.micro_batch * pipe.micro_batches}",
        f"global_batch_size = {pipe.global_batch}",
        "",
        "# Python config (torchtitan/config/configs.py, ParallelismConfig)",
        f"config.parallelism.pipeline_parallel_degree = {pipe.stages}",
        "config.parallelism.module_fqns_per_model_part = [",
        *(f"    {_toml_list(part)}," for part in parts),
        "]",
        f'config.parallelism.pipeline_parallel_schedule = "{pipe.schedule}"',
        f"config.parallelism.num_pp_microbatches = {pipe.micro_batches}",
        f"config.parallelism.data_parallel_replicate_degree = {degree}",
        "config.parallelism.data_parallel_shard_degree = 1",
        f"# training.num_tokens_per_microbatch_per_dp_rank: {pipe.micro_batch} samples' tokens",
    ]
    return "\n".join(lines) + "\n"


def _blocks_line(build: BuildSpec) -> tuple[str, str]:
    """The zoo function and the Python line that build the plan's chain as ``blocks``."""
    if build.zoo is not None:
        args = "".join(f", {k}={v!r}" for k, v in sorted(build.sizes.items()))
        line = f"blocks = list(build_model({build.zoo!r}, seed={build.seed}{args}))"
        return "build_model", line
    kwargs = pformat(dict(build.kwargs), width=80, sort_dicts=False, compact=True)
    kwargs = kwargs.replace("\n", "\n    ")
    return "load_model", f"blocks = list(load_model(\n    {build.callable!r},\n    **{kwargs},\n))"


def to_deepspeed(plan: Plan) -> str:
    """The DeepSpeed ``PipelineModule`` and batch configuration of ``plan`` (module
    docstring). O(blocks)."""
    pipe = pipeline(plan, "DeepSpeed")
    if pipe.schedule != "1F1B":
        raise _refuse(
            plan, "DeepSpeed", f"its schedule is {pipe.schedule}; DeepSpeed's pipeline "
            "engine runs only its 1F1B TrainSchedule (plan with --schedule 1f1b)"
        )
    build = _build(plan, "DeepSpeed")
    builder, blocks = _blocks_line(build)
    names = ", ".join(plan.problem.model.blocks[s].name for s in pipe.starts)
    loss = build.loss or "edgepipe.executor.profiling.zoo:cross_entropy"
    lines = [
        *pipe.header("DeepSpeed"),
        "# partition_method 'type:' weighs layers whose class name matches 1, balances the",
        "# sums: one marked layer per stage start cuts exactly there",
        "from deepspeed.pipe import PipelineModule",
        f"from edgepipe.executor.profiling.zoo import {builder}, load_callable",
        "from torch import nn",
        "",
        blocks,
        "",
        "",
        f"class {MARKER}(nn.Sequential):",
        '    """The first layer of a pipeline stage."""',
        "",
        "",
        f"STAGE_STARTS = {pipe.starts}  # {names}",
        f"layers = [{MARKER}(b) if i in STAGE_STARTS else b for i, b in enumerate(blocks)]",
        "model = PipelineModule(",
        f'    layers=layers, num_stages={pipe.stages}, partition_method="type:^{MARKER}$",',
        f"    loss_fn=load_callable({loss!r}),",
        ")",
        "ds_config = {",
        f'    "train_batch_size": {pipe.global_batch},',
        f'    "train_micro_batch_size_per_gpu": {pipe.micro_batch},',
        f'    "gradient_accumulation_steps": {pipe.micro_batches},',
        "}",
    ]
    return "\n".join(lines) + "\n"


#: target name -> exporter
TARGETS: dict[str, Callable[[Plan], str]] = {
    "torchtitan": to_torchtitan, "deepspeed": to_deepspeed
}


def export(plan: Plan, target: str) -> str:
    """``plan`` in ``target``'s configuration terms (:data:`TARGETS`), or a one-line
    :class:`~planner.errors.PlanMismatchError` where the target cannot express it."""
    if target not in TARGETS:
        raise PlanMismatchError(f"unknown export target {target!r}; use one of {list(TARGETS)}")
    return TARGETS[target](plan)
