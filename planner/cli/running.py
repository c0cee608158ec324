"""The commands that train a plan: ``run`` (one local process per planned device) and
``coordinate`` (the control plane of a multi-host torchrun job). The executor, and with
it torch, is imported inside each command
(:func:`planner.cli.torch_imports.executor_imports`)."""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from edgepipe.planner.check.live import WINDOW, Follower, progress
from edgepipe.planner.cli.args import (
    KEEP_CHECKPOINTS,
    add_coordinate_arguments,
    non_negative_int,
    output_dir,
    positive_float,
    positive_int,
)
from edgepipe.planner.cli.console import err, out, warn
from edgepipe.planner.cli.lab import add_lab_arguments, check_lab_arguments, run_in_lab
from edgepipe.planner.cli.torch_imports import executor_imports
from edgepipe.planner.errors import InputError
from edgepipe.planner.plan import Plan, load_plan, replica_standbys, short_run_note
from edgepipe.planner.timeouts import GLOO_TIMEOUT_S, HANG_TIMEOUT_S, HEARTBEAT_S
from rich.table import Table

if TYPE_CHECKING:
    from edgepipe.executor.core.emulation import EmulatedSlowdown
    from edgepipe.executor.ft.coordinator import Stopped
    from edgepipe.executor.ft.joins import EmulatedJoin


def cmd_run(args: argparse.Namespace) -> None:
    check_lab_arguments(args)
    with executor_imports():
        from edgepipe.executor import launch
        from edgepipe.executor.core.options import WorkerOptions
        from edgepipe.executor.engines import base as engines
        from edgepipe.executor.ft.joins import EmulatedJoin
    plan = load_plan(args.plan)
    engine = engines.find(args.engine)  # an unknown name: one line naming the installed ones
    engines.refuse_unsupported(engine, plan, plan.problem.model.build)
    if args.lab and engine.name != engines.DEFAULT:
        raise InputError("--engine", engine.name, "the lab runs edgepipe's runtime only; drop "
                         "--lab or --engine")
    time_scale = _time_scale(args)
    opts = WorkerOptions(
        plan=args.plan,
        steps=args.steps,
        out=args.out,
        deterministic=args.deterministic,
        dataset=args.dataset,
        timeout_s=args.timeout,
        save_weights=args.save_weights,
        emulate=args.emulate,
        time_scale=time_scale,
        checkpoint_every=args.checkpoint_every,
        checkpoint_dir=args.checkpoint_dir,
        keep_checkpoints=args.keep_checkpoints,
        resume=args.resume,
        emulate_slowdown=_emulated_slowdowns(args),
        faults=args.inject,
    )
    joins = [EmulatedJoin.parse(spec, plan) for spec in args.emulate_join]
    _check_faults(args, plan, joins, launch.recovers(
        opts, plan, args.hang_timeout, False if args.no_recover else None))
    devices = len(plan.partition.used_devices())
    err.print(
        f"running {plan.id} ({plan.problem.model.name}, {plan.partition.num_stages} stages) "
        f"on {devices} local processes for {args.steps} steps"
        f"{' (deterministic mode)' if args.deterministic else ''}"
        f"{f' on the {engine.name} engine' if engine.name != engines.DEFAULT else ''}"
        f"{f' emulating its devices (time scale {time_scale:g})' if args.emulate else ''}"
        f"{' in the lab (docs/lab.md)' if args.lab else ''}"
    )
    # only edgepipe's runtime replicates
    slow = (None if args.no_recover or engine.name != engines.DEFAULT
            else short_run_note(plan, args.steps))
    if slow:  # a recovering run replicates at the plan's interval
        warn(slow)
    ticker = ProgressLine(Path(args.out) / "metrics.jsonl", args.steps,
                          plan.partition.micro_batch_size * plan.partition.num_micro_batches)
    ticker.start()
    try:
        result = run_in_lab(args, opts) if args.lab else engine.run(
            plan, plan.problem.model.build, engines.RunOptions(
                opts, hang_timeout_s=args.hang_timeout, heartbeat_s=args.heartbeat,
                recover=False if args.no_recover else None, joins=tuple(joins),
                standbys=args.standbys, watch_slowdown=args.watch_slowdown,
            ))
    except KeyboardInterrupt:  # the launcher has reaped every worker: 130 (cli.main)
        raise KeyboardInterrupt("interrupted; every worker was stopped") from None
    finally:
        ticker.finish()
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
        warn(failed["reason"])
    for e in result.events:
        what = "re-partitioned for" if e["cause"] in ("slow", "join") else "recovered from"
        out.print(
            f"{what} {e['cause']} of {e['device']}: generation {e['generation']} "
            f"runs {e['new_plan']} from step {e['replay_from_step']}, first commit "
            f"{_s(e['t_first_commit_s'])} after detection"
        )
        if e.get("warning"):
            warn(e["warning"])
    walls = sorted(m["wall_ms"] for m in result.metrics)
    predicted = plan.cost.iteration_ms * time_scale
    out.print(
        f"median step {walls[len(walls) // 2]:.1f} ms measured vs {predicted:.1f} ms "
        f"predicted; wrote {args.out}/metrics.jsonl and timeline.jsonl"
    )
    if args.emulate:
        from edgepipe.planner.check.report import emulation_overruns

        warning = emulation_overruns(args.out)
        if warning:
            warn(warning)


class ProgressLine(threading.Thread):
    """The progress line of ``edgepipe run`` on stderr (step/N, loss, samples/s, ETA:
    :func:`planner.check.live.progress` of the run's ``metrics.jsonl`` so far, read
    every ``TICK_S``): refreshed in place on a terminal, else one line when the first
    step shows, then at most one every ``EVERY_S``, and the last step's at the end. A
    ``metrics.jsonl`` left by an earlier run is ignored until this run's writer touches
    it."""

    TICK_S = 0.5
    EVERY_S = 10.0

    def __init__(self, path: Path, total: int, global_batch: int) -> None:
        super().__init__(name="edgepipe-progress", daemon=True)
        # the progress needs the last WINDOW steps; the slack is for other lines
        self.follower = Follower(path, keep=2 * WINDOW)
        self.total, self.batch = total, global_batch
        self.stale = _stamp(path)
        self.tty = err.is_terminal
        self.shown: int | None = None
        self.printed_at = 0.0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.TICK_S):
            self._tick(final=False)

    def _tick(self, final: bool) -> None:
        if self.stale is not None and _stamp(self.follower.path) == self.stale:
            return
        self.stale = None
        self.follower.read()
        now = progress(self.follower.lines, self.total, self.batch)
        if now is None or now.done == self.shown:
            return
        if self.tty:
            err.file.write(f"\r{now.text()}\x1b[K")
            err.file.flush()
        elif self.shown is None or final or time.monotonic() - self.printed_at >= self.EVERY_S:
            err.print(now.text(), highlight=False, soft_wrap=True)
            self.printed_at = time.monotonic()
        else:
            return
        self.shown = now.done

    def finish(self) -> None:
        """Stop; show the last step read (and end the refreshed line)."""
        self._done.set()
        self.join()
        self._tick(final=True)
        if self.tty and self.shown is not None:
            err.file.write("\n")
            err.file.flush()


def _stamp(path: Path) -> tuple[int, int] | None:
    """A file's (mtime ns, size), None when it does not exist."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _emulated_slowdowns(args: argparse.Namespace) -> tuple[EmulatedSlowdown, ...]:
    """``--emulate-slowdown`` values as the emulation's type (needs --emulate)."""
    if not args.emulate_slowdown:
        return ()
    if not args.emulate:
        raise InputError("--emulate-slowdown", "", "needs --emulate (it slows an emulated "
                         "device)")
    with executor_imports():
        from edgepipe.executor.core.emulation import EmulatedSlowdown
    try:
        return tuple(EmulatedSlowdown.parse(t) for t in args.emulate_slowdown)
    except ValueError as exc:
        raise InputError("--emulate-slowdown", "", str(exc)) from None


def _time_scale(args: argparse.Namespace) -> float:
    """``--time-scale`` (default 1); it stretches emulated times, so it needs --emulate."""
    if args.time_scale is None:
        return 1.0
    if not args.emulate:
        raise InputError("--time-scale", "", f"{args.time_scale:g} stretches emulated times, "
                         "but this run does not emulate; add --emulate or drop --time-scale")
    return float(args.time_scale)


def _check_faults(args: argparse.Namespace, plan: Plan, joins: Sequence[EmulatedJoin],
                  recovering: bool) -> None:
    """Refuse an ``--inject`` spec that could never fire, before any process starts
    (:func:`executor.ft.faults.check`; the devices that run a process: the plan's, its
    standbys and the joining devices)."""
    with executor_imports():
        from edgepipe.executor.ft import faults

    running = [*plan.partition.used_devices(), *(replica_standbys(plan) if recovering else ()),
               *(d for join in joins for d in join.devices)]
    faults.check(args.inject, running, args.steps, recovering)


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


def cmd_coordinate(args: argparse.Namespace) -> None:
    with executor_imports():
        from edgepipe.executor.ft import coordinator
    err.print(f"coordinating {args.plan}: store on port {args.port}; start each host's "
              f"workers with --coordinator <this host>:{args.port}", highlight=False,
              soft_wrap=True)
    standbys = replica_standbys(load_plan(args.plan)) if args.recover and args.standbys else ()
    if len(standbys) >= args.standbys > 0:  # otherwise the coordinator refuses them
        err.print(f"expecting standby(s) {', '.join(standbys[:args.standbys])}: start each on "
                  f"its host with python -m executor.worker {args.plan} --steps {args.steps} "
                  f"--coordinator <this host>:{args.port} --standby DEV", highlight=False,
                  soft_wrap=True)
    coordinated(coordinator.run(args))


def coordinated(done: Stopped) -> None:
    """What ``edgepipe coordinate`` prints of a run that finished: a warning line per
    dropped join (executor/ft/joins.py, "Failed joins"), then the last generation."""
    for reason in done.join_failures:
        warn(reason)
    err.print(f"every worker finished (generation {done.generation})", highlight=False)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
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
        help="with --emulate: stretch every emulated time by this factor (default 1; "
        "without --emulate it is refused)",
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
        "--keep-checkpoints",
        type=positive_int,
        default=KEEP_CHECKPOINTS,
        metavar="K",
        help="keep the newest K committed checkpoints, delete older ones after each commit "
        f"(default {KEEP_CHECKPOINTS})",
    )
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
        "d1:2:forward kills d1 after its first forward of step 2; DEV must run in this run "
        "and STEP be below --steps (checked before anything starts)",
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
    add_lab_arguments(p)
    p.set_defaults(func=cmd_run)


def add_run_command_arguments(p: argparse.ArgumentParser) -> None:
    """``run``'s arguments, ``--engine`` included."""
    add_run_arguments(p)
    p.add_argument(
        "--engine",
        default="edgepipe",
        metavar="NAME",
        help="the engine that trains the plan: edgepipe (default: edgepipe's runtime, every "
        "plan, fault tolerance), torch-pipelining (torch.distributed.pipelining: equal "
        "shares, no fault tolerance) or any engine installed under the entry-point group "
        "edgepipe.engines (docs/engines.md)",
    )


def add_coordinate_command_arguments(p: argparse.ArgumentParser) -> None:
    add_coordinate_arguments(p)
    p.set_defaults(func=cmd_coordinate)


#: command -> the function that adds its arguments and handler to its parser
ARGUMENTS = {
    "run": add_run_command_arguments,
    "coordinate": add_coordinate_command_arguments,
}
