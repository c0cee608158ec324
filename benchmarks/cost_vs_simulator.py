"""The cost model against the independent simulator, by network kind.

For a seeded grid of random plans (tests/helpers/synthetic.py random_plans: random problems on
point-to-point, switched and shared-medium networks, random valid partitions) compares
the cost model's iteration time (what every plan reports), Asteroid's closed form
(``PlanCost.closed_form_ms``) and the DP's search objective (``pipeline_closed_form_ms``)
with the makespan of planner.check.simulator, which prices every device
and every transfer on its own channel and shares no code with the cost model. Relative
error = prediction / simulated - 1 (negative: optimistic). Also prints the time spent in
the cost model and in the simulator over the grid (a ratio within one run).

    .venv/bin/python benchmarks/cost_vs_simulator.py [--plans 2400] [--markdown out.md]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgepipe.planner.check.simulator import simulate
from edgepipe.planner.cost.closed_form import pipeline_closed_form_ms
from edgepipe.planner.cost.model import CostModel

from benchmarks.markdown_table import emit
from tests.helpers.synthetic import random_plans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=int, default=2400)
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--markdown")
    args = parser.parse_args()
    start = time.perf_counter()
    spent = {"cost": 0.0, "sim": 0.0}
    rows: dict[str, list[tuple[float, float, float, str]]] = {}
    for problem, part in random_plans(args.plans, args.seed):
        t0 = time.process_time()
        cm = CostModel(problem)
        cost = cm.evaluate(part)
        t1 = time.process_time()
        objective = pipeline_closed_form_ms(cm, part)
        t2 = time.process_time()
        sim = simulate(problem, part).makespan_ms
        spent["cost"] += t1 - t0
        spent["sim"] += time.process_time() - t2
        where = (
            f"{part.num_stages} stage(s), {len(part.used_devices())} devices, M = "
            f"{part.num_micro_batches}, {problem.config.schedule}, "
            f"{problem.cluster.network.bandwidth_mbps:g} Mbit/s"
        )
        rows.setdefault(problem.cluster.network.kind, []).append(
            (cost.iteration_ms / sim - 1, cost.closed_form_ms / sim - 1, objective / sim - 1, where)
        )
    lines = [
        "| network | plans | cost model: median abs | 99th pct | largest abs | within 1% | "
        "within 5% | Asteroid closed form: median abs | 90th pct | worst | within 5% | "
        "DP objective: median abs | 90th pct | worst | within 5% |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    worst_cases = []
    for kind in ("point_to_point", "switched", "shared_medium"):
        sel = rows.get(kind, [])
        exact = np.array([r[0] for r in sel])
        closed = np.array([r[1] for r in sel])
        dp = np.array([r[2] for r in sel])
        a, c, d = np.abs(exact), np.abs(closed), np.abs(dp)
        lines.append(
            f"| {kind} | {len(sel)} | {np.median(a):.2%} | {np.percentile(a, 99):.2%} | "
            f"{a.max():.1e} | {np.mean(a <= 0.01):.0%} | {np.mean(a <= 0.05):.0%} | "
            f"{np.median(c):.2%} | {np.percentile(c, 90):.1%} | {closed[c.argmax()]:+.1%} | "
            f"{np.mean(c <= 0.05):.0%} | {np.median(d):.2%} | {np.percentile(d, 90):.1%} | "
            f"{dp[d.argmax()]:+.1%} | {np.mean(d <= 0.05):.0%} |"
        )
        worst_cases.append(
            f"- {kind}: cost model's largest |error| {a.max():.1e} on {sel[a.argmax()][3]}; "
            f"closed form's worst {closed[c.argmax()]:+.1%} on {sel[c.argmax()][3]}; "
            f"DP objective's worst {dp[d.argmax()]:+.1%} on {sel[d.argmax()][3]}"
        )
    lines += [
        "",
        *worst_cases,
        "",
        f"({time.perf_counter() - start:.0f} s wall; process time: cost model "
        f"{spent['cost']:.1f} s, simulator {spent['sim']:.1f} s)",
    ]
    emit(lines, args.markdown)


if __name__ == "__main__":
    main()
