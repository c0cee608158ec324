"""Built-in datasets: shapes, labels, learnable structure, and the errors for misuse."""

from __future__ import annotations

import pytest
import torch
from edgepipe.executor.core.data import Rows, load_dataset
from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.profile import BuildSpec

IMAGE = BuildSpec(zoo="resnet18", sizes={"resolution": 16, "num_classes": 10})
GPT2 = BuildSpec(zoo="gpt2-small", sizes={"vocab": 32, "seq_len": 5})
BERT = BuildSpec(zoo="bert-small", sizes={"vocab": 40, "seq_len": 4, "num_classes": 2})


def test_synthetic_images_are_class_prototypes_plus_noise():
    data = load_dataset("synthetic", IMAGE, seed=0)
    x, y = data.x, data.y
    assert x.shape == (512, 3, 16, 16) and y.dtype == torch.int64
    assert set(y.tolist()) == set(range(10))
    # two samples of a class are closer than samples of different classes, on average
    means = torch.stack([x[y == c].mean(0) for c in range(10)])
    within = (x - means[y]).pow(2).mean()
    between = (means[:, None] - means[None]).pow(2).mean()
    assert within < between


def test_synthetic_language_task_predicts_the_next_token_by_adding_one():
    data = load_dataset("synthetic", GPT2, seed=1)
    assert data.x.shape == (512, 5)
    assert torch.equal(data.y, (data.x + 1) % 32)


def test_synthetic_bert_label_is_read_from_the_first_token():
    data = load_dataset("synthetic", BERT, seed=2)
    assert torch.equal(data.y, (data.x[:, 0] >= 20).long())


def test_digits_are_resized_normalised_three_channel_images():
    data = load_dataset("digits", IMAGE, seed=0)
    assert data.x.shape == (1797, 3, 16, 16)
    assert set(data.y.tolist()) == set(range(10))
    assert abs(float(data.x.mean())) < 0.1
    assert torch.equal(data.x[:, 0], data.x[:, 2])


def test_rows_reads_a_generic_dataset_by_index_list():
    rows = Rows(load_dataset("tests.helpers.executor_helpers:mlp_dataset", IMAGE, seed=0))
    x, y = rows.inputs([3, 1]), rows.targets([3, 1])
    assert x.shape == (2, 6) and y.shape == (2,)


@pytest.mark.parametrize(
    ("name", "build", "message"),
    [
        ("mnist", IMAGE, "unknown dataset 'mnist'"),
        ("digits", GPT2, "is an image dataset; gpt2-small takes tokens"),
        ("synthetic", BuildSpec(callable="tests.helpers.executor_helpers:mlp"),
         "needs a zoo model"),
        ("tests.helpers.executor_helpers:mlp", IMAGE, "must return a map-style torch Dataset"),
    ],
)
def test_misused_datasets_are_refused_with_the_fix(name, build, message):
    with pytest.raises(InputError, match=message):
        load_dataset(name, build, seed=0)
