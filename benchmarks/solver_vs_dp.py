"""DP plan quality against the exact solver's optimum on shipped clusters x models.

Instances: every shipped cluster (profiles/clusters), the demo testbed on gigabit
Ethernet (``jetson-testbed-6-ethernet``, as in ``speedup.py``) and two 8-device variants
of the demo testbed (2 more Jetsons; on its Wi-Fi and on gigabit Ethernet, to cover the
"<= 8 devices" target): 7 clusters x every shipped model profile usable on them (the four PipeDream
imports and the eight analytic zoo profiles), under the training config ``g32``; the
PipeDream models also under ``g64-adam``:

- ``g32``: global batch 32, every micro-batch size dividing it (1..32), SGD + momentum,
  Asteroid warm-up (the CLI's defaults);
- ``g64-adam``: global batch 64, micro-batches 2, 4, 8 or 16, Adam.

For each instance: the DP's predicted iteration time and solve time, and the first
exact-solver backend's best plan, lower bound, status and solve time (time limit per
instance, warm-started from the DP's plan), read from the cache of
:mod:`benchmarks.exact_cache` when it holds this instance solved with these settings,
else solved and stored there; further backends are solved every time. The reference is
the best known plan, min(exact solver's best, this DP's plan, any plan recorded for the
instance in ``benchmarks/results/known_plans.json``): the optimum where the
exact solver proved its plan optimal (status ``optimal``) and the DP did not beat it,
otherwise only the best known, and the DP's gap (DP - reference) / reference is then a
lower bound on its gap to the optimum; (DP - bound) / bound is an upper bound. Gaps up to
the DP's tie tolerance (0.5%) can be its tie rule's choice (fewer devices, stages or a
smaller micro-batch within it), counted apart. Summaries
per cluster and over all instances (issue 10's target: median 0%, mean <= 0.5%, worst
<= 3%).

    .venv/bin/python benchmarks/solver_vs_dp.py [--backends cpsat,highs,cbc] [--time-limit 60]
        [--markdown out.md] [--clusters jetson-testbed-8-ethernet,pi-lab-4]
        [--cache benchmarks/results/exact_cpsat_60s.json] [--exact-only | --no-solve]

``--exact-only`` fills the cache and prints no table (resumable: cached instances are
skipped); ``--no-solve`` only reads it (the DP side alone, minutes).

``--fine`` runs the fine-grained suite instead (issue 29, :func:`fine_main`): the
DAG-shaped synthetic profiles of :mod:`benchmarks.fine_profiles` (ResNet-, DenseNet-
and Inception-like, 257-1,071 blocks imported node by node) on 4, 8 and 16 identical
and mixed devices; per instance the DP alone, the DP with its coarse views and the
local improvement pass (``solve``, what ``edgepipe plan`` returns), a wider
neighbourhood search from that plan and from the DP's
(:func:`planner.solvers.improve.improve` with radius ``WIDE_RADIUS``, ``WIDE_EVALUATIONS``
evaluations) and, with ``--fine-exact-limit S`` > 0, the exact solver
warm-started from it; the best known plan is the least steady step of them all, and the
DP's gap is to it (target: median
0, worst <= 1%). The load average is printed with every row.

    .venv/bin/python benchmarks/solver_vs_dp.py --fine [--fine-shapes resnet101-like,...]
        [--fine-devices 4,8,16] [--fine-exact-limit 10] [--markdown out.md]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgepipe.planner import api
from edgepipe.planner.inputs.cluster import Cluster
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import Problem, make_problem
from edgepipe.planner.inputs.profile import ModelProfile
from edgepipe.planner.solvers.dp.driver import plan_dp
from edgepipe.planner.solvers.dp.sizes import TIE_TOLERANCE
from edgepipe.planner.solvers.exact.solver import plan_milp
from edgepipe.planner.solvers.improve import improve
from edgepipe.planner.solvers.solve import solve

from benchmarks import exact_cache, fine_profiles

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
        cluster_variant("jetson-testbed-6", "jetson-testbed-6-ethernet", network=ETHERNET),
        cluster_variant("jetson-testbed-6", "jetson-testbed-8", more),
        cluster_variant("jetson-testbed-6", "jetson-testbed-8-ethernet", more, ETHERNET),
    ]


def models() -> list[str]:
    """Shipped model profiles usable on the clusters: the PipeDream imports and the
    analytic zoo profiles (``*-cpu`` profiles are timed on the build host's CPU, a device
    type no cluster has)."""
    return [m for m in api.shipped("models") if not m.endswith("-cpu")]


def instances(order: list[str] | None = None) -> list[tuple[str, Problem]]:
    """Every model x cluster (those named in ``order``, in that order, when given) with
    ``g32``; the PipeDream models also with ``g64-adam``."""
    out = []
    by_name = {c.name: c for c in clusters()}
    unknown = set(order or ()) - set(by_name)
    if unknown:
        raise SystemExit(f"unknown clusters {sorted(unknown)}; available: {sorted(by_name)}")
    for name in order or by_name:
        cluster = by_name[name]
        for model_name in models():
            model = ModelProfile.load(api.resolve(model_name, "models"))
            for config_name, config in CONFIGS.items():
                if config_name != "g32" and not model_name.startswith("pipedream-"):
                    continue
                label = f"{model_name} / {cluster.name} / {config_name}"
                out.append((label, make_problem(model, cluster, config)))
    return out


def gap_summary(rows: list[dict]) -> str:
    """One summary row: instances, DP at the best known, median / mean / worst gap to
    the best known, how many references CP-SAT proved optimal, the worst gap to the
    exact solver's lower bound (an upper bound on the gap to the optimum), DP times."""
    g = np.array([r["gap"] for r in rows])
    above_tie = int(np.sum(g > TIE_TOLERANCE + 1e-9))
    upper = [r["gap_to_bound"] for r in rows if r["gap_to_bound"] is not None]
    proven = sum(r["status"] == "optimal" for r in rows)
    times = [r["dp_s"] for r in rows]
    worst_upper = f"{max(upper):.2%}" if len(upper) == len(rows) else "n/a"
    return (
        f"| {len(g)} | {np.mean(g <= 1e-9):.0%} | {above_tie} | {np.median(g):.2%} | "
        f"{g.mean():.2%} | {g.max():.2%} | {proven}/{len(rows)} | {worst_upper} | "
        f"{np.median(times):.2f} s / {max(times):.2f} s |"
    )


#: the fine suite's shapes (:data:`benchmarks.fine_profiles.SHAPES`), device counts and
#: device mixes: one type, or four Jetson types dealt round robin, on gigabit Ethernet
FINE_SHAPES = ("resnet101-like", "densenet121-like", "inception-like", "inception-large-like")
FINE_DEVICES = (4, 8, 16)
FINE_MIXES = {
    "nx": ("jetson-xavier-nx",),
    "mixed": ("jetson-orin-nano", "jetson-xavier-nx", "jetson-tx2", "jetson-nano"),
}
FINE_CONFIG = TrainingConfig(64, (2, 4, 8, 16))
#: the wider neighbourhood search of the best-known reference: cut radius, evaluations
WIDE_RADIUS, WIDE_EVALUATIONS = 12, 1500


def fine_cluster(mix: str, n: int) -> Cluster:
    """``n`` devices of ``FINE_MIXES[mix]`` dealt round robin, one switch, 940 Mbit/s."""
    kinds = FINE_MIXES[mix]
    doc = {
        "schema_version": 1,
        "kind": "edgepipe.cluster",
        "name": f"{mix}-{n}",
        "devices": [{"id": f"d{i}", "type": kinds[i % len(kinds)]} for i in range(n)],
        "network": dict(ETHERNET),
    }
    return Cluster.from_dict(doc, doc["name"])


def fine_instances(shapes: list[str], devices: list[int]) -> list[tuple[str, Problem]]:
    out = []
    for shape in shapes:
        model = fine_profiles.profile(shape)
        for n in devices:
            for mix in FINE_MIXES:
                out.append((f"{shape} / {mix}-{n}",
                            make_problem(model, fine_cluster(mix, n), FINE_CONFIG)))
    return out


def fine_row(label: str, problem: Problem, exact_limit: float) -> dict:
    """One instance of the fine suite: every figure a steady step (ms) by the cost model;
    CPU seconds of this process."""
    cpu = time.process_time()
    plain = solve(problem, "dp", improve=False, time_limit=600.0)
    plain_cpu, cpu = time.process_time() - cpu, time.process_time()
    ours = solve(problem, "dp", time_limit=600.0)
    ours_cpu, cpu = time.process_time() - cpu, time.process_time()
    # the wider search from both plans: local optima differ
    wide = improve(problem, ours.partition, starts=[plain.partition], radius=WIDE_RADIUS,
                   max_evaluations=WIDE_EVALUATIONS)
    wide_cpu = time.process_time() - cpu
    known = [ours.cost.steady_ms, wide.cost.steady_ms]
    exact, exact_gap = "-", None
    if exact_limit > 0:
        cpu = time.process_time()
        result = plan_milp(problem, time_limit=exact_limit, warm_start=ours.partition)
        known.append(result.cost.steady_ms)
        # the proven gap is of the iteration time (the exact solver's objective)
        exact_gap = 0.0 if result.status == "optimal" else result.gap
        shown = "-" if exact_gap is None else f"{exact_gap:.2%}"
        exact = (f"{result.cost.steady_ms:.1f} {result.status}, gap {shown}, "
                 f"{time.process_time() - cpu:.0f} CPU s")
    best = min(known)
    return {
        "label": label, "blocks": problem.model.num_blocks,
        "devices": len(problem.cluster.devices), "dp_ms": plain.cost.steady_ms,
        "dp_cpu": plain_cpu, "ours_ms": ours.cost.steady_ms, "ours_cpu": ours_cpu,
        "moves": ours.solver.settings["improve"]["moves"],
        "stop": ours.solver.settings["improve"]["status"], "wide_ms": wide.cost.steady_ms,
        "wide_cpu": wide_cpu, "exact": exact, "exact_gap": exact_gap, "best_ms": best,
        "dp_gap": plain.cost.steady_ms / best - 1, "gap": ours.cost.steady_ms / best - 1,
        "load": os.getloadavg()[0],
    }


def proof_summary(rows: list[dict]) -> str:
    """The exact solver's proofs over ``rows`` (issue 29: >= 80% proved or within 1%);
    a row the solver closed nothing on counts as a 100% gap in the median."""
    proven = [r["exact_gap"] for r in rows]
    return (
        f"\nexact solver: proved optimal {sum(g == 0.0 for g in proven)}, gap <= 1% "
        f"{sum(g is not None and g <= 0.01 for g in proven)} of {len(rows)}; median gap "
        f"{np.median([1.0 if g is None else g for g in proven]):.2%}"
    )


def fine_main(args: argparse.Namespace) -> None:
    """The fine-grained suite (module docstring): a row per instance, then a summary."""
    head = ("| instance | L | N | DP ms | DP CPU s | DP+views+improve ms | its CPU s | moves, stop "
            "| wide search ms | its CPU s | exact (limit s) | best known ms | DP gap | "
            "DP+improve gap | load |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    print(head, flush=True)
    rows = []
    for label, problem in fine_instances(args.fine_shapes.split(","),
                                         [int(n) for n in args.fine_devices.split(",")]):
        r = fine_row(label, problem, args.fine_exact_limit)
        rows.append(r)
        line = (f"| {label} | {r['blocks']} | {r['devices']} | {r['dp_ms']:.1f} | "
                f"{r['dp_cpu']:.1f} | {r['ours_ms']:.1f} | {r['ours_cpu']:.1f} | "
                f"{r['moves']} {r['stop']} | {r['wide_ms']:.1f} | {r['wide_cpu']:.1f} | "
                f"{r['exact']} | "
                f"{r['best_ms']:.1f} | {r['dp_gap']:.2%} | {r['gap']:.2%} | {r['load']:.1f} |")
        lines.append(line)
        print(line, flush=True)
    gaps, plain = np.array([r["gap"] for r in rows]), np.array([r["dp_gap"] for r in rows])
    summary = [
        "",
        "| instances | DP+improve at best known | median gap | worst gap | DP alone: median "
        "| DP alone: worst | exact limit | load min-max |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
        f"| {len(rows)} | {np.mean(gaps <= 1e-9):.0%} | {np.median(gaps):.2%} | "
        f"{gaps.max():.2%} | {np.median(plain):.2%} | {plain.max():.2%} | "
        f"{args.fine_exact_limit:g} s | {min(r['load'] for r in rows):.1f}-"
        f"{max(r['load'] for r in rows):.1f} |",
    ]
    if args.fine_exact_limit > 0:
        summary.append(proof_summary(rows))
    print("\n".join(summary))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines + summary) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="cpsat", help="the first one is cached")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--markdown", help="also write the tables to this file")
    parser.add_argument(
        "--clusters", help="comma-separated cluster names, run in this order (default: all)"
    )
    parser.add_argument(
        "--cache", default=str(exact_cache.DEFAULT_PATH), help="exact results' JSON cache"
    )
    parser.add_argument("--exact-only", action="store_true", help="only fill the cache (no table)")
    parser.add_argument(
        "--cached-dp",
        action="store_true",
        help="report the DP figures stored with each exact result (the DP of the commit "
        "that warm-started it) instead of running this tree's DP; implies --no-solve",
    )
    parser.add_argument(
        "--no-solve",
        action="store_true",
        help="never run the exact solver: instances not in the cache are left out",
    )
    parser.add_argument("--fine", action="store_true", help="the fine-grained suite instead")
    parser.add_argument("--fine-shapes", default=",".join(FINE_SHAPES))
    parser.add_argument("--fine-devices", default=",".join(map(str, FINE_DEVICES)))
    parser.add_argument("--fine-exact-limit", type=float, default=0.0,
                        help="seconds of the exact solver per fine instance (0: not run)")
    args = parser.parse_args()
    if args.fine:
        fine_main(args)
        return
    order = args.clusters.split(",") if args.clusters else None
    backends = args.backends.split(",")
    cache = exact_cache.ExactCache(Path(args.cache), backends[0], args.time_limit)

    head = (
        "| instance | L | N | DP ms | DP s | DP CPU s | best known ms | reference | DP gap | "
        "gap to bound |"
    )
    rule = "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|"
    for b in backends:
        head += f" {b} status | {b} s |"
        rule += "---|---:|"
    lines = [head, rule]
    if not args.exact_only:
        print(head, flush=True)
    rows: list[dict] = []
    missing: list[str] = []
    stale: list[str] = []  # cached plans the cost model now prices differently
    timed_out: list[str] = []  # the DP hit its time limit (its plan is its best so far)
    for label, problem in instances(order):
        entry = cache.get(label, problem)
        if args.exact_only and entry is not None:
            print(f"cached: {label}", flush=True)
            continue
        if entry is None and (args.no_solve or args.cached_dp):
            missing.append(label)
            continue
        if args.cached_dp:
            dp_ms, dp_s, dp_cpu = (
                entry["dp"][k] for k in ("iteration_ms", "solve_time_s", "cpu_s")
            )
            if entry["dp"].get("status", "complete") != "complete":
                timed_out.append(label)
        else:
            start, start_cpu = time.perf_counter(), time.process_time()
            dp = plan_dp(problem)
            dp_s = time.perf_counter() - start
            dp_cpu = time.process_time() - start_cpu
            dp_ms = dp.cost.iteration_ms
            if dp.status != "complete":
                timed_out.append(label)
        if entry is None:
            record = {
                "iteration_ms": dp.cost.iteration_ms,
                "solve_time_s": dp_s,
                "cpu_s": dp_cpu,
                "status": dp.status,
            }
            entry = cache.solve(label, problem, dp.partition, record)
            if args.exact_only:
                print(
                    f"solved: {label}: {entry['status']} {entry['best_ms']:.1f} ms "
                    f"(bound {entry['bound_ms']}) in {entry['solve_time_s']:.1f} s, "
                    f"load {entry['load_average']}",
                    flush=True,
                )
                continue
        others = {
            b: plan_milp(problem, backend=b, time_limit=args.time_limit) for b in backends[1:]
        }
        # the exact solver's best is warm-started from the DP of its commit; the DP of
        # this tree may have found better since, so the reference is the best known
        exact_ms = exact_cache.rescored_ms(problem, entry)
        changed = abs(exact_ms / entry["best_ms"] - 1) > 1e-9
        if changed:
            stale.append(f"{label} ({entry['best_ms']:.2f} -> {exact_ms:.2f} ms)")
        known = exact_cache.known_plans_ms(problem, label)
        best = min([exact_ms, dp_ms, *known])
        optimal = entry["status"] == "optimal" and best == exact_ms and not changed
        reference = "optimum" if optimal else "best known"
        if known and min(known) < min(exact_ms, dp_ms):
            reference = "known plan"
        bound = entry["bound_ms"]
        row = {
            "label": label,
            "cluster": problem.cluster.name,
            "gap": dp_ms / best - 1,
            "gap_to_bound": None if bound is None else dp_ms / bound - 1,
            "status": entry["status"],
            "dp_s": dp_s,
        }
        rows.append(row)
        n_dev, n_blk = len(problem.cluster.devices), problem.model.num_blocks
        upper = "n/a" if bound is None else f"{row['gap_to_bound']:.2%}"
        line = (
            f"| {label} | {n_blk} | {n_dev} | {dp_ms:.1f} | {dp_s:.2f} "
            f"| {dp_cpu:.2f} | {best:.1f} | {reference} "
            f"| {row['gap']:.2%} | {upper} | {entry['status']} | {entry['solve_time_s']:.1f} |"
        )
        for r in others.values():
            line += f" {r.status} | {r.solve_time_s:.1f} |"
        lines.append(line)
        print(line, flush=True)
    if args.exact_only:
        return

    summary_head = [
        f"| instances | DP at best known | DP gap > {TIE_TOLERANCE:.1%} (tie rule) | median DP "
        f"gap | mean DP gap | worst DP gap | {backends[0]} proved optimal | worst gap to bound "
        "| DP time median / max |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    summary = ["", "| suite " + summary_head[0], "|---" + summary_head[1]]
    for name in dict.fromkeys(r["cluster"] for r in rows):
        summary.append(f"| {name} " + gap_summary([r for r in rows if r["cluster"] == name]))
    if rows:
        summary.append("| **all** " + gap_summary(rows))
    if timed_out:
        summary += [
            "",
            f"The DP timed out (best plan so far) on {len(timed_out)}: {', '.join(timed_out)}",
        ]
    if stale:
        summary += [
            "",
            f"The cost model changed since these were cached (bounds and proofs stale): "
            f"{len(stale)}: {', '.join(stale)}",
        ]
    if missing:
        summary += ["", f"Not in the cache (left out): {len(missing)}: {', '.join(missing)}"]
    print("\n".join(summary))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines + summary) + "\n")


if __name__ == "__main__":
    main()
