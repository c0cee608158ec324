"""Coarse-to-fine planning against the DP on every block (planner/solvers/dp/multilevel.py, issue
10).

On long chains (more than ``MULTILEVEL_ABOVE`` blocks) ``plan_dp`` plans on merged
blocks, then near the coarse plans' cuts. This prints, per instance, the iteration time
of both plans (the cost model's exact figure) and both planning times (process CPU), and
the gap's median, mean and worst; positive gaps are the coarse-to-fine plan being slower.

Instances: random chains (tests/helpers/synthetic.py ``random_problem``: two device types,
shared 100 Mbit/s medium) of 220, 300 and 400 blocks on 8 devices, seeds 0-2; the
planner_scaling synthetic chains (switched 1 Gbit/s) of 300 and 400 blocks on 16
identical devices and on 12 devices of 3 types; the NASNet-like graph (252 fused
blocks) on 16 Orin Nanos and on the six-device Jetson testbed; and the 240-block chain of
tests/unit/test_multilevel.py.

    .venv/bin/python benchmarks/multilevel_quality.py [--markdown out.md] [--only NAME]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from edgepipe.planner import api
from edgepipe.planner.inputs.cluster import Cluster
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import Problem, make_problem
from edgepipe.planner.solvers.dp.driver import plan_dp
from planner_scaling import nasnet, synthetic

from tests.helpers.synthetic import nasnet_profile, random_problem


def instances() -> dict[str, object]:
    out: dict[str, object] = {}
    for blocks in (220, 300, 400):
        for seed in range(3):
            out[f"random {blocks} x 8 mixed, seed {seed}"] = lambda b=blocks, s=seed: (
                random_problem(b, 8, seed=s, global_batch=32, candidates=None)
            )
    for blocks in (300, 400):
        out[f"synthetic {blocks} x 16 identical"] = lambda b=blocks: synthetic(b, 16, 1)
        out[f"synthetic {blocks} x 12, 3 types"] = lambda b=blocks: synthetic(b, 12, 3)
    out["nasnet-like 252 x 16 orin nanos"] = lambda: nasnet(16)
    out["nasnet-like 252 x jetson-testbed-6"] = nasnet_testbed
    out["random 240 x 6 mixed, global batch 16 (tests/unit/test_multilevel.py)"] = lambda: (
        random_problem(240, 6, seed=0, global_batch=16, candidates=(2, 4, 8))
    )
    return out


def nasnet_testbed() -> Problem:
    """The NASNet-like graph on the six-device Jetson testbed (four types, Wi-Fi)."""
    profile = nasnet_profile()
    cluster = Cluster.load(api.resolve("jetson-testbed-6", "clusters"))
    return make_problem(profile, cluster, TrainingConfig(32))


def timed(problem, multilevel: bool) -> tuple[float, float]:
    start = time.process_time()
    result = plan_dp(problem, time_limit=900, multilevel=multilevel)
    return result.cost.iteration_ms, time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run the instances whose name contains this")
    parser.add_argument("--markdown", help="also write the table to this file")
    args = parser.parse_args()
    lines = [
        "| instance | blocks | every block (ms) | CPU (s) | coarse to fine (ms) | CPU (s) | gap |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    print("\n".join(lines), flush=True)
    gaps = []
    for name, make in instances().items():
        if args.only and args.only not in name:
            continue
        problem = make()
        full_ms, full_s = timed(problem, multilevel=False)
        fast_ms, fast_s = timed(problem, multilevel=True)
        gaps.append(100 * (fast_ms / full_ms - 1))
        lines.append(
            f"| {name} | {problem.model.num_blocks} | {full_ms:.1f} | {full_s:.2f} | "
            f"{fast_ms:.1f} | {fast_s:.2f} | {gaps[-1]:+.2f}% |"
        )
        print(lines[-1], flush=True)
    summary = (
        f"\n{len(gaps)} instances: gap median {statistics.median(gaps):+.2f}%, "
        f"mean {statistics.mean(gaps):+.2f}%, worst {max(gaps):+.2f}%, best {min(gaps):+.2f}%"
    )
    print(summary)
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n" + summary + "\n")


if __name__ == "__main__":
    main()
