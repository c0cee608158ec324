"""The commands that measure with torch on this machine: ``profile`` (a model's blocks)
and ``probe`` (the machine as a device type). Torch is imported inside each command
(:func:`planner.cli.torch_imports.needs_torch`)."""

from __future__ import annotations

import argparse
import json

from edgepipe.planner.cli.args import file_output, increasing_int_list, positive_int
from edgepipe.planner.cli.console import out, progress_bars, progress_callback
from edgepipe.planner.cli.torch_imports import needs_torch
from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.cluster import load_catalog
from edgepipe.planner.inputs.schema import validate, write_text_atomic

GIB = 2**30


def cmd_profile(args: argparse.Namespace) -> None:
    from functools import partial

    from edgepipe.planner.inputs.profile import BuildSpec

    with needs_torch("profile"):
        from edgepipe.executor.profiling import zoo
        from edgepipe.executor.profiling.analytic import analytic_profile
        from edgepipe.executor.profiling.profiler import profile_model

    if args.split is not None and ":" not in args.model:
        raise InputError("--split", "", "splits a MODULE:FACTORY model; zoo models are chains")
    if ":" in args.model:
        if args.split is not None:
            from edgepipe.executor.profiling.split import split_source

            model, build = split_source(args.model, args.split)
        else:
            model = zoo.load_model(args.model)
            build = BuildSpec(callable=args.model)
        if not args.input:
            raise InputError(
                "--input",
                "",
                "a bring-your-own model needs --input MODULE:CALLABLE returning "
                "an example batch of a given size",
            )
        example = zoo.load_callable(args.input)
        name = args.name or args.model.rsplit(":", 1)[1]
    else:
        sizes = zoo.parse_sizes(args.model, args.size)
        model = zoo.build_model(args.model, **sizes)
        build = BuildSpec(zoo=args.model, sizes=sizes, seed=0)
        example = partial(zoo.example_input, args.model, **sizes)
        name = args.name or args.model
    batch_sizes = list(args.batch_sizes)
    with progress_bars() as progress:
        profile = profile_model(
            model,
            example,
            batch_sizes,
            args.device_type,
            name=name,
            warmup=args.warmup,
            repeats=args.repeats,
            num_threads=args.threads,
            progress=progress_callback(progress, f"profiling {name}"),
            build=build,
        )
    if args.analytic:
        profile = analytic_profile(
            profile, load_catalog(), reference=profile.timings[args.device_type]
        )
    write_text_atomic(args.output, json.dumps(profile.to_dict(), indent=1) + "\n")
    out.print(
        f"wrote {args.output}: {name}, {profile.num_blocks} blocks, timed on "
        f"{', '.join(sorted(profile.timings))}"
    )


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


def add_profile_arguments(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--device-type", default="host-cpu", help="timing key the profile records")
    p.add_argument("--name", help="profile name (default: the model's)")
    p.add_argument("--warmup", type=positive_int, default=2, help="untimed runs per batch size")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed runs per batch size")
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
