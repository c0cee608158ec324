"""The ``demo`` command: the demo's problem (:mod:`planner.cli.lab_demo`) planned with
every planner, then the DP plan, the exact solver's, data parallelism and the best
baseline run and measured against their predictions. Where this machine can host the
lab (root, cgroups, iproute2) they run there (:func:`planner.cli.lab_demo.lab_demo`);
elsewhere, or with ``--emulate``, the demo says why in one line and runs them here on
emulated devices (:mod:`planner.cli.emulated_demo`), saying so in every line."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgepipe.planner.cli.args import non_negative_int, output_dir, positive_float
from edgepipe.planner.cli.console import out
from edgepipe.planner.cli.emulated_demo import emulated_runs
from edgepipe.planner.cli.lab_demo import four_plans, lab_demo, lab_unavailable
from edgepipe.planner.solvers.exact.solver import DEFAULT_BACKEND

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
        four_plans(outdir, args.time_limit, DEFAULT_BACKEND,
                   emulated_runs(outdir, args.run_steps), run=args.run_steps > 0)
    except KeyboardInterrupt:  # its run's workers are reaped (launch): 130 (cli.main)
        raise KeyboardInterrupt(f"interrupted; the demo's files so far are in {outdir}") from None


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out",
        type=output_dir,
        default="out/demo",
        help="folder for the profile, plans, runs and charts",
    )
    p.add_argument(
        "--run-steps",
        type=non_negative_int,
        default=3,
        help="in emulation: steps of each plan's run after its calibration (0: plan only, "
        "run nothing; the demo then runs no lab either)",
    )
    p.add_argument(
        "--emulate", action="store_true",
        help="run the four plans emulated even where this machine can host the lab",
    )
    p.add_argument(
        "--time-limit",
        type=positive_float,
        default=DEMO_TIME_LIMIT,
        help="wall-clock limit in seconds of the exact solver (and its dp) "
        f"(default {DEMO_TIME_LIMIT:g})",
    )
    p.set_defaults(func=cmd_demo)


#: command -> the function that adds its arguments and handler to its parser
ARGUMENTS = {"demo": add_demo_arguments}
