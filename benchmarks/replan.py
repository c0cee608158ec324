"""Re-planning after the loss of every single device: time and quality (issue 8).

For each (model, cluster) the DP plans the full cluster; then, for every device d, the
plan is re-planned with d lost (``planner.replan``, default rule) and, as the
yardstick, the DP solves the surviving devices from scratch. The table gives per loss:
the path taken, the fast path's own time (wall median and minimum of ``--repeats`` runs,
and CPU time of the process, which a loaded machine inflates less; everything but the
full solve: checks, new problem, search, migration), the cost-model evaluations it made,
the whole re-plan call's median wall time, the re-planned throughput as a
fraction of the fresh plan's, and the migration (bytes, predicted seconds).

Targets (issue 8): fast path <= 10 ms on the demo cluster, re-planned throughput >= 95%
of a fresh full plan for the surviving devices.

    .venv/bin/python benchmarks/replan.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

from edgepipe.planner import api
from edgepipe.planner.errors import EdgepipeError
from edgepipe.planner.inputs.problem import make_problem
from edgepipe.planner.plan import Plan
from edgepipe.planner.replan.incremental import replan

CASES = [
    (api.DEMO_MODEL, api.DEMO_CLUSTER, api.DEMO_GLOBAL_BATCH),
    # the former emulated demo's plan (benchmarks/ft_overhead.py: DEMO_RUN_*): one Orin
    # and a standby
    ("resnet18-analytic", api.DEMO_CLUSTER, 8),
    ("pipedream-vgg16", "home-mixed-5", 32),
    ("resnet18-analytic", "pi-lab-4", 64),
]


def fresh_without(plan: Plan, dev: str) -> Plan:
    """The DP's plan for the cluster without ``dev`` (the yardstick)."""
    cl = plan.problem.cluster
    cluster = replace(
        cl,
        devices=tuple(d for d in cl.devices if d.id != dev),
        network=replace(
            cl.network, links=tuple(ln for ln in cl.network.links if dev not in (ln.a, ln.b))
        ),
    )
    return api.solve(make_problem(plan.problem.model, cluster, plan.problem.config, catalog={}))


def run_case(model: str, cluster: str, batch: int, repeats: int) -> list[dict]:
    problem = api.load_problem(model, cluster, global_batch=batch)
    plan = api.solve(problem)
    rows = []
    for dev in [d.id for d in problem.cluster.devices]:
        try:
            new = replan(plan, lost=[dev])
        except EdgepipeError as exc:
            rows.append({"lost": dev, "error": str(exc).split(";")[0][:60]})
            continue
        fast_times, fast_cpu, call_times = [], [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            replan(plan, lost=[dev])
            call_times.append(time.perf_counter() - t0)
            c0 = time.process_time()
            fast = replan(plan, lost=[dev], full_solve=False)
            fast_cpu.append(time.process_time() - c0)
            fast_times.append(fast.solver.settings["fast_path_s"])
        fresh = fresh_without(plan, dev)
        rows.append(
            {
                "lost": dev,
                "used": dev in plan.partition.used_devices(),
                "path": new.changes.path,
                "fast_ms": statistics.median(fast_times) * 1e3,
                "fast_min_ms": min(fast_times) * 1e3,
                "fast_cpu_ms": statistics.median(fast_cpu) * 1e3,
                "evaluations": fast.solver.settings["candidates"],
                "call_ms": statistics.median(call_times) * 1e3,
                "ratio": fresh.cost.iteration_ms / new.cost.iteration_ms,
                "stages": new.partition.num_stages,
                "mib": sum(t.bytes for t in new.migration) / 2**20,
                "migration_s": new.migration_ms / 1e3,
            }
        )
    print(
        f"\n{model} on {cluster} (global batch {batch}): plan "
        f"{plan.partition.num_stages} stages on {len(plan.partition.used_devices())} of "
        f"{len(problem.cluster.devices)} devices, {plan.cost.iteration_ms:.1f} ms/iteration"
    )
    print(
        f"{'lost':<10} {'used':>5} {'path':>5} {'fast ms':>8} {'min ms':>7} {'cpu ms':>7} "
        f"{'evals':>5} {'call ms':>8} "
        f"{'vs fresh':>9} {'stages':>6} {'moved MiB':>10} {'migr. s':>8}"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['lost']:<10} {r['error']}")
            continue
        print(
            f"{r['lost']:<10} {'yes' if r['used'] else 'no':>5} {r['path']:>5} "
            f"{r['fast_ms']:>8.2f} {r['fast_min_ms']:>7.2f} {r['fast_cpu_ms']:>7.2f} "
            f"{r['evaluations']:>5} {r['call_ms']:>8.1f} "
            f"{r['ratio']:>8.1%} {r['stages']:>6} "
            f"{r['mib']:>10.1f} {r['migration_s']:>8.2f}"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    all_rows = []
    for case in CASES:
        all_rows += run_case(*case, args.repeats)
    ok = [r for r in all_rows if "error" not in r]
    fast = [r for r in ok if r["path"] == "fast"]
    print(
        f"\n{len(ok)} losses re-planned: {len(fast)} by the fast path "
        f"(fast path wall median {statistics.median(r['fast_ms'] for r in ok):.2f} ms, "
        f"max {max(r['fast_ms'] for r in ok):.2f} ms; CPU max "
        f"{max(r['fast_cpu_ms'] for r in ok):.2f} ms), "
        f"worst throughput vs fresh {min(r['ratio'] for r in ok):.1%}"
    )


if __name__ == "__main__":
    main()
