"""The commands that run a planner: ``plan``, ``compare`` and ``replan``.

Every flag is parsed into a typed value before anything runs; training-config flags given
explicitly beat a ``--config`` file's values; a solver flag that does not apply to the
chosen planner is an error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from edgepipe.planner import api
from edgepipe.planner.cli.args import (
    device_factor,
    int_list,
    name_list,
    output_dir,
    output_file,
    positive_float,
    positive_int,
    replication_interval,
)
from edgepipe.planner.cli.console import (
    compact_table,
    err,
    out,
    print_table,
    progress_bars,
    progress_callback,
)
from edgepipe.planner.cli.plan_views import print_plan
from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.cluster import Cluster
from edgepipe.planner.inputs.config import OPTIMIZER_STATE, TrainingConfig
from edgepipe.planner.inputs.problem import Problem
from edgepipe.planner.inputs.schema import excerpt
from edgepipe.planner.plan import Plan, Transfer, load_plan, plan_to_dict, save_plan
from edgepipe.planner.solvers.comparison import ComparisonResult
from edgepipe.planner.solvers.exact.solver import BACKENDS, DEFAULT_BACKEND, DEFAULT_TIME_LIMIT
from rich.progress import TaskID
from rich.table import Table

#: training-config flags -> TrainingConfig fields; a flag given explicitly beats --config
CONFIG_FLAGS = {
    "global_batch": "global_batch",
    "micro_batches": "micro_batch_candidates",
    "optimizer": "optimizer",
    "schedule": "schedule",
    "warmup": "warmup",
    "max_stages": "max_stages",
    "replication_interval": "replication_interval",
}

#: solver flags -> the planners they apply to (anything else given with them is an error)
SOLVER_FLAGS = {"backend": ("milp",), "time_limit": ("dp", "milp"), "every_block": ("dp",),
                "no_improve": ("dp",), "cpu_time_limit": ("dp", "milp")}


def _config_from_args(args: argparse.Namespace) -> TrainingConfig:
    """The training config: ``--config``'s file (or the defaults), with every flag the
    user gave explicitly (not None) replacing the file's value."""
    given = {
        name: getattr(args, flag)
        for flag, name in CONFIG_FLAGS.items()
        if getattr(args, flag) is not None
    }
    if args.config:
        return replace(TrainingConfig.load(args.config), **given)
    given.setdefault("global_batch", api.DEMO_GLOBAL_BATCH)
    return TrainingConfig(**given)


def _check_solver_flags(args: argparse.Namespace, planners: Sequence[str]) -> None:
    """A solver flag given explicitly for planners none of which it applies to is an error."""
    for flag, applies in SOLVER_FLAGS.items():
        if getattr(args, flag, None) is not None and not set(planners) & set(applies):
            option = "--" + flag.replace("_", "-")
            raise InputError(
                option,
                "",
                f"applies only to {' and '.join(applies)}, not to {', '.join(planners)}; "
                f"drop {option} or run {' or '.join(applies)}",
            )


def _solver_options(args: argparse.Namespace) -> tuple[str, float]:
    backend = DEFAULT_BACKEND if args.backend is None else args.backend
    return backend, DEFAULT_TIME_LIMIT if args.time_limit is None else args.time_limit


def _solve(args: argparse.Namespace) -> Plan:
    if args.solver not in api.planners():
        shown = excerpt(args.solver, 40)
        raise InputError("--solver", "", f"unknown solver {shown!r}; use one of {api.planners()}")
    _check_solver_flags(args, [args.solver])
    problem = api.load_problem(args.model, args.cluster, _config_from_args(args))
    backend, _ = _solver_options(args)
    label = f"planning ({args.solver})"
    cpu = time.process_time()
    with progress_bars() as progress:
        plan = api.solve(
            problem,
            args.solver,
            progress_callback(progress, label),
            backend=backend,
            time_limit=args.time_limit,  # None: the default for the cluster's size
            multilevel=not args.every_block,
            improve=not args.no_improve,
            cpu_time_limit=args.cpu_time_limit,
        )
    warning = time_limit_warning(plan, time.process_time() - cpu)
    if warning:
        err.print(warning, highlight=False, soft_wrap=True, markup=False)
    return plan


def time_limit_warning(plan: Plan, cpu_s: float) -> str | None:
    """One line for stderr when a time limit stopped the search (``cpu_s``: the CPU
    seconds it took): which limit, how far the search got and the bound on the gap where
    one is known; None when the search was complete."""
    info, settings = plan.solver, plan.solver.settings
    if info.status not in ("timed_out", "feasible"):
        return None
    limits, fix = f"{settings['time_limit_s']:g} s wall clock", "raise --time-limit"
    if settings.get("cpu_time_limit_s") is not None:
        limits += f" or {settings['cpu_time_limit_s']:g} CPU s"
        fix += " or --cpu-time-limit"
    head = (f"warning: {info.name} stopped at its time limit ({limits}) after "
            f"{info.solve_time_s:.1f} s, {cpu_s:.1f} CPU s")
    if info.name == "milp":
        got = f"{settings['programs_closed']} of {settings['programs']} programs closed"
    else:
        got = (f"plans for micro-batch sizes {settings['sizes_planned']} of "
               f"{settings['micro_batch_sizes']}")
    if info.gap is None:
        gap = "no bound on the gap is known"
    else:
        gap = (f"the plan is at most {info.gap:.1%} slower than the best "
               f"(bound {info.objective_bound_ms:.1f} ms)")
    return f"{head}: {got}; {gap}; {fix}"


def cmd_plan(args: argparse.Namespace) -> None:
    plan = _solve(args)
    if args.output == "-":
        sys.stdout.write(json.dumps(plan_to_dict(plan), indent=1) + "\n")
        return
    if args.output:  # first: a reader of the summary that stops early loses nothing
        save_plan(plan, args.output)
    print_plan(plan)
    if args.output:
        out.print(f"wrote {args.output}", highlight=False)


def comparison_table(result: ComparisonResult) -> Table:
    """The comparison as a rich table, one row per planner, that fits 80 columns:
    iteration ms and samples/s predicted by the cost model, speed-up over data-parallel,
    solve seconds, the exact solver's gap, memory headroom, stages/devices used and the
    micro-batch size (legend in the caption)."""
    table = compact_table(
        caption=(
            "x DP: speed-up over data-parallel; headroom: usable memory left free on the "
            "fullest device; "
            "P/N: stages/devices used; B: micro-batch size"
        ),
        caption_justify="left",
    )
    for col in ("planner", "status", "iter ms", "samp/s", "x DP", "solve s", "gap", "headroom",
                "P/N", "B"):  # fmt: skip
        left = col in ("planner", "status")
        table.add_column(col, justify="left" if left else "right", no_wrap=left)

    def fmt(value: float | int | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    for r in result.rows:
        table.add_row(
            r.planner,
            r.status,
            fmt(r.iteration_ms, ".1f"),
            fmt(r.samples_per_s, ".2f"),
            fmt(r.speedup_vs_data_parallel, ".1f"),
            fmt(r.solve_time_s, ".2f"),
            fmt(r.gap, ".1%"),
            fmt(r.memory_headroom, ".0%"),
            "-" if r.stages is None else f"{r.stages}/{r.devices_used}",
            fmt(r.micro_batch_size, "d"),
        )
    return table


def comparison_lines(result: ComparisonResult) -> list[str]:
    """The narrow layout of :func:`comparison_table`: one line per planner."""

    def fmt(value: float | int | None, spec: str, unit: str = "") -> str:
        return "-" if value is None else format(value, spec) + unit

    return [
        f"{r.planner}: {r.status}, {fmt(r.iteration_ms, '.1f', ' ms')}, "
        f"{fmt(r.samples_per_s, '.2f', ' samples/s')}, "
        f"{fmt(r.speedup_vs_data_parallel, '.1f', 'x data-parallel')}, solved in "
        f"{r.solve_time_s:.2f} s, gap {fmt(r.gap, '.1%')}, memory headroom "
        f"{fmt(r.memory_headroom, '.0%')}, "
        + ("no plan" if r.stages is None else
           f"{r.stages} stages on {r.devices_used} devices, micro-batch {r.micro_batch_size}")
        for r in result.rows
    ]  # fmt: skip


def run_compare(
    problem: Problem,
    names: list[str] | None,
    backend: str,
    time_limit: float,
    outdir: str | Path | None,
) -> bool:
    """Run and print the comparison (and write its files); True if any plan is feasible."""
    with progress_bars() as progress:
        tasks: dict[str, TaskID] = {}

        def report(label: str, done: int, total: int) -> None:
            if label not in tasks:
                tasks[label] = progress.add_task(label, total=total)
            progress.update(tasks[label], completed=done, total=total)

        result = api.compare(problem, names, backend, time_limit, report)
    # the files first: a reader of the table that stops early loses nothing
    written = result.write(outdir) if outdir else []
    out.print(
        f"{result.model} on {result.cluster}, global batch {result.global_batch} "
        "(every row scored by the cost model)",
        highlight=False,
    )
    print_table(comparison_table(result), lambda: comparison_lines(result))
    for r in result.rows:
        if r.note:
            out.print(f"[dim]{r.planner}: {r.note}[/dim]", highlight=False)
    for path in written:
        out.print(f"wrote {path}", highlight=False)
    return any(r.feasible for r in result.rows)


def cmd_compare(args: argparse.Namespace) -> int:
    names = list(args.planners) if args.planners else api.planners()
    unknown = [n for n in names if n not in api.planners()]
    if unknown:
        raise InputError(
            "--planners", "", f"unknown planners {unknown}; available: {api.planners()}"
        )
    _check_solver_flags(args, names)
    problem = api.load_problem(args.model, args.cluster, _config_from_args(args))
    backend, time_limit = _solver_options(args)
    if run_compare(problem, names, backend, time_limit, args.out):
        return 0
    err.print("no planner found a feasible plan (exit status 1)", highlight=False, soft_wrap=True)
    return 1


def migration_heading(plan: Plan) -> str:
    """The line above :func:`migration_table`: transfers, MiB and predicted seconds."""
    return (f"migration: {len(plan.migration)} transfers, "
            f"{sum(t.bytes for t in plan.migration) / 2**20:.1f} MiB, "
            f"predicted {plan.migration_ms / 1e3:.2f} s")


def _copy_kind(t: Transfer) -> str:
    return "local replica" if t.source == t.to else "replica" if t.from_replica else "live"


def migration_table(plan: Plan) -> Table:
    """The transfers a re-planned plan needs, as a rich table."""
    table = Table()
    for col in ("to", "from", "blocks", "copy", "MiB", "ms"):
        table.add_column(col, justify="right" if col in ("MiB", "ms") else "left")
    for t in plan.migration:
        table.add_row(t.to, t.source, f"[{t.first}, {t.end})", _copy_kind(t),
                      f"{t.bytes / 2**20:.1f}", f"{t.ms:.0f}")
    return table


def migration_lines(plan: Plan) -> list[str]:
    """The narrow layout of :func:`migration_table`: one line per transfer."""
    return [f"{t.to} <- {t.source}: blocks [{t.first}, {t.end}), {_copy_kind(t)}, "
            f"{t.bytes / 2**20:.1f} MiB, {t.ms:.0f} ms" for t in plan.migration]


def cmd_replan(args: argparse.Namespace) -> None:
    plan = load_plan(args.plan)
    slowed = dict(args.slowed or [])
    joined = Cluster.load(args.joined) if args.joined else None
    full = True if args.full_solve else None
    new = api.replan(plan, lost=args.lost or [], slowed=slowed, joined=joined, full_solve=full,
                     interval=args.replication_interval)
    if args.output == "-":
        sys.stdout.write(json.dumps(plan_to_dict(new), indent=1) + "\n")
        return
    if args.output:  # first: a reader of the summary that stops early loses nothing
        save_plan(new, args.output)
    print_plan(new)
    ch = new.changes
    assert ch is not None
    out.print(f"re-planned from {plan.id} ({ch.path} path): {ch.reason}")
    out.print(migration_heading(new), highlight=False)
    print_table(migration_table(new), lambda: migration_lines(new))
    if args.output:
        out.print(f"wrote {args.output}", highlight=False)


def _add_problem_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model profile file or shipped name")
    p.add_argument("--cluster", required=True, help="cluster file or shipped name")
    p.add_argument(
        "--config", help="training config file; the options below, when given, override it"
    )
    p.add_argument(
        "--global-batch",
        type=positive_int,
        help=f"samples per optimizer step (default {api.DEMO_GLOBAL_BATCH})",
    )
    p.add_argument(
        "--micro-batches", type=int_list, help="comma-separated micro-batch size candidates"
    )
    p.add_argument("--optimizer", choices=sorted(OPTIMIZER_STATE), help="default momentum")
    p.add_argument("--schedule", choices=["1f1b", "gpipe"], help="default 1f1b")
    p.add_argument("--warmup", choices=["asteroid", "classic"], help="default asteroid")
    p.add_argument("--max-stages", type=positive_int, help="most pipeline stages")
    p.add_argument(
        "--replication-interval", type=replication_interval, metavar="K|auto",
        help="committed steps between replica refreshes, 0 for none (default auto: the "
        "fewest steps that hide a replica's predicted transfer; the plan holds the number)",
    )


def _add_solver_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend",
        choices=list(BACKENDS),
        help=f"exact solver's backend (milp only; default {DEFAULT_BACKEND})",
    )
    p.add_argument(
        "--time-limit",
        type=positive_float,
        help="wall-clock limit in seconds of the dp (it returns its best plan so far) and "
        f"of the exact solver (dp and milp; default {DEFAULT_TIME_LIMIT:g}, x devices / 256 "
        "above 256 devices)",
    )


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    _add_problem_args(p)
    p.add_argument(
        "--solver", default="dp", help=f"planner to use, one of {', '.join(api.planners())}"
    )
    _add_solver_args(p)
    p.add_argument(
        "--cpu-time-limit", type=positive_float, metavar="SECONDS",
        help="dp and milp: also stop after this many CPU seconds of this process (the same "
        "plan however busy the machine is; the first limit to run out stops the search)",
    )
    p.add_argument(
        "--every-block", action="store_const", const=True,
        help="dp: plan a model of more than 200 blocks on every block, not coarse to fine "
        "(slower; docs/planners.md)",
    )  # fmt: skip
    p.add_argument(
        "--no-improve", action="store_const", const=True,
        help="dp: return the DP's plan as it is, without the local improvement pass "
        "(moved cuts, devices and micro-batch sizes; docs/planners.md)",
    )  # fmt: skip
    p.add_argument("-o", "--output", type=output_file, help="plan file to write ('-': stdout)")
    p.set_defaults(func=cmd_plan)


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    _add_problem_args(p)
    p.add_argument("--planners", type=name_list, help="comma-separated planners (default: all)")
    _add_solver_args(p)
    p.add_argument(
        "--out", type=output_dir, help="folder for compare.csv, compare.json and compare.png"
    )
    p.set_defaults(func=cmd_compare)


def add_replan_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan")
    p.add_argument("--lost", action="append", metavar="DEV", help="a lost device (repeatable)")
    p.add_argument(
        "--slowed",
        action="append",
        type=device_factor,
        metavar="DEV=FACTOR",
        help="a device now FACTOR times slower (repeatable)",
    )
    p.add_argument("--joined", metavar="FILE", help="cluster file of the devices that join")
    p.add_argument("--full-solve", action="store_true", help="always run the full solve to compare")
    p.add_argument(
        "--replication-interval", type=replication_interval, metavar="K|auto",
        help="the new plan's replication interval, 0 for none (default: the parent's choice; "
        "auto, where the parent's was auto, is resolved again for the new plan)",
    )
    p.add_argument("-o", "--output", type=output_file, help="plan file to write ('-': stdout)")
    p.set_defaults(func=cmd_replan)


#: command -> the function that adds its arguments and handler to its parser
ARGUMENTS = {
    "plan": add_plan_arguments,
    "compare": add_compare_arguments,
    "replan": add_replan_arguments,
}
