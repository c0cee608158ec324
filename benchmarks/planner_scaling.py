"""DP planning time and peak memory over blocks x devices x device types (issue 10).

Cases (each run in a fresh process, so its peak resident memory is its own):

- synthetic models (tests/helpers/synthetic.py: random blocks, two timed device types) on
  clusters of N devices in T types (type t has t+1 times the base throughput pattern of
  "fast"/"slow" alternately; 1 Gbit/s switched network), global batch 64, every divisor
  of 64 as micro-batch candidate (seven DP runs);
- PipeDream's shipped profiles on 16 identical Jetson Nanos and vgg16 on 64 (global
  batch 32, the CLI defaults);
- the densely branched NASNet-style graph of tests/helpers/synthetic.py (25 cells, 402 layers)
  imported by the PipeDream importer (252 blocks: its lossless fusion) on 16 Orin Nanos,
  global batch 64 (as benchmarks/import_pipedream_profiles.py);
- small mixed clusters (issue 29): that graph at 15 and 25 cells (152 and 252 blocks) and
  the resnet50-like graph of benchmarks/fine_profiles.py (158 blocks, the issue's case) on
  the shipped ``home-mixed-5`` and ``jetson-testbed-6``, global batch 32 (the CLI's
  default), target <= 1 CPU s and <= 150 MB for the whole process; with ``--whole`` these
  run ``solve(problem, "dp")``, what ``edgepipe plan`` runs (the DP, its coarse views and
  the improvement pass), instead of ``plan_dp``;
- the schema's largest cluster: 1,024 devices of 4 types, 30 blocks
  (tests/helpers/dp_cases.py ``identical``, as tests/integration/test_planning_time.py),
  under the default limit for its size (240 s, planner/solvers/time_limit.py): it must
  complete.

Besides the DP's own wall and CPU time, every case reports its process's (a fresh
spawned interpreter: imports, the problem's construction and one DP run) CPU seconds
and peak resident memory, what ``edgepipe plan`` costs as a whole, and the load average
over the last minute as it ends.

The DP runs as ``plan_dp`` does by default: chains of more than 200 blocks (the 400-block
and NASNet-like cases) coarse to fine (planner/solvers/dp/multilevel.py; ``benchmarks/
multilevel_quality.py`` compares that with the DP on every block).

Targets on the 2-core development machine: 100 blocks x 16 mixed devices <= 2 s;
64 identical devices <= 1 s; 512 devices of 8 types with 100 blocks <= 30 s and <= 2 GB;
400 blocks on 16 identical devices <= 5 s; every shipped PipeDream profile on 16
identical devices <= 0.5 s. Prints a markdown table (also written with --markdown) with
wall-clock and process CPU time; the verdict uses CPU time, which other jobs on a shared
machine inflate far less than wall time (both are reported). A virtual machine's CPU time
still varies with its host's load (by 10-50% within an hour on the development machine,
docs/benchmarks.md), so the run also times a fixed reference workload (pure Python and
numpy, nothing of the planner) and the sessions' reference loop (6e6 squares in pure
Python) before and after the cases: a run whose reference is slow ran on a slow machine.

    .venv/bin/python benchmarks/planner_scaling.py [--repeat 3] [--markdown out.md]
        [--time-limit 120] [--only NAME]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgepipe.planner import api
from edgepipe.planner.inputs.cluster import Cluster, Device, Network, load_catalog
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.importers.pipedream import parse_pipedream
from edgepipe.planner.inputs.problem import Problem, make_problem
from edgepipe.planner.inputs.profile import ModelProfile
from edgepipe.planner.solvers.dp.driver import plan_dp
from edgepipe.planner.solvers.solve import solve
from edgepipe.planner.solvers.time_limit import default_time_limit

from benchmarks import fine_profiles
from tests.helpers.dp_cases import identical
from tests.helpers.synthetic import device_type, nasnet_like, nasnet_profile, random_problem

#: name -> (blocks, devices, types, target seconds, target GiB)
SYNTHETIC = {
    "synthetic 10 x 4 mixed": (10, 4, 2, None, None),
    "synthetic 50 x 8 mixed": (50, 8, 2, None, None),
    "synthetic 100 x 16 mixed": (100, 16, 2, 2.0, None),
    "synthetic 100 x 64 identical": (100, 64, 1, 1.0, None),
    "synthetic 100 x 512, 8 types": (100, 512, 8, 30.0, 2.0),
    "synthetic 400 x 16 identical": (400, 16, 1, 5.0, None),
}
PIPEDREAM = (
    "pipedream-alexnet",
    "pipedream-resnet18",
    "pipedream-squeezenet1_0",
    "pipedream-vgg16",
)


def synthetic(blocks: int, n_dev: int, types: int) -> Problem:
    base = random_problem(blocks, 2, seed=blocks * 1000 + n_dev, global_batch=64,
                          candidates=None, bandwidth_mbps=1000.0)  # fmt: skip
    kinds = {f"t{k}": device_type(f"t{k}", 8e9 / (1 + k % 2), 100.0 + 20 * k, 1e5)
             for k in range(types)}  # fmt: skip
    timings = {}
    for k in range(types):
        t = base.model.timings[("fast", "slow")[k % 2]]
        scale = 1.0 / (1 + 0.15 * k)
        timings[f"t{k}"] = type(t)(
            t.batch_sizes,
            tuple(tuple(v * scale for v in row) for row in t.forward_ms),
            tuple(tuple(v * scale for v in row) for row in t.backward_ms),
        )
    model = ModelProfile(base.model.name, base.model.source, base.model.input_bytes_per_sample,
                         base.model.blocks, timings)  # fmt: skip
    devices = tuple(Device(f"d{i}", f"t{i % types}") for i in range(n_dev))
    cluster = Cluster(f"{n_dev}x{types}", devices, Network(1000.0, 0.5, False), kinds)
    return make_problem(model, cluster, base.config, catalog=kinds)


def nanos(model: str, n_dev: int) -> Problem:
    profile = ModelProfile.load(api.resolve(model, "models"))
    catalog = Cluster.load(api.resolve("jetson-testbed-6", "clusters")).device_types
    devices = tuple(Device(f"nano-{i}", "jetson-nano") for i in range(n_dev))
    cluster = Cluster(f"nano-{n_dev}", devices, Network(940.0, 0.2, False),
                      {"jetson-nano": catalog["jetson-nano"]})  # fmt: skip
    return make_problem(profile, cluster, TrainingConfig(32))


def nasnet(n_dev: int) -> Problem:
    profile = nasnet_profile()
    catalog = load_catalog()
    kinds = {"jetson-orin-nano": catalog["jetson-orin-nano"], "v100": catalog["v100"]}
    devices = tuple(Device(f"orin-{i}", "jetson-orin-nano") for i in range(n_dev))
    cluster = Cluster(f"orin-{n_dev}", devices, Network(940.0, 0.2, False),
                      {"jetson-orin-nano": kinds["jetson-orin-nano"]})  # fmt: skip
    return make_problem(profile, cluster, TrainingConfig(64), catalog=kinds)


def small_mixed(cells: int | str, cluster: str) -> Problem:
    """``cells``: the NASNet-like graph's cell count, or a shape of fine_profiles."""
    profile = (fine_profiles.profile(cells) if isinstance(cells, str) else
               parse_pipedream(nasnet_like(cells), "nasnet-like", batch_size=32,
                               device_type="v100"))  # fmt: skip
    return make_problem(profile, Cluster.load(api.resolve(cluster, "clusters")),
                        TrainingConfig(32), catalog=load_catalog())  # fmt: skip


def build(spec: tuple) -> Problem:
    maker = {"synthetic": synthetic, "nanos": nanos, "nasnet": nasnet, "mixed": small_mixed,
             "identical": identical}[spec[0]]  # fmt: skip
    return maker(*spec[1:])


def cases() -> dict[str, tuple]:
    out: dict[str, tuple] = {
        name: (("synthetic", b, n, t), target_s, target_gb)
        for name, (b, n, t, target_s, target_gb) in SYNTHETIC.items()
    }
    for model in PIPEDREAM:
        out[f"{model} x 16 nanos"] = (("nanos", model, 16), 0.5, None)
    out["pipedream-vgg16 x 64 nanos"] = (("nanos", "pipedream-vgg16", 64), 1.0, None)
    out["nasnet-like (252 fused blocks) x 16 orin nanos"] = (("nasnet", 16), 5.0, None)
    for cells in (15, 25, "resnet50-like"):
        for cluster in ("home-mixed-5", "jetson-testbed-6"):
            name = cells if isinstance(cells, str) else f"nasnet-like {cells} cells"
            out[f"{name} on {cluster}"] = (("mixed", cells, cluster), 1.0, 150 / 1024)
    out["1,024 devices of 4 types, 30 blocks"] = (("identical", 1024, 30, 4), None, None)
    return out


def reference_seconds() -> float:
    """CPU seconds of a fixed workload that shares no code with the planner (a Python
    loop and small numpy operations, as the DP's time is spent), best of 3."""
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        total = 0
        for i in range(1_000_000):
            total += i % 7
        values = np.arange(20_000.0)
        for _ in range(2_000):
            values = np.minimum(values + 1.0, values[::-1] * 0.5)
        best = min(best, time.process_time() - start)
    return best


def squares_seconds() -> float:
    """CPU seconds of the sessions' reference loop (the sum of 6e6 squares in pure Python:
    0.37-0.40 s on the machine the issue's figures came from), best of 3, so that a
    table measured on a slower machine can be read at that speed."""
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        total = 0
        for i in range(6_000_000):
            total += i * i
        best = min(best, time.process_time() - start)
    return best


def run_case(spec: tuple, repeat: int, time_limit: float | None, queue,
             whole: bool = False) -> None:
    problem = build(spec)
    limit = default_time_limit(len(problem.cluster.devices)) if time_limit is None else time_limit
    best = cpu = float("inf")
    result = None
    process_cpu = 0.0
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        if whole:  # edgepipe plan's solve: status, graph, partition and cost as plan_dp's
            plan = solve(problem, "dp", time_limit=limit)
            status = "timed_out" if plan.solver.status == "timed_out" else "complete"
            result = (status, plan.solver.settings["state_graph"], plan.partition, plan.cost)
        else:
            dp = plan_dp(problem, time_limit=limit)
            result = (dp.status, dp.graph, dp.partition, dp.cost)
        best = min(best, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
        if not process_cpu:  # the whole process up to its first plan
            usage = resource.getrusage(resource.RUSAGE_SELF)
            process_cpu = usage.ru_utime + usage.ru_stime
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
    assert result is not None
    queue.put(
        (
            problem.model.num_blocks,
            len(problem.cluster.devices),
            len({d.type for d in problem.cluster.devices}),
            best,
            cpu,
            peak_gib,
            result[0],
            result[1],
            result[2].num_stages,
            len(result[2].used_devices()),
            result[2].micro_batch_size,
            result[3].iteration_ms,
            process_cpu,
            os.getloadavg()[0],
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs")
    parser.add_argument("--time-limit", type=float, default=None,
                        help="DP limit per run (default: the default for the cluster's size, "
                        "60 s up to 256 devices)")
    parser.add_argument("--only", help="run the cases whose name contains this")
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("--whole", action="store_true",
                        help="small mixed cases: run solve(problem, 'dp') as edgepipe plan does "
                        "(DP, coarse views, improvement pass) instead of plan_dp")
    args = parser.parse_args()

    lines = [
        "| case | blocks | devices | types | wall (s) | CPU (s) | process CPU (s) | peak RSS "
        "(MB) | load | status | graph | stages | devices used | micro-batch | iteration (ms) "
        "| target (on CPU time) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---|",
    ]
    before, squares_before = reference_seconds(), squares_seconds()
    print(f"reference workload: {before:.3f} s CPU before the cases; 6e6 squares "
          f"{squares_before:.3f} s", flush=True)
    print(lines[0], flush=True)
    ctx = multiprocessing.get_context("spawn")
    for name, (spec, target_s, target_gb) in cases().items():
        if args.only and args.only not in name:
            continue
        queue = ctx.Queue()
        big = spec[0] in ("synthetic", "identical") and spec[1 + (spec[0] == "synthetic")] >= 512
        repeat = 1 if big or spec[0] == "mixed" else args.repeat
        whole = args.whole and spec[0] == "mixed"
        proc = ctx.Process(target=run_case, args=(spec, repeat, args.time_limit, queue, whole))
        proc.start()
        row = queue.get()
        proc.join()
        blocks, n_dev, types, secs, cpu, gib, status, graph, stages, used, batch, ms = row[:12]
        process_cpu, load = row[12:]
        verdict = ""
        if spec[0] == "identical":
            met = "met" if status == "complete" else "MISSED"
            verdict = f"complete within the default limit: {met}"
        if target_s is not None:
            # small mixed cases: the whole process's CPU (imports and problem included)
            spent = process_cpu if spec[0] == "mixed" else cpu
            ok = status == "complete" and spent <= target_s
            ok = ok and (target_gb is None or gib <= target_gb)
            goal = f"<= {target_s:g} s" + (f", <= {target_gb * 1024:.0f} MB" if target_gb else "")
            verdict = f"{goal}: {'met' if ok else 'MISSED'}"
        lines.append(
            f"| {name} | {blocks} | {n_dev} | {types} | {secs:.3f} | {cpu:.3f} | {process_cpu:.2f} "
            f"| {gib * 1024:.0f} | {load:.1f} | {status} | "
            f"{graph} | {stages} | {used} | {batch} | {ms:.1f} | {verdict} |"
        )
        print(lines[-1], flush=True)
    after, squares_after = reference_seconds(), squares_seconds()
    note = (f"reference workload: {before:.3f} s CPU before the cases, {after:.3f} s after; "
            f"6e6 squares {squares_before:.3f} s before, {squares_after:.3f} s after")
    print(note)
    if args.markdown:
        Path(args.markdown).write_text("\n".join([*lines, "", note]) + "\n")


if __name__ == "__main__":
    main()
