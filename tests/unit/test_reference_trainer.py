"""Specification of the reference trainer (tests/helpers/reference_trainer.py), the executor's
oracle: its sampler follows the data-order spec, its deterministic mode is ordinary
training up to float rounding, sums gradients in global-position order, and its
split-as-the-plan-does mode computes each device slice as one batch."""

from __future__ import annotations

import functools

import pytest
import torch
from edgepipe.executor.profiling import zoo
from torch.utils.data import TensorDataset

from tests.helpers.reference_trainer import (
    ModelSpec,
    OptimizerSpec,
    StageSplit,
    step_sample_ids,
    train,
    train_split,
)

torch.set_num_threads(1)

TEXT = {"layers": 4, "hidden": 16, "heads": 2, "vocab": 40, "seq_len": 6, "max_positions": 8}
BERT = ModelSpec("bert-small", TEXT, seed=7)
GPT = ModelSpec("gpt2-small", TEXT, seed=7)
RESNET = ModelSpec("resnet18", {"resolution": 16, "width": 0.125, "num_classes": 4}, seed=7)
OPTIMIZERS = [
    OptimizerSpec("sgd", lr=0.1),
    OptimizerSpec("momentum", lr=0.1, momentum=0.9),
    # eps well above float noise: Adam divides by sqrt(v), so a gradient that is zero in
    # exact arithmetic (e.g. the key bias of attention) would turn rounding noise into
    # full-size updates in the allclose comparison
    OptimizerSpec("adam", lr=0.01, eps=1e-3),
]


def dataset(spec: ModelSpec, n: int) -> TensorDataset:
    x, y = zoo.example_batch(spec.name, n, seed=11, **spec.sizes)
    return TensorDataset(x, y)


# -- sampler ------------------------------------------------------------------------------


def test_sampler_hand_worked_five_samples_batch_two() -> None:
    # numpy's permutation for SeedSequence((3, 0)) is [4 2 1 3 0], for (3, 1) [1 4 0 2 3];
    # two steps per epoch, sample 0 (epoch 0) and 3 (epoch 1) are the unused leftovers.
    assert [step_sample_ids(t, 2, 5, seed=3) for t in range(4)] == [
        [4, 2], [1, 3], [1, 4], [0, 2]
    ]


def test_sampler_uses_every_sample_exactly_once_per_epoch() -> None:
    for epoch in range(3):
        seen = [i for k in range(4) for i in step_sample_ids(4 * epoch + k, 5, 20, seed=1)]
        assert sorted(seen) == list(range(20))


def test_sampler_orders_differ_between_epochs_and_seeds() -> None:
    assert step_sample_ids(0, 20, 20, seed=1) != step_sample_ids(1, 20, 20, seed=1)
    assert step_sample_ids(0, 20, 20, seed=1) != step_sample_ids(0, 20, 20, seed=2)


def test_sampler_refuses_a_dataset_smaller_than_the_batch() -> None:
    with pytest.raises(ValueError, match="3 samples < global batch 4"):
        step_sample_ids(0, 4, 3, seed=0)


def test_train_reports_the_sampler_ids_of_every_step() -> None:
    result = train(BERT, dataset(BERT, 12), 4, 4, OPTIMIZERS[0], data_seed=5)
    assert result.sample_ids == [step_sample_ids(t, 4, 12, seed=5) for t in range(4)]


# -- deterministic mode -------------------------------------------------------------------


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=lambda o: o.kind)
@pytest.mark.parametrize("spec", [BERT, GPT], ids=lambda s: s.name)
def test_deterministic_agrees_with_full_batch_training(spec: ModelSpec, opt: OptimizerSpec
                                                       ) -> None:
    data = dataset(spec, 16)
    per_sample = train(spec, data, 8, 3, opt, data_seed=2, deterministic=True)
    full = train(spec, data, 8, 3, opt, data_seed=2, deterministic=False)
    assert per_sample.losses == pytest.approx(full.losses, rel=1e-5)
    for key, value in full.state.items():
        assert torch.allclose(per_sample.state[key], value, rtol=1e-4, atol=1e-6), key
    assert per_sample.optimizer["state"].keys() == full.optimizer["state"].keys()


def test_deterministic_gradient_is_the_in_order_sum_of_per_sample_gradients() -> None:
    # Independent computation: a fresh model per sample, .backward() instead of
    # autograd.grad, then functools.reduce in global-position order and one SGD step
    # by hand; must match bit for bit.
    data = dataset(BERT, 8)
    lr, batch = 0.5, 4
    result = train(BERT, data, batch, 1, OptimizerSpec("sgd", lr=lr), data_seed=9)
    ids = step_sample_ids(0, batch, 8, seed=9)
    grads, losses = [], []
    for i in ids:
        net = BERT.build()
        x, y = data[i]
        loss = zoo.loss_fn(BERT.name)(net(x[None]), y[None])
        loss.backward()
        grads.append({k: p.grad for k, p in net.named_parameters()})
        losses.append(loss.detach())
    start = dict(BERT.build().named_parameters())
    for key, p0 in start.items():
        acc = functools.reduce(lambda a, b: a.add_(b), [g[key] for g in grads[1:]],
                               grads[0][key].clone()).div_(batch)
        assert torch.equal(result.state[key], p0.detach() - lr * acc), key
    total = functools.reduce(lambda a, b: a.add_(b), losses[1:], losses[0].clone())
    assert result.losses == [float(total.div_(batch))]


def test_deterministic_training_is_bitwise_repeatable() -> None:
    data = dataset(GPT, 8)
    a = train(GPT, data, 4, 2, OPTIMIZERS[2])
    b = train(GPT, data, 4, 2, OPTIMIZERS[2])
    assert a.losses == b.losses
    assert all(torch.equal(a.state[k], b.state[k]) for k in a.state)
    assert all(
        torch.equal(a.optimizer["state"][n]["exp_avg"], b.optimizer["state"][n]["exp_avg"])
        for n in a.optimizer["state"]
    )


# -- split as the plan does ---------------------------------------------------------------


@pytest.mark.parametrize("spec", [BERT, RESNET], ids=lambda s: s.name)
def test_split_with_one_device_is_ordinary_full_batch_training(spec: ModelSpec) -> None:
    data = dataset(spec, 8)
    nblocks = len(spec.build())
    split = train_split(spec, data, 4, 4, [StageSplit(0, nblocks, (4,))], 2, OPTIMIZERS[1])
    full = train(spec, data, 4, 2, OPTIMIZERS[1], deterministic=False)
    assert split.losses == full.losses
    assert all(torch.equal(split.state[k], full.state[k]) for k in full.state)


def test_split_pipeline_with_unequal_widths_agrees_with_the_deterministic_reference() -> None:
    # 6 blocks as stages of widths 2 -> 1 -> 3 with uneven sample counts; no batch norm,
    # so only float rounding separates it from per-sample training.
    data = dataset(BERT, 24)
    stages = [StageSplit(0, 2, (1, 3)), StageSplit(2, 1, (4,)), StageSplit(3, 3, (2, 1, 1))]
    split = train_split(BERT, data, 12, 4, stages, 3, OPTIMIZERS[1], data_seed=4)
    ref = train(BERT, data, 12, 3, OPTIMIZERS[1], data_seed=4)
    assert split.losses == pytest.approx(ref.losses, rel=1e-5)
    for key, value in ref.state.items():
        assert torch.allclose(split.state[key], value, rtol=1e-4, atol=1e-6), key


def test_split_batch_norm_statistics_are_those_of_each_device_slice() -> None:
    data = dataset(RESNET, 5)
    nblocks = len(RESNET.build())
    result = train_split(
        RESNET, data, 5, 5, [StageSplit(0, nblocks, (2, 3))], 1, OPTIMIZERS[0]
    )
    x = data[step_sample_ids(0, 5, 5, seed=0)][0]
    for device, rows in [(0, slice(0, 2)), (1, slice(2, 5))]:
        fresh = RESNET.build()
        fresh(x[rows])
        buffers = dict(fresh.named_buffers())
        mine = result.device_buffers[(0, device)]
        assert mine.keys() == buffers.keys()
        assert all(torch.equal(mine[k], buffers[k]) for k in buffers)


def test_split_changes_a_batch_norm_model() -> None:
    data = dataset(RESNET, 8)
    nblocks = len(RESNET.build())
    whole = train_split(RESNET, data, 4, 4, [StageSplit(0, nblocks, (4,))], 1, OPTIMIZERS[0])
    halves = train_split(RESNET, data, 4, 4, [StageSplit(0, nblocks, (2, 2))], 1,
                         OPTIMIZERS[0])
    assert whole.losses != halves.losses


def test_split_refuses_stages_that_do_not_cover_the_model() -> None:
    with pytest.raises(ValueError, match="continue at block 2"):
        train_split(BERT, dataset(BERT, 4), 4, 4,
                    [StageSplit(0, 2, (4,)), StageSplit(3, 3, (4,))], 1, OPTIMIZERS[0])
