"""The commands that measure with torch on this machine: ``profile`` (a model's blocks)
and ``probe`` (the machine as a device type). Torch is imported inside each command
(:func:`planner.cli.torch_imports.needs_torch`)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from edgepipe.planner.cli.args import (
    file_output,
    increasing_int_list,
    positive_float,
    positive_int,
)
from edgepipe.planner.cli.console import out, progress_bars, progress_callback, warn
from edgepipe.planner.cli.torch_imports import needs_torch
from edgepipe.planner.inputs.cluster import load_catalog
from edgepipe.planner.inputs.schema import validate, write_text_atomic

if TYPE_CHECKING:
    from edgepipe.executor.profiling.noise import NoisePolicy
    from edgepipe.executor.profiling.sources import ModelSource

GIB = 2**30


def cmd_profile(args: argparse.Namespace) -> None:
    with needs_torch("profile"):
        from edgepipe.executor.profiling.analytic import analytic_profile
        from edgepipe.executor.profiling.noise import measure_until_stable, warnings
        from edgepipe.executor.profiling.profiler import profile_model
        from edgepipe.executor.profiling.sources import build_source

    built = build_source(model_source(args))
    policy = noise_policy(args)
    with progress_bars() as progress:
        tick = progress_callback(progress, f"profiling {built.name}")
        profile = measure_until_stable(
            lambda: profile_model(
                built.model,
                built.example,
                list(args.batch_sizes),
                args.device_type,
                name=built.name,
                warmup=args.warmup,
                repeats=args.repeats,
                num_threads=args.threads,
                progress=tick,
                build=built.build,
            ),
            args.device_type,
            policy,
        )
    for line in warnings(profile, args.device_type, policy):
        warn(line)
    if args.analytic:
        profile = analytic_profile(
            profile, load_catalog(), reference=profile.timings[args.device_type]
        )
    write_text_atomic(args.output, json.dumps(profile.to_dict(), indent=1) + "\n")
    noise = profile.timings[args.device_type].noise
    assert noise is not None
    out.print(
        f"wrote {args.output}: {built.name}, {profile.num_blocks} blocks, timed on "
        f"{', '.join(sorted(profile.timings))} ({noise.rounds} rounds, spread "
        f"{noise.spread:.1%}, load average {noise.load_average})"
    )


def model_source(args: argparse.Namespace) -> ModelSource:
    """The model the command's arguments name (``--model``, ``--size``, ``--input``,
    ``--split``, ``--name``)."""
    from edgepipe.executor.profiling.sources import ModelSource

    return ModelSource(
        model=args.model, sizes=tuple(args.size), input=args.input, split=args.split,
        name=args.name,
    )


def noise_policy(args: argparse.Namespace) -> NoisePolicy:
    """When repeated rounds count as stable (``--max-spread``, ``--max-rounds``)."""
    from edgepipe.executor.profiling.noise import NoisePolicy

    window = min(NoisePolicy.window, args.max_rounds)
    return NoisePolicy(max_spread=args.max_spread, window=window, max_rounds=args.max_rounds)


def cmd_probe(args: argparse.Namespace) -> None:
    with needs_torch("probe"):
        from edgepipe.executor.profiling.probe import probe_device

    with progress_bars() as progress:
        progress.add_task("probing this machine (compute, memory, loopback link)", total=None)
        entry = probe_device(num_threads=args.threads)
    doc = {
        "schema_version": 1,
        "kind": "edgepipe.device_catalog",
        "device_types": {args.name: entry},
    }
    validate(doc, "edgepipe.device_catalog", "probe result")
    write_text_atomic(args.output, json.dumps(doc, indent=1) + "\n")
    out.print(
        f"wrote {args.output}: {args.name}: {entry['peak_fp32_gflops']} GFLOP/s peak, "
        f"efficiency {entry['efficiency']}, {entry['memory_bytes'] / GIB:.1f} GiB, "
        f"link {entry['network']['bandwidth_mbps']} Mbit/s"
    )


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of what to measure and how long (``profile`` and ``lab profile``)."""
    p.add_argument(
        "--model",
        required=True,
        help="zoo name, MODULE:CALLABLE returning an nn.Sequential, or with --split any "
        "nn.Module's MODULE:FACTORY",
    )
    p.add_argument(
        "--split",
        help="cut MODULE:FACTORY's nn.Module into blocks: 'auto' (every module boundary "
        "where one tensor crosses) or module FQNs, e.g. layers.2,layers.4",
    )
    p.add_argument("--input", help="MODULE:CALLABLE(batch) -> example input, for your own model")
    p.add_argument(
        "--size",
        action="append",
        default=[],
        help="zoo size NAME=VALUE (repeatable), e.g. resolution=64",
    )
    p.add_argument(
        "--batch-sizes",
        type=increasing_int_list,
        default=(1, 2, 4, 8),
        help="increasing batch sizes to time (default 1,2,4,8)",
    )
    p.add_argument("--name", help="profile name (default: the model's)")
    p.add_argument("--warmup", type=positive_int, default=2, help="untimed runs per batch size")
    p.add_argument(
        "--repeats", type=positive_int, default=5, help="timed runs per batch size and round"
    )
    p.add_argument(
        "--max-spread",
        type=positive_float,
        default=0.05,
        help="rounds are repeated until the last 3 agree within this relative spread "
        "(default 0.05)",
    )
    p.add_argument(
        "--max-rounds",
        type=positive_int,
        default=8,
        help="stop after this many rounds, stable or not (default 8; 1: one round)",
    )


def add_profile_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--device-type", default="host-cpu", help="timing key the profile records")
    p.add_argument("--threads", type=positive_int, help="torch threads while measuring")
    p.add_argument(
        "--analytic", action="store_true", help="also add analytic times for every catalog type"
    )
    p.add_argument("-o", "--output", type=file_output, required=True)
    p.set_defaults(func=cmd_profile)


def add_probe_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", default="host-cpu", help="device type name to write")
    p.add_argument("--threads", type=positive_int, help="torch threads while measuring")
    p.add_argument("-o", "--output", type=file_output, required=True)
    p.set_defaults(func=cmd_probe)


#: command -> the function that adds its arguments and handler to its parser
ARGUMENTS = {
    "profile": add_profile_arguments,
    "probe": add_probe_arguments,
}
