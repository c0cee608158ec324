"""``edgepipe run PLAN --lab``: the run command's lab flags and its lab launch (docs/lab.md).

The executor, and with it torch, is imported inside :func:`run_in_lab` only.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from edgepipe.planner.cli.args import positive_float
from edgepipe.planner.cli.console import err, warn
from edgepipe.planner.cli.torch_imports import executor_imports
from edgepipe.planner.errors import InputError
from edgepipe.planner.units import human_bytes

if TYPE_CHECKING:
    from edgepipe.executor.core.options import WorkerOptions
    from edgepipe.executor.launch import RunResult

#: run flags the lab refuses, with why
_NOT_IN_LAB = {
    "emulate": ("--emulate", "--emulate waits out the plan's own times, --lab runs real "
                "compute on confined devices; drop one of them"),
    "emulate_join": ("--emulate-join", "the lab runs without in-process recovery, which "
                     "joins need; drop --emulate-join"),
    "standbys": ("--standbys", "the lab runs without in-process recovery, which standbys "
                 "serve; drop --standbys"),
    "watch_slowdown": ("--watch-slowdown", "the lab runs without in-process recovery, "
                       "which re-partitions slow devices; drop --watch-slowdown"),
}


def memory_limit(text: str) -> tuple[str, int]:
    """``DEV=MIB``: a device's lab memory limit in MiB (> 0)."""
    dev, sep, mib = text.partition("=")
    try:
        value = float(mib)
    except ValueError:
        value = -1.0
    if not sep or not dev or not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not DEV=MIB (e.g. d1=512)")
    return dev, int(value * 2**20)


def add_lab_arguments(p: argparse.ArgumentParser) -> None:
    """The run command's lab flags."""
    p.add_argument(
        "--lab", action="store_true",
        help="run every device as a real process confined like it (CPU quota, memory "
        "limit, its own network namespace on links shaped to the cluster's; root, cgroups "
        "and iproute2 needed; docs/lab.md)")
    p.add_argument(
        "--lab-share", type=positive_float, metavar="F",
        help="with --lab: the share of this machine's cores all devices use together "
        "(default 0.5, at most 1)")
    p.add_argument(
        "--lab-memory", type=memory_limit, action="append", default=[], metavar="DEV=MIB",
        help="with --lab: device DEV's memory limit in MiB instead of its budget plus the "
        "process baseline (repeatable)")
    p.add_argument(
        "--lab-skip-memory-check", action="store_true",
        help="with --lab: launch even where a device's memory under the plan exceeds its "
        "limit (the kernel then kills it; tests)")


def check_lab_arguments(args: argparse.Namespace) -> None:
    """Refuse lab flags without ``--lab`` and run flags the lab does not do; a lab run
    does not recover in-process (``args.no_recover`` is set)."""
    if not args.lab:
        for flag, given in (("--lab-share", args.lab_share is not None),
                            ("--lab-memory", bool(args.lab_memory)),
                            ("--lab-skip-memory-check", args.lab_skip_memory_check)):
            if given:
                raise InputError(flag, "", "applies to a lab run only; add --lab or drop it")
        return
    for name, (flag, why) in _NOT_IN_LAB.items():
        if getattr(args, name):
            raise InputError("--lab", "", f"not with {flag}: {why}")
    if args.lab_share is not None and args.lab_share > 1:
        raise InputError("--lab-share", str(args.lab_share),
                         "is a share of this machine's cores, at most 1")
    args.no_recover = True
    # the launcher's store, in the lab's control namespace, cannot resolve its peers'
    # names and torch logs a C++ warning for each; torch reads the level once, when it
    # loads (as executor/worker.py does for the workers)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


def run_in_lab(args: argparse.Namespace, opts: WorkerOptions) -> RunResult:
    """Run ``opts`` in the lab (:func:`executor.lab.launch.run_lab`), saying on stderr
    what each device runs under and what the lab does not reproduce."""
    with executor_imports():
        from edgepipe.executor.lab.launch import DEFAULT_SHARE, LabOptions, run_lab
    lab = LabOptions(
        share=DEFAULT_SHARE if args.lab_share is None else args.lab_share,
        memory_limits=dict(args.lab_memory),
        skip_memory_check=args.lab_skip_memory_check,
    )
    run = run_lab(opts, lab, hang_timeout_s=args.hang_timeout, heartbeat_s=args.heartbeat)
    for dev, c in run.confinements.items():
        limit = "no memory limit" if c.mem_bytes is None else f"limit {human_bytes(c.mem_bytes)}"
        err.print(f"lab device {dev}: {c.cpu_cores:.3g} core, {limit}, peak "
                  f"{human_bytes(run.peak_memory_bytes[dev])}")
    for note in run.notes:
        warn(note)
    return run.result
