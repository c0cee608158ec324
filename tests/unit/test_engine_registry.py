"""Engines are found by name through the entry-point group ``edgepipe.engines``
(executor/engines/base.py), a third party's included; the torch-pipelining engine refuses,
in one line and before any process starts, the plans and options it cannot run
(executor/engines/torch_pipelining.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from edgepipe.executor.core.options import WorkerOptions
from edgepipe.executor.engines import base
from edgepipe.executor.engines.runtime import EdgepipeEngine
from edgepipe.executor.engines.torch_pipelining import TorchPipeliningEngine
from edgepipe.executor.engines.torch_plans import refusal
from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.profile import BuildSpec

from tests.helpers import reference_trainer as ref
from tests.helpers.engines import THIRD_PARTY, install_engine
from tests.helpers.executor_helpers import (
    MLP_DATASET,
    make_test_plan,
    mlp,
    mlp_dataset,
    profile_mlp,
    write_plan,
)

PROFILE = profile_mlp()


def plan(stages, micro_batch=2, micro_batches=2, **cfg):
    return make_test_plan(PROFILE, stages, micro_batch, micro_batches, **cfg)


def test_the_built_in_engines_are_found_by_name() -> None:
    assert {"edgepipe", "torch-pipelining"} <= set(base.installed())
    assert isinstance(base.find("edgepipe"), EdgepipeEngine)
    assert isinstance(base.find("torch-pipelining"), TorchPipeliningEngine)
    assert base.find("edgepipe").name == base.DEFAULT


def test_an_unknown_engine_name_gets_one_line_listing_the_installed_ones() -> None:
    with pytest.raises(InputError) as refused:
        base.find("tensorflow")
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("--engine: tensorflow: no engine of that name is installed; "
                              "installed: edgepipe, torch-pipelining")


def test_a_third_party_engine_registered_through_an_entry_point_is_found_and_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_engine(tmp_path, monkeypatch)
    assert "one-process" in base.installed()
    engine = base.find("one-process")
    assert engine.name == "one-process"
    p = plan([(0, 2, [2]), (2, 4, [2])], micro_batches=2)
    path = write_plan(p, tmp_path)
    result = engine.run(p, p.problem.model.build,
                        base.RunOptions(WorkerOptions(str(path), 3, dataset=MLP_DATASET)))
    # it really trained: 3 steps; step 0's loss is the untrained model's mean cross-entropy
    # on step 0's batch, worked out here with the reference trainer's own sampler; the
    # updates change the next steps' losses
    batch = ref.step_sample_ids(0, 4, len(mlp_dataset()), p.problem.config.seed)
    x, y = mlp_dataset()[batch]
    with torch.no_grad():
        untrained = float(F.cross_entropy(torch.nn.Sequential(*mlp(width=8))(x), y))
    assert [m["step"] for m in result.metrics] == [0, 1, 2]
    assert result.losses[0] == pytest.approx(untrained, rel=1e-6)
    assert len(set(result.losses)) == 3


def test_an_entry_point_that_is_not_an_engine_is_refused_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_engine(tmp_path, monkeypatch, name="broken",
                   source="class NotAnEngine:\n    name = 'broken'\n", target="NotAnEngine")
    with pytest.raises(InputError, match=r"^--engine: broken: entry point .* gives NotAnEngine, "
                       r"which lacks the engine interface \(name, supports, run"):
        base.find("broken")


def test_the_third_party_source_is_an_engine() -> None:
    namespace: dict[str, object] = {}
    exec(textwrap.dedent(THIRD_PARTY), namespace)  # the text the tests install
    assert isinstance(namespace["OneProcess"](), base.Engine)  # type: ignore[operator]


# -- what the torch-pipelining engine refuses ----------------------------------------------


def test_the_torch_engine_runs_equal_stage_groups_and_pipelines() -> None:
    assert refusal(plan([(0, 2, [2]), (2, 4, [2])])) is None
    assert refusal(plan([(0, 2, [1, 1]), (2, 4, [1, 1])])) is None
    assert refusal(plan([(0, 4, [1, 1])])) is None


def test_the_torch_engine_refuses_uneven_shares_naming_the_pytorch_issue() -> None:
    why = refusal(plan([(0, 2, [3, 1]), (2, 4, [2, 2])], micro_batch=4))
    assert why == ("stage 0 splits each micro-batch unevenly (3/1 samples on d0, d1): "
                   "torch's data parallelism gives every replica the same batch "
                   "(pytorch#126600); run it with --engine edgepipe")


def test_the_torch_engine_refuses_stages_of_different_widths() -> None:
    why = refusal(plan([(0, 2, [1, 1]), (2, 4, [2])]))
    assert why is not None and why.startswith("its stages have different numbers of devices "
                                              "(2, 1): torch pipelining runs one pipeline")


def test_the_torch_engine_refuses_1f1b_with_fewer_micro_batches_than_stages() -> None:
    three = [(0, 1, [2]), (1, 2, [2]), (2, 4, [2])]
    assert refusal(plan(three, micro_batches=2)) == (
        "torch's Schedule1F1B needs at least as many micro-batches as stages (2 < 3); plan "
        "with schedule gpipe, or run it with --engine edgepipe")
    assert refusal(plan(three, micro_batches=2, schedule="gpipe")) is None


def test_both_engines_refuse_a_model_other_than_the_plans() -> None:
    p = plan([(0, 4, [2])])
    other = BuildSpec(callable="tests.helpers.executor_helpers:mlp", kwargs={"width": 16})
    for engine in (EdgepipeEngine(), TorchPipeliningEngine()):
        why = engine.supports(p, other)
        assert why is not None and "not tests.helpers.executor_helpers:mlp(width=16)" in why
        assert engine.supports(p, p.problem.model.build) is None


@pytest.mark.parametrize(("flag", "change"), [
    ("--recover", {"recover": True}),
    ("--inject", {"faults": "d0:1:forward"}),
    ("--checkpoint-every", {"checkpoint_every": 2}),
    ("--emulate", {"emulate": True}),
    ("--standbys", {"standbys": 1}),
])
def test_the_torch_engine_refuses_options_that_need_fault_tolerance(
        tmp_path: Path, flag: str, change: dict[str, object]) -> None:
    p = plan([(0, 2, [2]), (2, 4, [2])])
    run_level = {k: v for k, v in change.items() if k in ("recover", "standbys")}
    worker = WorkerOptions(str(write_plan(p, tmp_path)), 1,
                           **{k: v for k, v in change.items() if k not in run_level})
    with pytest.raises(InputError, match=rf"^{flag}: the torch-pipelining engine runs without "
                       "edgepipe's fault tolerance"):
        TorchPipeliningEngine().run(p, p.problem.model.build,
                                    base.RunOptions(worker, **run_level))  # type: ignore[arg-type]
