"""Single-process reference trainer: the executor's test oracle.

Written from ``/work/notes/DETERMINISTIC.md`` (the shared data-order and deterministic-mode
spec) alone. It uses :mod:`executor.profiling.zoo` only to build the model and its loss, and any
indexable dataset of ``(input, target)`` pairs; it shares no code with the executor's
sampler, stages, communication, runtime or gradient combination, so agreement between
the two is evidence, not tautology.

Two trainers:

* :func:`train` (``deterministic=True``): every sample of a step is run forward and
  backward alone (a batch of one) through the whole model; the per-sample gradients are
  summed in global-position order, ``acc = g_0.clone(); acc.add_(g_i) ...; acc.div_(B)``,
  and the step loss likewise. A plan-independent unit of computation, so every plan of
  the executor's deterministic mode must match it bit for bit (``torch.equal``).
  ``deterministic=False`` is ordinary full-batch training (one forward of all ``B``
  samples, mean loss): the float-tolerance cross-check of the deterministic path.
* :func:`train_split`: "split as the plan does", the oracle of the executor's fast mode
  and of models with batch statistics (BatchNorm), whose function depends on the split.
  Every micro-batch is run stage by stage; inside a stage each device's slice of the
  micro-batch is computed as one batch (with that device's own BatchNorm running
  statistics); the last stage's slices give losses scaled by ``slice / B``; the
  gradients of one micro-batch are accumulated in micro-batch order. Equal to the
  executor's fast mode up to float summation order (``allclose``), because the executor
  all-reduces partial sums.

Sampler (spec): ``steps_per_epoch = N // B``; step ``t`` is step ``k = t % steps_per_epoch``
of epoch ``e = t // steps_per_epoch``, whose order is
``default_rng(SeedSequence((seed, e))).permutation(N)``; step ``t`` takes
``order[k*B:(k+1)*B]`` (the ``N % B`` leftover samples of an epoch are unused).

Cost: :func:`train` is O(steps x B) single-sample forward/backward passes and keeps one
gradient accumulator per parameter (it streams, never stores ``B`` gradients).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from edgepipe.executor.profiling import zoo
from torch import nn


class SampleDataset(Protocol):
    """What the trainers read: ``len(d)`` samples, ``d[i] -> (input, target)`` of one
    sample, without a batch dimension (a ``torch.utils.data.TensorDataset`` qualifies)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass(frozen=True)
class ModelSpec:
    """A zoo model: ``name``, its size settings and the model seed of the run."""

    name: str
    sizes: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0

    def build(self) -> nn.Sequential:
        return zoo.build_model(self.name, seed=self.seed, **dict(self.sizes))


@dataclass(frozen=True)
class OptimizerSpec:
    """The plan's optimizer: ``kind`` sgd | momentum | adam with its hyper-parameters."""

    kind: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.9
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def build(self, params: Sequence[nn.Parameter]) -> torch.optim.Optimizer:
        """The spec's optimizer, always ``foreach=False`` (a fixed per-tensor code path)."""
        if self.kind == "sgd":
            return torch.optim.SGD(params, lr=self.lr, foreach=False)
        if self.kind == "momentum":
            return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, foreach=False)
        if self.kind == "adam":
            return torch.optim.Adam(
                params, lr=self.lr, betas=self.betas, eps=self.eps, foreach=False
            )
        raise ValueError(f"unknown optimizer kind {self.kind!r}")


@dataclass
class Result:
    """What a reference run produced.

    ``losses[t]`` is step ``t``'s reported loss, ``sample_ids[t]`` its samples in global
    position order, ``state`` the final ``state_dict`` (cloned tensors), ``optimizer``
    the final ``optimizer.state_dict()``; :func:`train_split` also fills
    ``device_buffers[(stage, device)]``: the buffers (BatchNorm running statistics) of
    that device's copy of its stage's blocks, keyed as in ``state`` (there the buffers
    of each stage are those of its device 0).
    """

    losses: list[float]
    sample_ids: list[list[int]]
    state: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    device_buffers: dict[tuple[int, int], dict[str, torch.Tensor]] = field(
        default_factory=dict
    )


def step_sample_ids(step: int, global_batch: int, num_samples: int, seed: int) -> list[int]:
    """Sample indices of step ``step`` in global-position order (the spec's sampler).
    O(N) per call (one permutation of the dataset)."""
    if num_samples < global_batch:
        raise ValueError(f"dataset of {num_samples} samples < global batch {global_batch}")
    steps_per_epoch = num_samples // global_batch
    epoch, k = divmod(step, steps_per_epoch)
    order = np.random.default_rng(np.random.SeedSequence((seed, epoch))).permutation(
        num_samples
    )
    return [int(i) for i in order[k * global_batch : (k + 1) * global_batch]]


def sample_ids_per_step(
    steps: int, global_batch: int, num_samples: int, seed: int
) -> list[list[int]]:
    """:func:`step_sample_ids` of steps 0 .. ``steps`` - 1, in step order."""
    return [step_sample_ids(t, global_batch, num_samples, seed) for t in range(steps)]


def _one(dataset: SampleDataset, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = dataset[index]
    return x.unsqueeze(0), y.unsqueeze(0)


def _batch(dataset: SampleDataset, ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = [dataset[i] for i in ids]
    return torch.stack([x for x, _ in pairs]), torch.stack([y for _, y in pairs])


def _snapshot(
    model: nn.Module, optimizer: torch.optim.Optimizer, losses: list[float], ids: list[list[int]]
) -> Result:
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return Result(losses, ids, state, optimizer.state_dict())


def train(
    model: ModelSpec,
    dataset: SampleDataset,
    global_batch: int,
    steps: int,
    optimizer: OptimizerSpec,
    *,
    data_seed: int = 0,
    deterministic: bool = True,
) -> Result:
    """Train ``model`` for ``steps`` optimizer steps of ``global_batch`` samples.

    Deterministic (the spec's deterministic mode): for each global position ``i`` in
    order, loss ``l_i`` and gradients ``g_i`` of sample ``i`` alone; ``grad = (g_0 + g_1 +
    ... + g_{B-1}) / B`` accumulated left to right into a clone of ``g_0``; step loss
    ``(l_0 + ... + l_{B-1}) / B`` the same way. Otherwise one forward of the whole batch
    with the loss function's mean. Grads are zeroed (set to None) before each step.
    """
    torch.set_num_threads(1)
    net = model.build()
    net.train()
    loss_of = zoo.loss_fn(model.name)
    params = [p for p in net.parameters() if p.requires_grad]
    opt = optimizer.build(params)
    losses: list[float] = []
    ids_per_step = sample_ids_per_step(steps, global_batch, len(dataset), data_seed)
    for ids in ids_per_step:
        opt.zero_grad(set_to_none=True)
        if deterministic:
            acc: list[torch.Tensor | None] = [None] * len(params)
            total: torch.Tensor | None = None
            for i in ids:
                x, y = _one(dataset, i)
                loss = loss_of(net(x), y)
                grads = torch.autograd.grad(loss, params, allow_unused=True)
                for n, g in enumerate(grads):
                    if g is None:
                        continue
                    cur = acc[n]
                    if cur is None:
                        acc[n] = g.clone()
                    else:
                        cur.add_(g)
                lv = loss.detach()
                if total is None:
                    total = lv.clone()
                else:
                    total.add_(lv)
            for p, a in zip(params, acc, strict=True):
                p.grad = None if a is None else a.div_(global_batch)
            assert total is not None
            losses.append(float(total.div_(global_batch)))
        else:
            x, y = _batch(dataset, ids)
            loss = loss_of(net(x), y)
            loss.backward()
            losses.append(float(loss.detach()))
        opt.step()
    return _snapshot(net, opt, losses, ids_per_step)


@dataclass(frozen=True)
class StageSplit:
    """One pipeline stage of a plan as the split trainer needs it: its blocks
    ``first .. first + count - 1`` and the sample count of every micro-batch that each of
    its devices takes, in plan order (they sum to the micro-batch size)."""

    first: int
    count: int
    samples: tuple[int, ...]


def _stage_modules(net: nn.Sequential, stage: StageSplit) -> nn.Sequential:
    return nn.Sequential(*list(net.children())[stage.first : stage.first + stage.count])


def _buffer_names(net: nn.Sequential, stage: StageSplit) -> list[str]:
    names = [name for name, _ in net.named_children()]
    owned = set(names[stage.first : stage.first + stage.count])
    return [k for k, _ in net.named_buffers() if k.split(".", 1)[0] in owned]


def train_split(
    model: ModelSpec,
    dataset: SampleDataset,
    global_batch: int,
    micro_batch: int,
    stages: Sequence[StageSplit],
    steps: int,
    optimizer: OptimizerSpec,
    *,
    data_seed: int = 0,
) -> Result:
    """Train as a plan's fast mode computes: micro-batch ``m`` holds global positions
    ``[m*b, (m+1)*b)``; in a stage whose devices take ``y_0..y_{g-1}`` samples, device
    ``j`` computes positions ``m*b + sum(y_<j) .. m*b + sum(y_<=j) - 1`` as one batch,
    using its own copy of the stage's buffers; the next stage re-slices the concatenated
    outputs by its own split. The last stage's device ``j`` contributes
    ``loss_fn(out_j, y_j) * len_j / B``; one backward per micro-batch accumulates the
    gradients in micro-batch order. The step loss is the sum of those contributions.

    Stages must cover the blocks contiguously in order. O(steps x B) samples of compute.
    """
    torch.set_num_threads(1)
    net = model.build()
    net.train()
    nblocks = len(list(net.children()))
    expect = 0
    for s in stages:
        if s.first != expect or s.count < 1 or sum(s.samples) != micro_batch or not all(
            y >= 0 for y in s.samples
        ):
            raise ValueError(f"stage {s} does not continue at block {expect} with "
                             f"samples summing to {micro_batch}")
        expect += s.count
    if expect != nblocks or global_batch % micro_batch:
        raise ValueError("stages must cover every block; micro-batch must divide the batch")
    loss_of = zoo.loss_fn(model.name)
    opt = optimizer.build([p for p in net.parameters() if p.requires_grad])
    # every device owns its copy of its stage's buffers; they are swapped into the modules
    # (not copied, which autograd would see as an in-place change) for its slices
    slots = {
        f"{path}.{name}" if path else name: (module, name)
        for path, module in net.named_modules()
        for name, buf in module.named_buffers(recurse=False)
        if buf is not None
    }
    bufs: dict[tuple[int, int], dict[str, torch.Tensor]] = {
        (p, j): {k: slots[k][0]._buffers[slots[k][1]].detach().clone()
                 for k in _buffer_names(net, s)}
        for p, s in enumerate(stages)
        for j in range(len(s.samples))
    }

    def use(device: tuple[int, int]) -> None:
        for k, v in bufs[device].items():
            module, name = slots[k]
            module._buffers[name] = v

    mods = [_stage_modules(net, s) for s in stages]
    losses: list[float] = []
    ids_per_step = sample_ids_per_step(steps, global_batch, len(dataset), data_seed)
    for ids in ids_per_step:
        opt.zero_grad(set_to_none=True)
        step_loss = 0.0
        for m in range(global_batch // micro_batch):
            x, y = _batch(dataset, ids[m * micro_batch : (m + 1) * micro_batch])
            h = x
            contributions: list[torch.Tensor] = []
            for p, (stage, mod) in enumerate(zip(stages, mods, strict=True)):
                outs: list[torch.Tensor] = []
                start = 0
                for j, size in enumerate(stage.samples):
                    if size == 0:
                        continue
                    use((p, j))
                    out = mod(h[start : start + size])
                    if p == len(stages) - 1:
                        part = loss_of(out, y[start : start + size]) * (size / global_batch)
                        contributions.append(part)
                    outs.append(out)
                    start += size
                h = torch.cat(outs)
            total = contributions[0]
            for c in contributions[1:]:
                total = total + c
            total.backward()
            step_loss += float(total.detach())
        losses.append(step_loss)
        opt.step()
    for p, _ in enumerate(stages):
        use((p, 0))
    result = _snapshot(net, opt, losses, ids_per_step)
    result.device_buffers = {
        device: {k: v.detach().clone() for k, v in mine.items()}
        for device, mine in bufs.items()
    }
    return result
