"""Any nn.Module through the whole flow: the plain-torch GPT of examples/gpt.py is
profiled through the CLI with ``--split auto``, planned on orin-pair-2, and its plan
trains 5 steps on edgepipe's runtime (real processes over gloo) in deterministic mode,
bit-identical to the single-process reference trainer run on the *original* module
(not its split chain); the same under torchrun across two network-namespace hosts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from edgepipe.executor.core.metrics import read_jsonl
from edgepipe.executor.core.options import WorkerOptions
from edgepipe.executor.launch import launch
from edgepipe.executor.profiling import split
from edgepipe.planner.cli.main import main
from edgepipe.planner.plan import Plan, load_plan
from torch import nn

from examples import gpt
from tests.helpers import needs, netns
from tests.helpers import reference_trainer as ref
from tests.helpers.executor_helpers import make_test_plan, profile_of, write_plan
from tests.helpers.paths import REPO
from tests.helpers.processes import torchrun_argv

STEPS = 5
DATASET = "examples.gpt:dataset"


@dataclass(frozen=True)
class OriginalGPT(ref.ModelSpec):
    """The reference trains ``examples.gpt.factory()`` itself, built as the split
    builder builds it (torch's RNG seeded with the build spec's seed). The name
    ``gpt2-small`` only selects the zoo's language-modelling loss, mean cross-entropy
    per token: the loss of a callable model without a ``loss`` of its own."""

    name: str = "gpt2-small"

    def build(self) -> nn.Sequential:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return nn.Sequential(gpt.factory())  # keys "0.<original name>"


def assert_trained_as_the_original(plan: Plan, out: Path, losses: list[float]) -> None:
    """``losses`` and every rank's saved weights and momentum (``out/weights``) are
    ``torch.equal`` to the reference trainer's on :class:`OriginalGPT`, and the ranks
    together hold every parameter."""
    config = plan.problem.config
    settings = config.optimizer_settings()
    want = ref.train(
        OriginalGPT(seed=0), gpt.dataset(), config.global_batch, STEPS,
        ref.OptimizerSpec(config.optimizer, lr=settings["lr"],
                          momentum=settings.get("momentum", 0.9)),
        data_seed=config.seed,
    )
    assert losses == want.losses
    names = [n for n, _ in OriginalGPT(seed=0).build().named_parameters()]
    seen = set()
    for saved in sorted((out / "weights").glob("rank*.pt")):
        rank = torch.load(saved)
        # a block's keys are "<block>.<original name>"; the reference's "0.<original name>"
        local = [f"0.{key.split('.', 1)[1]}" for key in rank["model"]]
        for key, value in zip(local, rank["model"].values(), strict=True):
            assert torch.equal(value, want.state[key]), f"{saved.name}: {key}"
        for i, state in rank["optimizer"]["state"].items():
            expected = want.optimizer["state"][names.index(local[i])]
            assert torch.equal(state["momentum_buffer"], expected["momentum_buffer"])
        seen.update(local)
    assert seen == set(want.state)


def test_the_example_gpt_is_profiled_planned_and_trained_as_the_original(tmp_path, capsys):
    profile, plan_path = tmp_path / "gpt.json", tmp_path / "plan.json"
    assert main([
        "profile", "--model", "examples.gpt:factory", "--input", "examples.gpt:example_input",
        "--split", "auto", "--name", "gpt", "--batch-sizes", "1,2", "--warmup", "1",
        "--repeats", "1", "--max-rounds", "1", "--analytic", "-o", str(profile),
    ]) == 0
    doc = json.loads(profile.read_text())
    assert [b["name"] for b in doc["blocks"]] == [
        "tok_emb", "layers_0", "layers_1", "layers_2", "layers_3", "ln_f", "head"
    ]
    # the pipeline-only baseline: two stages on the two Orins, 4 micro-batches of 2
    assert main([
        "plan", "--model", str(profile), "--cluster", "orin-pair-2", "--solver", "gpipe",
        "--global-batch", "8", "--micro-batches", "2", "-o", str(plan_path),
    ]) == 0
    capsys.readouterr()
    plan = load_plan(plan_path)
    assert [(s.first, s.end) for s in plan.partition.stages] == [(0, 4), (4, 7)]

    result = launch(WorkerOptions(str(plan_path), STEPS, str(tmp_path / "run"),
                                  deterministic=True, dataset=DATASET, timeout_s=60,
                                  save_weights=True))
    assert_trained_as_the_original(plan, tmp_path / "run", result.losses)


README_SECTION = "## Use edgepipe's planner with torch pipelining / torchtitan"


def readme_blocks() -> tuple[str, list[str]]:
    """The README section's commands (its bash block) and the output it shows (its
    text block), without the output's first line (the plan id varies with the profile)."""
    section = (REPO / "README.md").read_text().split(README_SECTION, 1)[1]
    commands = section.split("```bash\n", 1)[1].split("```", 1)[0]
    shown = section.split("```text\n", 1)[1].split("```", 1)[0]
    return commands, shown.splitlines()[1:]


def test_the_readme_example_runs_and_prints_what_the_readme_shows(tmp_path):
    commands, shown = readme_blocks()
    shutil.copytree(REPO / "examples", tmp_path / "examples")  # "from the repository root"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", commands], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    printed = done.stdout.splitlines()
    export = printed[printed.index(next(p for p in printed if p.startswith("# torchtitan"))):]
    assert export[0].startswith("# torchtitan: plan plan-")
    assert export[1:] == shown, "update README.md's export example to this output"


@pytest.mark.slow
def test_a_gpt_plan_trains_across_two_hosts_under_torchrun(tmp_path):
    needs.network_namespaces()  # fails, never skips, where ip or root is missing
    # hosts are network namespaces on a 100 Mbit/s link (tests/helpers/netns.py); the
    # plan: blocks 0-3 on host 0, 4-6 on host 1, 4 micro-batches of 2
    build = split.split_source("examples.gpt:factory", "auto")[1]
    profile = profile_of(build, gpt.example_input, name="gpt")
    plan = make_test_plan(profile, [(0, 4, [2]), (4, 7, [2])], 2, 4, optimizer="momentum")
    path = write_plan(plan, tmp_path)
    out = tmp_path / "run"
    worker = ["-m", "edgepipe.executor.worker", str(path), "--steps", str(STEPS), "--out",
              str(out), "--dataset", DATASET, "--deterministic", "--save-weights",
              "--timeout", "60"]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}
    with netns.Hosts(2, rate_mbit=100) as hosts:
        agents = [hosts.start(i, torchrun_argv(hosts, i, worker), cwd=REPO,
                              env={**env, "EDGEPIPE_DEVICE": f"d{i}"},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                  for i in range(2)]
        logs = [a.communicate(timeout=240)[0] for a in agents]
    assert [a.returncode for a in agents] == [0, 0], "\n".join(log[-3000:] for log in logs)
    assert netns.leftover_namespaces() == []
    losses = [m["loss"] for m in read_jsonl(out / "metrics.jsonl")]
    assert_trained_as_the_original(plan, out, losses)
