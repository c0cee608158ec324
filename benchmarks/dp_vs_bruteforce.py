"""DP plan quality against exhaustive search on tiny instances (<= 6 blocks, <= 4 devices).

The oracle enumerates every stage count, block cut, device-to-stage assignment (any
order, idle devices allowed) and positive sample split, keeping memory-feasible plans,
and scores them with the cost model. On clusters this small the DP searches every
device-to-stage assignment too (its complete state graph), with Algorithm 1 splits and
the closed form as its objective, so its gap shows what those two cost.

    .venv/bin/python benchmarks/dp_vs_bruteforce.py [--instances 40] [--markdown out.md]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgepipe.planner.solvers.dp.driver import plan_dp

from benchmarks.markdown_table import emit
from tests.helpers.oracles import brute_force_best
from tests.helpers.synthetic import random_problem


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=40)
    parser.add_argument("--markdown")
    args = parser.parse_args()
    gaps, dp_times, bf_times = [], [], []
    shapes = list(itertools.product(range(2, 7), range(2, 5)))
    rng = np.random.default_rng(5)
    for i in range(args.instances):
        blocks, devices = shapes[i % len(shapes)]
        problem = random_problem(
            blocks,
            devices,
            seed=i,
            global_batch=4,
            candidates=(2, 4),
            bandwidth_mbps=float(rng.choice([1e3, 1e4, 1e5])),
            memory=(float(rng.choice([8e9, 6e7])), float(rng.choice([4e9, 3e7]))),
        )
        start = time.perf_counter()
        oracle, _ = brute_force_best(problem)
        bf_times.append(time.perf_counter() - start)
        if not np.isfinite(oracle):
            continue
        start = time.perf_counter()
        dp = plan_dp(problem).cost.iteration_ms
        dp_times.append(time.perf_counter() - start)
        gaps.append(dp / oracle - 1)
    gaps_arr = np.array(gaps)
    lines = [
        "| instances | DP optimal | median gap | mean gap | worst gap | DP time (median) | "
        "brute force time (median) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {len(gaps)} | {np.mean(gaps_arr <= 1e-9):.0%} | {np.median(gaps_arr):.2%} | "
        f"{gaps_arr.mean():.2%} | {gaps_arr.max():.2%} | {np.median(dp_times) * 1e3:.1f} ms | "
        f"{np.median(bf_times):.2f} s |",
    ]
    emit(lines, args.markdown)


if __name__ == "__main__":
    main()
