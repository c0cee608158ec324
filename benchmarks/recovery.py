"""Recovery time: from a device's crash to the first committed step under a new plan.

**In-process recovery** (executor/ft/recovery.py, docs/fault-tolerance.md): the device
kills itself (SIGKILL) after its first forward of step ``--fail-at``
(:mod:`executor.ft.faults`, which stamps the fault's wall-clock time); the survivors keep
their processes, the supervisor re-plans (``planner.replan``, a pre-computed lookup for
a single loss), the survivors rebuild their process groups, restore the last durable
state (their own copies and the lost stage's ring replica) and replay. Phases from the
recovery event of ``metrics.jsonl``: detect (fault to detection), abort acknowledged
(detection to every survivor's acknowledgement of the abort), re-plan, rebuild
(generation opened to every member's groups built), restore (to every member's state
restored), and the first step (the rest, to the new generation's first committed step:
publishing the generation, replicating its start state, computing the replayed step,
the commit vote).

The baseline is what torchrun's elastic restart gives (reference/fault-tolerance.md §1,
"torchelastic"): every worker is stopped, the surviving devices are planned from
scratch (the DP, ``planner.api.solve``), every worker is started again and resumes
from the last checkpoint (``--resume``, executor/ft/checkpoint.py). Phases, all wall
clock on this machine, from the SIGKILL of the device:

* **detect**: until the launcher declares the device dead (its exit status);
* **stop**: until every other worker is stopped (abort, grace, SIGKILL);
* **re-plan**: the full solve for the survivors;
* **restart to first commit**: from starting the new workers (interpreter, torch
  import, process groups, checkpoint load) to the first committed step;
* **redo**: from there until the run is back at the step it had reached (the steps
  since the checkpoint are trained again: their work was lost).

Model: gpt2-small at a toy size (6 blocks), a 3-stage pipeline (one device per stage,
identical CPU devices, gloo), SGD, a checkpoint every ``--checkpoint-every`` steps; the
middle device is SIGKILLed once ``--fail-at`` steps are committed.

    .venv/bin/python benchmarks/recovery.py [--fail-at 6] [--checkpoint-every 4] [--pairs 4]

**Paired runs.** The machine is shared, and its load changes within seconds, so a ratio
of medians (or of runs minutes apart) can pair one kind's quiet run with the other's
burst. Each pair runs the two back to back, the first alternating between pairs; the
ratio is taken per pair, and every pair's ratio, phases and load average (before and
after each half) are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgepipe.executor.core.options import WorkerOptions
from edgepipe.executor.launch import RunFailed, launch
from edgepipe.executor.profiling import zoo
from edgepipe.executor.profiling.profiler import profile_model
from edgepipe.planner import api
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import make_problem
from edgepipe.planner.inputs.profile import BuildSpec
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.plan import Plan, SolverInfo, make_plan, save_plan

from benchmarks.local_cluster import identical_cpus

BUILD = BuildSpec(zoo="gpt2-small", sizes={"layers": 4, "hidden": 16, "heads": 2, "vocab": 32,
                                           "max_positions": 8, "seq_len": 4}, seed=3)
MICRO, M = 2, 3
LOST = "d1"
#: the gloo timeout of the runs (a crash is seen by exit status long before it)
TIMEOUT_S = 60.0
#: the phase the target is on
TOTAL = "total: failure to first commit"


def three_stage_plan() -> Plan:
    torch.set_num_threads(1)
    model = zoo.build_model(BUILD.zoo, seed=BUILD.seed, **BUILD.sizes)
    profile = profile_model(model, lambda b: zoo.example_input(BUILD.zoo, b, **BUILD.sizes),
                            [1, 2], "host-cpu", name="gpt2-toy", warmup=1, repeats=1,
                            build=BUILD)
    cfg = TrainingConfig(global_batch=MICRO * M, micro_batch_candidates=(MICRO,),
                         optimizer="sgd", learning_rate=0.01)
    problem = make_problem(profile, identical_cpus(3), cfg, catalog={})
    n = len(model)
    cuts = [(0, n // 3), (n // 3, 2 * n // 3), (2 * n // 3, n)]
    stages = tuple(StageAssignment(a, b, (f"d{i}",), (MICRO,)) for i, (a, b) in enumerate(cuts))
    return make_plan(problem, Partition(MICRO, M, stages), SolverInfo("hand"))


def metrics_lines(out: Path) -> int:
    path = out / "metrics.jsonl"
    return sum(1 for _ in path.open()) if path.exists() else 0


class Killer(threading.Thread):
    """SIGKILLs ``device``'s process once ``after`` steps are in ``out``'s metrics."""

    def __init__(self, out: Path, device: str, after: int) -> None:
        super().__init__(daemon=True)
        self.out, self.device, self.after = out, device, after
        self.pid: int | None = None
        self.killed_at: float | None = None

    def on_start(self, ranks: list[dict]) -> None:
        self.pid = next(r["pid"] for r in ranks if r["device"] == self.device)
        self.start()

    def run(self) -> None:
        while metrics_lines(self.out) < self.after:
            time.sleep(0.005)
        assert self.pid is not None
        self.killed_at = time.monotonic()
        os.kill(self.pid, signal.SIGKILL)


class FirstLines(threading.Thread):
    """Records when the metrics of ``out`` first hold one line and ``n`` lines."""

    def __init__(self, out: Path, n: int) -> None:
        super().__init__(daemon=True)
        self.out, self.n = out, n
        self.first: float | None = None
        self.nth: float | None = None

    def run(self) -> None:
        while self.nth is None:
            lines = metrics_lines(self.out)
            now = time.monotonic()
            if lines >= 1 and self.first is None:
                self.first = now
            if lines >= self.n:
                self.nth = now
            time.sleep(0.005)


def restart_baseline(plan: Plan, folder: Path, fail_at: int, every: int) -> dict[str, float]:
    """The phases of a restart-everything recovery (module docstring), seconds."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "plan.json"
    save_plan(plan, path)
    out, ckpt = folder / "run", folder / "checkpoints"
    killer = Killer(out, LOST, fail_at)
    opts = WorkerOptions(str(path), 10_000, str(out), timeout_s=TIMEOUT_S,
                         checkpoint_every=every, checkpoint_dir=str(ckpt))
    try:  # no in-process recovery: the failure stops the run (as without this work)
        launch(opts, on_start=killer.on_start, recover=False)
        raise RuntimeError("the run ended without the failure")
    except RunFailed as failed:
        stopped = time.monotonic()
        assert failed.device == LOST and killer.killed_at is not None, failed
        detected = failed.detected_at
    reached = metrics_lines(out)  # steps committed before the failure
    start = time.monotonic()
    cl = plan.problem.cluster
    survivors = replace(cl, devices=tuple(d for d in cl.devices if d.id != LOST))
    new = api.solve(make_problem(plan.problem.model, survivors, plan.problem.config,
                                 catalog={}), "dp")
    replanned = time.monotonic()
    new_path = folder / "replanned.json"
    save_plan(new, new_path)
    resumed = folder / "resumed"
    resume_from = max(int(p.name.split("-")[1]) for p in ckpt.glob("step-*"))
    watcher = FirstLines(resumed, reached - resume_from)
    watcher.start()
    restarted = time.monotonic()
    launch(replace(opts, plan=str(new_path), out=str(resumed), steps=reached,
                   resume=str(ckpt), checkpoint_every=0), recover=False)
    watcher.join(timeout=10)
    assert watcher.first is not None and watcher.nth is not None
    return {
        "detect": detected - killer.killed_at,
        "stop": stopped - detected,
        "re-plan": replanned - start,
        "restart to first commit": watcher.first - restarted,
        "redo": watcher.nth - watcher.first,
        TOTAL: watcher.first - killer.killed_at,
        "total: back at the failed step": watcher.nth - killer.killed_at,
        "steps redone": float(reached - resume_from),
        "stages after": float(new.partition.num_stages),
    }


def in_process(plan: Plan, folder: Path, fail_at: int) -> dict[str, float]:
    """The phases of an in-process recovery (module docstring), seconds."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "plan.json"
    save_plan(plan, path)
    result = launch(WorkerOptions(str(path), fail_at + 3, str(folder / "run"),
                                  timeout_s=TIMEOUT_S, faults=f"{LOST}:{fail_at}:forward"))
    (event,) = result.events
    assert event["cause"] == "crash" and event["device"] == LOST, event
    phases = ("t_abort_s", "t_replan_s", "t_rebuild_s", "t_restore_s")
    return {
        "detect": event["t_detect_s"],
        "abort acknowledged": event["t_abort_s"],
        "re-plan": event["t_replan_s"],
        "rebuild": event["t_rebuild_s"],
        "restore": event["t_restore_s"],
        "first step (start replica, compute, commit)":
            event["t_first_commit_s"] - sum(event[k] for k in phases),
        TOTAL: event["t_detect_s"] + event["t_first_commit_s"],
        "steps redone": float(fail_at - event["replay_from_step"]),
    }


def paired_runs(plan: Plan, tmp: Path, pairs: int, fail_at: int, every: int) -> list[dict]:
    """``pairs`` pairs of an in-process recovery and a restart baseline, back to back,
    the first of each pair alternating (in-process first in pair 1), so that a load
    change between pairs moves both halves of a pair alike and any order effect
    cancels. Each half records the 1-minute load average before and after it."""
    out = []
    for r in range(pairs):
        order = ("in-process", "restart") if r % 2 == 0 else ("restart", "in-process")
        pair: dict = {"first": order[0]}
        for kind in order:
            before = os.getloadavg()[0]
            folder = tmp / f"{kind}-{r}"
            pair[kind] = (in_process(plan, folder, fail_at) if kind == "in-process"
                          else restart_baseline(plan, folder, fail_at, every))
            pair[f"load {kind}"] = (before, os.getloadavg()[0])
        pair["ratio"] = pair["restart"][TOTAL] / pair["in-process"][TOTAL]
        out.append(pair)
    return out



def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fail-at", type=int, default=6, help="steps committed before the kill")
    p.add_argument("--checkpoint-every", type=int, default=4)
    p.add_argument("--pairs", type=int, default=4)
    args = p.parse_args()
    plan = three_stage_plan()
    with tempfile.TemporaryDirectory() as tmp:
        pairs = paired_runs(plan, Path(tmp), args.pairs, args.fail_at, args.checkpoint_every)
    print(f"{plan.id}: gpt2-small {BUILD.sizes}, 3 stages on 3 local processes (gloo), "
          f"{LOST} SIGKILLed in step {args.fail_at}; restart: checkpoint every "
          f"{args.checkpoint_every}; {args.pairs} pairs, each an in-process recovery and a "
          "restart back to back (the first alternating)")
    print(f"{'pair':>4} {'first':>10} {'load in-process':>16} {'load restart':>13} "
          f"{'in-process s':>12} {'restart s':>10} {'ratio':>7}")
    for n, pair in enumerate(pairs, 1):
        loads = [f"{a:.1f}-{b:.1f}" for a, b in (pair["load in-process"],
                                                  pair["load restart"])]
        print(f"{n:>4} {pair['first']:>10} {loads[0]:>16} {loads[1]:>13} "
              f"{pair['in-process'][TOTAL]:>12.3f} {pair['restart'][TOTAL]:>10.3f} "
              f"{pair['ratio']:>6.1f}x")
    ratios = [pair["ratio"] for pair in pairs]
    print(f"restart / in-process, failure to first commit, per pair: median "
          f"{statistics.median(ratios):.1f}x, lowest {min(ratios):.1f}x (target >= 20x in "
          f"every pair: {'met' if min(ratios) >= 20 else 'NOT met'})")
    print(f"{'phase (s)':<44} {'median':>7}  per pair")
    for kind in ("in-process", "restart"):
        print(kind)
        for phase in pairs[0][kind]:
            values = [pair[kind][phase] for pair in pairs]
            print(f"  {phase:<42} {statistics.median(values):>7.3f}  "
                  f"{', '.join(f'{v:.3f}' for v in values)}")
    print(json.dumps(pairs))


if __name__ == "__main__":
    main()
