"""Measure a chain of blocks into a :class:`~planner.inputs.profile.ModelProfile`.

Method (see docs/executor.md):

* **Sizes**, once, at the largest batch size ``B`` (per-sample figures are the measured
  bytes / ``B``): boundary bytes = the block's output tensor; saved bytes = the distinct
  storages autograd saves during the block's forward, caught with
  ``torch.autograd.graph.saved_tensors_hooks`` (tensors sharing a storage, e.g. views of
  one projection, count once; storages of the block's own parameters and buffers are
  excluded; the block's input counts when an op saves it); parameter bytes; forward
  FLOPs by ``torch.utils.flop_counter.FlopCounterMode`` under the math SDPA kernel (CPU's
  fused attention kernel is not in the counter's registry and would count 0). Counted
  FLOPs are those of matmuls and convolutions (2 per multiply-add), as is conventional.
* **Times**, per block in isolation: the block's input at every batch size (from a
  no-grad pass of the chain) detached, with ``requires_grad`` for every floating input
  after the first block, as in a pipeline stage; ``warmup`` untimed then ``repeats``
  timed rounds, each running forward (building the autograd graph, train mode) and
  backward (from a fixed random output gradient) at every batch size in turn, so that
  interference from other processes spreads over all batch sizes. Reported per batch
  size: the median and the inter-quartile range of the repeats.
* **Paced** (``pace``, for a lab profile: docs/lab.md, "Lab profiles"): ``pace()`` is
  called at the start of every round of every block, outside the timed intervals, then
  one untimed forward at the first batch size takes the round's cold start, so every
  timed forward and backward runs right after other compute, as a stage's blocks do
  within an action of a paced run (the action's one cold start is the runtime's work
  per micro-batch). Without ``pace`` nothing of this runs.
* **Clock**: wall time (``time.perf_counter``) by default, what a device alone runs at.
  ``clock="thread"`` times the CPU time of the calling thread (``time.thread_time``)
  instead, for one torch thread on a shared machine: time the thread spends descheduled
  while other processes run is then not counted (their cache and memory-bandwidth
  interference still is). With one thread, CPU autograd runs forward and backward on
  the calling thread, so nothing of the block's work is missed.

The model is put in train mode; its buffers (batch-norm running statistics) are restored
and its gradients cleared afterwards. The library never prints; pass ``progress`` for a
callback ``(done, total)``.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from itertools import pairwise
from typing import Literal

import torch
from edgepipe.executor.profiling.hostinfo import host_detail, now_iso
from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.profile import Block, BuildSpec, ModelProfile, Timing
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

#: times are stored rounded to this many decimals of a millisecond (0.1 microsecond)
MS_DECIMALS = 4
#: the clocks a profile can be timed with (module docstring)
ClockName = Literal["wall", "thread"]
CLOCKS: dict[ClockName, Callable[[], float]] = {
    "wall": time.perf_counter, "thread": time.thread_time
}


def block_inputs(model: nn.Sequential, x: torch.Tensor) -> list[torch.Tensor]:
    """Inputs of every block of ``model`` for chain input ``x`` (a no-grad pass); element
    ``i`` is block ``i``'s input. A block that returns anything but one tensor is an
    :class:`~planner.errors.InputError`. O(one forward)."""
    inputs = []
    with torch.no_grad():
        for name, block in model.named_children():
            inputs.append(x)
            x = block(x)
            if not isinstance(x, torch.Tensor):
                raise InputError(
                    "model", f"block {name!r}", f"returned {type(x).__name__}; every block "
                    "of a chain must take and return one tensor"
                )
    return inputs


def leaf_input(x: torch.Tensor, first: bool) -> torch.Tensor:
    """``x`` detached as a leaf that requires grad unless it is the chain's input or not
    floating point (token ids): what a pipeline stage receives."""
    return x.detach().requires_grad_(not first and x.is_floating_point())


def saved_bytes(block: nn.Module, x: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Bytes autograd saves for backward in ``block(x)``, and the output.

    Each saved tensor is attributed to its storage; a storage counts once, with its full
    size (a saved view keeps the whole storage alive); storages of the block's parameters
    and buffers are not activations and are skipped. O(one forward).
    """
    own = {t.untyped_storage().data_ptr() for t in (*block.parameters(), *block.buffers())}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in own:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = block(x)
    return sum(seen.values()), out


def forward_flops(block: nn.Module, x: torch.Tensor) -> int:
    """FLOPs of ``block(x)``'s forward counted by ``FlopCounterMode`` with attention on the
    math SDPA kernel (whose matmuls the counter sees). O(one forward)."""
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        counter = FlopCounterMode(display=False)
        with counter:
            block(x)
    return int(counter.get_total_flops())


def time_block(
    block: nn.Module,
    xs: Sequence[torch.Tensor],
    warmup: int,
    repeats: int,
    clock: Callable[[], float] = time.perf_counter,
    pace: Callable[[], None] | None = None,
) -> list[tuple[list[float], list[float]]]:
    """Forward and backward milliseconds of ``block`` on each leaf input of ``xs`` (one
    per batch size), read from ``clock`` (seconds): per input, one entry per timed repeat.

    Round ``r`` runs forward then backward on every input in turn, and rounds
    ``0..warmup-1`` are not timed, so a burst of interference from other processes
    lands on one sample of every batch size instead of on all samples of one. With
    ``pace``, each round starts with ``pace()`` and an untimed forward on ``xs[0]``
    (module docstring, "Paced"). Backward starts from a fixed random output gradient;
    it is 0 when the output needs no gradient (a parameter-free block on the chain
    input). Python's garbage collector is paused while timing. O((warmup + repeats) x
    len(xs) x (forward + backward)).
    """
    out_samples: list[tuple[list[float], list[float]]] = [([], []) for _ in xs]
    grads: list[torch.Tensor | None] = [None for _ in xs]
    gen = torch.Generator().manual_seed(0)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for r in range(warmup + repeats):
            if pace is not None:
                pace()
                block(xs[0])  # untimed: takes the round's cold start
            for k, x in enumerate(xs):
                x.grad = None
                t0 = clock()
                out = block(x)
                t1 = clock()
                grad = grads[k]
                if grad is None:
                    grad = grads[k] = torch.randn(out.shape, generator=gen, dtype=out.dtype)
                backward_ms = 0.0
                if out.requires_grad:
                    t2 = clock()
                    out.backward(grad)
                    backward_ms = (clock() - t2) * 1e3
                if r >= warmup:
                    out_samples[k][0].append((t1 - t0) * 1e3)
                    out_samples[k][1].append(backward_ms)
                del out
    finally:
        if gc_was_enabled:
            gc.enable()
    block.zero_grad(set_to_none=True)
    for x in xs:
        x.grad = None
    return out_samples


def median_and_spread(samples: Sequence[float]) -> tuple[float, float]:
    """Median and inter-quartile range (inclusive quartiles; 0 for a single sample)."""
    if len(samples) == 1:
        return samples[0], 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return statistics.median(samples), q3 - q1


def _check_args(
    batch_sizes: Sequence[int], warmup: int, repeats: int, clock: str, num_threads: int | None
) -> None:
    if not batch_sizes or batch_sizes[0] < 1 or any(
        b <= a for a, b in pairwise(batch_sizes)
    ):
        raise ValueError(f"batch sizes {list(batch_sizes)} must be positive and increasing")
    if warmup < 0 or repeats < 1:
        raise ValueError(f"need warmup >= 0 and repeats >= 1, got {warmup} and {repeats}")
    if clock not in CLOCKS:
        raise ValueError(f"clock {clock!r} is not one of {sorted(CLOCKS)}")
    if clock == "thread" and num_threads != 1:
        raise ValueError(
            f"clock 'thread' times one thread's CPU time; it needs num_threads=1, got "
            f"{num_threads}"
        )


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def profile_model(
    model: nn.Sequential,
    example_input_fn: Callable[[int], torch.Tensor],
    batch_sizes: Sequence[int],
    device_type: str,
    *,
    name: str = "model",
    warmup: int = 2,
    repeats: int = 5,
    num_threads: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    build: BuildSpec | None = None,
    clock: ClockName = "wall",
    pace: Callable[[], None] | None = None,
) -> ModelProfile:
    """Profile every block of ``model`` on this CPU; see the module docstring for the method.

    Args:
        model: the chain; its children are the blocks, each taking and returning one tensor.
        example_input_fn: ``batch -> chain input`` with ``batch`` samples.
        batch_sizes: strictly increasing batch sizes to time.
        device_type: key of the measured :class:`~planner.inputs.profile.Timing`.
        name: the profile's name.
        warmup, repeats: untimed and timed rounds per block (each round covers every
            batch size).
        num_threads: ``torch.set_num_threads`` for the measurement (restored after);
            None keeps the current setting.
        progress: called with ``(done, total)`` after each block of the sizes pass and
            of the timing pass (``total`` = 2 x blocks).
        build: how the executor rebuilds ``model`` (zoo name + sizes + seed, or
            ``module:callable`` + kwargs), stored in the profile so its plans can run.
        clock: ``"wall"`` or ``"thread"`` (module docstring; ``"thread"`` needs
            ``num_threads=1``).
        pace: called at the start of every block's every round of the timing pass,
            before an untimed forward (module docstring, "Paced"); None: neither runs.

    Steps: :func:`_measure_sizes` (one sizes pass at the largest batch), then
    :func:`_time_blocks` (one no-grad chain forward per batch size, then (warmup +
    repeats) forward+backward of every block at every batch size; memory holds every
    block's input at every batch size at once), both inside :func:`_measuring`.
    """
    _check_args(batch_sizes, warmup, repeats, clock, num_threads)
    named = list(model.named_children())
    total = 2 * len(named)
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    with _measuring(model, num_threads):
        try:
            chain_input = example_input_fn(batch_sizes[-1])
            blocks = _measure_sizes(model, named, chain_input, batch_sizes[-1], tick)
            timing = _time_blocks(
                model, [block for _, block in named], example_input_fn, batch_sizes, warmup,
                repeats, CLOCKS[clock], tick, pace,
            )
            threads = torch.get_num_threads()
        except (RuntimeError, ValueError) as exc:
            raise InputError(
                f"model {name!r}",
                "",
                f"running it failed while profiling: {exc}. Check the model's sizes against "
                "the batch sizes (e.g. batch norm needs more than one value per channel, so "
                "tiny inputs at batch 1 fail)",
            ) from exc

    return ModelProfile(
        name=name,
        source={
            "kind": "measured",
            "detail": f"{host_detail(threads)}; warmup {warmup}, repeats {repeats}, "
            "median and inter-quartile range"
            + ("; thread CPU time" if clock == "thread" else ""),
            "date": now_iso(),
            "tool": "edgepipe profile",
        },
        input_bytes_per_sample=_nbytes(chain_input) / batch_sizes[-1],
        blocks=blocks,
        build=build,
        timings={device_type: timing},
    )


@contextmanager
def _measuring(model: nn.Sequential, num_threads: int | None) -> Iterator[None]:
    """``model`` in train mode on ``num_threads`` threads (None: as they are) for the
    measurement; afterwards the thread count, the buffers (batch-norm running
    statistics) and the mode are restored and the gradients cleared."""
    saved_threads = torch.get_num_threads()
    saved_buffers = {k: v.clone() for k, v in model.named_buffers()}
    was_training = model.training
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    model.train()
    try:
        yield
    finally:
        torch.set_num_threads(saved_threads)
        with torch.no_grad():
            for key, value in model.named_buffers():
                value.copy_(saved_buffers[key])
        model.zero_grad(set_to_none=True)
        model.train(was_training)


def _measure_sizes(
    model: nn.Sequential,
    named: Sequence[tuple[str, nn.Module]],
    chain_input: torch.Tensor,
    big: int,
    tick: Callable[[], None],
) -> tuple[Block, ...]:
    """The sizes pass (module docstring, "Sizes") over ``model``'s ``named`` blocks:
    every block's parameter, output and saved bytes and forward FLOPs, per sample of
    ``chain_input``'s batch of ``big``; ``tick`` after each block. O(one forward of the
    chain + two of each block)."""
    blocks = []
    for i, ((block_name, block), x) in enumerate(
        zip(named, block_inputs(model, chain_input), strict=True)
    ):
        saved, out = saved_bytes(block, leaf_input(x, i == 0))
        blocks.append(
            Block(
                name=block_name,
                param_bytes=float(sum(_nbytes(p) for p in block.parameters())),
                output_bytes_per_sample=_nbytes(out) / big,
                saved_bytes_per_sample=saved / big,
                forward_flops_per_sample=forward_flops(block, x) / big,
            )
        )
        del out
        tick()
    return tuple(blocks)


def _time_blocks(
    model: nn.Sequential,
    blocks: Sequence[nn.Module],
    example_input_fn: Callable[[int], torch.Tensor],
    batch_sizes: Sequence[int],
    warmup: int,
    repeats: int,
    clock: Callable[[], float],
    tick: Callable[[], None],
    pace: Callable[[], None] | None,
) -> Timing:
    """The timing pass (module docstring, "Times"): :func:`time_block` on each of
    ``model``'s ``blocks`` at every batch size (paced by ``pace``, if any), summarised
    per block and batch size by :func:`median_and_spread` (rounded to ``MS_DECIMALS``);
    ``tick`` after each block.
    O(one no-grad chain forward per batch size + (warmup + repeats) x blocks x batch
    sizes forward+backward); memory holds every block's input at every batch size."""
    mid: tuple[list[tuple[float, ...]], list[tuple[float, ...]]] = ([], [])
    spread: tuple[list[tuple[float, ...]], list[tuple[float, ...]]] = ([], [])
    inputs = [block_inputs(model, example_input_fn(b)) for b in batch_sizes]
    for i, block in enumerate(blocks):
        xs = [leaf_input(per_batch[i], i == 0) for per_batch in inputs]
        timed = time_block(block, xs, warmup, repeats, clock, pace)
        for pass_index in (0, 1):  # forward, backward
            stats = [median_and_spread(samples[pass_index]) for samples in timed]
            mid[pass_index].append(tuple(round(m, MS_DECIMALS) for m, _ in stats))
            spread[pass_index].append(tuple(round(q, MS_DECIMALS) for _, q in stats))
        tick()
    return Timing(
        batch_sizes=tuple(batch_sizes),
        forward_ms=tuple(mid[0]),
        backward_ms=tuple(mid[1]),
        source="measured",
        forward_spread_ms=tuple(spread[0]),
        backward_spread_ms=tuple(spread[1]),
        repeats=repeats,
    )
