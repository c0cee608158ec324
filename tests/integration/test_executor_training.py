"""Training learns: the loss falls under hybrid plans, on the synthetic task and on a real
dataset (scikit-learn's handwritten digits), in fast mode (real processes over gloo)."""

from __future__ import annotations

import statistics

import pytest
from edgepipe.executor.core.options import WorkerOptions
from edgepipe.executor.launch import launch
from edgepipe.executor.profiling import zoo
from edgepipe.planner.inputs.profile import BuildSpec

from tests.helpers.executor_helpers import make_test_plan, profile_of, write_plan


def train(tmp_path, build, stages, micro_batch, micro_batches, steps, dataset=None,
          batch_sizes=(1, 2), **cfg):
    profile = profile_of(build, lambda b: zoo.example_input(build.zoo, b, **build.sizes),
                         name=build.zoo, batch_sizes=batch_sizes)
    plan = make_test_plan(profile, stages, micro_batch, micro_batches, **cfg)
    path = write_plan(plan, tmp_path)
    return launch(WorkerOptions(str(path), steps, str(tmp_path), dataset=dataset,
                                timeout_s=60)).losses


@pytest.mark.slow
def test_the_synthetic_language_task_is_learned_under_a_hybrid_plan(tmp_path):
    gpt2 = BuildSpec(zoo="gpt2-small", sizes={"layers": 2, "hidden": 32, "heads": 2,
                                              "vocab": 32, "max_positions": 8, "seq_len": 8})
    losses = train(tmp_path, gpt2, [(0, 2, [1, 3]), (2, 4, [4])], 4, 2, 30,
                   optimizer="adam", learning_rate=0.01)
    # uniform guessing over 32 tokens is ln 32 = 3.47; next = previous + 1 is learnable
    assert losses[0] > 3.0
    assert statistics.mean(losses[-5:]) < 0.5 * losses[0]


@pytest.mark.slow
def test_handwritten_digits_are_learned_by_a_resnet_under_a_hybrid_plan(tmp_path):
    resnet = BuildSpec(zoo="resnet18", sizes={"resolution": 32, "width": 0.125,
                                              "num_classes": 10})
    losses = train(tmp_path, resnet, [(0, 4, [2, 2]), (4, 10, [4])], 4, 4, 60,
                   dataset="digits", batch_sizes=(2, 4), optimizer="adam", learning_rate=0.01)
    assert losses[0] > 2.0  # about ln 10 = 2.30 at the start
    assert statistics.mean(losses[-10:]) < 0.7 * statistics.mean(losses[:5])
