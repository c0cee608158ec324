"""Stage construction and the block check against the profile."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from edgepipe.executor.core.stage import build_stage, check_build, stage_loss
from edgepipe.executor.profiling import zoo
from edgepipe.planner.api import resolve, shipped
from edgepipe.planner.errors import PlanMismatchError
from edgepipe.planner.inputs.profile import BuildSpec, ModelProfile

ZOO_PROFILES = [n for n in shipped("models") if not n.startswith("pipedream")]


@pytest.mark.parametrize("name", ZOO_PROFILES)
def test_every_shipped_zoo_profile_builds_the_blocks_it_describes(name):
    profile = ModelProfile.load(resolve(name, "models"))
    assert profile.build is not None and profile.build.zoo == profile.name
    check_build(profile)  # on the meta device: no weights are allocated


def test_a_profile_whose_parameter_bytes_differ_is_refused():
    profile = ModelProfile.load(resolve("vgg16-analytic", "models"))
    blocks = list(profile.blocks)
    blocks[14] = replace(blocks[14], param_bytes=blocks[14].param_bytes + 4)
    with pytest.raises(PlanMismatchError, match=r"block 14 \('fc7'\) has 67125248 parameter "
                       r"bytes but profile 'vgg16' says 67125252"):
        check_build(replace(profile, blocks=tuple(blocks)))


def test_a_stage_has_exactly_the_blocks_and_weights_of_the_whole_model():
    sizes = {"layers": 2, "hidden": 16, "heads": 2, "vocab": 32, "max_positions": 8,
             "seq_len": 4}
    whole = zoo.build_model("gpt2-small", seed=4, **sizes)
    profile = ModelProfile.load(resolve("gpt2-small-analytic", "models"))
    # a profile of the small model: same block names, its own parameter bytes
    small = replace(
        profile,
        blocks=tuple(
            replace(profile.blocks[0], name=n, param_bytes=float(
                sum(p.numel() * 4 for p in b.parameters())))
            for n, b in whole.named_children()
        ),
        timings={},
        build=BuildSpec(zoo="gpt2-small", sizes=sizes, seed=4),
    )
    stage = build_stage(small, 1, 3)
    assert [n for n, _ in stage.named_children()] == ["layer0", "layer1"]
    full = whole.state_dict()
    for key, value in stage.state_dict().items():
        assert torch.equal(value, full[key])
    assert stage_loss(small) is zoo.cross_entropy
