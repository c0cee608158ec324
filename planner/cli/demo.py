"""The ``demo`` command. Where this machine can host the lab (root, cgroups, iproute2),
the demo runs there (:mod:`planner.cli.lab_demo`): a hybrid plan and its alternatives
profiled, planned and run on confined devices, measured against their predictions.
Elsewhere, or with ``--emulate``, it says why in one line and runs in emulation: plan
the demo model on the demo cluster, show and simulate the plan, compare the planners,
then run a small plan here on emulated devices and set the measured iteration against
the prediction."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgepipe.planner import api
from edgepipe.planner.cli.args import non_negative_int, output_dir, positive_float
from edgepipe.planner.cli.console import err, out, progress_bars, progress_callback, warn
from edgepipe.planner.cli.lab_demo import lab_demo, lab_unavailable
from edgepipe.planner.cli.plan_views import gantt_title, print_plan, simulation_summary
from edgepipe.planner.cli.planning import run_compare
from edgepipe.planner.cli.torch_imports import executor_imports
from edgepipe.planner.errors import EdgepipeError
from edgepipe.planner.inputs.profile import ModelProfile
from edgepipe.planner.plan import replica_standbys, save_plan, short_run_note
from edgepipe.planner.solvers.exact.solver import DEFAULT_BACKEND

#: the model the demo runs here: a zoo build spec with analytic Jetson times, and this
#: machine's measured profile of the same blocks (for the emulation's time scale)
DEMO_RUN_MODEL, DEMO_RUN_HOST, DEMO_RUN_BATCH = "resnet18-analytic", "resnet18-cpu", 8
#: the exact solver's limit in the demo (s): the demo stays a few minutes long
DEMO_TIME_LIMIT = 20.0


def cmd_demo(args: argparse.Namespace) -> None:
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    try:
        if args.run_steps and not args.emulate:
            why = lab_unavailable()
            if why is None:
                lab_demo(outdir, args.time_limit, DEFAULT_BACKEND)
                return
            out.print(f"in emulation, not in the lab: {why}", highlight=False, markup=False)
        _demo_steps(args, outdir)
    except KeyboardInterrupt:  # its run's workers are reaped (launch): 130 (cli.main)
        raise KeyboardInterrupt(f"interrupted; the demo's files so far are in {outdir}") from None


def _demo_steps(args: argparse.Namespace, outdir: Path) -> None:
    """The demo's steps (:func:`cmd_demo`), writing into ``outdir``."""
    from edgepipe.planner.check.gantt import draw_gantt
    from edgepipe.planner.check.simulator import simulate

    out.rule(f"edgepipe demo: {api.DEMO_MODEL} on {api.DEMO_CLUSTER}")
    problem = api.load_problem(api.DEMO_MODEL, api.DEMO_CLUSTER)
    with progress_bars() as progress:
        plan = api.solve(problem, "dp", progress_callback(progress, "planning (dp)"))
    print_plan(plan)
    path = outdir / "plan.json"
    save_plan(plan, path)
    timeline = simulate(plan.problem, plan.partition)
    draw_gantt(timeline, outdir / "gantt.png", title=gantt_title(plan))
    out.print(simulation_summary(plan, timeline.makespan_ms))
    out.print(f"wrote {path} and {outdir / 'gantt.png'}", highlight=False)
    out.rule("the DP against the exact solver and the baselines")
    run_compare(problem, None, DEFAULT_BACKEND, args.time_limit, outdir)
    if args.run_steps:
        _demo_run(outdir, args.run_steps)


def _demo_run(outdir: Path, steps: int) -> None:
    """Plan DEMO_RUN_MODEL on the demo cluster, run the plan here with emulated devices
    and links, and set the measured iteration against the prediction."""
    from edgepipe.planner.check.report import build_report, draw_report

    out.rule(f"running a plan here: {DEMO_RUN_MODEL} on {api.DEMO_CLUSTER}, emulated")
    try:
        with executor_imports():
            from edgepipe.executor import launch
            from edgepipe.executor.core import emulation
            from edgepipe.executor.core.options import WorkerOptions
    except EdgepipeError as exc:
        out.print(f"skipped: {exc}", highlight=False)
        return
    problem = api.load_problem(DEMO_RUN_MODEL, api.DEMO_CLUSTER, global_batch=DEMO_RUN_BATCH)
    plan = api.solve(problem, "dp")
    print_plan(plan)
    host = ModelProfile.load(api.resolve(DEMO_RUN_HOST, "models"))
    path = outdir / "run-plan.json"
    save_plan(plan, path)
    run_dir = outdir / "run"
    # this CPU is slower than the Jetsons: 2 steps at the scale its measured profile
    # suggests, then the scale its real compute under the current load needs; the
    # calibration runs as the measured run does (recovering or not: a recovering run's
    # standbys and replication compete for this machine's cores in both, so the scale
    # allows for them)
    # a few steps cannot hide a replica whose transfer takes many (the demo's 93.5 MB
    # over the modelled Wi-Fi: ~340 steps, which its interval, auto, spans, but 2 steps
    # do not), so such a short run goes without recovery and says why (docs/decisions.md)
    slow = short_run_note(plan, min(2, steps))
    recover = None if slow is None else False
    first_k = emulation.time_scale_for(plan, host)
    err.print(f"calibrating: 2 emulated steps at time scale {first_k:.1f}", soft_wrap=True)
    launch.launch(
        WorkerOptions(
            str(path), 2, str(outdir / "run-calibration"), emulate=True, time_scale=first_k,
            timeout_s=120,
        ),
        recover=recover,
    )
    k = emulation.calibrated_time_scale(
        plan, emulation.read_reports(outdir / "run-calibration")
    )
    used = len(plan.partition.used_devices())
    spares = len(replica_standbys(plan)) if slow is None else 0
    held = f" and {spares} standbys that hold its replica" if spares else ""
    err.print(f"running {steps} steps on {used + spares} local "
              f"process{'es' if used + spares > 1 else ''} ({used} of the "
              f"plan{held}), every emulated time x {k:.1f}", soft_wrap=True)
    if slow is not None:
        err.print(f"without replicas or recovery (calibration and run alike): {slow}",
                  soft_wrap=True, highlight=False, markup=False)
    launch.launch(
        WorkerOptions(
            str(path), steps, str(run_dir), emulate=True, time_scale=k, timeout_s=120
        ),
        recover=recover,
    )
    report = build_report(run_dir)
    draw_report(report, run_dir, run_dir / "report.png")
    measured = report.iteration_measured_ms / k
    out.print(
        f"iteration on the emulated devices: predicted {plan.cost.iteration_ms:.1f} ms, "
        f"measured {measured:.1f} ms (x{measured / plan.cost.iteration_ms:.2f}; "
        f"{report.iteration_measured_ms:.0f} ms here at time scale {k:.1f}); wrote "
        f"{run_dir}/report.png (`edgepipe report {run_dir}` for the per-device table)",
        highlight=False,
    )
    if report.overrun_warning:
        warn(report.overrun_warning)


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out",
        type=output_dir,
        default="out/demo",
        help="folder for the plan, chart and comparison",
    )
    p.add_argument(
        "--run-steps",
        type=non_negative_int,
        default=3,
        help="in emulation: also run a plan of resnet18 here for this many emulated steps "
        "(0: skip; the demo then runs no lab either)",
    )
    p.add_argument(
        "--emulate", action="store_true",
        help="run the emulated demo even where this machine can host the lab",
    )
    p.add_argument(
        "--time-limit",
        type=positive_float,
        default=DEMO_TIME_LIMIT,
        help="wall-clock limit in seconds of the comparison's exact solver (and its dp) "
        f"(default {DEMO_TIME_LIMIT:g})",
    )
    p.set_defaults(func=cmd_demo)


#: command -> the function that adds its arguments and handler to its parser
ARGUMENTS = {"demo": add_demo_arguments}
