"""``edgepipe run PLAN --lab`` (executor/lab/launch.py): real processes in their devices'
namespaces and cgroups train exactly as the single-process reference does in
deterministic mode; a plan that does not fit a device's memory limit is refused before
launch, and forced past the check fails with one line naming the device the kernel
killed; nothing the lab made is left after any of them (no ``edgepipe-<pid>-...``
namespace or cgroup, no process).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from edgepipe.executor.core import data
from edgepipe.executor.core.options import WorkerOptions
from edgepipe.executor.lab.cgroups import PROCESS_BASELINE_BYTES
from edgepipe.executor.lab.launch import LabOptions, run_lab
from edgepipe.executor.profiling import zoo
from edgepipe.planner.inputs.profile import BuildSpec
from edgepipe.planner.plan import save_plan
from edgepipe.planner.units import human_bytes

from tests.helpers import needs
from tests.helpers import reference_trainer as ref
from tests.helpers.executor_helpers import profile_of
from tests.helpers.lab_runs import lab_plan, leftovers
from tests.helpers.processes import ctrl_c_at_default


@pytest.fixture(autouse=True)
def lab_machine():
    """Fail, naming the fix, where root or iproute2 is missing (docs/testing.md)."""
    needs.network_namespaces()


GPT2 = BuildSpec(
    zoo="gpt2-small",
    sizes={"layers": 2, "hidden": 16, "heads": 2, "vocab": 32, "max_positions": 8, "seq_len": 4},
    seed=3,
)
STEPS = 3
#: the lab's devices together get half of this machine's cores (lab groups carry the top
#: CPU weight): the other half stays for the tests running beside these (docs/testing.md)
SHARE = 0.5
EDGEPIPE = str(Path(sys.executable).with_name("edgepipe"))


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    """A hybrid plan on 3 devices of a switched 100 Mbit/s network: stage 0 on d0, stage 1
    a data-parallel group d1 + d2."""
    profile = profile_of(GPT2, lambda b: zoo.example_input(GPT2.zoo, b, **GPT2.sizes),
                         name=GPT2.zoo)
    n = len(profile.blocks)
    plan = lab_plan(profile, [(0, 2, [2]), (2, n, [1, 1])], 2, 2, "switched")
    path = tmp_path_factory.mktemp("lab") / "plan.json"
    save_plan(plan, path)
    return path, plan


def test_a_lab_run_trains_as_the_reference_does(plan_file, tmp_path):
    path, plan = plan_file
    run = run_lab(WorkerOptions(str(path), STEPS, str(tmp_path), deterministic=True,
                                timeout_s=60), LabOptions(share=SHARE))
    config = plan.problem.config
    settings = config.optimizer_settings()
    reference = ref.train(
        ref.ModelSpec(GPT2.zoo, GPT2.sizes, GPT2.seed), data.synthetic(GPT2, config.seed),
        config.global_batch, STEPS,
        ref.OptimizerSpec(config.optimizer, lr=settings["lr"],
                          momentum=settings.get("momentum", 0.9)),
        data_seed=config.seed,
    )
    assert run.result.losses == reference.losses
    record = json.loads((tmp_path / "lab.json").read_text())
    assert record["topology"] == "switched"
    assert sorted(record["devices"]) == ["d0", "d1", "d2"]
    # each device's port shaped both ways: 6 buckets at the cluster's 100 Mbit/s
    assert sorted(link["channel"] for link in record["links"]) == [
        "d0 down", "d0 up", "d1 down", "d1 up", "d2 down", "d2 up"]
    assert {link["rate_mbps"] for link in record["links"]} == {100.0}
    # gloo's data crossed the shaped links: d0's uplink carried at least stage 0's
    # outputs, d1's and d2's at least their input gradients (same size), float32
    sent = {link["channel"]: link["sent_bytes"] for link in record["links"]}
    out_bytes = plan.problem.model.blocks[1].output_bytes_per_sample
    batch = config.global_batch * STEPS
    assert sent["d0 up"] >= out_bytes * batch
    assert sent["d1 up"] + sent["d2 up"] >= out_bytes * batch
    assert all(d["peak_memory_bytes"] > 0 for d in record["devices"].values())
    assert leftovers(os.getpid()) == []
    assert multiprocessing.active_children() == []


def cli_run(plan_path: Path, out: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(
        [EDGEPIPE, "run", str(plan_path), "--steps", "2", "--out", str(out), "--lab",
         "--lab-share", str(SHARE), *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert leftovers(proc.pid) == []
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def test_a_plan_over_a_devices_memory_limit_is_refused_before_launch(plan_file, tmp_path):
    path, plan = plan_file
    done = cli_run(path, tmp_path, "--lab-memory", "d1=100")
    assert done.returncode == 2
    need = plan.cost.stages[1].memory_bytes[0]  # d1's, the planner's memory model
    assert done.stderr.splitlines()[-1] == (
        f"error: device d1 needs {human_bytes(need)} under the plan plus "
        f"{human_bytes(PROCESS_BASELINE_BYTES)} for its process, above its lab memory "
        "limit 100.00 MiB; re-plan for less memory, or force the run with "
        "--lab-skip-memory-check (the kernel then kills the device)")
    assert not (tmp_path / "ranks.json").exists()  # no process started


def test_forced_past_the_check_the_device_is_killed_and_named_in_one_line(plan_file,
                                                                          tmp_path):
    path, _ = plan_file
    done = cli_run(path, tmp_path, "--lab-memory", "d1=40", "--lab-skip-memory-check")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1].startswith(
        "error: device d1 ran out of memory: the kernel killed it at its lab limit "
        "40.00 MiB (peak ")


def test_ctrl_c_once_the_devices_run_leaves_nothing_behind(plan_file, tmp_path):
    """Ctrl-C once every device's process started (``ranks.json``). SIGTERM unwinds the
    same ``with`` blocks as a SystemExit (test_lab_network.py). The run starts with SIGINT
    at its default: under a background ``pytest ... &`` it would inherit SIGINT ignored
    and rightly ignore it (tests/unit/test_cli.py, ``ctrl_c_delivered``)."""
    path, _ = plan_file
    proc = subprocess.Popen(
        [EDGEPIPE, "run", str(path), "--steps", "100000", "--out", str(tmp_path), "--lab",
         "--lab-share", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=ctrl_c_at_default)
    try:
        deadline = time.monotonic() + 90
        while not (tmp_path / "ranks.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert leftovers(proc.pid) == []
