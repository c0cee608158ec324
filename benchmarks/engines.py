"""Engines against each other and against hand-written torch, same model, split and devices.

Two cases, each measured in one run of this script, the runners interleaved (one run of
each, in turn, ``--repeats`` times, so a change of the machine's load hits all alike):

* **pipeline**: a 2-stage plan (one device per stage, 4 micro-batches of 4) on the
  ``edgepipe`` engine (edgepipe's runtime), on the ``torch-pipelining`` engine
  (torch's ``PipelineStage`` + ``Schedule1F1B`` driven by the plan) and on hand-written
  torch pipelining (``benchmarks/executor_overhead.py``: the same cut, ``Schedule1F1B``);
* **data parallel**: a 1-stage plan over 2 devices (even split) on both engines and on
  hand-written ``DistributedDataParallel`` with the same per-rank work.

BERT-small at a reduced size (``executor_overhead.BUILD``), SGD, fast mode, gloo, one thread
per rank, both engines' fault tolerance off (no control plane, the plan does not
replicate). samples/s: the global batch over the median step time after the first (a
step's time is its slowest rank's). CPU per step: the CPU seconds (user + system) of the
run's processes, launcher included, minus those of a two-step run of the same runner (its
start-up, imports, building, connecting, and two steps), over the steps beyond the
second. The machine's load (``os.getloadavg``) is printed with the figures. Target:
edgepipe's runtime >= 0.95x the torch engine's samples/s.

    .venv/bin/python benchmarks/engines.py [--steps 12] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgepipe.executor.core.options import WorkerOptions
from edgepipe.executor.engines import base
from edgepipe.executor.profiling import zoo
from edgepipe.executor.profiling.profiler import profile_model
from edgepipe.planner.plan import Plan, save_plan

from benchmarks.executor_overhead import BUILD, MICRO, M, _plan, theirs

Runner = Callable[[int], float]  # steps -> samples/s


def _cpu_s() -> float:
    """CPU seconds of this process and its reaped children so far."""
    me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF,
                                                resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def engine_runner(name: str, plan: Plan, folder: Path) -> Runner:
    """A runner of ``plan`` on engine ``name`` (control plane off)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "plan.json"
    save_plan(plan, path)
    engine = base.find(name)

    def run(steps: int) -> float:
        options = base.RunOptions(WorkerOptions(str(path), steps, str(folder), timeout_s=300),
                                  hang_timeout_s=None, recover=False)
        walls = [m["wall_ms"] for m in engine.run(plan, plan.problem.model.build,
                                                  options).metrics[1:]]
        return MICRO * M / statistics.median(walls) * 1e3 if walls else 0.0
    return run


def measure(runner: Runner, steps: int) -> tuple[float, float]:
    """(samples/s, CPU seconds of the run)."""
    before = _cpu_s()
    rate = runner(steps)
    return rate, _cpu_s() - before


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (>= 3)")
    args = p.parse_args()
    torch.set_num_threads(1)
    model = zoo.build_model(BUILD.zoo, seed=BUILD.seed, **BUILD.sizes)
    profile = profile_model(model, lambda b: zoo.example_input(BUILD.zoo, b, **BUILD.sizes),
                            [1, 2, 4], "host-cpu", name="bert-small", warmup=1, repeats=1,
                            build=BUILD)
    nblocks, cut = len(model), len(model) // 2
    # without a control plane neither engine replicates or recovers (launch.recovers)
    pipe = _plan(profile, [(0, cut, [MICRO]), (cut, nblocks, [MICRO])], MICRO, M)
    dp = _plan(profile, [(0, nblocks, [MICRO // 2, MICRO // 2])], MICRO, M)
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        cases = {
            "pipeline": (pipe, "hand-written Schedule1F1B", "pipeline"),
            "DP over 2": (dp, "hand-written DDP", "ddp"),
        }
        results = {}
        for case, (plan, hand, mode) in cases.items():
            runners = {
                "edgepipe": engine_runner("edgepipe", plan, Path(tmp) / case / "edgepipe"),
                "torch-pipelining": engine_runner("torch-pipelining", plan,
                                                  Path(tmp) / case / "torch"),
                hand: lambda steps, mode=mode: theirs(mode, cut, steps),
            }
            start_up = {name: measure(run, 2)[1] for name, run in runners.items()}
            rates: dict[str, list[float]] = {name: [] for name in runners}
            cpu: dict[str, list[float]] = {name: [] for name in runners}
            for _ in range(args.repeats):
                for name, run in runners.items():
                    rate, seconds = measure(run, args.steps)
                    rates[name].append(rate)
                    cpu[name].append((seconds - start_up[name]) / (args.steps - 2) * 1e3)
                loads.append(os.getloadavg()[0])
            results[case] = (rates, cpu)
    print(f"bert-small {BUILD.sizes}, micro-batch {MICRO} x {M}, {args.steps} steps, gloo, "
          f"1 thread per rank, {args.repeats} interleaved rounds; load (1 min) "
          f"{min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs")
    print(f"{'case':<10} {'runner':<26} {'samples/s (median)':>18} {'CPU ms/step':>11} "
          f"{'edgepipe / this (median, worst round)':>38}")
    for case, (rates, cpu) in results.items():
        ours = rates["edgepipe"]
        for name in rates:
            ratios = [a / b for a, b in zip(ours, rates[name], strict=True)]
            print(f"{case:<10} {name:<26} {statistics.median(rates[name]):>18.1f} "
                  f"{statistics.median(cpu[name]):>11.1f} "
                  f"{statistics.median(ratios):>24.2f} {min(ratios):>13.2f}")


if __name__ == "__main__":
    main()
