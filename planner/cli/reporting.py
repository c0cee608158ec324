"""The ``report`` command: a run's measurements against its plan's prediction, per device
and per recovery, with the Gantt charts (torch-free: it reads the run's files)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from edgepipe.planner.cli.args import chart_file
from edgepipe.planner.cli.console import out, print_table, warn
from rich.table import Table

if TYPE_CHECKING:
    from edgepipe.planner.check.report import RunReport


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _ratio(measured: float | None, predicted: float) -> str:
    return "-" if measured is None or predicted <= 0 else f"{measured / predicted:.2f}"


def _secs(seconds: float | None) -> str:
    """A phase's seconds, or - when the phase was never reached."""
    return "-" if seconds is None else f"{seconds:.3f}"


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


def device_table(report: RunReport) -> Table:
    """One row per device of the run's plan: predicted and measured ms per micro-batch."""
    table = Table()
    for col in ("stage", "device", "y", "fwd pred", "fwd meas", "bwd pred", "bwd meas",
                "ar pred", "ar meas", "recv wait/step"):
        table.add_column(col, justify="right")
    for d in report.devices:
        table.add_row(
            str(d.stage), d.device, str(d.samples), _ms(d.forward_predicted),
            _ms(d.forward_measured), _ms(d.backward_predicted), _ms(d.backward_measured),
            _ms(d.allreduce_predicted), _ms(d.allreduce_measured), _ms(d.recv_wait_measured),
        )
    return table


def device_lines(report: RunReport) -> list[str]:
    """The narrow layout of :func:`device_table`: one line per device."""
    return [
        f"{d.device} (stage {d.stage}, {d.samples} samples): forward {_ms(d.forward_predicted)} "
        f"predicted, {_ms(d.forward_measured)} measured; backward {_ms(d.backward_predicted)} "
        f"/ {_ms(d.backward_measured)}; all-reduce {_ms(d.allreduce_predicted)} / "
        f"{_ms(d.allreduce_measured)}; receive wait {_ms(d.recv_wait_measured)} per step (ms)"
        for d in report.devices
    ]


def cmd_report(args: argparse.Namespace) -> None:
    from edgepipe.planner.check.report import build_report, draw_report

    report = build_report(args.run_dir)
    chart = Path(args.output) if args.output else Path(args.run_dir) / "report.png"
    draw_report(report, args.run_dir, chart)  # first: a reader that stops early loses nothing
    if report.unfinished:  # a run still going, or one that died: its steps so far
        out.print(report.unfinished, highlight=False, soft_wrap=True)
    used = report.steps_used
    kind = f"emulated, time scale {report.time_scale:g}" if report.emulated else "not emulated"
    out.print(f"{report.plan.id}: predicted vs measured per micro-batch ({kind}; steps "
              f"{used[0]}-{used[-1]} of {report.steps})", highlight=False)
    print_table(device_table(report), lambda: device_lines(report))
    out.print(
        f"iteration: predicted {report.iteration_predicted_ms:.1f} ms (one isolated step), "
        f"{report.steady_predicted_ms:.1f} ms a step in a run; measured "
        f"{report.iteration_measured_ms:.1f} ms (median; x"
        f"{_ratio(report.iteration_measured_ms, report.steady_predicted_ms)} of the steady "
        f"step); {report.samples_per_s_predicted:.2f} vs "
        f"{report.samples_per_s_measured:.2f} samples/s",
        highlight=False,
    )
    if not report.emulated:
        out.print(
            "[dim]not emulated: measured at this machine's speed, predicted for the plan's "
            "devices (run with --emulate to compare like with like)[/dim]",
            highlight=False,
        )
    if report.overrun_warning:
        warn(report.overrun_warning)
    if report.recoveries:
        print_table(recovery_table(report), lambda: recovery_lines(report))
    for r in report.recoveries:
        if r.warning:
            warn(f"recovery {r.generation}: {r.warning}")
    for reason in report.join_failures:
        warn(reason)
    whole = ", the whole run with its recoveries below" if report.recoveries else ""
    out.print(f"wrote {chart} (predicted iteration above measured step "
              f"{report.measured_step}{whole})", highlight=False)


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="run directory written by `edgepipe run --out DIR`")
    p.add_argument(
        "-o", "--output", type=chart_file, help="chart file (default RUN_DIR/report.png)"
    )
    p.set_defaults(func=cmd_report)


#: command -> the function that adds its arguments and handler to its parser
ARGUMENTS = {"report": add_report_arguments}
