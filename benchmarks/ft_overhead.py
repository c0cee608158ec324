"""Steady-state cost of fault tolerance on the emulated demo cluster (issue 8).

The demo's model and cluster (``edgepipe demo``: resnet18 with analytic Jetson times on
jetson-testbed-6, global batch 8) as a 3-stage pipeline on orin-0, nx-0 and tx2-0 (the
DP itself keeps resnet18 on one Orin, whose replica then goes to a standby process:
docs/fault-tolerance.md, "Standbys"; not measured here), cut where
the cost model's iteration is least, micro-batch 2 x 4, is trained here with emulated
devices and links
(docs/executor.md, "Heterogeneity emulation") under each configuration in turn, the
configurations alternating ``--repeats`` times within this one script (so that a load
burst on the shared machine hits all of them alike):

* ``off``: no control plane (the launcher watches exit codes only);
* ``heartbeats``: the control plane at its defaults (a heartbeat every 0.5 s on the
  worker's own store connection, the launcher polling every 20 ms, a control check
  before every action), no recovery (``recover=False``);
* ``heartbeats + replication``: in-process recovery at the default replication interval
  (1: after every step each single-device stage sends its weights and optimizer state
  to its ring replica holder), with the commit vote before every optimizer step.

Throughput is the global batch over the median step period of the steps after the
first: a step's period is its wall time (``wall_ms``: compute start to optimizer step,
the largest rank's) plus the largest rank's ``replication_ms`` (a recovering rank
replicates after its optimizer step, outside ``wall_ms``, before the next step starts;
0 without recovery). The table gives each configuration's median over the repeats and
its ratio to ``off``. Target: fault tolerance costs <= 5% of throughput (ratio >= 0.95). The time
scale is calibrated first, as the demo does, so that real compute fits the emulated
budgets; steps then last what the emulated devices take, and any extra time is the
control plane's.

    .venv/bin/python benchmarks/ft_overhead.py [--steps 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
from pathlib import Path

from executor import emulation
from executor.launch import launch
from executor.worker import WorkerOptions
from planner import api
from planner.cli import DEMO_RUN_BATCH, DEMO_RUN_HOST, DEMO_RUN_MODEL
from planner.partition import Partition, StageAssignment
from planner.plan import Plan, SolverInfo, make_plan, save_plan
from planner.profile import ModelProfile

#: name -> launch keyword arguments
CONFIGS = {
    "off": {"hang_timeout_s": None},
    "heartbeats": {"recover": False},
    "heartbeats + replication": {"recover": True},
}


DEVICES = ("orin-0", "nx-0", "tx2-0")
MICRO, M = 2, 4


def demo_plan(folder: Path) -> tuple[Plan, Path]:
    """The 3-stage plan of the module docstring: every pair of cuts, the fastest."""
    problem = api.load_problem(DEMO_RUN_MODEL, api.DEMO_CLUSTER, global_batch=DEMO_RUN_BATCH)
    n = problem.model.num_blocks
    plans = []
    for a, b in itertools.combinations(range(1, n), 2):
        cuts = [(0, a), (a, b), (b, n)]
        stages = tuple(StageAssignment(f, e, (d,), (MICRO,))
                       for (f, e), d in zip(cuts, DEVICES, strict=True))
        plans.append(make_plan(problem, Partition(MICRO, M, stages), SolverInfo("hand")))
    plan = min(plans, key=lambda x: (x.cost.iteration_ms, x.id))
    path = folder / "plan.json"
    save_plan(plan, path)
    return plan, path


def calibrate(plan: Plan, path: Path, folder: Path) -> float:
    """The demo's time scale: the profile's guess, then two steps' measurement."""
    host = ModelProfile.load(api.resolve(DEMO_RUN_HOST, "models"))
    first = emulation.time_scale_for(plan, host)
    out = folder / "calibration"
    launch(WorkerOptions(str(path), 2, str(out), emulate=True, time_scale=first, timeout_s=120))
    return emulation.calibrated_time_scale(plan, emulation.read_reports(out))


def samples_per_s(plan: Plan, path: Path, folder: Path, steps: int, k: float,
                  kwargs: dict) -> float:
    result = launch(WorkerOptions(str(path), steps, str(folder), emulate=True, time_scale=k,
                                  timeout_s=120), **kwargs)
    periods = [step_period_ms(m) for m in result.metrics[1:]]
    batch = plan.partition.micro_batch_size * plan.partition.num_micro_batches
    return batch / statistics.median(periods) * 1e3


def step_period_ms(line: dict) -> float:
    """A metrics line's step period (module docstring): ``wall_ms`` plus the largest
    device's ``replication_ms``."""
    return line["wall_ms"] + max(
        (d.get("replication_ms", 0.0) for d in line["devices"].values()), default=0.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        plan, path = demo_plan(folder)
        k = calibrate(plan, path, folder)
        cuts = ", ".join(f"[{s.first}, {s.end}) on {s.devices[0]}"
                         for s in plan.partition.stages)
        print(f"{plan.id}: {DEMO_RUN_MODEL} on {api.DEMO_CLUSTER}: {cuts}, predicted "
              f"{plan.cost.iteration_ms:.1f} ms; emulated, time scale {k:.2f}; "
              f"{args.steps} steps x {args.repeats} alternating repeats")
        runs: dict[str, list[float]] = {name: [] for name in CONFIGS}
        for r in range(args.repeats):
            for name, kwargs in CONFIGS.items():
                sps = samples_per_s(plan, path, folder / f"{name}-{r}", args.steps, k, kwargs)
                runs[name].append(sps)
                print(f"  repeat {r}: {name:<26} {sps:8.3f} samples/s", flush=True)
    base = statistics.median(runs["off"])
    print()
    print(f"{'configuration':<26} {'samples/s (median)':>19} {'ratio to off':>13} "
          f"{'per-repeat ratios':>30}")
    for name, values in runs.items():
        ratios = " ".join(f"{v / o:.3f}" for v, o in zip(values, runs["off"], strict=True))
        print(f"{name:<26} {statistics.median(values):>19.3f} "
              f"{statistics.median(values) / base:>13.3f} {ratios:>30}")


if __name__ == "__main__":
    main()
