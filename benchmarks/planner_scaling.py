"""DP planning time over blocks x devices (issue: planner core).

Synthetic models (tests/synthetic.py: two device types, uniform 1 Gbit/s shared network)
with global batch 64 and the default micro-batch candidates (every divisor of 64: seven
sizes), plus the PipeDream vgg16 profile on the demo cluster. Prints a table and writes
it as markdown with --markdown FILE. Targets on a 2-core machine: 50 blocks x 8 devices
<= 1 s, 100 x 16 <= 20 s, vgg16 on the demo cluster <= 1 s.

    .venv/bin/python benchmarks/planner_scaling.py [--repeat 3] [--markdown out.md]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner import api
from planner.dp import plan_dp
from tests.synthetic import random_problem

GRID_BLOCKS = (10, 25, 50, 100)
GRID_DEVICES = (2, 4, 8, 16)
TARGETS = {(50, 8): 1.0, (100, 16): 20.0}


def timed(problem, repeat: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = plan_dp(problem)
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs")
    parser.add_argument("--markdown", help="also write the table to this file")
    args = parser.parse_args()

    lines = [
        "| blocks | devices | DP time (s) | stages | micro-batch | target |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for blocks in GRID_BLOCKS:
        for devices in GRID_DEVICES:
            problem = random_problem(
                blocks,
                devices,
                seed=blocks * 100 + devices,
                global_batch=64,
                candidates=None,
                bandwidth_mbps=1000.0,
            )
            repeat = 1 if blocks * devices >= 800 else args.repeat
            secs, result = timed(problem, repeat)
            target = TARGETS.get((blocks, devices))
            verdict = (
                ""
                if target is None
                else f"<= {target:g} s: {'met' if secs <= target else 'MISSED'}"
            )
            lines.append(
                f"| {blocks} | {devices} | {secs:.3f} | {result.partition.num_stages} | "
                f"{result.partition.micro_batch_size} | {verdict} |"
            )
            print(lines[-1], flush=True)
    problem = api.load_problem(api.DEMO_MODEL, api.DEMO_CLUSTER)
    secs, result = timed(problem, args.repeat)
    lines.append(
        f"| vgg16 ({problem.model.num_blocks}, PipeDream) | 6 (demo) | {secs:.3f} | "
        f"{result.partition.num_stages} | {result.partition.micro_batch_size} | "
        f"<= 1 s: {'met' if secs <= 1.0 else 'MISSED'} |"
    )
    print(lines[-1])
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
