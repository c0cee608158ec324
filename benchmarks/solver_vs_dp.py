"""DP plan quality against the exact solver's optimum on shipped clusters x models.

Instances: every shipped cluster (profiles/clusters) plus two 8-device variants of the
demo testbed (2 more Jetsons; on its Wi-Fi and on gigabit Ethernet, to cover the "<= 8
devices" target) x every shipped model profile usable on them (the four PipeDream
imports and the eight analytic zoo profiles), under the training config ``g32``; the
PipeDream models also under ``g64-adam``:

- ``g32``: global batch 32, every micro-batch size dividing it (1..32), SGD + momentum,
  Asteroid warm-up (the CLI's defaults);
- ``g64-adam``: global batch 64, micro-batches 2, 4, 8 or 16, Adam.

For each instance: the DP's predicted iteration time and solve time, and for each
exact-solver backend its optimum, status and solve time (time limit per instance). The
DP's gap is (DP - optimum) / optimum, the optimum taken from the first backend. Target:
the exact solver proves optimality on every instance with <= 8 devices and <= 40 blocks
within 60 s on this machine.

    .venv/bin/python benchmarks/solver_vs_dp.py [--backends cpsat,highs,cbc] [--time-limit 60]
        [--markdown out.md] [--clusters jetson-testbed-8-ethernet,pi-lab-4]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner import api
from planner.cluster import Cluster
from planner.config import TrainingConfig
from planner.dp import plan_dp
from planner.milp import plan_milp
from planner.problem import Problem, make_problem
from planner.profile import ModelProfile

CONFIGS = {
    "g32": TrainingConfig(32),
    "g64-adam": TrainingConfig(64, (2, 4, 8, 16), optimizer="adam"),
}

#: gigabit Ethernet through one switch: 940 Mbit/s TCP goodput, 0.2 ms (as pi-lab-4)
ETHERNET = {"bandwidth_mbps": 940, "latency_ms": 0.2, "shared_medium": False}


def cluster_variant(
    base: str, name: str, extra: tuple[tuple[str, str], ...] = (), network: dict | None = None
) -> Cluster:
    """A shipped cluster with ``extra`` (id, type) devices and/or another network."""
    doc = json.loads(api.resolve(base, "clusters").read_text())
    doc["name"] = name
    doc["devices"] += [{"id": i, "type": t} for i, t in extra]
    if network is not None:
        doc["network"] = dict(network)
    return Cluster.from_dict(doc, name)


def clusters() -> list[Cluster]:
    shipped = [Cluster.load(api.resolve(c, "clusters")) for c in api.shipped("clusters")]
    more = (("orin-1", "jetson-orin-nano"), ("nx-1", "jetson-xavier-nx"))
    return [
        *shipped,
        cluster_variant("jetson-testbed-6", "jetson-testbed-8", more),
        cluster_variant("jetson-testbed-6", "jetson-testbed-8-ethernet", more, ETHERNET),
    ]


def models() -> list[str]:
    """Shipped model profiles usable on the clusters: the PipeDream imports and the
    analytic zoo profiles (``*-cpu`` profiles are timed on the build host's CPU, a device
    type no cluster has)."""
    return [m for m in api.shipped("models") if not m.endswith("-cpu")]


def instances(only: set[str] | None = None) -> list[tuple[str, Problem]]:
    """Every model x cluster (those named in ``only``, when given) with ``g32``; the
    PipeDream models also with ``g64-adam``."""
    out = []
    for cluster in clusters():
        if only is not None and cluster.name not in only:
            continue
        for model_name in models():
            model = ModelProfile.load(api.resolve(model_name, "models"))
            for config_name, config in CONFIGS.items():
                if config_name != "g32" and not model_name.startswith("pipedream-"):
                    continue
                label = f"{model_name} / {cluster.name} / {config_name}"
                out.append((label, make_problem(model, cluster, config)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="cpsat")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--markdown", help="also write the tables to this file")
    parser.add_argument("--clusters", help="comma-separated cluster names (default: all)")
    args = parser.parse_args()
    only = set(args.clusters.split(",")) if args.clusters else None
    backends = args.backends.split(",")

    head = "| instance | L | N | DP ms | DP s | DP CPU s | optimum ms | DP gap |"
    rule = "|---|---:|---:|---:|---:|---:|---:|---:|"
    for b in backends:
        head += f" {b} status | {b} s |"
        rule += "---|---:|"
    lines = [head, rule]
    print(head, flush=True)
    gaps, dp_times = [], []
    per_backend: dict[str, list[tuple[float, str, bool]]] = {b: [] for b in backends}
    for label, problem in instances(only):
        start, start_cpu = time.perf_counter(), time.process_time()
        dp = plan_dp(problem)
        dp_times.append(time.perf_counter() - start)
        dp_cpu = time.process_time() - start_cpu
        results = {b: plan_milp(problem, backend=b, time_limit=args.time_limit) for b in backends}
        optimum = results[backends[0]].cost.iteration_ms
        gap = dp.cost.iteration_ms / optimum - 1
        gaps.append(gap)
        n_dev, n_blk = len(problem.cluster.devices), problem.model.num_blocks
        row = (
            f"| {label} | {n_blk} | {n_dev} | {dp.cost.iteration_ms:.1f} | {dp_times[-1]:.2f} "
            f"| {dp_cpu:.2f} | {optimum:.1f} | {gap:.2%} |"
        )
        for b, r in results.items():
            row += f" {r.status} | {r.solve_time_s:.1f} |"
            per_backend[b].append((r.solve_time_s, r.status, n_dev <= 8 and n_blk <= 40))
        lines.append(row)
        print(row, flush=True)

    g = np.array(gaps)
    summary = [
        "",
        "| instances | DP optimal | median DP gap | mean DP gap | worst DP gap | "
        "DP time median / max |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {len(g)} | {np.mean(g <= 1e-9):.0%} | {np.median(g):.2%} | {g.mean():.2%} | "
        f"{g.max():.2%} | {np.median(dp_times):.2f} s / {max(dp_times):.2f} s |",
        "",
        "| backend | proven optimal | time median | time max | target (<= 8 devices, "
        f"<= 40 blocks: optimal within {args.time_limit:g} s) |",
        "|---|---:|---:|---:|---|",
    ]
    for b, runs in per_backend.items():
        times = [t for t, _, _ in runs]
        proven = sum(s == "optimal" for _, s, _ in runs)
        target = all(s == "optimal" and t <= args.time_limit for t, s, small in runs if small)
        summary.append(
            f"| {b} | {proven}/{len(runs)} | {np.median(times):.1f} s | {max(times):.1f} s | "
            f"{'met' if target else 'MISSED'} |"
        )
    print("\n".join(summary))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines + summary) + "\n")


if __name__ == "__main__":
    main()
