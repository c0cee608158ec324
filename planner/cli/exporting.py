"""``edgepipe export PLAN --to torchtitan|deepspeed``: the plan in another framework's
pipeline configuration terms (:mod:`planner.export`), printed to stdout as it is, or
written with ``-o``; a plan the target cannot express is refused in one line."""

from __future__ import annotations

import argparse

from edgepipe.planner.cli.args import file_output
from edgepipe.planner.cli.console import line
from edgepipe.planner.export import TARGETS, export
from edgepipe.planner.inputs.schema import write_text_atomic
from edgepipe.planner.plan import load_plan


def cmd_export(args: argparse.Namespace) -> None:
    text = export(load_plan(args.plan), args.to)
    if args.output:
        write_text_atomic(args.output, text)
        line(f"wrote {args.output}: plan {args.plan} for {args.to}")
    else:
        line(text.rstrip("\n"))


def add_export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", help="plan file")
    p.add_argument(
        "--to", required=True, choices=sorted(TARGETS),
        help="torchtitan: split points, schedule and micro-batches (TOML job config and "
        "Python config); deepspeed: the PipelineModule partition and batch settings",
    )
    p.add_argument("-o", "--output", type=file_output, help="write to this file instead")
    p.set_defaults(func=cmd_export)


#: command -> the function that adds its arguments and handler to its parser
ARGUMENTS = {"export": add_export_arguments}
