"""Deterministic mode is bit-identical to the single-process reference trainer.

Each case runs a real plan with ``executor.launch`` (one spawned process per device, gloo)
for 3 steps and compares, with ``torch.equal``, every step's loss, every final weight
(each data-parallel replica's copy) and every optimizer state tensor with
``tests/helpers/reference_trainer.py``, which shares only the zoo model builder, the loss and
the dataset with the executor.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from edgepipe.executor.core import data
from edgepipe.executor.core.metrics import read_jsonl
from edgepipe.executor.core.options import WorkerOptions
from edgepipe.executor.launch import launch
from edgepipe.executor.profiling import zoo
from edgepipe.planner.inputs.profile import BuildSpec

from tests.helpers import reference_trainer as ref
from tests.helpers.executor_helpers import (
    assert_saved_state_equals,
    make_test_plan,
    profile_of,
    write_plan,
)

STEPS = 3

GPT2 = BuildSpec(
    zoo="gpt2-small",
    sizes={"layers": 4, "hidden": 16, "heads": 2, "vocab": 32, "max_positions": 8, "seq_len": 4},
    seed=3,
)
BERT = BuildSpec(
    zoo="bert-small",
    sizes={"layers": 2, "hidden": 16, "heads": 2, "vocab": 40, "max_positions": 8, "seq_len": 4},
    seed=5,
)
#: VGG-16 has no batch norm: the CNN of the any-plan parity cases
VGG = BuildSpec(zoo="vgg16", sizes={"resolution": 32, "width": 0.015625, "num_classes": 10})

_PROFILES: dict[str, object] = {}


def profile(build: BuildSpec):
    key = build.describe()
    if key not in _PROFILES:
        _PROFILES[key] = profile_of(
            build, lambda b: zoo.example_input(build.zoo, b, **build.sizes), name=build.zoo
        )
    return _PROFILES[key]


def run_and_compare(tmp_path: Path, build: BuildSpec, stages, micro_batch, micro_batches, **cfg):
    plan = make_test_plan(profile(build), stages, micro_batch, micro_batches, **cfg)
    path = write_plan(plan, tmp_path)
    result = launch(
        WorkerOptions(str(path), STEPS, str(tmp_path), deterministic=True, timeout_s=60,
                      save_weights=True)
    )
    config = plan.problem.config
    settings = config.optimizer_settings()
    reference = ref.train(
        ref.ModelSpec(build.zoo, build.sizes, build.seed),
        data.synthetic(build, config.seed),
        config.global_batch,
        STEPS,
        ref.OptimizerSpec(
            config.optimizer,
            lr=settings["lr"],
            momentum=settings.get("momentum", 0.9),
            betas=settings.get("betas", (0.9, 0.999)),
            eps=settings.get("eps", 1e-8),
        ),
        data_seed=config.seed,
    )
    assert result.losses == reference.losses
    assert_saved_state_equals(tmp_path, build, reference)
    return result


def test_pure_data_parallel_with_an_uneven_split_matches_the_reference(tmp_path):
    run_and_compare(tmp_path, GPT2, [(0, 6, [1, 2])], 3, 2, optimizer="sgd")


def test_two_stage_pipeline_with_momentum_matches_the_reference(tmp_path):
    run_and_compare(tmp_path, GPT2, [(0, 3, [2]), (3, 6, [2])], 2, 3, optimizer="momentum")


@pytest.mark.slow
def test_three_stage_pipeline_classic_warmup_with_adam_matches_the_reference(tmp_path):
    result = run_and_compare(
        tmp_path, GPT2, [(0, 2, [2]), (2, 4, [2]), (4, 6, [2])], 2, 4,
        optimizer="adam", learning_rate=0.01, warmup="classic",
    )
    assert len(result.metrics) == STEPS
    # the plan's warm-ups (classic: K_p = P - p = 3, 2, 1) decide the compute order
    timeline = read_jsonl(tmp_path / "timeline.jsonl")

    def order(device):
        return " ".join(f"{e['kind']}{e['micro_batch']}" for e in timeline
                        if e["device"] == device and e["step"] == 0 and e["kind"] in ("F", "B"))

    assert order("d0") == "F0 F1 F2 B0 F3 B1 B2 B3"
    assert order("d1") == "F0 F1 B0 F2 B1 F3 B2 B3"
    assert order("d2") == "F0 B0 F1 B1 F2 B2 F3 B3"


@pytest.mark.slow
def test_hybrid_two_one_three_with_uneven_splits_under_gpipe_matches_the_reference(tmp_path):
    run_and_compare(
        tmp_path, BERT, [(0, 1, [1, 2]), (1, 3, [3]), (3, 4, [1, 1, 1])], 3, 2,
        optimizer="momentum", schedule="gpipe",
    )


@pytest.mark.slow
def test_no_batch_norm_cnn_hybrid_matches_the_reference(tmp_path):
    run_and_compare(tmp_path, VGG, [(0, 7, [1, 1]), (7, 16, [2])], 2, 2, optimizer="adam",
                    learning_rate=0.001)


RESNET = BuildSpec(zoo="resnet18", sizes={"resolution": 32, "width": 0.125, "num_classes": 10})


@pytest.mark.slow
def test_fast_mode_with_batch_norm_matches_the_reference_split_as_the_plan_does(tmp_path):
    """Batch norm depends on the split: fast mode is set against the reference trainer's
    split-as-the-plan-does mode (float tolerance: all-reduce sums in another order),
    every device's own running statistics included."""
    stages = [(0, 4, [2, 2]), (4, 10, [4])]
    prof = profile_of(RESNET, lambda b: zoo.example_input("resnet18", b, **RESNET.sizes),
                      name="resnet18", batch_sizes=(2, 4))
    plan = make_test_plan(prof, stages, 4, 2, optimizer="sgd", learning_rate=0.05)
    path = write_plan(plan, tmp_path)
    result = launch(WorkerOptions(str(path), STEPS, str(tmp_path), timeout_s=60,
                                  save_weights=True))
    reference = ref.train_split(
        ref.ModelSpec("resnet18", RESNET.sizes, RESNET.seed),
        data.synthetic(RESNET, 0),
        8, 4,
        [ref.StageSplit(first, end - first, tuple(samples)) for first, end, samples in stages],
        STEPS,
        ref.OptimizerSpec("sgd", lr=0.05),
    )
    assert result.losses == pytest.approx(reference.losses, rel=1e-5)
    initial = zoo.build_model("resnet18", seed=RESNET.seed, **RESNET.sizes).state_dict()
    for saved in sorted((tmp_path / "weights").glob("rank*.pt")):
        rank = torch.load(saved)
        index = plan.partition.stages[rank["stage"]].devices.index(rank["device"])
        buffers = reference.device_buffers[(rank["stage"], index)]
        for key, value in rank["model"].items():
            want = buffers[key] if key in buffers else reference.state[key]
            # batch norm over 2-sample slices (1 x 1 maps in the last units) amplifies
            # float noise to ~0.5% of the 3 steps' change; a wrong split or shared
            # statistics changes it by ~100%
            change = (want.float() - initial[key].float()).abs().max()
            diff = (value.float() - want.float()).abs().max()
            assert diff <= 0.05 * change + 1e-6, f"{saved.name} {key}: {diff} vs {change}"


@pytest.mark.slow
def test_fast_mode_with_an_uneven_hybrid_split_gives_the_global_batch_mean(tmp_path):
    """Fast mode scales each slice's loss by slice / B and all-reduces: with uneven
    splits that is still the full-batch mean, equal to ordinary full-batch training up
    to float summation order."""
    plan = make_test_plan(profile(GPT2), [(0, 2, [1, 2]), (2, 6, [2, 1])], 3, 2,
                          optimizer="sgd", learning_rate=0.5)
    path = write_plan(plan, tmp_path)
    result = launch(WorkerOptions(str(path), STEPS, str(tmp_path), timeout_s=60,
                                  save_weights=True))
    reference = ref.train(ref.ModelSpec(GPT2.zoo, GPT2.sizes, GPT2.seed),
                          data.synthetic(GPT2, 0), 6, STEPS, ref.OptimizerSpec("sgd", lr=0.5),
                          deterministic=False)
    assert result.losses == pytest.approx(reference.losses, rel=1e-5)
    for saved in sorted((tmp_path / "weights").glob("rank*.pt")):
        for key, value in torch.load(saved)["model"].items():
            assert torch.allclose(value, reference.state[key], rtol=1e-4, atol=1e-6), key
