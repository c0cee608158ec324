"""Specification of the model zoo: published sizes, chains of blocks that are the model,
an independent functional forward per architecture, per-block seeded initialisation,
example batches, losses and bring-your-own models."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from edgepipe.executor.profiling import zoo
from edgepipe.executor.profiling.models import cnn, transformer
from edgepipe.planner.errors import InputError
from torch import nn

torch.set_num_threads(1)

IMAGE = {"resolution": 32, "width": 0.25, "num_classes": 10}
TEXT = {"layers": 2, "hidden": 32, "heads": 4, "vocab": 50, "seq_len": 8, "max_positions": 16}
BATCH = 2


def tiny(name: str) -> dict[str, int | float]:
    return IMAGE if zoo.ZOO[name].is_image else TEXT


# -- sizes at full scale ------------------------------------------------------------------

BERT_SMALL = (
    (30522 + 512 + 2) * 512 + 2 * 512  # token, position, segment embeddings; layer norm
    + 4 * (512 * 1536 + 1536 + 512 * 512 + 512 + 2 * 2 * 512  # qkv, proj, 2 layer norms
           + 512 * 2048 + 2048 + 2048 * 512 + 512)  # MLP
    + 512 * 512 + 512 + 512 * 2 + 2  # pooler, classifier
)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("resnet18", 11_689_512),  # torchvision / He et al.
        ("resnet50", 25_557_032),
        ("mobilenetv2", 3_504_872),
        ("efficientnet-b0", 5_288_548),
        ("vgg16", 138_357_544),
        ("bert-base", 109_482_240 + 768 * 2 + 2),  # BertModel + 2-class classifier
        ("bert-small", BERT_SMALL),
        ("gpt2-small", 124_439_808 + 50257 * 768),  # GPT-2 + its untied LM head
    ],
)
def test_full_size_parameter_counts_match_the_published_models(name: str, params: int) -> None:
    with torch.device("meta"):
        model = zoo.build_model(name)
    assert sum(p.numel() for p in model.parameters()) == params


def test_block_layout_of_each_model() -> None:
    def names(name: str) -> list[str]:
        with torch.device("meta"):
            return [n for n, _ in zoo.build_model(name).named_children()]

    assert names("resnet18") == ["stem"] + [
        f"layer{s}_{u}" for s in range(1, 5) for u in range(2)
    ] + ["head"]
    assert len(names("resnet50")) == 1 + 3 + 4 + 6 + 3 + 1
    assert names("mobilenetv2") == ["stem"] + [f"block{k}" for k in range(17)] + [
        "last_conv", "head"
    ]
    assert names("efficientnet-b0") == ["stem"] + [f"block{k}" for k in range(16)] + [
        "last_conv", "head"
    ]
    assert names("vgg16") == [
        "conv1_1", "conv1_2", "conv2_1", "conv2_2", "conv3_1", "conv3_2", "conv3_3",
        "conv4_1", "conv4_2", "conv4_3", "conv5_1", "conv5_2", "conv5_3", "fc6", "fc7", "fc8",
    ]
    assert names("bert-base") == ["embed"] + [f"layer{i}" for i in range(12)] + ["head"]
    assert names("bert-small") == ["embed"] + [f"layer{i}" for i in range(4)] + ["head"]
    assert names("gpt2-small") == ["embed"] + [f"layer{i}" for i in range(12)] + ["head"]


def test_width_and_depth_multipliers() -> None:
    assert [cnn.make_divisible(v) for v in (3.2, 16, 20, 37, 100)] == [8, 16, 24, 40, 104]
    assert [cnn.scaled_repeats(n, 0.5) for n in (1, 2, 3, 4)] == [1, 1, 2, 2]
    model = zoo.build_model("resnet18", width=0.25, depth=0.5)
    assert len(model) == 1 + 4 + 1  # one unit per stage
    assert model.stem[0][0].out_channels == 16
    assert model.head.fc.in_features == 128


# -- the chain is the model ---------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(zoo.ZOO))
def test_stages_built_separately_compose_to_the_whole_model(name: str) -> None:
    model = zoo.build_model(name, **tiny(name))
    x = zoo.example_input(name, BATCH, **tiny(name))
    with torch.no_grad():
        whole = model(x)
        # two stages built separately (as two ranks would) compose to the same output
        cut = len(model) // 2
        first = zoo.build_model(name, blocks=range(cut), **tiny(name))
        second = zoo.build_model(name, blocks=range(cut, len(model)), **tiny(name))
        assert torch.equal(second(first(x)), whole)


# Independent functional forwards, written from the papers' descriptions. Convolutional
# models use the same primitive ops as the modules, so they must agree bit for bit;
# attention is spelled out as softmax(QK^T / sqrt(d)) V, so transformers agree to rounding.


def _conv(m: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    return F.conv2d(x, m.weight, m.bias, m.stride, m.padding, m.dilation, m.groups)


def _bn(m: nn.BatchNorm2d, x: torch.Tensor) -> torch.Tensor:
    return F.batch_norm(x, None, None, m.weight, m.bias, training=True, eps=m.eps)


def _layer(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Reference of one standard layer or a plain sequence of them."""
    if type(m) in (nn.Sequential, cnn.ConvBNAct, cnn.LinearReLU):
        for child in m:
            x = _layer(child, x)
        return x
    leaf = {
        nn.Conv2d: lambda: _conv(m, x),
        nn.BatchNorm2d: lambda: _bn(m, x),
        nn.ReLU: lambda: F.relu(x),
        nn.ReLU6: lambda: F.hardtanh(x, 0.0, 6.0),
        nn.SiLU: lambda: F.silu(x),
        nn.MaxPool2d: lambda: F.max_pool2d(x, 3, 2, 1),
        nn.Linear: lambda: F.linear(x, m.weight, m.bias),
    }
    return leaf[type(m)]()


def _residual(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Inverted residuals add the input exactly when the shapes allow it."""
    return x + y if x.shape == y.shape else y


VGG_POOLS_AFTER = {"conv1_2", "conv2_2", "conv3_3", "conv4_3", "conv5_3"}


def _cnn_block(name: str, m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if isinstance(m, cnn.BasicBlock):
        short = x if m.downsample is None else _layer(m.downsample, x)
        y = F.relu(_bn(m.bn1, _conv(m.conv1, x)))
        return F.relu(_bn(m.bn2, _conv(m.conv2, y)) + short)
    if isinstance(m, cnn.Bottleneck):
        short = x if m.downsample is None else _layer(m.downsample, x)
        y = F.relu(_bn(m.bn1, _conv(m.conv1, x)))
        y = F.relu(_bn(m.bn2, _conv(m.conv2, y)))
        return F.relu(_bn(m.bn3, _conv(m.conv3, y)) + short)
    if isinstance(m, cnn.InvertedResidual):
        return _residual(x, _layer(m.conv, x))
    if isinstance(m, cnn.MBConv):
        *pre, se, project = m.block
        y = _layer(nn.Sequential(*pre), x)
        s = F.adaptive_avg_pool2d(y, 1)
        s = torch.sigmoid(_conv(se.fc2, F.silu(_conv(se.fc1, s))))
        return _residual(x, _layer(project, y * s))
    if isinstance(m, cnn.PoolLinear):
        return F.linear(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1), m.fc.weight, m.fc.bias)
    if isinstance(m, cnn.ConvReLU):
        y = F.relu(_conv(m.conv, x))
        return F.max_pool2d(y, 2) if name in VGG_POOLS_AFTER else y
    if isinstance(m, cnn.VGGClassifierIn):
        y = torch.flatten(F.adaptive_avg_pool2d(x, 7), 1)
        return F.relu(F.linear(y, m.fc.weight, m.fc.bias))
    return _layer(m, x)


def _attention(m: transformer.SelfAttention, x: torch.Tensor, causal: bool) -> torch.Tensor:
    b, n, d = x.shape
    h = m.heads

    def split(t: torch.Tensor) -> torch.Tensor:
        return t.view(b, n, h, d // h).transpose(1, 2)

    q, k, v = (
        split(F.linear(x, w, bias))
        for w, bias in zip(m.qkv.weight.chunk(3), m.qkv.bias.chunk(3), strict=True)
    )
    scores = q @ k.transpose(-2, -1) / math.sqrt(d // h)
    if causal:
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, d)
    return F.linear(out, m.proj.weight, m.proj.bias)


def _ln(m: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, m.normalized_shape, m.weight, m.bias, m.eps)


def _transformer_block(gpt: bool, m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if isinstance(m, transformer.Embeddings):
        h = m.tokens.weight[x] + m.positions.weight[: x.shape[1]]
        return h if gpt else _ln(m.ln, h + m.segments.weight[0])
    if isinstance(m, transformer.TransformerLayer):
        fc1, _, fc2 = m.mlp

        def mlp(t: torch.Tensor) -> torch.Tensor:
            t = F.gelu(F.linear(t, fc1.weight, fc1.bias), approximate="tanh" if gpt else "none")
            return F.linear(t, fc2.weight, fc2.bias)

        if gpt:  # pre-norm, causal
            x = x + _attention(m.attn, _ln(m.ln1, x), causal=True)
            return x + mlp(_ln(m.ln2, x))
        x = _ln(m.ln1, x + _attention(m.attn, x, causal=False))  # post-norm
        return _ln(m.ln2, x + mlp(x))
    if isinstance(m, transformer.ClassifierHead):
        pooled = torch.tanh(F.linear(x[:, 0], m.pooler.weight, m.pooler.bias))
        return F.linear(pooled, m.classifier.weight, m.classifier.bias)
    assert isinstance(m, transformer.LMHead)
    return F.linear(_ln(m.ln, x), m.proj.weight)


@pytest.mark.parametrize("name", sorted(zoo.ZOO))
def test_blocks_agree_with_a_hand_written_functional_forward(name: str) -> None:
    model = zoo.build_model(name, **tiny(name))
    x = zoo.example_input(name, BATCH, **tiny(name))
    with torch.no_grad():
        ref = x
        for block_name, block in model.named_children():
            if zoo.ZOO[name].is_image:
                ref = _cnn_block(block_name, block, ref)
            else:
                ref = _transformer_block(name.startswith("gpt2"), block, ref)
        out = model(x)
    if zoo.ZOO[name].is_image:
        assert torch.equal(out, ref)
    else:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(zoo.ZOO))
def test_one_training_step_reaches_every_parameter(name: str) -> None:
    model = zoo.build_model(name, **tiny(name))
    x, y = zoo.example_batch(name, BATCH, **tiny(name))
    loss = zoo.loss_fn(name)(model(x), y)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters())


# -- initialisation -----------------------------------------------------------------------


def test_each_block_is_initialised_from_its_own_seed_only() -> None:
    full = zoo.build_model("resnet18", seed=7, **IMAGE)
    stage = zoo.build_model("resnet18", seed=7, blocks=[3, 4], **IMAGE)
    assert [n for n, _ in stage.named_children()] == ["layer2_0", "layer2_1"]
    for (_, a), (_, b) in zip(
        stage.state_dict().items(), nn.Sequential(full[3], full[4]).state_dict().items(),
        strict=True,
    ):
        assert torch.equal(a, b)
    other = zoo.build_model("resnet18", seed=8, blocks=[3], **IMAGE)
    assert not torch.equal(other[0].conv1.weight, full[3].conv1.weight)


def test_building_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = zoo.build_model("bert-small", **TEXT)
    assert torch.equal(torch.rand(3), expected)
    torch.manual_seed(999)
    b = zoo.build_model("bert-small", **TEXT)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_init_rules() -> None:
    block = nn.Sequential(nn.Conv2d(4, 8, 3), nn.BatchNorm2d(8), nn.Linear(8, 2))
    block[1].running_mean.fill_(5.0)
    zoo.init_block(block, seed=1)
    assert torch.equal(block[0].bias, torch.zeros(8))
    assert torch.equal(block[1].weight, torch.ones(8))
    assert torch.equal(block[1].running_mean, torch.zeros(8))
    assert torch.equal(block[2].bias, torch.zeros(2))
    # Kaiming normal, fan-out: std = sqrt(2 / (8 * 3 * 3)) = 1/6; 288 weights
    assert abs(block[0].weight.std().item() - 1 / 6) < 0.03
    copy = nn.Sequential(nn.Conv2d(4, 8, 3), nn.BatchNorm2d(8), nn.Linear(8, 2))
    zoo.init_block(copy, seed=1)
    assert torch.equal(copy[0].weight, block[0].weight)
    assert torch.equal(copy[2].weight, block[2].weight)


def test_init_block_refuses_modules_it_cannot_reproduce() -> None:
    with pytest.raises(ValueError, match="PReLU"):
        zoo.init_block(nn.Sequential(nn.PReLU()), seed=0)


def test_block_seed_is_a_pure_function_of_base_seed_and_index() -> None:
    # the same in a fresh interpreter with another hash seed: no process state leaks in
    probe = ("from edgepipe.executor.profiling.zoo import block_seed; "
             "print(block_seed(3, 5), block_seed(0, 0))")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    fresh = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           env=env, check=True, timeout=120).stdout.split()  # fmt: skip
    assert fresh == [str(zoo.block_seed(3, 5)), str(zoo.block_seed(0, 0))]
    assert zoo.block_seed(3, 5) != zoo.block_seed(5, 3)
    seeds = {zoo.block_seed(base, i) for base in range(4) for i in range(50)}
    assert len(seeds) == 200
    assert all(0 <= s < 2**64 for s in seeds)


def test_build_model_rejects_bad_block_indices() -> None:
    for blocks in ([2, 1], [0, 0], [-1], [10]):
        with pytest.raises(InputError, match="strictly increasing"):
            zoo.build_model("resnet18", blocks=blocks, **IMAGE)


# -- inputs, targets and losses -------------------------------------------------------------


def test_example_batches() -> None:
    x, y = zoo.example_batch("resnet50", 3, **IMAGE)
    assert (x.shape, x.dtype, y.shape, y.dtype) == (
        (3, 3, 32, 32), torch.float32, (3,), torch.int64
    )
    assert int(y.max()) < 10
    x, y = zoo.example_batch("bert-base", 3, **TEXT)
    assert x.shape == (3, 8) and y.shape == (3,) and int(x.max()) < 50
    x, y = zoo.example_batch("gpt2-small", 3, **TEXT)
    assert x.shape == y.shape == (3, 8)
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the next tokens
    assert torch.equal(zoo.example_input("gpt2-small", 3, **TEXT), x)
    again, _ = zoo.example_batch("gpt2-small", 3, seed=1, **TEXT)
    assert not torch.equal(again, x)


def test_losses_are_mean_cross_entropy_over_predicted_positions() -> None:
    # uniform logits: the loss is ln(classes) whatever the targets
    assert zoo.loss_fn("resnet18")(torch.zeros(4, 10), torch.arange(4)).item() == pytest.approx(
        math.log(10)
    )
    logits = torch.zeros(2, 3, 7)
    logits[0, 0, 5] = math.log(6.0)  # p(5) = 6 / (6 + 6) = 1/2 at one position
    targets = torch.full((2, 3), 5)
    expected = (math.log(2) + 5 * math.log(7)) / 6
    assert zoo.loss_fn("gpt2-small")(logits, targets).item() == pytest.approx(expected)


# -- sizes and errors ---------------------------------------------------------------------


def test_sizes_resolve_and_parse() -> None:
    assert zoo.resolve_sizes("vgg16", resolution=64)["resolution"] == 64
    assert zoo.resolve_sizes("bert-small")["hidden"] == 512
    assert zoo.parse_sizes("gpt2-small", ["seq_len=64", "ffn=256"]) == {
        "seq_len": 64, "ffn": 256
    }
    assert zoo.parse_sizes("mobilenetv2", ["width=0.5"]) == {"width": 0.5}
    with pytest.raises(InputError, match="has no size 'seq_len'"):
        zoo.build_model("resnet18", seq_len=4)
    with pytest.raises(InputError, match="NAME=VALUE"):
        zoo.parse_sizes("resnet18", ["depth"])
    with pytest.raises(InputError, match="resolution takes int values"):
        zoo.parse_sizes("resnet18", ["resolution=big"])
    with pytest.raises(InputError, match="unknown zoo model 'alexnet'"):
        zoo.build_model("alexnet")


# -- bring your own model -----------------------------------------------------------------


@pytest.fixture
def user_module(tmp_path, monkeypatch) -> str:
    (tmp_path / "my_models.py").write_text(
        textwrap.dedent(
            """
            from torch import nn

            def as_list(width=4):
                return [nn.Linear(3, width), nn.ReLU(), nn.Linear(width, 2)]

            def as_sequential():
                return nn.Sequential(nn.Linear(3, 2))

            def not_a_model():
                return 42

            class Zoo:
                @staticmethod
                def nested():
                    return (nn.Linear(1, 1),)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_models"


def test_load_model_wraps_lists_and_passes_sequentials_through(user_module: str) -> None:
    model = zoo.load_model(f"{user_module}:as_list", width=5)
    assert isinstance(model, nn.Sequential)
    assert [n for n, _ in model.named_children()] == ["0", "1", "2"]
    assert model[0].out_features == 5
    assert len(zoo.load_model(f"{user_module}:as_sequential")) == 1
    assert len(zoo.load_model(f"{user_module}:Zoo.nested")) == 1


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("my_models", "expected 'package.module:callable'"),
        ("no_such_module_xyz:f", "cannot import"),
        ("my_models:missing", "has no attribute"),
        ("my_models:not_a_model", "return an nn.Sequential"),
    ],
)
def test_load_model_errors_name_the_problem(user_module: str, spec: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        zoo.load_model(spec)
