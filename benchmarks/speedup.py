"""Predicted throughput of the best plan relative to each baseline, per edge cluster.

Clusters: the heterogeneous shipped ones (the demo ``jetson-testbed-6``, ``home-mixed-5``,
``pi-lab-4``; ``orin-pair-2`` is homogeneous) and the demo devices on gigabit Ethernet
instead of shared 100 Mbit/s Wi-Fi (``jetson-testbed-6-ethernet``), which isolates the
network's part in the ratios. Models: every shipped profile usable on them (PipeDream
imports and analytic zoo profiles); config: global batch 32, the CLI's defaults.

For every (cluster, model) ``api.compare`` runs the DP and the baselines; the exact
solver's plan (CP-SAT, warm-started from the DP's plan) comes from the cache of
:mod:`benchmarks.exact_cache` shared with ``solver_vs_dp.py`` (solved and stored when the
instance is not there), re-scored by this tree's cost model; "best" is the better of it
and this tree's DP plan (the exact solver's on a tie). The ratio over
a baseline is its iteration time / the best plan's (= throughput ratio); "inf" when the
baseline has no plan that fits memory. Per cluster and baseline group (conventional:
data-parallel, gpipe, torchgpipe, deepspeed; hybrid: pipedream, hetpipe): the largest
finite ratio over models and baselines, next to the Asteroid paper's "up to 12.2x over
conventional parallelism, 2.1x over hybrid planners", and the geometric mean over models
against the group's strongest baseline.

    .venv/bin/python benchmarks/speedup.py [--time-limit 60] [--markdown out.md]
        [--plot out.png] [--cache benchmarks/results/exact_cpsat_60s.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgepipe.planner import api
from edgepipe.planner.inputs.cluster import Cluster
from edgepipe.planner.inputs.problem import make_problem
from edgepipe.planner.inputs.profile import ModelProfile
from edgepipe.planner.solvers.baselines import BASELINES

from benchmarks import exact_cache
from benchmarks.solver_vs_dp import CONFIGS, ETHERNET, cluster_variant, models

CONVENTIONAL = ("data-parallel", "gpipe", "torchgpipe", "deepspeed")
HYBRID = ("pipedream", "hetpipe")
PAPER = {"conventional": 12.2, "hybrid": 2.1}


def clusters() -> list[Cluster]:
    names = ("jetson-testbed-6", "home-mixed-5", "pi-lab-4")
    return [
        *(Cluster.load(api.resolve(n, "clusters")) for n in names),
        cluster_variant("jetson-testbed-6", "jetson-testbed-6-ethernet", network=ETHERNET),
    ]


def fmt(ratio: float) -> str:
    return "inf" if not np.isfinite(ratio) else f"{ratio:.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--markdown", help="also write the tables to this file")
    parser.add_argument("--plot", help="bar chart of the geometric-mean ratios (PNG)")
    parser.add_argument(
        "--cache", default=str(exact_cache.DEFAULT_PATH), help="exact results' JSON cache"
    )
    parser.add_argument("--clusters", help="comma-separated cluster names (default: all)")
    args = parser.parse_args()
    cache = exact_cache.ExactCache(Path(args.cache), "cpsat", args.time_limit)
    names = ["dp", *BASELINES]
    lines: list[str] = []
    summary = [
        "| cluster | conventional: up to | conventional: strongest (geo-mean) | "
        "hybrid: up to | hybrid: strongest (geo-mean) | exact vs DP planner: up to |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    geo: dict[str, dict[str, float]] = {}
    for cluster in clusters():
        if args.clusters and cluster.name not in args.clusters.split(","):
            continue
        lines += [
            "",
            f"### {cluster.name}",
            "",
            "| model | best samples/s | best layout | " + " | ".join(names) + " |",
            "|---|---:|---|" + "---:|" * len(names),
        ]
        ratios: dict[str, list[float]] = {n: [] for n in names}
        for model_name in models():
            model = ModelProfile.load(api.resolve(model_name, "models"))
            problem = make_problem(model, cluster, CONFIGS["g32"])
            table = api.compare(problem, names)
            dp = table.plans["dp"]
            label = f"{model_name} / {cluster.name} / g32"
            dp_record = {
                "iteration_ms": dp.cost.iteration_ms,
                "solve_time_s": table.row("dp").solve_time_s,
            }
            entry = cache.get(label, problem) or cache.solve(
                label, problem, dp.partition, dp_record
            )
            exact_ms = exact_cache.rescored_ms(problem, entry)
            part = exact_cache.partition_from_dict(entry["partition"])
            best_ms = exact_ms
            if dp.cost.iteration_ms < exact_ms:  # this tree's DP beat the cached solve
                best_ms, part = dp.cost.iteration_ms, dp.partition
            devices = len(part.used_devices())
            layout = f"{part.num_stages} st / {devices} dev / mb {part.micro_batch_size}"
            samples_per_s = problem.config.global_batch * 1000.0 / best_ms
            row = f"| {model_name} | {samples_per_s:.2f} | {layout} |"
            for n in names:
                r = table.row(n)
                ratio = r.iteration_ms / best_ms if r.feasible else float("inf")
                ratios[n].append(ratio)
                row += f" {fmt(ratio)} |"
            lines.append(row)
            print(cluster.name, row, flush=True)
        geo[cluster.name] = {}
        for n in names:
            finite = [r for r in ratios[n] if np.isfinite(r)]
            geo[cluster.name][n] = float(np.exp(np.mean(np.log(finite)))) if finite else np.nan
        lines.append(
            "| geo-mean | | | " + " | ".join(f"{geo[cluster.name][n]:.2f}x" for n in names) + " |"
        )

        def group(members: tuple[str, ...], ratios=ratios, name=cluster.name) -> str:
            """Largest finite ratio (and how many plans did not fit memory) | the
            strongest baseline of the group by geometric mean."""
            every = [r for m in members for r in ratios[m]]
            finite = [r for r in every if np.isfinite(r)]
            infeasible = len(every) - len(finite)
            top = f"{max(finite):.2f}x" + (f" ({infeasible} infeasible)" if infeasible else "")
            strongest = min(
                (m for m in members if np.isfinite(geo[name][m])), key=lambda m: geo[name][m]
            )
            return f"{top} | {geo[name][strongest]:.2f}x ({strongest})"

        summary.append(
            f"| {cluster.name} | {group(CONVENTIONAL)} | {group(HYBRID)} | "
            f"{fmt(max(ratios['dp']))} |"
        )
    summary.append(
        f"| Asteroid paper (MobiCom'24) | up to {PAPER['conventional']}x | | "
        f"up to {PAPER['hybrid']}x | | |"
    )
    text = "\n".join(summary + lines)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    if args.plot:
        plot(geo, names, args.plot)


def plot(geo: dict[str, dict[str, float]], names: list[str], path: str) -> None:
    """Grouped bars: per cluster, the geometric-mean ratio over each baseline (log y)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.2), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / len(names)
    for i, n in enumerate(names):
        xs = [c + (i - len(names) / 2 + 0.5) * width for c in range(len(geo))]
        ax.bar(xs, [geo[c][n] for c in geo], width, label=n)
    ax.set_yscale("log")
    ax.axhline(1.0, color="black", linewidth=0.8)
    for level, style in ((PAPER["conventional"], ":"), (PAPER["hybrid"], "--")):
        ax.axhline(level, color="#c44e52", linestyle=style, linewidth=1)
    ax.set_xticks(range(len(geo)), list(geo), fontsize=8)
    ax.set_ylabel("best plan's throughput / baseline's\n(geometric mean over models)")
    ax.set_title("Exact plan vs baselines (red: Asteroid's 12.2x dotted, 2.1x dashed)", fontsize=9)
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main()
