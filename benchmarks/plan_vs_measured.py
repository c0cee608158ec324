"""Plans executed on the emulated demo cluster: measured vs predicted iteration time.

The demo cluster (``jetson-testbed-6``: six Jetsons on one shared 100 Mbit/s Wi-Fi
channel) and ResNet-18 at 64 x 64 (``resnet18-analytic``: analytic Jetson times, a zoo
build spec). Plans: the DP, the exact solver (CP-SAT, warm-started from the DP) and the
pipeline baselines. Each runs ``--steps`` steps with ``edgepipe run --emulate
--no-recover`` (a device that looks slow or lost under load stops the run instead of
re-partitioning it mid-measurement) at one time scale ``k`` of its own (from this
machine's measured profile ``resnet18-cpu``, see
:func:`executor.core.emulation.time_scale_for`), so each device computes for ``k x`` its
profiled time and every transfer takes ``k x`` its link time on the shared channel;
measured times are divided by ``k`` back into the devices' milliseconds. ``k`` is
calibrated per plan by a 3-step emulated run first (real compute per unit of budget as
measured under the machine's current load, :func:`executor.core.emulation.calibrated_time_scale`).

Table: per plan, the predicted iteration (``plan.cost.iteration_ms``), the measured one
(median step wall time after the first, divided by ``k``), their ratio, and the
emulation's overruns (actions whose real compute exceeded ``k x`` the budget). Then the
predicted and the measured ranking of the plans.

    .venv/bin/python benchmarks/plan_vs_measured.py [--steps 10] [--global-batch 8]
        [--planners dp,milp,gpipe,pipedream,hetpipe] [--out out/plan_vs_measured]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from edgepipe.executor.core.emulation import calibrated_time_scale, read_reports, time_scale_for
from edgepipe.executor.core.options import WorkerOptions
from edgepipe.executor.launch import launch
from edgepipe.planner import api
from edgepipe.planner.check.report import build_report
from edgepipe.planner.errors import EdgepipeError
from edgepipe.planner.inputs.profile import ModelProfile
from edgepipe.planner.plan import save_plan

MODEL, HOST_PROFILE, CLUSTER = "resnet18-analytic", "resnet18-cpu", "jetson-testbed-6"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--planners", default="dp,milp,gpipe,deepspeed,pipedream,hetpipe")
    p.add_argument("--margin", type=float, default=1.5)
    p.add_argument("--out", default="out/plan_vs_measured")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    problem = api.load_problem(MODEL, CLUSTER, global_batch=args.global_batch)
    host = ModelProfile.load(api.resolve(HOST_PROFILE, "models"))
    plans = {}
    for name in args.planners.split(","):
        try:
            plans[name] = api.solve(problem, name, time_limit=30)
        except EdgepipeError as exc:
            print(f"{name}: no plan ({exc})")
    print(f"{MODEL} on {CLUSTER}, global batch {args.global_batch}, {args.steps} steps per "
          "plan, each at its own time scale k")
    rows = []
    for name, plan in plans.items():
        path = out / f"{name}.json"
        save_plan(plan, path)
        started = time.perf_counter()
        # calibrate: 3 steps at the profile's scale, then the scale this machine needs now
        first_k = time_scale_for(plan, host, margin=args.margin)
        # recover=False: a run measures the plan it was given; with launch's default a
        # replicating plan re-partitions when the load makes a device look slow or lost
        launch(WorkerOptions(str(path), 3, str(out / f"{name}-calibration"), emulate=True,
                             time_scale=first_k, timeout_s=300), recover=False)
        k = calibrated_time_scale(plan, read_reports(out / f"{name}-calibration"),
                                  margin=args.margin)
        launch(WorkerOptions(str(path), args.steps, str(out / name), emulate=True,
                             time_scale=k, timeout_s=300), recover=False)
        report = build_report(out / name)  # the plan as run, re-scored on load
        overruns = sum(1 for _ in [report.overrun_warning] if report.overrun_warning)
        rows.append((name, report.plan, report.iteration_measured_ms / k, overruns,
                     report.overrun_warning, time.perf_counter() - started, k))
    print()
    print(f"{'plan':<10} {'stages':>6} {'devices':>7} {'mb x M':>7} {'predicted ms':>12} "
          f"{'measured ms':>11} {'ratio':>6} {'k':>6} {'overruns':>8} {'run s':>6}")
    for name, plan, measured, overruns, _, seconds, k in rows:
        part = plan.partition
        print(f"{name:<10} {part.num_stages:>6} {len(part.used_devices()):>7} "
              f"{part.micro_batch_size:>3} x {part.num_micro_batches:<2} "
              f"{plan.cost.iteration_ms:>12.1f} {measured:>11.1f} "
              f"{measured / plan.cost.iteration_ms:>6.3f} {k:>6.1f} "
              f"{'yes' if overruns else 'no':>8} "
              f"{seconds:>6.0f}")
    predicted_rank = [r[0] for r in sorted(rows, key=lambda r: r[1].cost.iteration_ms)]
    measured_rank = [r[0] for r in sorted(rows, key=lambda r: r[2])]
    # plans with the same partition (the exact solver often returns the DP's) tie: only
    # pairs whose predictions differ must be ordered alike
    swapped = [
        (a[0], b[0]) for a in rows for b in rows
        if a[1].cost.iteration_ms < b[1].cost.iteration_ms and a[1].partition != b[1].partition
        and a[2] >= b[2]
    ]
    print(f"\npredicted ranking: {' < '.join(predicted_rank)}")
    print(f"measured ranking:  {' < '.join(measured_rank)}")
    print("ranking: same (up to plans with identical partitions)" if not swapped else
          f"ranking: DIFFERENT for {swapped}")
    errors = [abs(r[2] / r[1].cost.iteration_ms - 1) for r in rows]
    print(f"worst |measured/predicted - 1| = {max(errors):.3f}, median "
          f"{statistics.median(errors):.3f}")
    for name, _, _, _, warning, _, _ in rows:
        if warning:
            print(f"{name}: {warning}")


if __name__ == "__main__":
    main()
