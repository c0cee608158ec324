"""The commands that read, check, draw or convert a document without planning: ``show``,
``simulate``, ``validate`` and ``import-pipedream``.

``validate`` is the one to start fast (``edgepipe validate PLAN``): this module imports
the simulator, the Gantt chart (matplotlib) and the PipeDream importer only inside the
commands that use them.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path

from edgepipe.planner.cli.args import chart_file, file_output, positive_int
from edgepipe.planner.cli.console import line, out, warn
from edgepipe.planner.cli.plan_views import gantt_title, print_plan, simulation_summary
from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.cluster import Cluster, catalog_from_dict, load_catalog
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.profile import ModelProfile
from edgepipe.planner.inputs.schema import (
    KINDS,
    ensure_regular_file,
    excerpt,
    read_json,
    write_text_atomic,
)
from edgepipe.planner.plan import Plan, load_plan, plan_from_dict, save_plan


def draw_gantt_atomic(plan: Plan, path: str | Path) -> None:
    """Simulate ``plan``'s iteration and draw its Gantt chart to ``path`` (PNG, SVG or
    PDF by suffix) through a temporary file renamed into place."""
    from edgepipe.planner.check.gantt import draw_gantt
    from edgepipe.planner.check.simulator import simulate

    target = Path(path)
    tmp = target.with_name(f".{target.stem}.{os.getpid()}.tmp{target.suffix}")
    try:
        draw_gantt(simulate(plan.problem, plan.partition), tmp, title=gantt_title(plan))
        tmp.replace(target)
    except OSError as exc:
        raise InputError(str(target), "", f"cannot write the chart ({exc.strerror})") from None
    finally:
        tmp.unlink(missing_ok=True)


def cmd_show(args: argparse.Namespace) -> None:
    plan = load_plan(args.plan)
    if args.output:  # first: a reader of the summary that stops early loses nothing
        draw_gantt_atomic(plan, args.output)
    print_plan(plan)
    if args.output:
        out.print(f"wrote {args.output}", highlight=False)


def cmd_simulate(args: argparse.Namespace) -> None:
    from edgepipe.planner.check.gantt import timeline_text
    from edgepipe.planner.check.simulator import simulate
    from edgepipe.planner.schedule import build

    plan = load_plan(args.plan)
    schedule = None
    if args.schedule is not None and args.schedule != plan.problem.config.schedule:
        stages, m = plan.partition.num_stages, plan.partition.num_micro_batches
        warmups = [plan.problem.config.warmup_depth(p, stages, m) for p in range(stages)]
        schedule = build(args.schedule, warmups, m)
    timeline = simulate(plan.problem, plan.partition, schedule)
    print_plan(plan)
    out.print(timeline_text(timeline))
    out.print(simulation_summary(plan, timeline.makespan_ms, args.schedule))


#: document kind -> the loader that runs its schema and semantic checks (as `plan` does)
LOADERS: dict[str, Callable[[object, str], object]] = {
    "edgepipe.model_profile": ModelProfile.from_dict,
    "edgepipe.device_catalog": catalog_from_dict,
    "edgepipe.cluster": Cluster.from_dict,
    "edgepipe.training_config": TrainingConfig.from_dict,
}


def cmd_validate(args: argparse.Namespace) -> None:
    doc = read_json(args.file)
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if kind not in KINDS:
        shown = excerpt(repr(kind), 40)
        raise InputError(args.file, "$.kind", f"is {shown}; expected one of {sorted(KINDS)}")
    if args.rehash and kind != "edgepipe.plan":
        raise InputError("--rehash", "", f"applies to plans only; {args.file} is a {kind}")
    if kind == "edgepipe.plan":
        plan = plan_from_dict(doc, args.file, rehash=args.rehash)
        if args.rehash and plan.id != doc["id"]:
            save_plan(plan, args.file)
            line(f"{args.file}: valid {kind}; re-identified {doc['id']} -> {plan.id}")
            return
    else:
        LOADERS[kind](doc, args.file)
    line(f"{args.file}: valid {kind}")


def cmd_import_pipedream(args: argparse.Namespace) -> None:
    from edgepipe.planner.inputs.importers.pipedream import (
        implied_batch,
        import_pipedream,
        swallowing_block,
    )

    known = load_catalog()
    if args.device_type not in known:
        raise InputError(
            "--device-type",
            "",
            f"unknown device type {excerpt(args.device_type, 40)!r}; use one of {sorted(known)}",
        )
    profile = import_pipedream(
        ensure_regular_file(args.graph),
        batch_size=args.batch_size,
        device_type=args.device_type,
        name=args.name,
    )
    write_text_atomic(args.output, json.dumps(profile.to_dict(), indent=1) + "\n")
    warning = swallowing_block(profile)
    if warning:
        warn(warning)
    linear = implied_batch(Path(args.graph).read_text(encoding="utf-8"), args.graph)
    if linear is not None and linear > args.batch_size:
        warn(f"the Linear layers' outputs hold {linear} samples of out_features fp32 values, "
             f"not --batch-size {args.batch_size}: if this is a classifier (one vector per "
             f"sample), it was profiled at batch {linear} and every per-sample figure here "
             f"is {linear / args.batch_size:g}x too large: re-import with --batch-size "
             f"{linear}; a sequence model's hold one per token: then ignore this")
    out.print(f"wrote {args.output}: {profile.name}, {profile.num_blocks} blocks")


def add_show_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan")
    p.add_argument("-o", "--output", type=chart_file, help="Gantt chart to write (.png/.svg/.pdf)")
    p.set_defaults(func=cmd_show)


def add_simulate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan")
    p.add_argument(
        "--schedule",
        choices=["1f1b", "gpipe"],
        help="simulate another schedule (default: the plan's)",
    )
    p.set_defaults(func=cmd_simulate)


def add_validate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file")
    p.add_argument(
        "--rehash",
        action="store_true",
        help="accept an edited plan: give it the id of its new content and rewrite the file",
    )
    p.set_defaults(func=cmd_validate)


def add_import_pipedream_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("graph")
    p.add_argument("-o", "--output", type=file_output, required=True)
    p.add_argument(
        "--batch-size",
        type=positive_int,
        required=True,
        help="the batch the graph was profiled at (PipeDream's -b; vgg16: 128; alexnet, "
        "resnet18, squeezenet1_0: 256): a graph.txt does not record it, and a wrong one "
        "scales every per-sample size. Read it off the Input node (activation_size / one "
        "sample's input bytes) or a classifier's last Linear (activation_size / 4 / "
        "out_features); one that does not divide them is refused",
    )
    p.add_argument("--device-type", default="v100", help="catalog type it was profiled on")
    p.add_argument("--name", help="model name (default: the file's stem)")
    p.set_defaults(func=cmd_import_pipedream)


#: command -> the function that adds its arguments and handler to its parser
ARGUMENTS = {
    "show": add_show_arguments,
    "simulate": add_simulate_arguments,
    "validate": add_validate_arguments,
    "import-pipedream": add_import_pipedream_arguments,
}
