"""Build a pipeline stage's blocks from a profile's build spec, and check them against it.

A zoo model is built block by block (``executor.profiling.zoo.build_model(name, seed,
blocks=...)``),
so a rank allocates only its own stage; each block is initialised from its index's seed
and has the weights it has in the whole model. A ``module:callable`` model is built whole
(its weights are the callable's) and cut to the stage's blocks.

The check (:func:`check_blocks`): the model has as many blocks as the profile, and each
block's parameter bytes equal the profile's. :func:`check_build` runs it on the whole
model before any process starts, on the ``meta`` device for zoo models (no memory, no
initialisation), for real for callables.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch
from edgepipe.executor.profiling import zoo
from edgepipe.planner.errors import PlanMismatchError
from edgepipe.planner.inputs.profile import BuildSpec, ModelProfile
from torch import nn

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _spec(profile: ModelProfile) -> BuildSpec:
    if profile.build is None:
        raise PlanMismatchError(f"model profile {profile.name!r} has no build spec")
    return profile.build


def param_bytes(block: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in block.parameters())


def check_blocks(
    profile: ModelProfile, total_blocks: int, built: list[tuple[int, str, nn.Module]]
) -> None:
    """Raise :class:`PlanMismatchError` unless the model has ``profile.num_blocks``
    blocks and every ``(index, name, block)`` in ``built`` has the profile's parameter
    bytes for that index. O(parameters of ``built``)."""
    spec = _spec(profile)
    if total_blocks != profile.num_blocks:
        raise PlanMismatchError(
            f"{spec.describe()} builds {total_blocks} blocks but profile {profile.name!r} "
            f"has {profile.num_blocks}; profile the model you run (edgepipe profile) and "
            "re-plan"
        )
    for i, name, block in built:
        have, want = param_bytes(block), profile.blocks[i].param_bytes
        if have != want:
            raise PlanMismatchError(
                f"{spec.describe()}: block {i} ({name!r}) has {have} parameter bytes but "
                f"profile {profile.name!r} says {want:.0f} (block "
                f"{profile.blocks[i].name!r}); profile the model you run and re-plan"
            )


def _callable_model(spec: BuildSpec) -> nn.Sequential:
    assert spec.callable is not None
    return zoo.load_model(spec.callable, **spec.kwargs)


def build_stage(profile: ModelProfile, first: int, end: int) -> nn.Sequential:
    """Blocks ``[first, end)`` of the profiled model as an ``nn.Sequential`` (train mode),
    checked against the profile (block count, parameter bytes)."""
    spec = _spec(profile)
    if spec.zoo is not None:
        total = len(zoo.block_specs(spec.zoo, **spec.sizes))
        if total != profile.num_blocks:
            check_blocks(profile, total, [])
        stage = zoo.build_model(spec.zoo, seed=spec.seed, blocks=range(first, end), **spec.sizes)
    else:
        whole = _callable_model(spec)
        total = len(whole)
        if total != profile.num_blocks:
            check_blocks(profile, total, [])
        stage = nn.Sequential(OrderedDict(list(whole.named_children())[first:end]))
    built = [(first + k, n, b) for k, (n, b) in enumerate(stage.named_children())]
    check_blocks(profile, total, built)
    return stage.train()


def check_build(profile: ModelProfile) -> None:
    """Check the whole model against the profile without training it (launcher side,
    before any process starts). Zoo blocks are built on the ``meta`` device."""
    spec = _spec(profile)
    if spec.zoo is not None:
        specs = zoo.block_specs(spec.zoo, **spec.sizes)
        if len(specs) != profile.num_blocks:
            check_blocks(profile, len(specs), [])
        with torch.device("meta"):
            built = [(i, name, factory()) for i, (name, factory) in enumerate(specs)]
        check_blocks(profile, len(specs), built)
    else:
        whole = _callable_model(spec)
        check_blocks(
            profile, len(whole), [(i, n, b) for i, (n, b) in enumerate(whole.named_children())]
        )


def stage_loss(profile: ModelProfile) -> Loss:
    """The model's training loss: the zoo's, the build spec's ``loss`` callable, or mean
    cross-entropy (:func:`executor.profiling.zoo.cross_entropy`)."""
    spec = _spec(profile)
    if spec.zoo is not None:
        return zoo.loss_fn(spec.zoo)
    if spec.loss is not None:
        return zoo.load_callable(spec.loss)
    return zoo.cross_entropy
