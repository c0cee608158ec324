"""Cost model vs the event simulator on a grid of random plans.

For each random problem (tests/synthetic.py) and random valid partition, compares the
cost model's iteration time (exact schedule recurrence) and Asteroid's closed form (the
DP's objective) with the simulator's makespan. Prints relative-error statistics per
schedule and micro-batch-count bucket (negative = the model is optimistic).

    .venv/bin/python benchmarks/cost_vs_simulator.py [--plans 2000] [--markdown out.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.cost import CostModel
from planner.simulator import simulate
from tests.synthetic import random_partition, random_problem


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=int, default=2000)
    parser.add_argument("--markdown")
    args = parser.parse_args()
    rng = np.random.default_rng(2024)
    rows: list[tuple[str, int, float, float]] = []
    for i in range(args.plans):
        schedule = "1f1b" if i % 4 else "gpipe"
        problem = random_problem(
            int(rng.integers(2, 16)),
            int(rng.integers(1, 9)),
            seed=i,
            global_batch=64,
            candidates=(1, 2, 4, 8, 16, 32),
            bandwidth_mbps=float(rng.choice([100.0, 1e3, 1e4])),
            schedule=schedule,
            warmup="asteroid" if i % 3 else "classic",
        )
        cost = CostModel(problem).evaluate(random_partition(problem, rng))
        sim = simulate(cost.chain).makespan_ms
        rows.append(
            (
                schedule,
                cost.chain.num_micro_batches,
                cost.iteration_ms / sim - 1,
                cost.closed_form_ms / sim - 1,
            )
        )

    lines = [
        "| schedule | micro-batches M | plans | exact: median abs | exact: max abs | "
        "closed form: median | closed form: min | closed form: max | closed form within 2% |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    buckets = [(1, 3), (4, 15), (16, 64)]
    for schedule in ("1f1b", "gpipe"):
        for lo, hi in [*buckets, (1, 64)]:
            sel = [r for r in rows if r[0] == schedule and lo <= r[1] <= hi]
            if not sel:
                continue
            exact = np.abs([r[2] for r in sel])
            closed = np.array([r[3] for r in sel])
            label = f"{lo}-{hi}" if (lo, hi) != (1, 64) else "all"
            lines.append(
                f"| {schedule} | {label} | {len(sel)} | {np.median(exact):.2%} | "
                f"{exact.max():.2%} | {np.median(closed):+.2%} | {closed.min():+.2%} | "
                f"{closed.max():+.2%} | {np.mean(np.abs(closed) <= 0.02):.0%} |"
            )
    print("\n".join(lines))
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
