"""``edgepipe`` command line: a thin shell over the library.

Every command prints a human summary; files are written only where ``-o`` says (``-o -``
writes the JSON document to stdout, after any solver has finished), each atomically (a
temporary file renamed into place, removed again on any failure or Ctrl-C).

Every argument is parsed into a typed value before anything runs (:mod:`argparse` types
below); flags given explicitly beat a ``--config`` file's values; a flag that does not
apply to the chosen planner is an error. Exit status: 0 success; 1 ``compare`` found no
feasible plan; 2 a bad argument or input, or any other error of edgepipe
(:class:`~planner.errors.EdgepipeError`), printed as one line; 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from edgepipe.planner import api
from edgepipe.planner.check.simulator import simulate
from edgepipe.planner.cost.closed_form import pipeline_closed_form_ms
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.errors import EdgepipeError, InputError
from edgepipe.planner.inputs.cluster import Cluster, catalog_from_dict, load_catalog
from edgepipe.planner.inputs.config import (
    AUTO,
    MAX_REPLICATION_INTERVAL,
    OPTIMIZER_STATE,
    TrainingConfig,
)
from edgepipe.planner.inputs.problem import Problem
from edgepipe.planner.inputs.profile import ModelProfile
from edgepipe.planner.inputs.schema import (
    KINDS,
    ensure_regular_file,
    excerpt,
    read_json,
    validate,
    write_text_atomic,
)
from edgepipe.planner.plan import (
    Plan,
    load_plan,
    plan_from_dict,
    plan_to_dict,
    replica_standbys,
    save_plan,
    short_run_note,
)
from edgepipe.planner.schedule import build
from edgepipe.planner.solvers.comparison import ComparisonResult
from edgepipe.planner.solvers.exact.solver import BACKENDS, DEFAULT_BACKEND, DEFAULT_TIME_LIMIT
from edgepipe.planner.timeouts import GLOO_TIMEOUT_S, HANG_TIMEOUT_S, HEARTBEAT_S, START_TIMEOUT_S
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, TaskID
from rich.table import Table

if TYPE_CHECKING:
    from edgepipe.executor.ft.coordinator import Stopped
    from edgepipe.planner.check.report import RunReport

out = Console()
err = Console(stderr=True)


def _warn(text: str) -> None:
    """Print ``warning: text`` to stderr as one line, whatever the terminal's width, and
    verbatim (no markup: ``[0, 6)`` and device ids stay as written)."""
    err.print(f"warning: {text}", highlight=False, soft_wrap=True, markup=False)


GIB = 2**30


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
SOLVER_FLAGS = {"backend": ("milp",), "time_limit": ("dp", "milp"), "every_block": ("dp",)}


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


#: tables: no vertical rules and no outer padding, so they fit 80 columns
TABLE_STYLE = {"box": box.SIMPLE_HEAD, "padding": (0, 1), "collapse_padding": True,
               "pad_edge": False, "title_justify": "left"}  # fmt: skip


def plan_table(plan: Plan) -> Table:
    """Per-stage summary of a plan as a rich table (fits 80 columns; the device list
    wraps). Columns: stage, blocks, devices (samples), K = in-flight micro-batches,
    forward / backward / all-reduce / outgoing link ms, the stage's peak memory as a
    share of its most loaded device's usable memory."""
    cost, part = plan.cost, plan.partition
    table = Table(**TABLE_STYLE)
    for col in ("stage", "blocks", "devices (samples)", "K", "fwd ms", "bwd ms", "ar ms",
                "link ms", "mem"):  # fmt: skip
        table.add_column(col, justify="left" if col == "devices (samples)" else "right")
    for p, (stage, sc) in enumerate(zip(part.stages, cost.stages, strict=True)):
        devices = ", ".join(f"{d} ({y})" for d, y in zip(stage.devices, stage.samples, strict=True))
        peak = max(m / b for m, b in zip(sc.memory_bytes, sc.budget_bytes, strict=True))
        table.add_row(
            str(p),
            f"{stage.first}-{stage.end - 1}",
            devices,
            str(sc.warmup),
            f"{sc.forward_ms:.1f}",
            f"{sc.backward_ms:.1f}",
            f"{sc.allreduce_ms:.1f}",
            f"{sc.link_out_ms:.1f}" if p + 1 < part.num_stages else "-",
            f"{peak:.0%}",
        )
    return table


DERIVED = re.compile(
    r"times for (\S+) derived from (\S+) x (\S+) \(effective GFLOP/s (\S+) / (\S+)\)"
)
SAME_REST = re.compile(r"times for (\S+) (.*)")


def grouped_assumptions(notes: Sequence[str]) -> list[str]:
    """Assumption lines with repeats merged (order of first appearance kept): derived
    times become one line per reference type, ``times derived from v100 (9800 effective
    GFLOP/s) by the ratio of effective GFLOP/s: a x 118.7 (82.56), b x 17.01 (576)``,
    and lines that differ only in the
    device type, ``times for a come from one batch size ...``, one line naming them all."""
    derived: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
    same: dict[str, list[str]] = {}
    for note in notes:
        if match := DERIVED.fullmatch(note):
            name, ref, factor, ref_speed, speed = match.groups()
            derived.setdefault((ref, ref_speed), []).append((name, factor, speed))
        elif match := SAME_REST.fullmatch(note):
            same.setdefault(match.group(2), []).append(match.group(1))
        else:
            same.setdefault(note, [])
    lines = [
        f"times derived from {ref} ({ref_speed} effective GFLOP/s) by the ratio of effective "
        "GFLOP/s: " + ", ".join(f"{name} x {factor} ({speed})" for name, factor, speed in group)
        for (ref, ref_speed), group in derived.items()
    ]
    for rest, names in same.items():
        lines.append(f"times for {', '.join(names)} {rest}" if names else rest)
    return lines


def plan_heading(plan: Plan) -> str:
    """The two lines above a plan's table: id and solver; problem and prediction."""
    cost, part = plan.cost, plan.partition
    return (
        f"{plan.id}  ({plan.solver.name}, {plan.solver.status}, "
        f"{plan.solver.solve_time_s:.2f} s)\n"
        f"{plan.problem.model.name} on {plan.problem.cluster.name}: micro-batch "
        f"{part.micro_batch_size} x {part.num_micro_batches}, iteration "
        f"{cost.iteration_ms:.1f} ms, {cost.samples_per_s:.2f} samples/s, bottleneck "
        f"{cost.bottleneck}"
    )


def unbroken_width(table: Table) -> int:
    """Columns needed to print ``table`` with no word of any cell or header cut: each
    column as wide as its longest word plus the two spaces rich puts around it."""
    widths = [
        max(len(word) for cell in (column.header, *column.cells) for word in str(cell).split())
        for column in table.columns
    ]
    return sum(widths) + 2 * len(widths)


def print_table(table: Table, narrow: Callable[[], list[str]]) -> None:
    """Print ``table`` if every cell fits the terminal unbroken (rich may wrap the device
    lists), else the ``narrow`` layout: one line per row, labelled, wrapped at words."""
    if unbroken_width(table) <= out.width:
        out.print(table)
        return
    for line in narrow():
        out.print(line, highlight=False)


def plan_lines(plan: Plan) -> list[str]:
    """The narrow layout of :func:`plan_table`: one line per stage."""
    lines = []
    for p, (stage, sc) in enumerate(zip(plan.partition.stages, plan.cost.stages, strict=True)):
        devices = ", ".join(f"{d} ({y})" for d, y in zip(stage.devices, stage.samples, strict=True))
        peak = max(m / b for m, b in zip(sc.memory_bytes, sc.budget_bytes, strict=True))
        link = f", link {sc.link_out_ms:.1f} ms" if p + 1 < plan.partition.num_stages else ""
        lines.append(
            f"stage {p}: blocks {stage.first}-{stage.end - 1} on {devices}; K {sc.warmup}; "
            f"fwd {sc.forward_ms:.1f} ms, bwd {sc.backward_ms:.1f} ms, all-reduce "
            f"{sc.allreduce_ms:.1f} ms{link}; memory {peak:.0%}"
        )
    return lines


def _print_plan(plan: Plan) -> None:
    out.print(plan_heading(plan), highlight=False)
    print_table(plan_table(plan), lambda: plan_lines(plan))
    idle = [d.id for d in plan.problem.cluster.devices if d.id not in plan.partition.used_devices()]
    if idle:
        out.print(f"idle devices: {', '.join(idle)}", highlight=False)
    k = plan.problem.config.replication_interval
    if isinstance(k, int) and k > 1:  # auto resolves beyond 1 where a point outlasts a step
        t = CostModel(plan.problem, plan.partition.micro_batch_size).replica_transfer_ms(
            plan.partition)
        out.print(f"replication: every {k} steps; a point's transfer takes {t:.0f} ms, "
                  f"{t / plan.cost.iteration_ms:.1f} steps (a loss replays up to {2 * k - 1} "
                  "steps)", highlight=False)
    for note in grouped_assumptions(plan.assumptions):
        out.print(f"[dim]assumption: {note}[/dim]", highlight=False)


def gantt_title(plan: Plan) -> str:
    """The Gantt chart's title: the plan and the schedule it runs."""
    config = plan.problem.config
    schedule = "GPipe" if config.schedule == "gpipe" else f"1F1B, {config.warmup} warm-up"
    return f"{plan.id}: one iteration ({schedule})"


def _progress_callback(progress: Progress, label: str) -> Callable[[int, int], None]:
    task = progress.add_task(label, total=None)

    def update(done: int, total: int) -> None:
        progress.update(task, completed=done, total=total)

    return update


def _solve(args: argparse.Namespace) -> Plan:
    if args.solver not in api.planners():
        shown = excerpt(args.solver, 40)
        raise InputError("--solver", "", f"unknown solver {shown!r}; use one of {api.planners()}")
    _check_solver_flags(args, [args.solver])
    problem = api.load_problem(args.model, args.cluster, _config_from_args(args))
    backend, time_limit = _solver_options(args)
    label = f"planning ({args.solver})"
    with Progress(console=err, transient=True) as progress:
        return api.solve(
            problem,
            args.solver,
            _progress_callback(progress, label),
            backend=backend,
            time_limit=time_limit,
            multilevel=not args.every_block,
        )


def cmd_plan(args: argparse.Namespace) -> None:
    plan = _solve(args)
    if args.output == "-":
        sys.stdout.write(json.dumps(plan_to_dict(plan), indent=1) + "\n")
        return
    _print_plan(plan)
    if args.output:
        save_plan(plan, args.output)
        out.print(f"wrote {args.output}", highlight=False)


def comparison_table(result: ComparisonResult) -> Table:
    """The comparison as a rich table, one row per planner, that fits 80 columns:
    iteration ms and samples/s predicted by the cost model, speed-up over data-parallel,
    solve seconds, the exact solver's gap, memory headroom, stages/devices used and the
    micro-batch size (legend in the caption)."""
    table = Table(
        caption=(
            "x DP: speed-up over data-parallel; mem: memory headroom; "
            "P/N: stages/devices used; B: micro-batch size"
        ),
        caption_justify="left",
        **TABLE_STYLE,
    )
    for col in ("planner", "status", "iter ms", "samp/s", "x DP", "solve s", "gap", "mem",
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


def _run_compare(
    problem: Problem,
    names: list[str] | None,
    backend: str,
    time_limit: float,
    outdir: str | Path | None,
) -> bool:
    """Run and print the comparison (and write its files); True if any plan is feasible."""
    with Progress(console=err, transient=True) as progress:
        tasks: dict[str, TaskID] = {}

        def report(label: str, done: int, total: int) -> None:
            if label not in tasks:
                tasks[label] = progress.add_task(label, total=total)
            progress.update(tasks[label], completed=done, total=total)

        result = api.compare(problem, names, backend, time_limit, report)
    out.print(
        f"{result.model} on {result.cluster}, global batch {result.global_batch} "
        "(every row scored by the cost model)",
        highlight=False,
    )
    print_table(comparison_table(result), lambda: comparison_lines(result))
    for r in result.rows:
        if r.note:
            out.print(f"[dim]{r.planner}: {r.note}[/dim]", highlight=False)
    if outdir:
        for path in result.write(outdir):
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
    if _run_compare(problem, names, backend, time_limit, args.out):
        return 0
    err.print("no planner found a feasible plan (exit status 1)", highlight=False, soft_wrap=True)
    return 1


def draw_gantt_atomic(plan: Plan, path: str | Path) -> None:
    """Simulate ``plan``'s iteration and draw its Gantt chart to ``path`` (PNG, SVG or
    PDF by suffix) through a temporary file renamed into place."""
    from edgepipe.planner.check.gantt import draw_gantt

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
    _print_plan(plan)
    if args.output:
        draw_gantt_atomic(plan, args.output)
        out.print(f"wrote {args.output}", highlight=False)


def cmd_simulate(args: argparse.Namespace) -> None:
    from edgepipe.planner.check.gantt import timeline_text

    plan = load_plan(args.plan)
    schedule = None
    if args.schedule is not None and args.schedule != plan.problem.config.schedule:
        stages, m = plan.partition.num_stages, plan.partition.num_micro_batches
        warmups = [plan.problem.config.warmup_depth(p, stages, m) for p in range(stages)]
        schedule = build(args.schedule, warmups, m)
    timeline = simulate(plan.problem, plan.partition, schedule)
    _print_plan(plan)
    out.print(timeline_text(timeline))
    out.print(simulation_summary(plan, timeline.makespan_ms, args.schedule))


def simulation_summary(plan: Plan, simulated_ms: float, schedule: str | None = None) -> str:
    """What is compared with what: the independent simulator (each device and each
    transfer on its channel) against the cost model's figure the plan reports (the same
    semantics, written apart), the DP's closed-form search objective and Asteroid's
    closed form."""
    cost = plan.cost
    objective = pipeline_closed_form_ms(
        CostModel(plan.problem, plan.partition.micro_batch_size), plan.partition
    )
    lines = [
        f"independent simulator: {simulated_ms:.1f} ms per iteration "
        f"({plan.problem.cluster.network.kind} network)",
        f"cost model (the plan's prediction): {cost.iteration_ms:.1f} ms, "
        f"{cost.iteration_ms / simulated_ms - 1:+.1%} against the simulator",
        f"DP's search objective (closed form): {objective:.1f} ms, "
        f"{objective / simulated_ms - 1:+.1%}",
        f"Asteroid's closed form (Eqs. 4-6, 11): {cost.closed_form_ms:.1f} ms, "
        f"{cost.closed_form_ms / simulated_ms - 1:+.1%}",
    ]
    if schedule is not None and schedule != plan.problem.config.schedule:
        lines.append(
            f"note: simulated with {schedule}; the plan and its prediction use "
            f"{plan.problem.config.schedule}"
        )
    return "\n".join(lines)


#: document kind -> the loader that runs its schema and semantic checks (as `plan` does)
LOADERS: dict[str, Callable[[object, str], object]] = {
    "edgepipe.model_profile": ModelProfile.from_dict,
    "edgepipe.device_catalog": catalog_from_dict,
    "edgepipe.cluster": Cluster.from_dict,
    "edgepipe.training_config": TrainingConfig.from_dict,
}


def device_factor(text: str) -> tuple[str, float]:
    """``DEV=FACTOR`` with a finite factor > 0, e.g. ``nano-0=3``."""
    dev, sep, factor = text.rpartition("=")
    if not sep or not dev:
        raise argparse.ArgumentTypeError(f"{excerpt(text, 40)!r} is not DEV=FACTOR (e.g. nano-0=3)")
    return dev, positive_float(factor)


def migration_table(plan: Plan) -> Table:
    """The transfers a re-planned plan needs, as a rich table."""
    table = Table(
        title=f"migration: {len(plan.migration)} transfers, "
        f"{sum(t.bytes for t in plan.migration) / 2**20:.1f} MiB, "
        f"predicted {plan.migration_ms / 1e3:.2f} s",
        title_justify="left",
    )
    for col in ("to", "from", "blocks", "copy", "MiB", "ms"):
        table.add_column(col, justify="right" if col in ("MiB", "ms") else "left")
    for t in plan.migration:
        kind = "local replica" if t.source == t.to else "replica" if t.from_replica else "live"
        table.add_row(
            t.to, t.source, f"[{t.first}, {t.end})", kind, f"{t.bytes / 2**20:.1f}", f"{t.ms:.0f}"
        )
    return table


def cmd_replan(args: argparse.Namespace) -> None:
    from edgepipe.planner.replan.incremental import replan

    plan = load_plan(args.plan)
    slowed = dict(args.slowed or [])
    joined = Cluster.load(args.joined) if args.joined else None
    full = True if args.full_solve else None
    new = replan(plan, lost=args.lost or [], slowed=slowed, joined=joined, full_solve=full)
    if args.output == "-":
        sys.stdout.write(json.dumps(plan_to_dict(new), indent=1) + "\n")
        return
    _print_plan(new)
    ch = new.changes
    assert ch is not None
    out.print(f"re-planned from {plan.id} ({ch.path} path): {ch.reason}")
    out.print(migration_table(new))
    if args.output:
        save_plan(new, args.output)
        out.print(f"wrote {args.output}", highlight=False)


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
            out.print(f"{args.file}: valid {kind}; re-identified {doc['id']} -> {plan.id}")
            return
    else:
        LOADERS[kind](doc, args.file)
    out.print(f"{args.file}: valid {kind}", highlight=False)


def cmd_import_pipedream(args: argparse.Namespace) -> None:
    from edgepipe.planner.inputs.importers.pipedream import import_pipedream, swallowing_block

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
        _warn(warning)
    out.print(f"wrote {args.output}: {profile.name}, {profile.num_blocks} blocks")


def cmd_demo(args: argparse.Namespace) -> None:
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    out.rule(f"edgepipe demo: {api.DEMO_MODEL} on {api.DEMO_CLUSTER}")
    problem = api.load_problem(api.DEMO_MODEL, api.DEMO_CLUSTER)
    with Progress(console=err, transient=True) as progress:
        plan = api.solve(problem, "dp", _progress_callback(progress, "planning (dp)"))
    _print_plan(plan)
    path = outdir / "plan.json"
    save_plan(plan, path)
    timeline = simulate(plan.problem, plan.partition)
    from edgepipe.planner.check.gantt import draw_gantt

    draw_gantt(timeline, outdir / "gantt.png", title=gantt_title(plan))
    out.print(simulation_summary(plan, timeline.makespan_ms))
    out.print(f"wrote {path} and {outdir / 'gantt.png'}", highlight=False)
    out.rule("the DP against the exact solver and the baselines")
    _run_compare(problem, None, DEFAULT_BACKEND, args.time_limit, outdir)
    if args.run_steps:
        _demo_run(outdir, args.run_steps)


#: the model the demo runs here: a zoo build spec with analytic Jetson times, and this
#: machine's measured profile of the same blocks (for the emulation's time scale)
DEMO_RUN_MODEL, DEMO_RUN_HOST, DEMO_RUN_BATCH = "resnet18-analytic", "resnet18-cpu", 8


def _demo_run(outdir: Path, steps: int) -> None:
    """Plan DEMO_RUN_MODEL on the demo cluster, run the plan here with emulated devices
    and links, and set the measured iteration against the prediction."""
    from edgepipe.planner.check.report import build_report, draw_report

    out.rule(f"running a plan here: {DEMO_RUN_MODEL} on {api.DEMO_CLUSTER}, emulated")
    try:
        launch = _executor("edgepipe.executor.launch")
        worker = _executor("edgepipe.executor.worker")
        emulation = _executor("edgepipe.executor.core.emulation")
    except EdgepipeError as exc:
        out.print(f"skipped: {exc}", highlight=False)
        return
    problem = api.load_problem(DEMO_RUN_MODEL, api.DEMO_CLUSTER, global_batch=DEMO_RUN_BATCH)
    plan = api.solve(problem, "dp")
    _print_plan(plan)
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
    first_k = emulation.time_scale_for(plan, host)  # type: ignore[attr-defined]
    err.print(f"calibrating: 2 emulated steps at time scale {first_k:.1f}", soft_wrap=True)
    launch.launch(  # type: ignore[attr-defined]
        worker.WorkerOptions(  # type: ignore[attr-defined]
            str(path), 2, str(outdir / "run-calibration"), emulate=True, time_scale=first_k,
            timeout_s=120,
        ),
        recover=recover,
    )
    k = emulation.calibrated_time_scale(  # type: ignore[attr-defined]
        plan, emulation.read_reports(outdir / "run-calibration")  # type: ignore[attr-defined]
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
    launch.launch(  # type: ignore[attr-defined]
        worker.WorkerOptions(  # type: ignore[attr-defined]
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
        _warn(report.overrun_warning)


@contextmanager
def _holding_ctrl_c() -> Iterator[None]:
    """Hold a Ctrl-C (SIGINT) back while the block runs, then deliver it.

    For the import of torch: a KeyboardInterrupt raised at an arbitrary point inside it
    can abort the process from C++ (``terminate called after throwing an instance of
    'pybind11::error_already_set'``, status -6), be lost in a callback that cannot raise
    (the command then runs on), or leave CPython's unhandled-interrupt flag set
    (:func:`_forget_handled_interrupts`). Held back, it arrives as an ordinary
    KeyboardInterrupt once the import is done (or failed). In a thread other than the
    main one, which receives no signals, the block just runs.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            signal.raise_signal(signal.SIGINT)  # to the handler before ours, as if now


@contextmanager
def _needs_torch(command: str) -> Iterator[None]:
    """Turn a missing torch (the ``executor`` extra) into a one-line error; a Ctrl-C
    during the import waits for its end (:func:`_holding_ctrl_c`)."""
    try:
        with _holding_ctrl_c():
            yield
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "torch":
            raise
        raise EdgepipeError(
            f"`edgepipe {command}` measures with torch, which is not installed: "
            "install edgepipe[executor] (pip install 'edgepipe[executor]')"
        ) from None


def cmd_profile(args: argparse.Namespace) -> None:
    from functools import partial

    from edgepipe.planner.inputs.profile import BuildSpec

    with _needs_torch("profile"):
        from edgepipe.executor.profiling import zoo
        from edgepipe.executor.profiling.analytic import analytic_profile
        from edgepipe.executor.profiling.profiler import profile_model

    if ":" in args.model:
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
    with Progress(console=err, transient=True) as progress:
        profile = profile_model(
            model,
            example,
            batch_sizes,
            args.device_type,
            name=name,
            warmup=args.warmup,
            repeats=args.repeats,
            num_threads=args.threads,
            progress=_progress_callback(progress, f"profiling {name}"),
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
    with _needs_torch("probe"):
        from edgepipe.executor.profiling.probe import probe_device

    with Progress(console=err, transient=True) as progress:
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


def _executor(module: str) -> object:
    """Import an executor module, turning a missing torch into an install hint; a Ctrl-C
    during the import waits for its end (:func:`_holding_ctrl_c`)."""
    import importlib

    try:
        with _holding_ctrl_c():
            return importlib.import_module(module)
    except ImportError as exc:
        if (exc.name or "").split(".")[0] == "torch":
            raise EdgepipeError(
                "running a plan needs the executor's dependencies (torch): "
                "pip install 'edgepipe[executor]'"
            ) from None
        raise


def cmd_run(args: argparse.Namespace) -> None:
    launch = _executor("edgepipe.executor.launch")
    worker = _executor("edgepipe.executor.worker")
    plan = load_plan(args.plan)
    opts = worker.WorkerOptions(  # type: ignore[attr-defined]
        plan=args.plan,
        steps=args.steps,
        out=args.out,
        deterministic=args.deterministic,
        dataset=args.dataset,
        timeout_s=args.timeout,
        save_weights=args.save_weights,
        emulate=args.emulate,
        time_scale=args.time_scale,
        checkpoint_every=args.checkpoint_every,
        checkpoint_dir=args.checkpoint_dir,
        resume=args.resume,
        emulate_slowdown=_emulated_slowdowns(args),
        faults=args.inject,
    )
    joins = [_executor("edgepipe.executor.ft.joins").EmulatedJoin.parse(spec, plan)  # type: ignore[attr-defined]
             for spec in args.emulate_join]
    devices = len(plan.partition.used_devices())
    err.print(
        f"running {plan.id} ({plan.problem.model.name}, {plan.partition.num_stages} stages) "
        f"on {devices} local processes for {args.steps} steps"
        f"{' (deterministic mode)' if args.deterministic else ''}"
        f"{f' emulating its devices (time scale {args.time_scale:g})' if args.emulate else ''}"
    )
    slow = None if args.no_recover else short_run_note(plan, args.steps)
    if slow:  # a recovering run replicates at the plan's interval
        _warn(slow)
    try:
        result = launch.launch(  # type: ignore[attr-defined]
            opts, hang_timeout_s=args.hang_timeout, heartbeat_s=args.heartbeat,
            recover=False if args.no_recover else None, joins=joins,
            standbys=args.standbys, watch_slowdown=args.watch_slowdown,
        )
    except KeyboardInterrupt:
        raise EdgepipeError("interrupted: every worker was stopped") from None
    table = Table(title=f"{plan.id}: measured", title_justify="left")
    for col in ("step", "loss", "wall ms", "samples/s"):
        table.add_column(col, justify="right")
    lines = result.metrics
    # a long run shows its first and last steps; every step is in metrics.jsonl
    shown = lines if len(lines) <= 12 else [*lines[:5], None, *lines[-5:]]
    for m in shown:
        if m is None:
            table.add_row("...", "", "", "")
            continue
        sps = m["samples_per_s"]
        table.add_row(
            str(m["step"]),
            f"{m['loss']:.6f}",
            f"{m['wall_ms']:.1f}",
            "-" if sps is None else f"{sps:.1f}",
        )
    out.print(table)
    for failed in result.join_failures:
        _warn(failed["reason"])
    for e in result.events:
        what = "re-partitioned for" if e["cause"] in ("slow", "join") else "recovered from"
        out.print(
            f"{what} {e['cause']} of {e['device']}: generation {e['generation']} "
            f"runs {e['new_plan']} from step {e['replay_from_step']}, first commit "
            f"{_s(e['t_first_commit_s'])} after detection"
        )
        if e.get("warning"):
            _warn(e["warning"])
    walls = sorted(m["wall_ms"] for m in result.metrics)
    predicted = plan.cost.iteration_ms * (args.time_scale if args.emulate else 1.0)
    out.print(
        f"median step {walls[len(walls) // 2]:.1f} ms measured vs {predicted:.1f} ms "
        f"predicted; wrote {args.out}/metrics.jsonl and timeline.jsonl"
    )
    if args.emulate:
        from edgepipe.planner.check.report import emulation_overruns

        warning = emulation_overruns(args.out)
        if warning:
            _warn(warning)


def _emulated_slowdowns(args: argparse.Namespace) -> tuple:
    """``--emulate-slowdown`` values as the emulation's type (needs --emulate)."""
    if not args.emulate_slowdown:
        return ()
    if not args.emulate:
        raise InputError("--emulate-slowdown", "", "needs --emulate (it slows an emulated "
                         "device)")
    emulation = _executor("edgepipe.executor.core.emulation")
    try:
        return tuple(emulation.EmulatedSlowdown.parse(t)  # type: ignore[attr-defined]
                     for t in args.emulate_slowdown)
    except ValueError as exc:
        raise InputError("--emulate-slowdown", "", str(exc)) from None


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


def cmd_coordinate(args: argparse.Namespace) -> None:
    coordinator = _executor("edgepipe.executor.ft.coordinator")
    err.print(f"coordinating {args.plan}: store on port {args.port}; start each host's "
              f"workers with --coordinator <this host>:{args.port}", highlight=False,
              soft_wrap=True)
    standbys = replica_standbys(load_plan(args.plan)) if args.recover and args.standbys else ()
    if len(standbys) >= args.standbys > 0:  # otherwise the coordinator refuses them
        err.print(f"expecting standby(s) {', '.join(standbys[:args.standbys])}: start each on "
                  f"its host with python -m executor.worker {args.plan} --steps {args.steps} "
                  f"--coordinator <this host>:{args.port} --standby DEV", highlight=False,
                  soft_wrap=True)
    _coordinated(coordinator.run(args))  # type: ignore[attr-defined]


def _coordinated(done: Stopped) -> None:
    """What ``edgepipe coordinate`` prints of a run that finished: a warning line per
    dropped join (executor/ft/joins.py, "Failed joins"), then the last generation."""
    for reason in done.join_failures:
        _warn(reason)
    err.print(f"every worker finished (generation {done.generation})", highlight=False)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _ratio(measured: float | None, predicted: float) -> str:
    return "-" if measured is None or predicted <= 0 else f"{measured / predicted:.2f}"


def recovery_table(report: RunReport) -> Table:
    """One row per recovery event of a run (planner.check.report.RecoveryEvent)."""
    table = Table(title=f"recoveries ({len(report.recoveries)}; figures of steps before "
                  "the first one are above)", title_justify="left")
    for col in ("gen", "cause", "device", "old plan", "new plan", "replay from", "blocks",
                "MB moved", "detect s", "replan s", "rebuild s", "restore s",
                "first commit s"):
        table.add_column(col, justify="right")
    for r in report.recoveries:
        table.add_row(
            str(r.generation), r.cause, r.device, r.old_plan, r.new_plan,
            str(r.replay_from_step), str(r.num_blocks), f"{r.bytes_moved / 1e6:.2f}",
            _secs(r.t_detect_s), _secs(r.t_replan_s), _secs(r.t_rebuild_s), _secs(r.t_restore_s),
            _secs(r.t_first_commit_s),
        )
    return table


def recovery_lines(report: RunReport) -> list[str]:
    """The narrow layout of :func:`recovery_table`: one line per recovery."""
    return [
        f"recovery {r.generation}: {r.cause} of {r.device}; {r.old_plan} -> {r.new_plan}, "
        f"replay from step {r.replay_from_step}; {r.num_blocks} blocks, "
        f"{r.bytes_moved / 1e6:.2f} MB moved; detect {_secs(r.t_detect_s)} s, re-plan "
        f"{_secs(r.t_replan_s)} s, rebuild {_secs(r.t_rebuild_s)} s, restore "
        f"{_secs(r.t_restore_s)} s, first commit {_secs(r.t_first_commit_s)} s"
        for r in report.recoveries
    ]


def _secs(seconds: float | None) -> str:
    """A phase's seconds, or - when the phase was never reached."""
    return "-" if seconds is None else f"{seconds:.3f}"


def cmd_report(args: argparse.Namespace) -> None:
    from edgepipe.planner.check.report import build_report, draw_report

    report = build_report(args.run_dir)
    used = report.steps_used
    kind = f"emulated, time scale {report.time_scale:g}" if report.emulated else "not emulated"
    table = Table(
        title=f"{report.plan.id}: predicted vs measured per micro-batch ({kind}; steps "
        f"{used[0]}-{used[-1]} of {report.steps})",
        title_justify="left",
    )
    for col in ("stage", "device", "y", "fwd pred", "fwd meas", "bwd pred", "bwd meas",
                "ar pred", "ar meas", "recv wait/step"):
        table.add_column(col, justify="right")
    for d in report.devices:
        table.add_row(
            str(d.stage), d.device, str(d.samples), _ms(d.forward_predicted),
            _ms(d.forward_measured), _ms(d.backward_predicted), _ms(d.backward_measured),
            _ms(d.allreduce_predicted), _ms(d.allreduce_measured), _ms(d.recv_wait_measured),
        )
    out.print(table)
    out.print(
        f"iteration: predicted {report.iteration_predicted_ms:.1f} ms, measured "
        f"{report.iteration_measured_ms:.1f} ms (median; x"
        f"{_ratio(report.iteration_measured_ms, report.iteration_predicted_ms)}); "
        f"{report.samples_per_s_predicted:.2f} vs {report.samples_per_s_measured:.2f} samples/s",
        highlight=False,
    )
    if not report.emulated:
        out.print(
            "[dim]not emulated: measured at this machine's speed, predicted for the plan's "
            "devices (run with --emulate to compare like with like)[/dim]",
            highlight=False,
        )
    if report.overrun_warning:
        _warn(report.overrun_warning)
    if report.recoveries:
        print_table(recovery_table(report), lambda: recovery_lines(report))
    for r in report.recoveries:
        if r.warning:
            _warn(f"recovery {r.generation}: {r.warning}")
    for reason in report.join_failures:
        _warn(reason)
    chart = Path(args.output) if args.output else Path(args.run_dir) / "report.png"
    draw_report(report, args.run_dir, chart)
    whole = ", the whole run with its recoveries below" if report.recoveries else ""
    out.print(f"wrote {chart} (predicted iteration above measured step "
              f"{report.measured_step}{whole})", highlight=False)


# -- argument types: each parses one value or raises a one-line ArgumentTypeError -------
def add_coordinate_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``edgepipe coordinate``, also those of ``python -m
    executor.ft.coordinator`` (the torchrun recipe, docs/executor.md)."""
    p.add_argument("plan", help="the plan every worker runs (same file on every host)")
    p.add_argument("--port", type=positive_int, default=29500,
                   help="port of the run's store here (workers: --coordinator HOST:PORT)")
    p.add_argument("--hang-timeout", type=positive_float, default=HANG_TIMEOUT_S,
                   help="seconds without a heartbeat after which a device is declared dead")
    p.add_argument("--start-timeout", type=positive_float, default=START_TIMEOUT_S,
                   help="seconds a worker may take to send its first heartbeat")
    p.add_argument("--recover", action="store_true",
                   help="recover in-process from a lost device or host (needs --steps)")
    p.add_argument("--steps", type=positive_int, help="with --recover: the workers' --steps")
    p.add_argument("--out", help="with --recover: metrics, re-planned plans and checkpoints "
                   "(a folder on this host, the workers need not see it; default: the "
                   "plan's folder)")
    p.add_argument("--deterministic", action="store_true",
                   help="with --recover: the workers run --deterministic")
    p.add_argument("--checkpoint-every", type=positive_int, default=0,
                   help="with --recover: commit a checkpoint every N steps on this host "
                   "(the workers send their parts through the store)")
    p.add_argument("--checkpoint-dir", help="with --recover: where (default OUT/checkpoints)")
    p.add_argument("--resume", help="with --recover: start from this checkpoint (or the "
                   "newest in this folder); it reaches the workers through the store")
    p.add_argument("--emulate", action="store_true",
                   help="with --recover: the workers run --emulate (the slowdown watch "
                   "then compares with the plan times --time-scale)")
    p.add_argument("--watch-slowdown", action=argparse.BooleanOptionalAction, default=None,
                   help="with --recover: re-partition a device that stays 1.5x slower "
                   "than the plan predicts for 3 steps (default on; on real devices the "
                   "predictions are calibrated over each plan's first steps; "
                   "docs/fault-tolerance.md, Slowdown)")
    p.add_argument("--time-scale", type=positive_float, default=1.0,
                   help="with --emulate: the workers' --time-scale")
    p.add_argument("--standbys", type=non_negative_int, default=0, metavar="N",
                   help="with --recover, a plan of one stage on one device: expect N "
                   "standby workers (python -m executor.worker ... --standby DEV) on the "
                   "plan's first N idle devices that can hold its replica (default 0: "
                   "unreplicated; docs/fault-tolerance.md, Standbys)")


def _whole_number_at_least(text: str, least: int) -> int:
    """``text`` as a whole number >= ``least``; else an ``argparse.ArgumentTypeError``
    saying which (not a whole number, or below ``least``), which argparse reports in one
    line naming the flag."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{excerpt(text, 40)!r} is not a whole number") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
    return value


def positive_int(text: str) -> int:
    """A whole number >= 1."""
    return _whole_number_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """A whole number >= 0."""
    return _whole_number_at_least(text, 0)


def replication_interval(text: str) -> int | str:
    """``auto`` or a whole number 0 .. ``MAX_REPLICATION_INTERVAL``."""
    if text == AUTO:
        return text
    try:
        value = _whole_number_at_least(text, 0)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; give {AUTO!r} or a whole number of "
                                         "steps (0: no replicas)") from None
    if value > MAX_REPLICATION_INTERVAL:
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_REPLICATION_INTERVAL}, got {value}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{excerpt(text, 40)!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text}")
    return value


def int_list(text: str) -> tuple[int, ...]:
    """Comma-separated distinct whole numbers >= 1, e.g. ``2,4,8``."""
    values = tuple(positive_int(part.strip()) for part in text.split(","))
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"{excerpt(text, 40)!r} repeats a value")
    return values


def increasing_int_list(text: str) -> tuple[int, ...]:
    """Comma-separated strictly increasing whole numbers >= 1, e.g. ``1,2,4,8``."""
    values = int_list(text)
    if list(values) != sorted(values):
        raise argparse.ArgumentTypeError(
            f"{excerpt(text, 40)!r} must be increasing, e.g. {','.join(map(str, sorted(values)))}"
        )
    return values


def name_list(text: str) -> tuple[str, ...]:
    """Comma-separated non-empty names."""
    names = tuple(part.strip() for part in text.split(","))
    if not all(names):
        raise argparse.ArgumentTypeError(f"{excerpt(text, 40)!r} has an empty name")
    return names


def output_file(text: str) -> str:
    """A file to write: not a directory, in a folder that exists (``-`` passes through)."""
    if text == "-":
        return text
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{excerpt(text, 60)} is a directory; name a file")
    parent = path.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(
            f"folder {excerpt(str(parent), 60)} does not exist; create it first"
        )
    return text


def file_output(text: str) -> str:
    """:func:`output_file` without ``-`` (stdout is not offered)."""
    if text == "-":
        raise argparse.ArgumentTypeError("writing to stdout is not offered here; name a file")
    return output_file(text)


#: chart formats `show -o` writes (matplotlib's Agg and vector backends)
CHART_SUFFIXES = (".png", ".svg", ".pdf")


def chart_file(text: str) -> str:
    """A chart file to write: :func:`output_file` with a PNG, SVG or PDF suffix."""
    path = file_output(text)
    if Path(path).suffix.lower() not in CHART_SUFFIXES:
        raise argparse.ArgumentTypeError(
            f"{excerpt(text, 60)} has no chart suffix; use one of {', '.join(CHART_SUFFIXES)}"
        )
    return path


def output_dir(text: str) -> str:
    """A folder to write into (created if missing): not an existing file."""
    if Path(text).exists() and not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{excerpt(text, 60)} is a file; name a folder")
    return text


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
        f"of the exact solver (dp and milp; default {DEFAULT_TIME_LIMIT:g})",
    )


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``edgepipe plan: error: argument --x: ...``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _version() -> str:
    try:
        return metadata.version("edgepipe")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="edgepipe",
        description="Plan hybrid pipeline-parallel training on heterogeneous edge devices.",
    )
    parser.add_argument("--version", action="version", version=f"edgepipe {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="solve for the best plan and write it as JSON")
    _add_problem_args(p)
    p.add_argument(
        "--solver", default="dp", help=f"planner to use, one of {', '.join(api.planners())}"
    )
    _add_solver_args(p)
    p.add_argument(
        "--every-block", action="store_const", const=True,
        help="dp: plan a model of more than 200 blocks on every block, not coarse to fine "
        "(slower; docs/planners.md)",
    )  # fmt: skip
    p.add_argument("-o", "--output", type=output_file, help="plan file to write ('-': stdout)")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser(
        "compare", help="run the DP, the exact solver and the baselines side by side"
    )
    _add_problem_args(p)
    p.add_argument("--planners", type=name_list, help="comma-separated planners (default: all)")
    _add_solver_args(p)
    p.add_argument(
        "--out", type=output_dir, help="folder for compare.csv, compare.json and compare.png"
    )
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("show", help="print a plan's summary; -o draws its timeline (PNG)")
    p.add_argument("plan")
    p.add_argument("-o", "--output", type=chart_file, help="Gantt chart to write (.png/.svg/.pdf)")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser(
        "simulate",
        help="replay a plan's iteration in the independent simulator and print the cost "
        "model's error against it",
    )
    p.add_argument("plan")
    p.add_argument(
        "--schedule",
        choices=["1f1b", "gpipe"],
        help="simulate another schedule (default: the plan's)",
    )
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser(
        "replan", help="re-plan after devices are lost, slow down or join; list the migration"
    )
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
    p.add_argument("-o", "--output", type=output_file, help="plan file to write ('-': stdout)")
    p.set_defaults(func=cmd_replan)

    p = sub.add_parser(
        "validate", help="check any edgepipe document: its schema and the checks `plan` makes"
    )
    p.add_argument("file")
    p.add_argument(
        "--rehash",
        action="store_true",
        help="accept an edited plan: give it the id of its new content and rewrite the file",
    )
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("import-pipedream", help="convert a PipeDream graph.txt profile")
    p.add_argument("graph")
    p.add_argument("-o", "--output", type=file_output, required=True)
    p.add_argument(
        "--batch-size",
        type=positive_int,
        required=True,
        help="batch the graph was profiled at (PipeDream's vgg16: 128; alexnet, resnet18, "
        "squeezenet1_0: 256 - the Input node's bytes / one sample's bytes)",
    )
    p.add_argument("--device-type", default="v100", help="catalog type it was profiled on")
    p.add_argument("--name", help="model name (default: the file's stem)")
    p.set_defaults(func=cmd_import_pipedream)

    p = sub.add_parser("profile", help="measure a zoo (or your own) model's blocks on this machine")
    p.add_argument(
        "--model", required=True, help="zoo name or MODULE:CALLABLE returning an nn.Sequential"
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

    p = sub.add_parser("probe", help="measure this machine as a device type (catalog entry)")
    p.add_argument("--name", default="host-cpu", help="device type name to write")
    p.add_argument("--threads", type=positive_int, help="torch threads while measuring")
    p.add_argument("-o", "--output", type=file_output, required=True)
    p.set_defaults(func=cmd_probe)

    p = sub.add_parser("run", help="train a plan here: one process per planned device")
    p.add_argument("plan")
    p.add_argument("--steps", type=positive_int, required=True, help="optimizer steps to run")
    p.add_argument(
        "--out", type=output_dir, default="out/run", help="run directory (plan, metrics, timeline)"
    )
    p.add_argument(
        "--deterministic",
        action="store_true",
        help="bit-identical to the single-process reference for any plan (slow; tests)",
    )
    p.add_argument(
        "--dataset",
        help="synthetic (default for zoo models), digits, or MODULE:CALLABLE returning a "
        "torch Dataset",
    )
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=GLOO_TIMEOUT_S,
        help="seconds a transfer or collective may wait",
    )
    p.add_argument(
        "--save-weights", action="store_true", help="write each rank's final weights to OUT/weights"
    )
    p.add_argument(
        "--emulate",
        action="store_true",
        help="emulate the plan's devices and links: wait out each device's profiled compute "
        "time and each transfer's bandwidth and latency (docs/executor.md)",
    )
    p.add_argument(
        "--time-scale",
        type=positive_float,
        default=1.0,
        help="with --emulate: stretch every emulated time by this factor",
    )
    p.add_argument(
        "--emulate-slowdown",
        action="append",
        default=[],
        metavar="DEV=S[@STEP]",
        help="with --emulate: from STEP on (default 0) device DEV computes at slowdown S "
        "(e.g. d1=3@2: three times slower than its profile from step 2; repeatable)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=positive_int,
        default=0,
        help="save a checkpoint every N steps to --checkpoint-dir (default OUT/checkpoints)",
    )
    p.add_argument("--checkpoint-dir", help="where --checkpoint-every saves")
    p.add_argument(
        "--hang-timeout",
        type=positive_float,
        default=HANG_TIMEOUT_S,
        help="seconds without a heartbeat after which a device is declared hung (a crash "
        "is seen at once; docs/executor.md, Failure detection)",
    )
    p.add_argument(
        "--watch-slowdown",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="re-partition a device that stays 1.5x slower than the plan predicts for 3 "
        "steps (default: only with --emulate; without it the local processes share this "
        "machine, and the predictions are calibrated over the plan's first steps; "
        "docs/fault-tolerance.md, Slowdown)",
    )
    p.add_argument(
        "--no-recover",
        action="store_true",
        help="stop the run on the first lost or hung device instead of recovering "
        "in-process (recovery is on when the plan replicates; docs/fault-tolerance.md)",
    )
    p.add_argument(
        "--inject",
        default="",
        metavar="DEV:STEP:PHASE[:SIGNAL]",
        help="fault injection for tests and benchmarks (executor/ft/faults.py): e.g. "
        "d1:2:forward kills d1 after its first forward of step 2",
    )
    p.add_argument(
        "--emulate-join",
        action="append",
        default=[],
        metavar="FILE@STEP",
        help="the devices of cluster file FILE join the run at step STEP (new ids, or a "
        "device lost earlier through --inject that comes back; executor/ft/joins.py, "
        "docs/fault-tolerance.md); repeatable: the files given for one STEP join together",
    )
    p.add_argument(
        "--heartbeat",
        type=positive_float,
        default=HEARTBEAT_S,
        help="seconds between a worker's heartbeats (under half of --hang-timeout)",
    )
    p.add_argument(
        "--standbys",
        type=non_negative_int,
        metavar="N",
        help="a plan of one stage on one device: run at most N standby processes on idle "
        "devices that can hold its replica (default: all of them; 0: none, unreplicated; "
        "docs/fault-tolerance.md, Standbys)",
    )
    p.add_argument(
        "--resume",
        help="continue from the latest committed checkpoint in DIR (a checkpoint, a "
        "checkpoints directory or a run directory); any plan of the same model and config",
    )
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "coordinate",
        help="host the control plane of a multi-host torchrun job (docs/executor.md, "
        "Across hosts)",
    )
    add_coordinate_arguments(p)
    p.set_defaults(func=cmd_coordinate)

    p = sub.add_parser(
        "report", help="a run's measurements against its plan's prediction, with Gantt charts"
    )
    p.add_argument("run_dir", help="run directory written by `edgepipe run --out DIR`")
    p.add_argument(
        "-o", "--output", type=chart_file, help="chart file (default RUN_DIR/report.png)"
    )
    p.set_defaults(func=cmd_report)

    p = sub.add_parser(
        "demo",
        help="plan the demo model on the demo cluster, show it, compare the planners, run a "
        "plan here (emulated)",
    )
    p.add_argument(
        "--out",
        type=output_dir,
        default="out/demo",
        help="folder for the plan, chart and comparison",
    )
    p.add_argument(
        "--run-steps",
        type=int,
        default=3,
        help="also run a plan of resnet18 here for this many emulated steps (0: skip)",
    )
    p.add_argument(
        "--time-limit",
        type=positive_float,
        default=DEFAULT_TIME_LIMIT,
        help="wall-clock limit in seconds of the comparison's exact solver (and its dp) "
        f"(default {DEFAULT_TIME_LIMIT:g})",
    )
    p.set_defaults(func=cmd_demo)
    return parser


def _forget_handled_interrupts() -> None:
    """Keep the exit status ours after a Ctrl-C that was caught.

    CPython 3.11 and 3.12 set a flag whenever a KeyboardInterrupt leaves code run from a
    string (``exec``/``eval``: dataclasses and namedtuples build their methods so, hundreds
    of times while torch is imported), even if a caller catches it later; under
    ``python -m`` the interpreter then ignores the status and kills itself with SIGINT at
    exit. Every string ``exec`` clears that flag when it starts, so one empty one does;
    later CPython sets the flag only for an interrupt nobody caught, and this is a no-op.
    """
    exec("pass", {})


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status (module docstring).

    Returning means nothing escaped, so any Ctrl-C on the way was handled (130, or the
    one-line error of ``run``): :func:`_forget_handled_interrupts` before every return.
    """
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, --version (0) or a bad argument (2, printed)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        status = args.func(args)
    except EdgepipeError as exc:
        message = f"[bold red]error:[/bold red] {escape(str(exc))}"
        err.print(message, highlight=False, soft_wrap=True)
        status = 2
    except KeyboardInterrupt:
        err.print("interrupted; nothing was written", highlight=False, soft_wrap=True)
        status = 130
    _forget_handled_interrupts()
    return 0 if status is None else status


if __name__ == "__main__":
    raise SystemExit(main())
