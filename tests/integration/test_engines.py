"""Plans trained on the torch-pipelining engine (real processes over gloo, torch's own
PipelineStage, Schedule1F1B / ScheduleGPipe), set against edgepipe's runtime and
the single-process reference trainer; the CLI's --engine with a third party's engine and
with a plan the torch engine refuses.

Exactness (executor/engines/torch_worker.py, "Step"): with the micro-batch count ``M`` and
the group width ``g`` powers of two, the torch engine's gradients are the runtime's fast
mode's bit for bit (every scaling, ``1/M``, ``1/g``, ``slice/B``, is exact in floating point).
Against the deterministic reference (per-sample gradients summed in position order) the
two differ by float summation order only: the bound below is 1e-6 of each weight's scale.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch
from edgepipe.executor.core import data
from edgepipe.executor.core.metrics import read_jsonl
from edgepipe.executor.core.options import WorkerOptions
from edgepipe.executor.engines import base
from edgepipe.executor.launch import RunResult
from edgepipe.executor.profiling import split, zoo
from edgepipe.planner.inputs.profile import BuildSpec, ModelProfile
from edgepipe.planner.plan import Plan
from torch import nn

from examples import gpt
from tests.helpers import needs, netns
from tests.helpers import reference_trainer as ref
from tests.helpers.engines import install_engine
from tests.helpers.executor_helpers import make_test_plan, profile_of, write_plan
from tests.helpers.paths import REPO
from tests.helpers.processes import PY, torchrun_argv

STEPS = 5
GPT2 = BuildSpec(
    zoo="gpt2-small",
    sizes={"layers": 2, "hidden": 16, "heads": 2, "vocab": 32, "max_positions": 8, "seq_len": 4},
    seed=3,
)
_PROFILE: dict[str, ModelProfile] = {}


def gpt2_plan(stages, micro_batch: int, micro_batches: int, **cfg) -> Plan:
    if "p" not in _PROFILE:
        _PROFILE["p"] = profile_of(
            GPT2, lambda b: zoo.example_input("gpt2-small", b, **GPT2.sizes), name="gpt2")
    return make_test_plan(_PROFILE["p"], stages, micro_batch, micro_batches,
                          replication_interval=0, **cfg)


def run(engine: str, plan: Plan, folder: Path, dataset: str | None = None,
        deterministic: bool = False) -> RunResult:
    folder.mkdir()
    path = write_plan(plan, folder)
    opts = WorkerOptions(str(path), STEPS, str(folder), deterministic=deterministic,
                         dataset=dataset, timeout_s=60, save_weights=True)
    return base.find(engine).run(plan, plan.problem.model.build, base.RunOptions(opts))


def saved(folder: Path) -> dict[int, dict[str, torch.Tensor]]:
    """Each rank's final weights (``--save-weights``)."""
    return {int(f.stem[4:]): torch.load(f)["model"]
            for f in sorted((folder / "weights").glob("rank*.pt"))}


@pytest.mark.slow
def test_a_pipeline_trains_to_the_runtimes_weights_bit_for_bit(tmp_path: Path) -> None:
    plan = gpt2_plan([(0, 2, [2]), (2, 4, [2])], 2, 4, optimizer="momentum")
    torch_run = run("torch-pipelining", plan, tmp_path / "torch")
    runtime = run("edgepipe", plan, tmp_path / "edgepipe")
    assert len(torch_run.losses) == STEPS
    assert torch_run.losses == runtime.losses
    # torch's schedule ran every micro-batch's forward and backward once on each device
    timeline = read_jsonl(tmp_path / "torch" / "timeline.jsonl")
    for device in ("d0", "d1"):
        ran = sorted(f"{e['kind']}{e['micro_batch']}" for e in timeline
                     if e["device"] == device and e["step"] == 0 and e["kind"] in "FB")
        assert ran == ["B0", "B1", "B2", "B3", "F0", "F1", "F2", "F3"], device
    theirs, ours = saved(tmp_path / "torch"), saved(tmp_path / "edgepipe")
    assert sorted(theirs) == [0, 1]
    for rank, state in theirs.items():
        for key, value in state.items():
            assert torch.equal(value, ours[rank][key]), (rank, key)


def test_equal_data_parallel_groups_train_within_rounding_of_the_reference(
        tmp_path: Path) -> None:
    """Two replicas of a two-stage pipeline (each stage's pair averages its gradients),
    in deterministic mode (torch's deterministic algorithms), against the deterministic
    reference: the same training up to float summation order."""
    plan = gpt2_plan([(0, 2, [1, 1]), (2, 4, [1, 1])], 2, 2, optimizer="momentum")
    result = run("torch-pipelining", plan, tmp_path / "torch", deterministic=True)
    settings = plan.problem.config.optimizer_settings()
    want = ref.train(ref.ModelSpec("gpt2-small", GPT2.sizes, GPT2.seed),
                     data.synthetic(GPT2, plan.problem.config.seed), 4, STEPS,
                     ref.OptimizerSpec("momentum", lr=settings["lr"],
                                       momentum=settings["momentum"]),
                     data_seed=plan.problem.config.seed)
    assert result.losses == pytest.approx(want.losses, rel=1e-6)
    states = saved(tmp_path / "torch")
    assert sorted(states) == [0, 1, 2, 3]
    initial = zoo.build_model("gpt2-small", seed=GPT2.seed, **GPT2.sizes).state_dict()
    for rank, state in states.items():
        replica = states[rank ^ 1]  # the other device of the stage: the same weights
        for key, value in state.items():
            assert torch.equal(value, replica[key]), (rank, key)
            moved = (want.state[key] - initial[key]).abs().max()
            # a wrong mean (a replica's gradient alone, or doubled) moves a weight by a
            # large part of the 5 steps' change; rounding by 1e-6 of the weight's scale
            assert (value - want.state[key]).abs().max() <= 1e-6 * max(
                1.0, float(want.state[key].abs().max())), (rank, key, float(moved))


class OriginalGPT(ref.ModelSpec):
    """The reference trains ``examples.gpt.factory()`` itself (not its split chain), built
    as the split builder builds it (torch's RNG seeded with the build spec's seed 0); the
    name selects the zoo's language-modelling loss, the callable model's default."""

    def build(self) -> nn.Sequential:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return nn.Sequential(gpt.factory())


def example_gpt_plan() -> Plan:
    """examples/gpt.py (not written as blocks) split with ``--split auto`` into 7 blocks,
    a two-stage plan under GPipe, 2 micro-batches of 2, momentum."""
    if "gpt" not in _PROFILE:
        blocks, build = split.split_source("examples.gpt:factory", "auto")
        _PROFILE["gpt"] = profile_of(build, gpt.example_input, name="gpt")
        assert len(blocks) == _PROFILE["gpt"].num_blocks == 7
    return make_test_plan(_PROFILE["gpt"], [(0, 4, [2]), (4, 7, [2])], 2, 2,
                          optimizer="momentum", schedule="gpipe", replication_interval=0)


def example_gpt_reference(plan: Plan) -> ref.Result:
    settings = plan.problem.config.optimizer_settings()
    return ref.train(OriginalGPT("gpt2-small"), gpt.dataset(), 4, STEPS,
                     ref.OptimizerSpec("momentum", lr=settings["lr"],
                                       momentum=settings["momentum"]),
                     data_seed=plan.problem.config.seed)


@pytest.mark.slow
def test_the_shipped_plain_torch_gpt_trains_five_steps_on_the_torch_engine(
        tmp_path: Path) -> None:
    """The example GPT's plan against the reference trainer on the original module: the
    same training up to float summation order."""
    plan = example_gpt_plan()
    result = run("torch-pipelining", plan, tmp_path / "torch", dataset="examples.gpt:dataset")
    assert result.losses == pytest.approx(example_gpt_reference(plan).losses, rel=1e-5)
    assert result.losses[-1] < result.losses[0]


def edgepipe_cli(*args: str, pythonpath: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (pythonpath, str(REPO)) if p)}
    return subprocess.run([PY, "-m", "edgepipe.planner.cli", *args], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=120)


def test_the_cli_refuses_an_uneven_plan_on_the_torch_engine_in_one_line(tmp_path: Path) -> None:
    plan = gpt2_plan([(0, 2, [3, 1]), (2, 4, [2, 2])], 4, 1)
    done = edgepipe_cli("run", str(write_plan(plan, tmp_path)), "--steps", "1", "--engine",
                        "torch-pipelining", "--out", str(tmp_path / "run"))
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr == (
        "error: --engine: torch-pipelining: stage 0 splits each micro-batch unevenly (3/1 "
        "samples on d0, d1): torch's data parallelism gives every replica the same batch "
        "(pytorch#126600); run it with --engine edgepipe\n"), done.stderr
    assert not (tmp_path / "run").exists()


def test_a_third_party_engine_runs_a_plan_through_the_cli(tmp_path: Path) -> None:
    site = install_engine(tmp_path)
    plan = gpt2_plan([(0, 2, [2]), (2, 4, [2])], 2, 2)
    done = edgepipe_cli("run", str(write_plan(plan, tmp_path)), "--steps", "3", "--engine",
                        "one-process", "--out", str(tmp_path / "run"), pythonpath=str(site))
    assert done.returncode == 0, done.stderr
    assert "on the one-process engine" in " ".join(done.stderr.split())
    assert [line.split()[1] for line in done.stdout.splitlines()
            if line.strip().startswith("│")][:3] == ["0", "1", "2"]


@pytest.mark.slow
def test_the_example_gpt_trains_under_torchrun_across_two_hosts(tmp_path: Path) -> None:
    """The example GPT's plan on two network-namespace hosts, one rank each, torchrun's
    c10d rendezvous: the reference's training up to float summation order."""
    needs.network_namespaces()  # fails, never skips, where ip or root is missing
    plan = example_gpt_plan()
    path = write_plan(plan, tmp_path)
    out = tmp_path / "run"
    worker = ["-m", "edgepipe.executor.engines.torch_worker", str(path), "--steps",
              str(STEPS), "--out", str(out), "--timeout", "30", "--dataset",
              "examples.gpt:dataset"]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO)}
    netns.remove_stale()
    with netns.Hosts(2) as hosts:
        agents = [hosts.start(i, torchrun_argv(hosts, i, worker), env=env, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                  for i in range(2)]
        logs = []
        for agent in agents:
            try:
                logs.append(agent.communicate(timeout=120)[0])
            except subprocess.TimeoutExpired:
                hosts.close()
                logs.append(agent.communicate()[0])
        assert [a.returncode for a in agents] == [0, 0], "\n".join(logs)
    assert netns.leftover_namespaces() == []
    losses = RunResult.read(out).losses
    assert losses == pytest.approx(example_gpt_reference(plan).losses, rel=1e-5)
