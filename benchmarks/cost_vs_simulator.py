"""The cost model against the independent simulator, by network kind.

For a seeded grid of random plans (tests/synthetic.py random_plans: random problems on
point-to-point, switched and shared-medium networks, random valid partitions) compares
the cost model's iteration time (what every plan reports) and Asteroid's closed form (the
DP's objective) with the makespan of planner.simulator, which prices every device and
every transfer on its own channel and shares no code with the cost model. Relative error
= prediction / simulated - 1 (negative: optimistic).

    .venv/bin/python benchmarks/cost_vs_simulator.py [--plans 2400] [--markdown out.md]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.cost import CostModel
from planner.simulator import simulate
from tests.synthetic import random_plans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=int, default=2400)
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--markdown")
    args = parser.parse_args()
    start = time.perf_counter()
    rows: dict[str, list[tuple[float, float, str]]] = {}
    for problem, part in random_plans(args.plans, args.seed):
        cost = CostModel(problem).evaluate(part)
        sim = simulate(problem, part).makespan_ms
        where = (
            f"{part.num_stages} stages, {len(part.used_devices())} devices, M = "
            f"{part.num_micro_batches}, {problem.config.schedule}, "
            f"{problem.cluster.network.bandwidth_mbps:g} Mbit/s"
        )
        rows.setdefault(problem.cluster.network.kind, []).append(
            (cost.iteration_ms / sim - 1, cost.closed_form_ms / sim - 1, where)
        )
    lines = [
        "| network | plans | cost model: median abs | 90th pct | 99th pct | worst | "
        "within 1% | within 5% | closed form: median abs | worst |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    worst_cases = []
    for kind in ("point_to_point", "switched", "shared_medium"):
        sel = rows.get(kind, [])
        exact = np.array([r[0] for r in sel])
        closed = np.array([r[1] for r in sel])
        a, c = np.abs(exact), np.abs(closed)
        lines.append(
            f"| {kind} | {len(sel)} | {np.median(a):.2%} | {np.percentile(a, 90):.2%} | "
            f"{np.percentile(a, 99):.2%} | {exact[a.argmax()]:+.2%} | {np.mean(a <= 0.01):.0%} | "
            f"{np.mean(a <= 0.05):.0%} | {np.median(c):.2%} | {closed[c.argmax()]:+.2%} |"
        )
        worst_cases.append(f"- {kind}: worst {exact[a.argmax()]:+.2%} on {sel[a.argmax()][2]}")
    lines += ["", *worst_cases, "", f"({time.perf_counter() - start:.0f} s)"]
    print("\n".join(lines))
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
