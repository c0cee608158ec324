"""The ordered graph's two heuristics, each against its absence, on ordered-graph instances.

The DP's ordered graph (planner/solvers/dp/graph.py, used above 1,500 moves: clusters of about 16
devices or more in two or more classes, or many of one) has two rules that are measured,
not proven:

- ``--rule falls`` (the default): a group that straddles a class boundary of a device
  order is kept only at a size s where the even share ceil(B / s) falls
  (``graph.falls``); against every mixed group (the rule patched out);
- ``--rule first-near``: the first search is the smallest micro-batch size whose relaxed
  bound lies within ``FIRST_NEAR`` of the least; against the size of least bound
  (``FIRST_NEAR`` 0).

This script plans each instance twice, without and with the rule, and prints the plans'
iteration times, the gap and the planning CPU time:

- benchmarks/planner_scaling.py's synthetic family, 30 and 60 blocks on 16, 24 and 32
  devices of 2, 3 and 4 types, and its 100 x 16 mixed case;
- the PipeDream imports and two analytic zoo profiles on 3, 5 and 8 each of the four
  Jetson types of jetson-testbed-6 on a 940 Mbit/s switch, global batch 32;
- with ``--big``, the 512 devices of 8 types (about 3 minutes).

    .venv/bin/python benchmarks/ordered_groups.py [--rule falls|first-near] [--big]
        [--markdown out.md]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgepipe.planner import api
from edgepipe.planner.inputs.cluster import Cluster, Device, Network
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import Problem, make_problem
from edgepipe.planner.inputs.profile import ModelProfile
from edgepipe.planner.solvers.dp import graph as dp_graph
from edgepipe.planner.solvers.dp import sizes as dp_sizes
from edgepipe.planner.solvers.dp.driver import plan_dp

from benchmarks.planner_scaling import synthetic

JETSONS = ("jetson-nano", "jetson-tx2", "jetson-xavier-nx", "jetson-orin-nano")
MODELS = (
    "pipedream-vgg16",
    "pipedream-resnet18",
    "pipedream-alexnet",
    "gpt2-small-analytic",
    "resnet50-analytic",
)


def jetsons(model: str, per_type: int) -> Problem:
    catalog = Cluster.load(api.resolve("jetson-testbed-6", "clusters")).device_types
    devices = tuple(Device(f"{k}-{i}", k) for k in JETSONS for i in range(per_type))
    cluster = Cluster(f"jetsons-{4 * per_type}", devices, Network(940.0, 0.2, False),
                      {k: catalog[k] for k in JETSONS})  # fmt: skip
    return make_problem(ModelProfile.load(api.resolve(model, "models")), cluster,
                        TrainingConfig(32))  # fmt: skip


def instances(big: bool) -> list[tuple[str, Callable[[], Problem]]]:
    out: list[tuple[str, Callable[[], Problem]]] = [
        (f"synthetic {b} x {n}, {t} types", lambda b=b, n=n, t=t: synthetic(b, n, t))
        for b, n, t in itertools.product((30, 60), (16, 24, 32), (2, 3, 4))
    ]
    out.append(("synthetic 100 x 16, 2 types", lambda: synthetic(100, 16, 2)))
    out += [
        (f"{m} x {4 * k} jetsons", lambda m=m, k=k: jetsons(m, k))
        for m, k in itertools.product(MODELS, (3, 5, 8))
    ]
    if big:
        out.append(("synthetic 100 x 512, 8 types", lambda: synthetic(100, 512, 8)))
    return out


def timed(problem: Problem) -> tuple[float, float, str]:
    start = time.process_time()
    result = plan_dp(problem, time_limit=3600)
    return result.cost.iteration_ms, time.process_time() - start, result.graph


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rule", choices=("falls", "first-near"), default="falls")
    parser.add_argument("--big", action="store_true", help="add 512 devices of 8 types")
    parser.add_argument("--markdown", help="also write the table to this file")
    args = parser.parse_args()
    falls, near = dp_graph.falls, dp_sizes.FIRST_NEAR

    def rule(on: bool) -> None:
        if args.rule == "falls":
            every = lambda g, batch: True  # noqa: E731
            dp_graph.falls = falls if on else every
        else:
            dp_sizes.FIRST_NEAR = near if on else 0.0

    without, with_rule = {
        "falls": ("every mixed group", "where the share falls"),
        "first-near": ("least bound first", f"smallest within {near:.0%} first"),
    }[args.rule]
    lines = [
        f"| instance | graph | {without} (ms) | CPU (s) | {with_rule} (ms) "
        "| CPU (s) | gap | time ratio |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    print(lines[0], flush=True)
    gaps, ratios = [], []
    for name, build in instances(args.big):
        problem = build()
        rule(False)
        every, t_every, graph = timed(problem)
        rule(True)
        kept, t_kept, _ = timed(problem)
        gaps.append((kept - every) / every)
        ratios.append(t_kept / t_every)
        lines.append(
            f"| {name} | {graph} | {every:.1f} | {t_every:.2f} | {kept:.1f} | {t_kept:.2f} "
            f"| {gaps[-1]:+.2%} | {ratios[-1]:.2f} |"
        )
        print(lines[-1], flush=True)
    same = sum(1 for g in gaps if abs(g) < 1e-12)
    summary = (
        f"{len(gaps)} instances: {same} the same plan figure, {sum(g < -1e-12 for g in gaps)} "
        f"faster, {sum(g > 1e-12 for g in gaps)} slower (worst {max(gaps):+.2%}, best "
        f"{min(gaps):+.2%}); planning time ratio {min(ratios):.2f}-{max(ratios):.2f}"
    )
    print(summary)
    if args.markdown:
        Path(args.markdown).write_text("\n".join([*lines, "", summary]) + "\n")


if __name__ == "__main__":
    main()
