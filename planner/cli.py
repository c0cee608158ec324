"""``edgepipe`` command line: a thin shell over the library.

Every command prints a human summary; files are written only where ``-o`` says (``-o -``
writes the JSON document to stdout, after any solver has finished). Errors of edgepipe
(:class:`~planner.errors.EdgepipeError`) are printed as one message and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, TaskID
from rich.table import Table

from planner import api
from planner.comparison import ComparisonResult
from planner.config import OPTIMIZER_STATE, TrainingConfig
from planner.errors import EdgepipeError, InputError
from planner.milp import BACKENDS, DEFAULT_BACKEND, DEFAULT_TIME_LIMIT
from planner.plan import Plan, load_plan, plan_to_dict, save_plan
from planner.problem import Problem
from planner.schema import KINDS, read_json, validate
from planner.simulator import gpipe, one_f_one_b, simulate

out = Console()
err = Console(stderr=True)

GIB = 2**30


def _config_from_args(args: argparse.Namespace) -> TrainingConfig | Path | None:
    if args.config:
        return Path(args.config)
    cands = tuple(int(x) for x in args.micro_batches.split(",")) if args.micro_batches else None
    return TrainingConfig(
        global_batch=args.global_batch,
        micro_batch_candidates=cands,
        optimizer=args.optimizer,
        schedule=args.schedule,
        warmup=args.warmup,
        max_stages=args.max_stages,
    )


def plan_table(plan: Plan) -> Table:
    """Per-stage summary of a plan as a rich table."""
    cost, part = plan.cost, plan.partition
    table = Table(
        title=(
            f"{plan.id}  ({plan.solver.name}, {plan.solver.status}, "
            f"{plan.solver.solve_time_s:.2f} s)\n"
            f"{plan.problem.model.name} on {plan.problem.cluster.name}: micro-batch "
            f"{part.micro_batch_size} x {part.num_micro_batches}, "
            f"iteration {cost.iteration_ms:.1f} ms, {cost.samples_per_s:.2f} samples/s, "
            f"bottleneck {cost.bottleneck}"
        ),
        title_justify="left",
    )
    for col in (
        "stage",
        "blocks",
        "devices (samples)",
        "K",
        "fwd ms",
        "bwd ms",
        "allreduce ms",
        "link out ms",
        "peak mem",
    ):
        table.add_column(col, justify="right" if col not in ("devices (samples)",) else "left")
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


def _print_plan(plan: Plan) -> None:
    out.print(plan_table(plan))
    idle = [d.id for d in plan.problem.cluster.devices if d.id not in plan.partition.used_devices()]
    if idle:
        out.print(f"idle devices: {', '.join(idle)}")
    for note in plan.problem.assumptions:
        out.print(f"[dim]assumption: {note}[/dim]")


def _progress_callback(progress: Progress, label: str) -> Callable[[int, int], None]:
    task = progress.add_task(label, total=None)

    def update(done: int, total: int) -> None:
        progress.update(task, completed=done, total=total)

    return update


def _solve(args: argparse.Namespace) -> Plan:
    problem = api.load_problem(args.model, args.cluster, _config_from_args(args))
    label = f"planning ({args.solver})"
    with Progress(console=err, transient=True) as progress:
        return api.solve(
            problem,
            args.solver,
            _progress_callback(progress, label),
            backend=args.backend,
            time_limit=args.time_limit,
        )


def cmd_plan(args: argparse.Namespace) -> None:
    plan = _solve(args)
    if args.output == "-":
        sys.stdout.write(json.dumps(plan_to_dict(plan), indent=1) + "\n")
        return
    _print_plan(plan)
    if args.output:
        save_plan(plan, args.output)
        out.print(f"wrote {args.output}")


def comparison_table(result: ComparisonResult) -> Table:
    """The comparison as a rich table (one row per planner)."""
    table = Table(
        title=(
            f"{result.model} on {result.cluster}, global batch {result.global_batch}: "
            "predicted by the cost model"
        ),
        title_justify="left",
    )
    columns = (
        "planner", "feasible", "status", "iteration ms", "samples/s", "speed-up", "solve s",
        "gap", "memory headroom", "stages", "devices", "micro-batch",
    )  # fmt: skip
    for col in columns:
        table.add_column(
            col,
            justify="left" if col in ("planner", "status") else "right",
            no_wrap=True,
        )
    table.caption = "speed-up: over the data-parallel baseline (iteration time ratio)"

    def fmt(value: float | int | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    for r in result.rows:
        table.add_row(
            r.planner,
            "yes" if r.feasible else "no",
            r.status,
            fmt(r.iteration_ms, ".1f"),
            fmt(r.samples_per_s, ".2f"),
            fmt(r.speedup_vs_data_parallel, ".2f"),
            fmt(r.solve_time_s, ".2f"),
            fmt(r.gap, ".2%"),
            fmt(r.memory_headroom, ".0%"),
            fmt(r.stages, "d"),
            fmt(r.devices_used, "d"),
            fmt(r.micro_batch_size, "d"),
        )
    return table


def _run_compare(
    problem: Problem,
    names: list[str] | None,
    backend: str,
    time_limit: float,
    outdir: str | Path | None,
) -> None:
    with Progress(console=err, transient=True) as progress:
        tasks: dict[str, TaskID] = {}

        def report(label: str, done: int, total: int) -> None:
            if label not in tasks:
                tasks[label] = progress.add_task(label, total=total)
            progress.update(tasks[label], completed=done, total=total)

        result = api.compare(problem, names, backend, time_limit, report)
    table = comparison_table(result)
    # numbers must not be cut: a table wider than the terminal is printed at full width
    wide = out.measure(table, options=out.options.update_width(1000)).maximum
    Console(file=out.file, width=max(out.width, wide)).print(table)
    for r in result.rows:
        if r.note:
            out.print(f"[dim]{r.planner}: {r.note}[/dim]", highlight=False)
    if outdir:
        for path in result.write(outdir):
            out.print(f"wrote {path}")


def cmd_compare(args: argparse.Namespace) -> None:
    problem = api.load_problem(args.model, args.cluster, _config_from_args(args))
    names = args.planners.split(",") if args.planners else None
    _run_compare(problem, names, args.backend, args.time_limit, args.out)


def cmd_show(args: argparse.Namespace) -> None:
    plan = load_plan(args.plan)
    _print_plan(plan)
    if args.output:
        from planner.gantt import draw_gantt

        timeline = simulate(plan.cost.chain)
        draw_gantt(timeline, args.output, title=f"{plan.id}: one iteration (1F1B)")
        out.print(f"wrote {args.output}")


def cmd_simulate(args: argparse.Namespace) -> None:
    from planner.gantt import timeline_text

    plan = load_plan(args.plan)
    chain = plan.cost.chain
    schedule = gpipe(chain) if args.schedule == "gpipe" else one_f_one_b(chain)
    timeline = simulate(chain, schedule)
    _print_plan(plan)
    out.print(timeline_text(timeline))
    predicted = plan.cost.iteration_ms
    out.print(
        f"simulated {timeline.makespan_ms:.1f} ms vs cost model {predicted:.1f} ms "
        f"(Asteroid closed form {plan.cost.closed_form_ms:.1f} ms)"
    )


def cmd_validate(args: argparse.Namespace) -> None:
    doc = read_json(args.file)
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if kind not in KINDS:
        raise EdgepipeError(f"{args.file}: $.kind is {kind!r}; expected one of {sorted(KINDS)}")
    if kind == "edgepipe.plan":
        load_plan(args.file)
    else:
        validate(doc, kind, args.file)
    out.print(f"{args.file}: valid {kind}")


def cmd_import_pipedream(args: argparse.Namespace) -> None:
    from planner.importers.pipedream import import_pipedream

    profile = import_pipedream(
        args.graph, batch_size=args.batch_size, device_type=args.device_type, name=args.name
    )
    Path(args.output).write_text(json.dumps(profile.to_dict(), indent=1) + "\n")
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
    timeline = simulate(plan.cost.chain)
    from planner.gantt import draw_gantt

    draw_gantt(timeline, outdir / "gantt.png", title=f"{plan.id}: one iteration (1F1B)")
    out.print(
        f"simulated iteration {timeline.makespan_ms:.1f} ms (cost model "
        f"{plan.cost.iteration_ms:.1f} ms); wrote {path} and {outdir / 'gantt.png'}"
    )
    out.rule("the DP against the exact solver and the baselines")
    _run_compare(problem, None, DEFAULT_BACKEND, DEFAULT_TIME_LIMIT, outdir)


def cmd_profile(args: argparse.Namespace) -> None:
    from functools import partial

    from executor import zoo
    from executor.analytic import analytic_profile
    from executor.profiler import profile_model
    from planner.cluster import load_catalog
    from planner.profile import BuildSpec

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
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
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
        profile = analytic_profile(profile, load_catalog())
    Path(args.output).write_text(json.dumps(profile.to_dict(), indent=1) + "\n")
    out.print(
        f"wrote {args.output}: {name}, {profile.num_blocks} blocks, timed on "
        f"{', '.join(sorted(profile.timings))}"
    )


def cmd_probe(args: argparse.Namespace) -> None:
    from executor.probe import probe_device

    with Progress(console=err, transient=True) as progress:
        progress.add_task("probing this machine (compute, memory, loopback link)", total=None)
        entry = probe_device(num_threads=args.threads)
    doc = {
        "schema_version": 1,
        "kind": "edgepipe.device_catalog",
        "device_types": {args.name: entry},
    }
    validate(doc, "edgepipe.device_catalog", "probe result")
    Path(args.output).write_text(json.dumps(doc, indent=1) + "\n")
    out.print(
        f"wrote {args.output}: {args.name}: {entry['peak_fp32_gflops']} GFLOP/s peak, "
        f"efficiency {entry['efficiency']}, {entry['memory_bytes'] / GIB:.1f} GiB, "
        f"link {entry['network']['bandwidth_mbps']} Mbit/s"
    )


def _executor(module: str) -> object:
    """Import an executor module, turning a missing torch into an install hint."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if (exc.name or "").split(".")[0] == "torch":
            raise EdgepipeError(
                "running a plan needs the executor's dependencies (torch): "
                "pip install 'edgepipe[executor]'"
            ) from None
        raise


def cmd_run(args: argparse.Namespace) -> None:
    launch = _executor("executor.launch")
    worker = _executor("executor.worker")
    plan = load_plan(args.plan)
    opts = worker.WorkerOptions(  # type: ignore[attr-defined]
        plan=args.plan,
        steps=args.steps,
        out=args.out,
        deterministic=args.deterministic,
        dataset=args.dataset,
        timeout_s=args.timeout,
        save_weights=args.save_weights,
    )
    devices = len(plan.partition.used_devices())
    err.print(
        f"running {plan.id} ({plan.problem.model.name}, {plan.partition.num_stages} stages) "
        f"on {devices} local processes for {args.steps} steps"
        f"{' (deterministic mode)' if args.deterministic else ''}"
    )
    result = launch.launch(opts)  # type: ignore[attr-defined]
    table = Table(title=f"{plan.id}: measured", title_justify="left")
    for col in ("step", "loss", "wall ms", "samples/s"):
        table.add_column(col, justify="right")
    for m in result.metrics:
        sps = m["samples_per_s"]
        table.add_row(
            str(m["step"]), f"{m['loss']:.6f}", f"{m['wall_ms']:.1f}",
            "-" if sps is None else f"{sps:.1f}",
        )
    out.print(table)
    walls = sorted(m["wall_ms"] for m in result.metrics)
    out.print(
        f"median step {walls[len(walls) // 2]:.1f} ms measured vs {plan.cost.iteration_ms:.1f} ms "
        f"predicted; wrote {args.out}/metrics.jsonl and timeline.jsonl"
    )


def _add_problem_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model profile file or shipped name")
    p.add_argument("--cluster", required=True, help="cluster file or shipped name")
    p.add_argument("--config", help="training config file (overrides the options below)")
    p.add_argument("--global-batch", type=int, default=api.DEMO_GLOBAL_BATCH)
    p.add_argument("--micro-batches", help="comma-separated micro-batch size candidates")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZER_STATE), default="momentum")
    p.add_argument("--schedule", choices=["1f1b", "gpipe"], default="1f1b")
    p.add_argument("--warmup", choices=["asteroid", "classic"], default="asteroid")
    p.add_argument("--max-stages", type=int)


def _add_solver_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend",
        choices=list(BACKENDS),
        default=DEFAULT_BACKEND,
        help="exact solver's backend (milp)",
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=DEFAULT_TIME_LIMIT,
        help="exact solver's wall-clock limit in seconds (milp)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgepipe",
        description="Plan hybrid pipeline-parallel training on heterogeneous edge devices.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="solve for the best plan and write it as JSON")
    _add_problem_args(p)
    p.add_argument(
        "--solver", default="dp", help=f"planner to use, one of {', '.join(api.planners())}"
    )
    _add_solver_args(p)
    p.add_argument("-o", "--output", help="plan file to write ('-' for stdout)")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser(
        "compare", help="run the DP, the exact solver and the baselines side by side"
    )
    _add_problem_args(p)
    p.add_argument("--planners", help="comma-separated planners (default: all)")
    _add_solver_args(p)
    p.add_argument("--out", help="folder for compare.csv, compare.json and compare.png")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("show", help="print a plan's summary; -o draws its timeline (PNG)")
    p.add_argument("plan")
    p.add_argument("-o", "--output", help="Gantt chart PNG to write")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("simulate", help="replay a plan's iteration in the event simulator")
    p.add_argument("plan")
    p.add_argument("--schedule", choices=["1f1b", "gpipe"], default="1f1b")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("validate", help="check any edgepipe JSON document against its schema")
    p.add_argument("file")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("import-pipedream", help="convert a PipeDream graph.txt profile")
    p.add_argument("graph")
    p.add_argument("-o", "--output", required=True)
    p.add_argument(
        "--batch-size",
        type=int,
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
    p.add_argument("--batch-sizes", default="1,2,4,8")
    p.add_argument("--device-type", default="host-cpu", help="timing key the profile records")
    p.add_argument("--name", help="profile name (default: the model's)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, help="torch threads while measuring")
    p.add_argument(
        "--analytic", action="store_true", help="also add analytic times for every catalog type"
    )
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("probe", help="measure this machine as a device type (catalog entry)")
    p.add_argument("--name", default="host-cpu", help="device type name to write")
    p.add_argument("--threads", type=int)
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(func=cmd_probe)

    p = sub.add_parser("run", help="train a plan here: one process per planned device")
    p.add_argument("plan")
    p.add_argument("--steps", type=int, required=True, help="optimizer steps to run")
    p.add_argument("--out", default="out/run", help="run directory (plan, metrics, timeline)")
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
        "--timeout", type=float, default=60.0, help="seconds a transfer or collective may wait"
    )
    p.add_argument(
        "--save-weights", action="store_true", help="write each rank's final weights to OUT/weights"
    )
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "demo", help="plan the demo model on the demo cluster, show it, compare the planners"
    )
    p.add_argument("--out", default="out/demo", help="folder for the plan, chart and comparison")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except EdgepipeError as exc:
        err.print(f"[bold red]error:[/bold red] {escape(str(exc))}", highlight=False)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
