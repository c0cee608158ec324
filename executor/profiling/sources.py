"""What ``edgepipe profile`` and ``edgepipe lab profile`` measure: a model named as on the
command line (a zoo name with sizes, or ``MODULE:CALLABLE`` with its example input and
optionally a split), built into a chain with its :class:`BuildSpec`, example input and
profile name. A :class:`ModelSource` is plain data, so a child process can build the
model itself (inside its lab confinement); torch is imported by :func:`build_source`, not
with this module, so a child unpickles its source before it loads torch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.profile import BuildSpec

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass(frozen=True)
class ModelSource:
    """A model as the command line names it: ``model`` a zoo name (``sizes`` its
    ``NAME=VALUE`` sizes) or ``MODULE:CALLABLE`` (``input`` the ``MODULE:CALLABLE``
    returning an example batch, ``split`` the cuts of a module that is not a chain);
    ``name`` the profile's name (default: the model's)."""

    model: str
    sizes: tuple[str, ...] = ()
    input: str | None = None
    split: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class Built:
    """A :class:`ModelSource` built: the chain, how to rebuild it, ``batch -> example
    input`` and the profile's name."""

    model: nn.Sequential
    build: BuildSpec
    example: Callable[[int], torch.Tensor]
    name: str


def build_source(source: ModelSource) -> Built:
    """Build ``source``; a bad name, size or combination is an
    :class:`~planner.errors.InputError` naming the flag."""
    from edgepipe.executor.profiling import zoo

    if source.split is not None and ":" not in source.model:
        raise InputError("--split", "", "splits a MODULE:FACTORY model; zoo models are chains")
    if ":" not in source.model:
        sizes = zoo.parse_sizes(source.model, source.sizes)
        return Built(
            zoo.build_model(source.model, **sizes),
            BuildSpec(zoo=source.model, sizes=sizes, seed=0),
            partial(zoo.example_input, source.model, **sizes),
            source.name or source.model,
        )
    if source.split is not None:
        from edgepipe.executor.profiling.split import split_source

        model, build = split_source(source.model, source.split)
    else:
        model, build = zoo.load_model(source.model), BuildSpec(callable=source.model)
    if not source.input:
        raise InputError(
            "--input",
            "",
            "a bring-your-own model needs --input MODULE:CALLABLE returning "
            "an example batch of a given size",
        )
    return Built(
        model, build, zoo.load_callable(source.input),
        source.name or source.model.rsplit(":", 1)[1],
    )
