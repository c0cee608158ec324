"""Exact evaluation speed (CostModel.evaluate) before and after a change, in one process.

Plans: the DP's answers for three of benchmarks/planner_scaling.py's synthetic problems
(50 blocks x 8 mixed devices, 100 x 16 mixed, 100 x 64 identical; global batch 64), each
evaluated on its network as built (1 Gbit/s switched) and with the topology replaced by
point_to_point and by shared_medium. The "before" cost model is planner/cost/model.py at git
revision ``--before`` (loaded from ``git show`` into a temporary module); "after" is the
working tree's. Both run alternately in the same process, so load from other jobs hits
both alike; the table gives evaluations per second (process time, best of
``--repeat``), their ratio, and the largest relative difference of the round time
(iteration_ms) between the two.

    .venv/bin/python benchmarks/eval_speed.py --before 615ec89 [--repeat 5] [--plan-time]

``--plan-time`` also times the DP's whole planning of each case (process time) with
``CostModel.evaluate`` as it was at ``--before`` (the old method patched onto the
current class: it calls the same per-stage methods, whose figures did not change) and as
it is, alternately, twice each, best of two.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import planner_scaling  # noqa: E402
from edgepipe.planner.cost import model as after  # noqa: E402
from edgepipe.planner.inputs.problem import Problem  # noqa: E402
from edgepipe.planner.partition import Partition  # noqa: E402
from edgepipe.planner.solvers.dp.driver import plan_dp  # noqa: E402

CASES = {"8 mixed": (50, 8, 2), "16 mixed": (100, 16, 2), "64 identical": (100, 64, 1)}
TOPOLOGIES = ("switched", "point_to_point", "shared_medium")


def load_before(rev: str, workdir: Path):
    """planner/cost/model.py at ``rev`` as a module of its own."""
    text = subprocess.run(["git", "show", f"{rev}:planner/cost/model.py"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout  # fmt: skip
    path = workdir / "cost_before.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("cost_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["cost_before"] = module
    spec.loader.exec_module(module)
    return module


def with_topology(problem: Problem, topology: str) -> Problem:
    network = dataclasses.replace(problem.cluster.network, topology=topology,
                                  shared_medium=topology == "shared_medium")  # fmt: skip
    return dataclasses.replace(problem, cluster=dataclasses.replace(problem.cluster,
                                                                    network=network))  # fmt: skip


def per_second(model, partition: Partition, repeat: int, budget_s: float) -> float:
    """Evaluations per second of process time: the best of ``repeat`` timed batches."""
    model.evaluate(partition)  # warm the caches, as a planner evaluating many plans does
    start = time.process_time()
    model.evaluate(partition)
    once = max(time.process_time() - start, 1e-6)
    batch = max(1, int(budget_s / once))
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(batch):
            model.evaluate(partition)
        best = min(best, (time.process_time() - start) / batch)
    return 1.0 / best


def planning_s(problem: Problem, evaluate) -> float:
    """Process seconds of one DP planning of ``problem`` with ``evaluate`` as
    CostModel.evaluate."""
    current = after.CostModel.evaluate
    after.CostModel.evaluate = evaluate  # type: ignore[method-assign]
    try:
        start = time.process_time()
        plan_dp(problem, time_limit=300)
        return time.process_time() - start
    finally:
        after.CostModel.evaluate = current  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git revision of the old cost model")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--budget", type=float, default=0.2, help="seconds per timed batch")
    parser.add_argument("--plan-time", action="store_true", help="also time the DP's planning")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before = load_before(args.before, Path(tmp))
        print("| plan | network | stages | M | before eval/s | after eval/s | speed-up | "
              "max rel diff |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
        for name, (blocks, devices, types) in CASES.items():
            base = planner_scaling.synthetic(blocks, devices, types)
            partition = plan_dp(base, time_limit=300).partition
            for topology in TOPOLOGIES:
                problem = with_topology(base, topology)
                old, new = before.CostModel(problem), after.CostModel(problem)
                a = old.evaluate(partition).iteration_ms
                b = new.evaluate(partition).iteration_ms
                rates = {"old": 0.0, "new": 0.0}
                for _ in range(2):  # alternate, so both see the same load
                    rates["old"] = max(rates["old"], per_second(old, partition, args.repeat,
                                                                args.budget))  # fmt: skip
                    rates["new"] = max(rates["new"], per_second(new, partition, args.repeat,
                                                                args.budget))  # fmt: skip
                print(f"| {devices} devices, {name.split()[1]} | {topology} | "
                      f"{partition.num_stages} | {partition.num_micro_batches} | "
                      f"{rates['old']:.1f} | {rates['new']:.1f} | "
                      f"{rates['new'] / rates['old']:.1f}x | {abs(b - a) / a:.1e} |",
                      flush=True)  # fmt: skip
        if args.plan_time:
            print("\n| plan | DP planning, evaluate before (s) | after (s) | ratio |\n"
                  "|---|---|---|---|")
            for name, (blocks, devices, types) in CASES.items():
                base = planner_scaling.synthetic(blocks, devices, types)
                times = {"old": float("inf"), "new": float("inf")}
                for _ in range(2):
                    times["old"] = min(times["old"], planning_s(base, before.CostModel.evaluate))
                    times["new"] = min(times["new"], planning_s(base, after.CostModel.evaluate))
                print(f"| {devices} devices, {name.split()[1]} | {times['old']:.2f} | "
                      f"{times['new']:.2f} | {times['old'] / times['new']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
