"""Steady-state cost of fault tolerance on the emulated demo cluster (issue 8).

The former emulated demo's model and cluster (resnet18 with analytic Jetson times on
jetson-testbed-6, global batch 8; ``edgepipe demo`` now runs the lab demo's problem), in
two plans:

* ``demo``: the DP's own plan on that problem (resnet18 on one Orin); a
  recovering run keeps its replica on a standby process of an idle device
  (docs/fault-tolerance.md, "Standbys"; every idle device that can hold it gets one,
  as the demo's launch does);
* ``3-stage``: a hand-made pipeline on orin-0, nx-0 and tx2-0, cut where the cost
  model's iteration is least, micro-batch 2 x 4 (ring replicas between the stages).

Each is trained here with emulated devices and links (docs/executor.md,
"Heterogeneity emulation") under each configuration in turn, the configurations
alternating ``--repeats`` times within this one script, in forward order on even
repeats and backward on odd ones (A B C C B A ...), so that a load that rises or falls
steadily over a pair of repeats weighs on every configuration alike and the mean of
the per-repeat ratios over an even number of repeats cancels it:

* ``off``: no control plane (the launcher watches exit codes only);
* ``heartbeats``: the control plane at its defaults (a heartbeat every 0.5 s on the
  worker's own store connection, the launcher polling every 20 ms, a control check
  before every action), no recovery (``recover=False``);
* ``heartbeats + replication``: in-process recovery at the replication interval
  ``--interval`` (default ``auto``, the training config's default: the smallest
  interval whose steps hide a point's predicted transfer, which
  :func:`planner.plan.make_plan` resolves, :func:`planner.cost.formulas.hiding_interval` of
  :meth:`planner.cost.model.CostModel.replica_transfer_ms`; every single-device stage's
  weights and optimizer state go to its replica holder every that many steps, in the
  background beside the steps of the interval, paced at the emulated link between
  owner and holder as a background flow that yields to the activations,
  executor/core/emulation.py "Replicas"), with the commit vote before every optimizer step.

Throughput is the global batch over the mean **step period** (the difference of two
consecutive steps' ``started_at`` on a device, the largest device's, steps after the
first): it includes everything a step waits for, replication too (a step's
``wall_ms`` ends at its optimizer step and would not); the mean, not the median, since
at interval k one step in k may wait for a point and a median would hide that. The
default ``--steps`` is 2k + 2, so that the periods cover two whole intervals, each
ending with the join of a point (the second a full one: the first, the untrained
start, has no optimizer state yet). The table gives each
configuration's median over the repeats and its ratio to ``off``, each repeat's ratio
to the ``off`` run of the same repeat and their mean, and, for the
replicating runs, the median time a step was blocked on replication
(``replication_ms``: the snapshot at the commit point plus any wait for the background
half before the vote) and the median background time of a point
(``replication_background_ms``). Target: fault tolerance costs <= 5% of throughput
(ratio >= 0.95). The time scale is calibrated first for each plan, as the demo does, so
that real compute fits the emulated budgets; steps then last what the emulated devices
take, and any extra time is fault tolerance's.

    .venv/bin/python benchmarks/ft_overhead.py [--steps N] [--repeats 2] [--plans demo,3-stage]
        [--interval auto|K] [--configs off,heartbeats,heartbeats + replication]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from edgepipe.executor.core import emulation
from edgepipe.executor.core.options import WorkerOptions
from edgepipe.executor.launch import launch
from edgepipe.planner import api
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.inputs.config import AUTO
from edgepipe.planner.inputs.profile import ModelProfile
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.plan import Plan, SolverInfo, make_plan, save_plan

#: the model measured: a zoo build spec with analytic Jetson times, and this machine's
#: measured profile of the same blocks (for the emulation's time scale)
DEMO_RUN_MODEL, DEMO_RUN_HOST, DEMO_RUN_BATCH = "resnet18-analytic", "resnet18-cpu", 8

#: name -> launch keyword arguments
CONFIGS = {
    "off": {"hang_timeout_s": None},
    "heartbeats": {"recover": False},
    "heartbeats + replication": {"recover": True},
}


DEVICES = ("orin-0", "nx-0", "tx2-0")
MICRO, M = 2, 4


def three_stage_plan() -> Plan:
    """The 3-stage plan of the module docstring: every pair of cuts, the fastest."""
    problem = api.load_problem(DEMO_RUN_MODEL, api.DEMO_CLUSTER, global_batch=DEMO_RUN_BATCH)
    n = problem.model.num_blocks
    plans = []
    for a, b in itertools.combinations(range(1, n), 2):
        cuts = [(0, a), (a, b), (b, n)]
        stages = tuple(StageAssignment(f, e, (d,), (MICRO,))
                       for (f, e), d in zip(cuts, DEVICES, strict=True))
        plans.append(make_plan(problem, Partition(MICRO, M, stages), SolverInfo("hand")))
    return min(plans, key=lambda x: (x.cost.iteration_ms, x.id))


def dp_plan() -> Plan:
    """The DP's plan of the former emulated demo's problem (module docstring)."""
    problem = api.load_problem(DEMO_RUN_MODEL, api.DEMO_CLUSTER, global_batch=DEMO_RUN_BATCH)
    return api.solve(problem, "dp")


#: plan name -> how to build it
PLANS = {"demo": dp_plan, "3-stage": three_stage_plan}


def calibrate(plan: Plan, path: Path, folder: Path) -> float:
    """The emulation's time scale: the profile's guess, then two steps' measurement."""
    host = ModelProfile.load(api.resolve(DEMO_RUN_HOST, "models"))
    first = emulation.time_scale_for(plan, host)
    out = folder / "calibration"
    launch(WorkerOptions(str(path), 2, str(out), emulate=True, time_scale=first, timeout_s=120))
    return emulation.calibrated_time_scale(plan, emulation.read_reports(out))


@dataclass(frozen=True)
class Measured:
    """One run: samples/s from the median step period; median blocked and background
    replication per step (ms; None without replication)."""

    samples_per_s: float
    blocked_ms: float | None
    background_ms: float | None


def _median_of(lines: list[dict], key: str) -> float | None:
    values = [d[key] for m in lines for d in m["devices"].values() if key in d]
    return statistics.median(values) if values else None


def measure(plan: Plan, path: Path, folder: Path, steps: int, k: float,
            kwargs: dict) -> Measured:
    result = launch(WorkerOptions(str(path), steps, str(folder), emulate=True, time_scale=k,
                                  timeout_s=120), **kwargs)
    lines = result.metrics
    if [m["step"] for m in lines] != list(range(steps)) or result.events:
        raise RuntimeError(f"run in {folder} did not train steps 0..{steps - 1} undisturbed")
    periods = [max(b["devices"][d]["started_at"] - a["devices"][d]["started_at"]
                   for d in a["devices"]) for a, b in itertools.pairwise(lines[1:])]
    batch = plan.partition.micro_batch_size * plan.partition.num_micro_batches
    return Measured(batch / statistics.mean(periods),
                    _median_of(lines[1:], "replication_ms"),
                    _median_of(lines[1:], "replication_background_ms"))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def with_interval(plan: Plan, interval: int | str) -> Plan:
    """``plan``'s partition made again at replication interval ``interval`` (``auto``:
    the smallest that hides its predicted transfer, resolved by ``make_plan``)."""
    config = dataclasses.replace(plan.problem.config, replication_interval=interval)
    return make_plan(dataclasses.replace(plan.problem, config=config), plan.partition,
                     plan.solver)


def run_plan(name: str, folder: Path, steps: int | None, repeats: int, interval: int | str,
             configs: list[str]) -> None:
    plan = with_interval(PLANS[name](), interval)
    k = plan.problem.config.replication_interval
    steps = steps if steps is not None else max(8, 2 * k + 2)
    transfer = CostModel(plan.problem, plan.partition.micro_batch_size).replica_transfer_ms(
        plan.partition)
    path = folder / "plan.json"
    save_plan(plan, path)
    scale = calibrate(plan, path, folder)
    cuts = ", ".join(f"[{s.first}, {s.end}) on {s.devices[0]}"
                     for s in plan.partition.stages)
    print(f"{name}: {plan.id}: {DEMO_RUN_MODEL} on {api.DEMO_CLUSTER}: {cuts}, predicted "
          f"{plan.cost.iteration_ms:.1f} ms, a point's transfer {transfer:.0f} ms; "
          f"replication interval {k} ({interval}); emulated, time scale {scale:.2f}; "
          f"{steps} steps x {repeats} alternating repeats; load {_load()}", flush=True)
    runs: dict[str, list[Measured]] = {c: [] for c in configs}
    for r in range(repeats):
        for config in configs if r % 2 == 0 else configs[::-1]:
            got = measure(plan, path, folder / f"{config}-{r}", steps, scale, CONFIGS[config])
            runs[config].append(got)
            print(f"  repeat {r}: {config:<26} {got.samples_per_s:8.3f} samples/s, blocked "
                  f"{_ms(got.blocked_ms)} ms, background {_ms(got.background_ms)} ms; load "
                  f"{_load()}", flush=True)
    off = [m.samples_per_s for m in runs["off"]]
    base = statistics.median(off)
    print()
    print(f"{'plan':<8} {'configuration':<26} {'samples/s (median)':>19} {'ratio to off':>13} "
          f"{'per-repeat ratios':>24} {'mean ratio':>11} {'blocked ms':>11} "
          f"{'background ms':>14}")
    for config, values in runs.items():
        sps = [m.samples_per_s for m in values]
        each = [v / o for v, o in zip(sps, off, strict=True)]
        ratios = " ".join(f"{x:.3f}" for x in each)
        blocked = [m.blocked_ms for m in values if m.blocked_ms is not None]
        background = [m.background_ms for m in values if m.background_ms is not None]
        print(f"{name:<8} {config:<26} {statistics.median(sps):>19.3f} "
              f"{statistics.median(sps) / base:>13.3f} {ratios:>24} "
              f"{statistics.mean(each):>11.3f} "
              f"{_ms(statistics.median(blocked) if blocked else None):>11} "
              f"{_ms(statistics.median(background) if background else None):>14}")
    print(flush=True)


def _load() -> str:
    """The 1-, 5- and 15-minute load averages."""
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=None,
                   help="default 2 x the replication interval + 2 (at least 8)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--interval", default=AUTO,
                   help="replication interval of the replicating runs: auto (default) or K")
    p.add_argument("--configs", default=",".join(CONFIGS),
                   help=f"comma-separated, of {', '.join(CONFIGS)} (off is always run)")
    p.add_argument("--plans", default=",".join(PLANS),
                   help=f"comma-separated, of {', '.join(PLANS)}")
    args = p.parse_args()
    names = [n for n in args.plans.split(",") if n]
    unknown = [n for n in names if n not in PLANS]
    if unknown:
        p.error(f"unknown plan(s) {', '.join(unknown)}; choose from {', '.join(PLANS)}")
    if args.interval != AUTO and not (args.interval.isdigit() and int(args.interval) > 0):
        p.error(f"--interval must be auto or a positive integer, got {args.interval!r}")
    interval = args.interval if args.interval == AUTO else int(args.interval)
    configs = ["off", *(c for c in args.configs.split(",") if c and c != "off")]
    if set(configs) - set(CONFIGS):
        p.error(f"unknown configuration(s) {', '.join(sorted(set(configs) - set(CONFIGS)))}; "
                f"choose from {', '.join(CONFIGS)}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            (Path(tmp) / name).mkdir()
            run_plan(name, Path(tmp) / name, args.steps, args.repeats, interval, configs)


if __name__ == "__main__":
    main()
