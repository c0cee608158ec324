"""``edgepipe lab profile``: a model profiled inside each device type's lab confinement
(:mod:`executor.lab.profiling`; docs/lab.md, "Lab profiles"). The executor, and with it
torch, is imported inside the command only."""

from __future__ import annotations

import argparse
import json

from edgepipe.planner.cli.args import file_output, positive_float
from edgepipe.planner.cli.console import err, out, warn
from edgepipe.planner.cli.measuring import add_model_arguments, model_source, noise_policy
from edgepipe.planner.cli.torch_imports import executor_imports
from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.schema import write_text_atomic
from edgepipe.planner.units import human_bytes


def cmd_lab_profile(args: argparse.Namespace) -> None:
    from edgepipe.planner.api import resolve
    from edgepipe.planner.inputs.cluster import Cluster

    if args.lab_share is not None and args.lab_share > 1:
        raise InputError("--lab-share", str(args.lab_share),
                         "is a share of this machine's cores, at most 1")
    cluster = Cluster.load(resolve(args.cluster, "clusters"))
    with executor_imports():
        from edgepipe.executor.lab.launch import DEFAULT_SHARE
        from edgepipe.executor.lab.profiling import Job, lab_profile, type_confinements
    share = DEFAULT_SHARE if args.lab_share is None else args.lab_share
    source, policy = model_source(args), noise_policy(args)
    for name, conf in type_confinements(cluster, share).items():
        err.print(f"lab device type {name}: {conf.cpu_cores:.4g} core, limit "
                  f"{human_bytes(conf.mem_bytes or 0)}", highlight=False)

    def job(device_type: str) -> Job:
        return Job(source, device_type, tuple(args.batch_sizes), args.warmup, args.repeats,
                   policy)

    def on_round(device_type: str, rounds: int, spread: float | None) -> None:
        said = "" if spread is None else f", spread {spread:.1%}"
        err.print(f"  {device_type}: round {rounds}{said}", highlight=False)

    result = lab_profile(source, cluster, share, job, on_round)
    for line in result.warnings:
        warn(line)
    profile = result.profile
    write_text_atomic(args.output, json.dumps(profile.to_dict(), indent=1) + "\n")
    out.print(f"wrote {args.output}: {profile.name}, {profile.num_blocks} blocks, lab timings "
              f"of {', '.join(sorted(profile.timings))} (cluster {cluster.name})",
              highlight=False)
    for name, t in sorted(profile.timings.items()):
        assert t.noise is not None and t.lab is not None
        out.print(f"  {name}: quota {t.lab.cpu_cores:.4g} core (got {t.lab.measured_cores:.4g}),"
                  f" {t.noise.rounds} rounds, spread {t.noise.spread:.1%}, peak "
                  f"{human_bytes(result.peak_memory_bytes[name])}", highlight=False)
        if t.runtime_work is not None:
            w = t.runtime_work
            out.print(f"    runtime work per micro-batch: forward {w.forward_ms:.3g} ms, "
                      f"backward {w.backward_ms:.3g} ms ({w.rounds} rounds, spread "
                      f"{w.spread:.1%})", highlight=False)


def add_lab_profile_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--cluster", required=True, help="cluster file or shipped name")
    p.add_argument(
        "--lab-share", type=positive_float, metavar="F",
        help="the share of this machine's cores all the cluster's devices use together, "
        "as in `run --lab` (default 0.5, at most 1)")
    p.add_argument("-o", "--output", type=file_output, required=True)
    p.set_defaults(func=cmd_lab_profile)


def add_lab_arguments(p: argparse.ArgumentParser) -> None:
    """``edgepipe lab``'s subcommands."""
    sub = p.add_subparsers(dest="lab_command", required=True, metavar="{profile}")
    add_lab_profile_arguments(sub.add_parser(
        "profile", help="profile a model in each device type's lab confinement"
    ))


#: command -> the function that adds its arguments and handler to its parser
ARGUMENTS = {"lab": add_lab_arguments}
