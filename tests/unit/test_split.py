"""Splitting an ordinary nn.Module into a chain of blocks (executor/profiling/split.py)."""

from __future__ import annotations

import pytest
import torch
from edgepipe.executor.profiling import split
from edgepipe.planner.errors import InputError
from torch import nn


class Skip(nn.Module):
    """stem, a ModuleList of four layers, head; layer 0's output skips over layers 1
    and 2 and is added after layer 2 (the add runs in forward, not in a layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(3, 4)
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(4))
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h0 = self.layers[0](self.stem(x))
        h2 = self.layers[2](self.layers[1](h0)) + h0
        return self.head(self.layers[3](h2))


def test_auto_cuts_only_where_one_tensor_crosses():
    # Candidates (children, the ModuleList expanded): stem, layers.0..3, head.
    # stem: where the model starts, no cut.
    # layers.0: before it only stem's output lives            -> 1 value, cut.
    # layers.1: h0 lives (layers.1 reads it, the add later)    -> 1 value, cut.
    # layers.2: h0 (for the add) and layers.1's output live    -> 2 values, no cut.
    # layers.3: h2 (the add's result) lives                    -> 1 value, cut.
    # head:     layers.3's output                              -> 1 value, cut.
    chain, cuts = split.split_module(Skip(), "auto")
    assert cuts == ["layers.0", "layers.1", "layers.3", "head"]
    assert [name for name, _ in chain.named_children()] == [
        "stem", "layers_0", "layers_1", "layers_3", "head"
    ]
    # the block at layers.1 holds layers 1 and 2 (and the skip's add)
    assert sorted(chain.layers_1.state_dict()) == [
        "layers.1.bias", "layers.1.weight", "layers.2.bias", "layers.2.weight"
    ]


def test_a_cut_across_the_skip_is_refused_in_one_line_naming_what_crosses():
    with pytest.raises(InputError) as err:
        split.split_module(Skip(), ["layers.2"], "toy")
    message = str(err.value)
    assert "\n" not in message
    assert message == (
        "toy: cannot cut at 'layers.2': 2 values cross there, not 1: layers_0 (output of "
        "layers.0), layers_1 (output of layers.1); cut where one tensor crosses "
        "(--split auto lists them)"
    )


@pytest.mark.parametrize(
    ("cuts", "problem"),
    [
        (["stem"], "cannot cut at 'stem': it is where the model starts"),
        (["tail"], "cannot cut at 'tail': it is no module of the model"),
        (["head", "layers.1"], "cut 'layers.1' does not come after 'head' in execution "
         "order; list the cuts in the order forward runs them"),
    ],
)
def test_bad_explicit_cuts_are_refused(cuts, problem):
    with pytest.raises(InputError) as err:
        split.split_module(Skip(), cuts, "toy")
    assert str(err.value) == f"toy: {problem}"


def test_the_chain_computes_exactly_what_the_model_computes_with_its_weights():
    torch.manual_seed(3)
    model = Skip()
    x = torch.randn(5, 3)
    for cuts in ("auto", ["layers.1"], ["layers.3"]):
        chain, _ = split.split_module(model, cuts)
        assert torch.equal(chain(x), model(x))
        # the blocks hold the model's own parameters under their original names
        owned = {k.split(".", 1)[1]: v for k, v in chain.state_dict().items()}
        assert owned.keys() == model.state_dict().keys()


def test_tied_weights_across_a_cut_are_refused():
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.mid = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.mid(self.emb(x)) @ self.emb.weight.t()

    with pytest.raises(InputError, match=r"weight emb\.weight is also used by the block at"):
        split.split_module(Tied(), ["mid"], "tied")


def test_a_constant_buffer_read_by_every_layer_goes_to_each_block():
    class Rotary(nn.Module):
        """Every layer reads the model's buffer ``freqs`` (as torchtitan's Llama does)."""

        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("freqs", torch.arange(4.0))
            self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x) * self.freqs
            return x

    model = Rotary()
    chain, cuts = split.split_module(model, "auto")
    assert cuts == ["layers.1", "layers.2"]
    assert [sorted(block.state_dict()) for block in chain] == [
        ["freqs", f"layers.{i}.bias", f"layers.{i}.weight"] for i in range(3)
    ]
    x = torch.randn(2, 4)
    assert torch.equal(chain(x), model(x))


def test_a_model_with_two_inputs_or_a_tuple_output_is_refused():
    class Two(nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x + y

    class Pair(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x, x

    with pytest.raises(InputError, match="its forward takes 2 inputs"):
        split.split_module(Two(), "auto")
    with pytest.raises(InputError, match="returns a container"):
        split.split_module(Pair(), "auto")


def test_the_example_gpt_splits_at_every_layer_and_rebuilds_identically():
    chain, build = split.split_source("examples.gpt:factory", "auto")
    assert build.callable == split.BUILDER
    assert build.kwargs == {
        "factory": "examples.gpt:factory",
        "split": ["layers.0", "layers.1", "layers.2", "layers.3", "ln_f", "head"],
        "seed": 0,
        "modules": [["tok_emb", "pos_emb"], ["layers.0"], ["layers.1"], ["layers.2"],
                    ["layers.3"], ["ln_f"], ["head"]],
    }
    again = split.chain(**build.kwargs)
    tokens = torch.randint(64, (2, 16), generator=torch.Generator().manual_seed(0))
    assert torch.equal(again(tokens), chain(tokens))
    from examples import gpt

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = gpt.factory()
    assert torch.equal(chain(tokens), model(tokens))
    # inside a layer the first residual's sum is the only live value before ln2
    with pytest.raises(InputError, match=r"cannot cut at 'layers\.1\.attn': 2 values cross"):
        split.split_source("examples.gpt:factory", "layers.1.attn")
    # a cut inside layers.1 (after its first residual): both blocks run layers.1
    inside = split.split_source("examples.gpt:factory", "layers.1.ln2")[1].kwargs
    assert inside["split"] == ["layers.1.ln2"]
    assert inside["modules"] == [
        ["tok_emb", "pos_emb", "layers.0", "layers.1"],
        ["layers.1", "layers.2", "layers.3", "ln_f", "head"],
    ]


def test_a_rebuild_whose_modules_differ_from_the_profile_is_refused():
    with pytest.raises(InputError, match="the model changed since it was profiled"):
        split.chain("examples.gpt:factory", ["layers.2"], modules=[["tok_emb"], ["head"]])
