"""The exact solver at 16-64 devices of 2-4 types: status, bound, gap and time.

Instances: a PipeDream profile on N Jetson-class devices (N = 16, 32, 64) of T types
(T = 2 or 4, round robin over Jetson Nano, TX2, Xavier NX and Orin Nano from the shipped
catalog) on switched gigabit Ethernet (940 Mbit/s, 0.2 ms), global batch 32 (every
micro-batch size dividing it), SGD + momentum, Asteroid warm-up, ring replication on
(the CLI's defaults). Device classes make the programs' size independent of N (one
class per type here).

Per instance: the DP's figure and wall time; the exact solver's figure (cost model), the
program's own value of that plan, status, global bound and gap (both in the cost
model's figure, valid because the programs relax it), wall time, programs closed / all
and plans excluded by no-good cuts. Time limit per solve (default 60 s).

``--bounds-only``: instead of the solve, the closed-form bounds alone, with no time
limit (what the solver's bound phase reaches when it is not cut short): every program
tested at the DP's figure, the others bisected to ``--tol``; per instance the programs
pruned, the least bound of the rest (the gap the solver would report if it solved none
of them) and the CPU seconds it took.

``--long-chains`` (issue 29): the exact solver alone (its own warm start: the DP's plan
improved, within its limit) on the NASNet-like imports of tests/helpers/synthetic.py
(``nasnet-like-C``: C cells, 10 C + 2 blocks) on the same fleets; per instance the
wall and CPU seconds of the whole call against the limit (which covers the warm start,
the tables and the bounds), status, proven gap, programs closed and the load average.

    .venv/bin/python benchmarks/exact_scaling.py [--time-limit 60] [--models ...]
        [--devices 16,32,64] [--types 2,4] [--markdown out.md] [--bounds-only --tol 0.01]
        [--long-chains --models nasnet-like-15,nasnet-like-30,nasnet-like-60]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from edgepipe.planner import api
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.inputs.cluster import Cluster, Device, Network, load_catalog
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.importers.pipedream import parse_pipedream
from edgepipe.planner.inputs.problem import Problem, make_problem
from edgepipe.planner.inputs.profile import ModelProfile
from edgepipe.planner.solvers.classes import device_classes
from edgepipe.planner.solvers.dp.driver import plan_dp
from edgepipe.planner.solvers.exact.bounds import program_bounds, quick_bound
from edgepipe.planner.solvers.exact.search import CUTOFF_SLACK
from edgepipe.planner.solvers.exact.solver import plan_milp
from edgepipe.planner.solvers.exact.tables import Tables

from tests.helpers.synthetic import nasnet_like

TYPES = ("jetson-nano", "jetson-tx2", "jetson-xavier-nx", "jetson-orin-nano")

#: gigabit Ethernet through one switch: 940 Mbit/s TCP goodput, 0.2 ms (as pi-lab-4)
ETHERNET = Network(940.0, 0.2)


def fleet(n_devices: int, n_types: int) -> Cluster:
    """``n_devices`` devices, types round robin over the first ``n_types`` of TYPES."""
    catalog = load_catalog()
    kinds = TYPES[:n_types]
    devices = tuple(Device(f"d{i}", kinds[i % n_types]) for i in range(n_devices))
    types = {t: catalog[t] for t in kinds}
    return Cluster(f"jetson-{n_devices}x{n_types}", devices, ETHERNET, types)


def problem(model_name: str, n_devices: int, n_types: int) -> Problem:
    if model_name.startswith("nasnet-like-"):
        cells = int(model_name.removeprefix("nasnet-like-"))
        model = parse_pipedream(nasnet_like(cells), model_name, batch_size=32,
                                device_type="v100")  # fmt: skip
    else:
        model = ModelProfile.load(api.resolve(model_name, "models"))
    cluster = fleet(n_devices, n_types)
    return make_problem(model, cluster, TrainingConfig(32), catalog=load_catalog())


def closed_form(prob: Problem, incumbent: float, tol: float) -> tuple[int, int, float, float]:
    """(programs pruned, programs, least bound of the others, CPU s) of the closed-form
    bounds at ``incumbent`` (no time limit)."""
    start = time.process_time()
    sizes = prob.config.micro_batch_sizes()
    tables = Tables(prob, CostModel(prob, max(sizes)), device_classes(prob))
    max_p = min(prob.model.num_blocks, len(prob.cluster.devices))
    ceiling = incumbent * (1 + CUTOFF_SLACK)
    pruned, least = 0, incumbent
    for b in sizes:
        known = [0.0, *(quick_bound(tables, b, p) for p in range(1, max_p + 1))]
        bounds = program_bounds(tables, b, max_p, ceiling, tol, np.array(known))
        pruned += int((bounds[1:] >= ceiling).sum())
        least = min(least, float(bounds[1:].min()))
    return pruned, len(sizes) * max_p, least, time.process_time() - start


BOUNDS_HEAD = (
    "| model | N | types | DP ms | pruned | least open bound ms | gap | CPU s |",
    "|---|---:|---:|---:|---:|---:|---:|---:|",
)
SOLVED_HEAD = (
    "| model | N | types | DP ms | DP s | exact ms | program ms | status | gap "
    "| bound ms | exact s | closed | excluded |",
    "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
)


def bounds_row(prob: Problem, args: argparse.Namespace) -> str:
    """The cells after (model, N, types) of one ``--bounds-only`` row."""
    dp = plan_dp(prob, time_limit=args.time_limit).cost.iteration_ms
    pruned, total, least, cpu = closed_form(prob, dp, args.tol)
    gap = max(0.0, (dp - least) / dp)
    return f"{dp:.1f} | {pruned}/{total} | {least:.1f} | {gap:.1%} | {cpu:.0f}"


def solved_row(prob: Problem, args: argparse.Namespace) -> str:
    """The cells after (model, N, types) of one row of the DP and the exact solver."""
    start = time.perf_counter()
    dp = plan_dp(prob, time_limit=args.time_limit)
    dp_s = time.perf_counter() - start
    r = plan_milp(prob, time_limit=args.time_limit, warm_start=dp.partition)
    closed = sum(s.closed for s in r.subproblems)
    gap = "-" if r.gap is None else f"{r.gap:.1%}"
    bound = "-" if r.bound_ms is None else f"{r.bound_ms:.1f}"
    program = "-" if r.program_ms is None else f"{r.program_ms:.1f}"
    return (
        f"{dp.cost.iteration_ms:.1f} | {dp_s:.1f} | {r.cost.iteration_ms:.1f} | {program} "
        f"| {r.status} | {gap} | {bound} | {r.solve_time_s:.0f} "
        f"| {closed}/{len(r.subproblems)} | {sum(s.excluded for s in r.subproblems)}"
    )


CHAIN_HEAD = (
    "| model | blocks | N | types | limit s | wall s | CPU s | within 10% | status | gap "
    "| exact ms | warm ms | closed | load |",
    "|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|",
)


def chain_row(prob: Problem, args: argparse.Namespace) -> str:
    """The cells after (model, N, types) of one ``--long-chains`` row: the exact solver's
    whole call against its limit."""
    start, cpu = time.perf_counter(), time.process_time()
    r = plan_milp(prob, time_limit=args.time_limit)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    gap = "-" if r.gap is None else f"{r.gap:.2%}"
    within = "yes" if wall <= 1.1 * args.time_limit else "NO"
    warm = "-" if r.warm_start_ms is None else f"{r.warm_start_ms:.1f}"
    closed = sum(s.closed for s in r.subproblems)
    return (f"{prob.model.num_blocks} | {args.time_limit:g} | {wall:.1f} | {cpu:.1f} | {within} "
            f"| {r.status} | {gap} | {r.cost.iteration_ms:.1f} | {warm} "
            f"| {closed}/{len(r.subproblems)} | {os.getloadavg()[0]:.1f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--models", default="pipedream-alexnet,pipedream-vgg16")
    parser.add_argument("--devices", default="16,32,64")
    parser.add_argument("--types", default="2,4")
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("--bounds-only", action="store_true", help="closed-form bounds only")
    parser.add_argument("--tol", type=float, default=0.01, help="bisection tolerance")
    parser.add_argument("--long-chains", action="store_true",
                        help="the exact solver's whole call against its limit")  # fmt: skip
    args = parser.parse_args()
    row = chain_row if args.long_chains else bounds_row if args.bounds_only else solved_row
    head = CHAIN_HEAD if args.long_chains else BOUNDS_HEAD if args.bounds_only else SOLVED_HEAD
    lines = list(head)
    print("\n".join(lines), flush=True)
    for model_name in args.models.split(","):
        for n_devices in (int(n) for n in args.devices.split(",")):
            for n_types in (int(t) for t in args.types.split(",")):
                cells = row(problem(model_name, n_devices, n_types), args)
                if args.long_chains:  # blocks after the model's name
                    blocks, rest = cells.split(" | ", 1)
                    lines.append(f"| {model_name} | {blocks} | {n_devices} | {n_types} | {rest} |")
                else:
                    lines.append(f"| {model_name} | {n_devices} | {n_types} | {cells} |")
                print(lines[-1], flush=True)
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
