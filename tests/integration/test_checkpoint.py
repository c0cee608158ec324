"""Checkpoints (executor/ft/checkpoint.py): saved atomically under one plan, resumed under
another plan of the same model bit-identically (weights, optimizer state, step, the
remaining losses) against an uninterrupted single-process reference; refused when
nothing is committed or the training differs. Real processes over gloo, real DCP files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from edgepipe.executor.core import data
from edgepipe.executor.core.options import WorkerOptions
from edgepipe.executor.core.runtime import make_optimizer
from edgepipe.executor.core.stage import build_stage
from edgepipe.executor.ft import checkpoint
from edgepipe.executor.ft.coordinator import build_parser
from edgepipe.executor.launch import launch
from edgepipe.executor.profiling import zoo
from edgepipe.executor.worker import parse_args
from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.profile import BuildSpec
from edgepipe.planner.plan import load_plan

from tests.helpers import reference_trainer as ref
from tests.helpers.executor_helpers import (
    assert_saved_state_equals,
    make_test_plan,
    profile_of,
    write_plan,
)
from tests.helpers.paths import REPO

GPT2 = BuildSpec(
    zoo="gpt2-small",
    sizes={"layers": 4, "hidden": 16, "heads": 2, "vocab": 32, "max_positions": 8, "seq_len": 4},
    seed=3,
)
CONFIG = {"optimizer": "adam", "learning_rate": 0.01}


@pytest.fixture(scope="module")
def gpt2_profile():
    return profile_of(GPT2, lambda b: zoo.example_input("gpt2-small", b, **GPT2.sizes),
                      name="gpt2-small")


def opts(plan_path: Path, out: Path, steps: int, **kw) -> WorkerOptions:
    return WorkerOptions(str(plan_path), steps, str(out), deterministic=True, timeout_s=60,
                         **kw)


@pytest.mark.slow
def test_saved_under_one_plan_resumed_under_another_is_bit_identical(tmp_path: Path,
                                                                    gpt2_profile) -> None:
    # plan A: two-stage pipeline; plan B: a 2 -> 1 hybrid with another cut and split
    plan_a = make_test_plan(gpt2_profile, [(0, 2, [3]), (2, 6, [3])], 3, 2, **CONFIG)
    plan_b = make_test_plan(gpt2_profile, [(0, 4, [1, 2]), (4, 6, [3])], 3, 2, **CONFIG)
    path_a = write_plan(plan_a, tmp_path, "a.json")
    path_b = write_plan(plan_b, tmp_path, "b.json")
    first = launch(opts(path_a, tmp_path / "a", 2, checkpoint_every=2))
    saved = tmp_path / "a" / "checkpoints" / "step-00000002"
    assert (saved / checkpoint.MARKER).is_file()
    assert not list((tmp_path / "a" / "checkpoints").glob(".*.tmp"))
    second = launch(opts(path_b, tmp_path / "b", 4, resume=str(tmp_path / "a"),
                         save_weights=True))
    config = plan_a.problem.config
    settings = config.optimizer_settings()
    reference = ref.train(
        ref.ModelSpec(GPT2.zoo, GPT2.sizes, GPT2.seed), data.synthetic(GPT2, config.seed),
        config.global_batch, 4,
        ref.OptimizerSpec("adam", lr=settings["lr"], betas=settings["betas"],
                          eps=settings["eps"]),
        data_seed=config.seed,
    )
    assert first.losses + second.losses == reference.losses
    assert [m["step"] for m in second.metrics] == [2, 3]
    assert_saved_state_equals(tmp_path / "b", GPT2, reference)


def test_an_uncommitted_checkpoint_is_never_resumed(tmp_path: Path) -> None:
    (tmp_path / "checkpoints" / "step-00000004").mkdir(parents=True)  # no marker
    (tmp_path / "checkpoints" / ".step-00000006.tmp").mkdir()
    done = tmp_path / "checkpoints" / "step-00000002"
    done.mkdir()
    (done / checkpoint.MARKER).write_text("2\n")
    assert checkpoint.resolve(tmp_path) == done
    assert checkpoint.resolve(done) == done
    with pytest.raises(InputError, match="no committed checkpoint"):
        checkpoint.resolve(tmp_path / "checkpoints" / "step-00000004")


@pytest.mark.slow
def test_resuming_with_another_optimizer_is_refused_before_any_process(
    tmp_path: Path, gpt2_profile
) -> None:
    plan_a = make_test_plan(gpt2_profile, [(0, 6, [3])], 3, 2, **CONFIG)
    launch(opts(write_plan(plan_a, tmp_path, "a.json"), tmp_path / "a", 1, checkpoint_every=1))
    plan_b = make_test_plan(gpt2_profile, [(0, 6, [3])], 3, 2, optimizer="momentum")
    path_b = write_plan(plan_b, tmp_path, "b.json")
    with pytest.raises(InputError, match="checkpoint has optimizer 'adam' but plan"):
        launch(opts(path_b, tmp_path / "b", 2, resume=str(tmp_path / "a")))
    assert not (tmp_path / "b" / "ranks.json").exists()
    assert checkpoint.check_resume(load_plan(tmp_path / "a.json"), tmp_path / "a")


def test_a_worker_imports_torchs_distributed_checkpoint_only_when_it_uses_it():
    # DCP pulls in DTensor and sympy: about 1 s of CPU per worker process here, paid by
    # every local rank at start-up unless the import waits for a DCP save or load
    probe = ("import sys, edgepipe.executor.worker, edgepipe.executor.launch; "
             "print(sorted(m for m in ('torch.distributed.checkpoint', 'sympy') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=REPO).stdout
    assert out == "[]\n"


def _trained(plan, steps: int):
    """The one stage of ``plan`` and its optimizer after ``steps`` Adam steps on seeded
    random gradients (each step count gives other weights and optimizer state)."""
    stage = plan.partition.stages[0]
    module = build_stage(plan.problem.model, stage.first, stage.end)
    config = plan.problem.config
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = make_optimizer(params, config.optimizer, config.optimizer_settings())
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=generator)
        optimizer.step()
    return module, optimizer


def _commit(layout: str, group, folder: Path, steps: int, module, optimizer, plan,
            keep: int) -> None:
    """Commit the one-stage checkpoint of ``steps`` in ``layout`` (a DCP save over
    ``group``, or device d0's part), keeping the newest ``keep``."""
    if layout == "dcp":
        checkpoint.Dcp(group).save(folder, steps, module, optimizer, 0, plan, 0, keep)
    else:
        part = checkpoint.Parts.part_bytes(steps, module, optimizer, 0, "adam")
        checkpoint.Parts.write(folder, steps, "d0", part)
        checkpoint.Parts.commit(folder, steps, plan, ["d0"], keep)


@pytest.mark.parametrize("layout", ["dcp", "parts"])
def test_a_folder_with_two_committed_steps_resumes_from_the_newest(tmp_path: Path, gpt2_profile,
                                                                   layout: str) -> None:
    # executor/ft/checkpoint.py: resolve picks the committed step-* with the most steps,
    # resume_step reads its step, load fills the state from it: in each layout
    plan = make_test_plan(gpt2_profile, [(0, 6, [3])], 3, 2, **CONFIG)
    folder = tmp_path / "checkpoints"
    group = None
    if layout == "dcp":
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        group = dist.group.WORLD
    try:
        for steps in (2, 10):
            module, optimizer = _trained(plan, steps)
            _commit(layout, group, folder, steps, module, optimizer, plan, 2)
        assert sorted(d.name for d in folder.glob("step-*")) == ["step-00000002",
                                                                  "step-00000010"]
        assert checkpoint.resume_step(tmp_path) == 10
        newest, newest_optimizer = _trained(plan, 10)
        module, optimizer = _trained(plan, 0)
        assert checkpoint.load(tmp_path, module, optimizer, 0, plan, group) == 10
    finally:
        if group is not None:
            dist.destroy_process_group()
    for (name, got), want in zip(module.state_dict().items(), newest.state_dict().values(),
                                 strict=True):
        assert torch.equal(got, want), name
    for p, q in zip(module.parameters(), newest.parameters(), strict=True):
        for key, value in newest_optimizer.state[q].items():
            assert torch.equal(optimizer.state[p][key], value), key


def _committed_steps(folder: Path) -> list[str]:
    return sorted(d.name for d in folder.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("recover", [False, None], ids=["dcp", "parts"])
def test_a_run_checkpointing_every_step_keeps_the_newest_k_and_resumes_from_the_newest(
    tmp_path: Path, gpt2_profile, recover: bool | None
) -> None:
    # executor/ft/checkpoint.py, "Retention": 4 steps, a checkpoint after each, K = 2:
    # after each commit the older ones go, so steps 3 and 4 stay and nothing else (no
    # .tmp, no .del); a plain run saves DCP checkpoints, a recovering one (the plan
    # replicates every step) parts
    plan = make_test_plan(gpt2_profile, [(0, 2, [3]), (2, 6, [3])], 3, 2, **CONFIG)
    path = write_plan(plan, tmp_path, "a.json")
    launch(opts(path, tmp_path / "a", 4, checkpoint_every=1, keep_checkpoints=2),
           recover=recover)
    folder = tmp_path / "a" / "checkpoints"
    assert _committed_steps(folder) == ["step-00000003", "step-00000004"]
    layout = "parts" if recover is None else "dcp"
    assert ((folder / "step-00000004" / checkpoint.PARTS).is_dir()) == (layout == "parts")
    resumed = launch(opts(path, tmp_path / "b", 5, resume=str(tmp_path / "a")), recover=recover)
    assert [m["step"] for m in resumed.metrics] == [4]


@pytest.mark.parametrize("layout", ["dcp", "parts"])
def test_a_commit_keeps_the_newest_k_and_clears_an_interrupted_deletion(
    tmp_path: Path, gpt2_profile, layout: str
) -> None:
    # a crash mid-deletion (checkpoint.prune) leaves a renamed .step-N.del folder, never
    # a half-deleted step-N: resolve does not see it, the next commit removes it
    plan = make_test_plan(gpt2_profile, [(0, 6, [3])], 3, 2, **CONFIG)
    folder = tmp_path / "checkpoints"
    (folder / ".step-00000001.del" / "parts").mkdir(parents=True)
    (folder / ".step-00000001.del" / checkpoint.MARKER).write_text("1\n")
    with pytest.raises(InputError, match="no committed checkpoint"):
        checkpoint.resolve(folder)
    group = None
    if layout == "dcp":
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        group = dist.group.WORLD
    kept = []
    try:
        for steps in (2, 3, 4, 5):
            module, optimizer = _trained(plan, 1)
            _commit(layout, group, folder, steps, module, optimizer, plan, 3)
            kept.append(_committed_steps(folder))
    finally:
        if group is not None:
            dist.destroy_process_group()
    assert kept == [["step-00000002"], ["step-00000002", "step-00000003"],
                    ["step-00000002", "step-00000003", "step-00000004"],
                    ["step-00000003", "step-00000004", "step-00000005"]]
    assert checkpoint.resume_step(folder) == 5


def test_keeping_fewer_than_one_checkpoint_is_refused_when_the_arguments_are_parsed(
    tmp_path: Path,
) -> None:
    # edgepipe run and coordinate (argparse: exit 2, one line naming the flag) and the
    # worker, before any plan is read (this one does not exist)
    for command in (["run", "no-plan.json", "--keep-checkpoints", "0"],
                    ["coordinate", "no-plan.json", "--recover", "--steps", "2",
                     "--keep-checkpoints", "-1"],
                    ["-m", "edgepipe.executor.worker", "no-plan.json", "--steps", "2",
                     "--keep-checkpoints", "0"]):
        argv = ([sys.executable, *command] if command[0] == "-m"
                else [str(REPO / ".venv" / "bin" / "edgepipe"), *command])
        done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 2, done
        assert "--keep-checkpoints: must be at least 1, got" in done.stderr.splitlines()[-1]
    with pytest.raises(InputError, match=r"--keep-checkpoints.*must be at least 1, got 0"):
        checkpoint.prune(tmp_path, 0)
    # a K the worker and the coordinator accept reaches their options, the default is 2
    argv = ["p.json", "--steps", "2", "--heartbeat", "0.5"]
    assert parse_args([*argv, "--keep-checkpoints", "3"]) == WorkerOptions(
        "p.json", 2, heartbeat_s=0.5, keep_checkpoints=3)
    assert parse_args(argv).keep_checkpoints == 2
    assert build_parser().parse_args(["p.json", "--keep-checkpoints", "5"]).keep_checkpoints == 5
