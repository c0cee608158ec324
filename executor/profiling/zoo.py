"""The model zoo: named models as chains of blocks, example batches, losses, seeded init.

Every model is an ``nn.Sequential`` whose children are its blocks (the unit the planner
cuts between); running the children one after another *is* the model's forward. Models:

=================  ===========================  =====================================
name               task                         blocks at default size
=================  ===========================  =====================================
resnet18           image classification         stem, 8 basic units, head (10)
resnet50           image classification         stem, 16 bottleneck units, head (18)
mobilenetv2        image classification         stem, 17 inverted residuals,
                                                last_conv, head (20)
efficientnet-b0    image classification         stem, 16 MBConv, last_conv, head (19)
vgg16              image classification         13 conv (+pool), fc6, fc7, fc8 (16)
bert-base          sequence classification      embed, 12 layers, head (14)
bert-small         sequence classification      embed, 4 layers, head (6)
gpt2-small         next-token prediction        embed, 12 layers, head (14)
=================  ===========================  =====================================

Sizes (keyword arguments, defaults in :data:`ZOO`): image models take ``resolution``,
``width`` (channel multiplier), ``depth`` (units-per-stage multiplier) and
``num_classes``; transformers take ``layers``, ``hidden``, ``heads``, ``ffn`` (None = 4 x
hidden), ``vocab``, ``max_positions``, ``seq_len`` and (BERT) ``num_classes``.

Initialisation is per block: block ``i`` of a model built with seed ``s`` is initialised
by :func:`init_block` from :func:`block_seed` ``(s, i)`` alone, so a pipeline stage that
builds only blocks 5..9 gets exactly the weights those blocks have in the full model.

Bring your own model with :func:`load_model` (``"package.module:callable"`` returning an
``nn.Sequential`` or a list of blocks), or any ``nn.Module`` split into blocks at module
boundaries by :mod:`executor.profiling.split` (``--model package.module:factory --split
auto``). ``package.module`` is imported as ``python -m`` would from the current
directory: an installed module, or one beside where the command runs.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import pairwise
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from edgepipe.executor.profiling.models import cnn, transformer
from edgepipe.executor.profiling.models.blocks import BlockSpec
from edgepipe.planner.errors import InputError
from torch import nn

#: task of image and BERT models: one label per sample
CLASSIFICATION = "classification"
#: task of GPT-2: one label (the next token) per input token
LANGUAGE_MODELLING = "language-modelling"


@dataclass(frozen=True)
class ZooModel:
    """A zoo entry: ``build(**sizes)`` returns the block specs; ``defaults`` lists every
    size the model takes (builder arguments and input sizes) with its default."""

    build: Callable[..., list[BlockSpec]]
    task: str
    defaults: Mapping[str, Any]

    @property
    def is_image(self) -> bool:
        return "resolution" in self.defaults


_IMAGE = {"resolution": 224, "width": 1.0, "depth": 1.0, "num_classes": 1000}
_TEXT = {"ffn": None, "vocab": 30522, "max_positions": 512, "seq_len": 128}

#: every zoo model by name
ZOO: dict[str, ZooModel] = {
    "resnet18": ZooModel(
        partial(cnn.resnet, (2, 2, 2, 2), cnn.BasicBlock), CLASSIFICATION, _IMAGE
    ),
    "resnet50": ZooModel(
        partial(cnn.resnet, (3, 4, 6, 3), cnn.Bottleneck), CLASSIFICATION, _IMAGE
    ),
    "mobilenetv2": ZooModel(cnn.mobilenetv2, CLASSIFICATION, _IMAGE),
    "efficientnet-b0": ZooModel(cnn.efficientnet_b0, CLASSIFICATION, _IMAGE),
    "vgg16": ZooModel(cnn.vgg16, CLASSIFICATION, _IMAGE),
    "bert-base": ZooModel(
        transformer.bert,
        CLASSIFICATION,
        {**_TEXT, "layers": 12, "hidden": 768, "heads": 12, "num_classes": 2},
    ),
    "bert-small": ZooModel(
        transformer.bert,
        CLASSIFICATION,
        {**_TEXT, "layers": 4, "hidden": 512, "heads": 8, "num_classes": 2},
    ),
    "gpt2-small": ZooModel(
        transformer.gpt2,
        LANGUAGE_MODELLING,
        {**_TEXT, "layers": 12, "hidden": 768, "heads": 12, "vocab": 50257,
         "max_positions": 1024},
    ),
}


def _entry(name: str) -> ZooModel:
    if name not in ZOO:
        raise InputError(
            "model", "", f"unknown zoo model {name!r}; use one of {sorted(ZOO)} or a "
            "'package.module:callable' of your own"
        )
    return ZOO[name]


def resolve_sizes(name: str, **size: Any) -> dict[str, Any]:
    """Defaults of model ``name`` overridden by ``size``; unknown size names are an
    :class:`~planner.errors.InputError`."""
    entry = _entry(name)
    unknown = sorted(set(size) - set(entry.defaults))
    if unknown:
        raise InputError(
            "model", "", f"{name} has no size {unknown[0]!r}; its sizes are "
            f"{sorted(entry.defaults)}"
        )
    return {**entry.defaults, **size}


def parse_sizes(name: str, pairs: Sequence[str]) -> dict[str, Any]:
    """Parse ``["resolution=64", "width=0.5"]`` (CLI form) into typed sizes of ``name``:
    each value takes the type of its default (int where the default is None)."""
    entry = _entry(name)
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or key not in entry.defaults:
            raise InputError(
                "model", "", f"bad size {pair!r}; write NAME=VALUE with NAME one of "
                f"{sorted(entry.defaults)}"
            )
        default = entry.defaults[key]
        kind = int if default is None else type(default)
        try:
            out[key] = kind(text)
        except ValueError:
            raise InputError(
                "model", "", f"size {key} takes {kind.__name__} values, got {text!r}"
            ) from None
    return out


def block_specs(name: str, **size: Any) -> list[BlockSpec]:
    """The ``(block name, factory)`` chain of model ``name`` at the given sizes."""
    entry = _entry(name)
    sizes = resolve_sizes(name, **size)
    params = inspect.signature(entry.build).parameters
    return entry.build(**{k: v for k, v in sizes.items() if k in params})


def block_seed(base_seed: int, index: int) -> int:
    """Seed of block ``index`` of a model built with ``base_seed``: the first 64-bit word
    of numpy's ``SeedSequence((base_seed, index))``, so different (base, index) pairs give
    statistically independent streams. O(1)."""
    return int(np.random.SeedSequence((base_seed, index)).generate_state(1, np.uint64)[0])


_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_BATCH_NORM = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_AFFINE_NORM = (*_BATCH_NORM, nn.LayerNorm, nn.GroupNorm)


def init_block(block: nn.Module, seed: int) -> None:
    """Initialise every parameter of ``block`` from ``seed`` alone, in module order.

    Convolutions: Kaiming normal (fan-out, ReLU gain), zero bias. Linear and embedding
    weights: normal(0, 0.02), zero bias. Batch/layer/group norm: weight 1, bias 0, batch
    norm running statistics reset. A module type with its own parameters that is none of
    these raises ``ValueError`` (its initialisation would not be reproducible).
    O(parameters).
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for path, module in block.named_modules():
            if isinstance(module, _CONV):
                nn.init.kaiming_normal_(
                    module.weight, mode="fan_out", nonlinearity="relu", generator=gen
                )
            elif isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, 0.0, 0.02, generator=gen)
            elif isinstance(module, _AFFINE_NORM):
                if module.weight is not None:
                    nn.init.ones_(module.weight)
                if isinstance(module, _BATCH_NORM):
                    module.reset_running_stats()
            elif next(module.parameters(recurse=False), None) is not None:
                raise ValueError(
                    f"cannot initialise {path or 'block'} ({type(module).__name__}) "
                    "reproducibly: init_block knows conv, linear, embedding and norm layers"
                )
            bias = getattr(module, "bias", None)
            if isinstance(bias, nn.Parameter):
                nn.init.zeros_(bias)


def build_model(
    name: str, *, seed: int = 0, blocks: Sequence[int] | None = None, **size: Any
) -> nn.Sequential:
    """Build zoo model ``name`` as an ``nn.Sequential`` of its blocks (train mode).

    ``blocks`` (strictly increasing indices) builds only those blocks, e.g. one pipeline
    stage; each keeps the name and weights it has in the full model. The caller's global
    RNG state is left untouched. O(parameters of the built blocks).
    """
    specs = block_specs(name, **size)
    chosen = list(range(len(specs))) if blocks is None else list(blocks)
    if any(b <= a for a, b in pairwise(chosen)) or (
        chosen and not 0 <= chosen[0] <= chosen[-1] < len(specs)
    ):
        raise InputError(
            "model", "", f"blocks {chosen} must be strictly increasing indices in "
            f"0..{len(specs) - 1} ({name} has {len(specs)} blocks)"
        )
    out: OrderedDict[str, nn.Module] = OrderedDict()
    with torch.random.fork_rng(devices=[]):
        for i in chosen:
            block_name, factory = specs[i]
            block = factory()
            init_block(block, block_seed(seed, i))
            out[block_name] = block
    return nn.Sequential(out)


def example_batch(
    name: str, batch: int, *, seed: int = 0, **size: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """A synthetic (input, target) batch of ``batch`` samples for model ``name``, drawn
    from a generator seeded with ``seed``.

    Images: float32 (batch, 3, resolution, resolution) standard normal, integer class
    labels (batch,). BERT: token ids (batch, seq_len), labels (batch,). GPT-2: token ids
    (batch, seq_len) and the next tokens (batch, seq_len), i.e. one random sequence of
    seq_len + 1 tokens split into inputs and targets shifted by one.
    """
    entry = _entry(name)
    sizes = resolve_sizes(name, **size)
    gen = torch.Generator().manual_seed(seed)
    if entry.is_image:
        r = sizes["resolution"]
        x = torch.randn(batch, 3, r, r, generator=gen)
        return x, torch.randint(sizes["num_classes"], (batch,), generator=gen)
    tokens = torch.randint(sizes["vocab"], (batch, sizes["seq_len"] + 1), generator=gen)
    if entry.task == LANGUAGE_MODELLING:
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    return tokens[:, :-1].contiguous(), torch.randint(
        sizes["num_classes"], (batch,), generator=gen
    )


def example_input(name: str, batch: int, *, seed: int = 0, **size: Any) -> torch.Tensor:
    """The input half of :func:`example_batch`; ``partial(example_input, name, **size)``
    is the ``example_input_fn`` the profiler takes."""
    return example_batch(name, batch, seed=seed, **size)[0]


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over predicted positions: ``output`` (..., classes) logits,
    ``target`` (...) class indices. For classification that is one position per sample;
    for language modelling one per token (targets are the inputs shifted by one)."""
    return F.cross_entropy(output.flatten(0, -2), target.flatten())


def loss_fn(name: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Training loss of zoo model ``name`` (both zoo tasks use :func:`cross_entropy`)."""
    _entry(name)
    return cross_entropy


def load_callable(spec: str) -> Callable[..., Any]:
    """Import ``"package.module:attr"`` (attr may be dotted) and return it; the current
    directory is searched after the installed packages (appended to ``sys.path``), so
    ``examples.gpt:factory`` works from the repository root, and in the workers a run
    starts there."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InputError(spec, "", "expected 'package.module:callable'")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError(spec, "", f"cannot import {module_name!r} ({exc})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InputError(spec, "", f"{module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise InputError(spec, "", f"{attr} is not callable")
    return obj


def load_model(spec: str, **kwargs: Any) -> nn.Sequential:
    """Bring-your-own model: call ``"package.module:callable"`` with ``kwargs``; it must
    return an ``nn.Sequential`` (returned as is) or a list/tuple of modules (wrapped, block
    names "0", "1", ...). Weights are the callable's own: a stage-parallel run needs it to
    build identical weights in every process (seed it)."""
    result = load_callable(spec)(**kwargs)
    if isinstance(result, nn.Sequential):
        return result
    if isinstance(result, list | tuple) and result and all(
        isinstance(m, nn.Module) for m in result
    ):
        return nn.Sequential(*result)
    raise InputError(
        spec, "", f"returned {type(result).__name__}; return an nn.Sequential or a "
        "non-empty list of nn.Module blocks"
    )
