"""The ``report`` command: a run's measurements against its plan's prediction, per device
and per recovery, with the Gantt charts (torch-free: it reads the run's files)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from edgepipe.planner.cli.args import chart_file
from edgepipe.planner.cli.console import out, print_table, warn
from edgepipe.planner.units import human_bytes
from rich.table import Table

if TYPE_CHECKING:
    from edgepipe.planner.check.breakdown import LinkRow
    from edgepipe.planner.check.report import RunReport


def _ms(x: float | None) -> str:
    """Milliseconds: one decimal, or two significant digits below 1 ms (a figure of
    0.03 ms does not show as 0.0)."""
    if x is None:
        return "-"
    return f"{x:.1f}" if abs(x) >= 1 or x == 0 else f"{x:.2g}"


def _ratio(measured: float | None, predicted: float) -> str:
    """measured / predicted: two decimals, or two significant digits below 0.1."""
    if measured is None or predicted <= 0:
        return "-"
    r = measured / predicted
    return f"{r:.2f}" if r >= 0.1 or r == 0 else f"{r:.2g}"


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
    table = Table(title="per device, ms per micro-batch (receive wait: per step)",
                  title_justify="left")
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


def _mem(x: float | None) -> str:
    """Bytes in their own unit (:func:`planner.units.human_bytes`), or - when unknown."""
    return "-" if x is None else human_bytes(x)


def _memory_what(report: RunReport) -> str:
    """What the measured memory is (planner.check.report.DeviceFigures.memory_measured)."""
    if any(d.memory_baseline is not None for d in report.devices):
        return "peak resident set above the process's before its model was built"
    return "peak allocated"


def step_table(report: RunReport) -> Table:
    """One row per device: predicted and measured figures of one step (compute, bubble)
    and its memory."""
    table = Table(title=f"per device and step, ms; memory (measured: "
                  f"{_memory_what(report)})", title_justify="left")
    for col in ("device", "compute pred", "compute meas", "bubble pred", "bubble meas",
                "mem pred", "mem meas"):
        table.add_column(col, justify="right")
    for d in report.devices:
        table.add_row(d.device, _ms(d.compute_predicted), _ms(d.compute_measured),
                      _ms(d.bubble_predicted), _ms(d.bubble_measured),
                      _mem(d.memory_predicted), _mem(d.memory_measured))
    return table


def step_lines(report: RunReport) -> list[str]:
    """The narrow layout of :func:`step_table`: one line per device."""
    return [
        f"{d.device} per step: compute {_ms(d.compute_predicted)} predicted, "
        f"{_ms(d.compute_measured)} measured; bubble {_ms(d.bubble_predicted)} / "
        f"{_ms(d.bubble_measured)} (ms); memory {_mem(d.memory_predicted)} / "
        f"{_mem(d.memory_measured)}"
        for d in report.devices
    ]


def stage_table(report: RunReport) -> Table:
    """One row per stage: its slowest device's compute, its ring all-reduce and the link
    to the next stage, predicted and measured (ms)."""
    table = Table(title="per stage, ms (fwd / bwd per micro-batch, ar per step, link per "
                  "micro-batch and direction)", title_justify="left")
    for col in ("stage", "devices", "fwd pred", "fwd meas", "bwd pred", "bwd meas",
                "ar pred", "ar meas", "link pred", "link meas"):
        table.add_column(col, justify="right")
    for r in report.stages:
        table.add_row(str(r.stage), " ".join(r.devices), _ms(r.forward_predicted),
                      _ms(r.forward_measured), _ms(r.backward_predicted),
                      _ms(r.backward_measured), _ms(r.allreduce_predicted),
                      _ms(r.allreduce_measured), _ms(r.link_predicted), _ms(r.link_measured))
    return table


def stage_lines(report: RunReport) -> list[str]:
    """The narrow layout of :func:`stage_table`: one line per stage."""
    return [
        f"stage {r.stage} ({', '.join(r.devices)}): forward {_ms(r.forward_predicted)} "
        f"predicted, {_ms(r.forward_measured)} measured; backward "
        f"{_ms(r.backward_predicted)} / {_ms(r.backward_measured)}; all-reduce "
        f"{_ms(r.allreduce_predicted)} / {_ms(r.allreduce_measured)}; link out "
        f"{_ms(r.link_predicted)} / {_ms(r.link_measured)} (ms)"
        for r in report.stages
    ]


def _link_measured(r: LinkRow) -> str:
    """The measured transfer: the mean of the exactly timed pieces, else the upper bound
    (planner.check.breakdown, "Per link")."""
    if r.measured_ms is not None:
        return _ms(r.measured_ms)
    return "-" if r.bound_ms is None else f"<={r.bound_ms:.1f}"


def link_table(report: RunReport) -> Table:
    """One row per ordered device pair of each boundary and direction: predicted and
    measured ms per piece, post to delivery."""
    table = Table(title="per link, ms per transfer from post to delivery (pred: alone on "
                  "an idle network; timed: pieces whose receiver was waiting)",
                  title_justify="left")
    for col in ("boundary", "dir", "from", "to", "size", "per step", "pred", "meas", "x",
                "timed"):
        table.add_column(col, justify="right")
    for r in report.links:
        table.add_row(f"{r.boundary}->{r.boundary + 1}", r.direction, r.src, r.dst,
                      _mem(r.num_bytes), str(r.per_step), _ms(r.predicted_ms),
                      _link_measured(r), _ratio(r.measured_ms, r.predicted_ms),
                      f"{r.exact}/{r.count}")
    return table


def link_lines(report: RunReport) -> list[str]:
    """The narrow layout of :func:`link_table`: one line per link."""
    return [
        f"{r.direction} {r.src} -> {r.dst} (stage {r.boundary} -> {r.boundary + 1}, "
        f"{_mem(r.num_bytes)}, {r.per_step} a step): {_ms(r.predicted_ms)} predicted, "
        f"{_link_measured(r)} measured (ms; {r.exact} of {r.count} timed)"
        for r in report.links
    ]


def _mode(report: RunReport) -> str:
    """What the run measured, in words."""
    if report.mode == "emulated":
        return f"emulated run, time scale {report.time_scale:g}"
    if report.mode == "lab":
        return "lab run: real compute confined like each device, shaped links"
    return "real run at this machine's speed"


def cmd_report(args: argparse.Namespace) -> None:
    from edgepipe.planner.check.report import build_report, draw_report

    report = build_report(args.run_dir)
    chart = Path(args.output) if args.output else Path(args.run_dir) / "report.png"
    draw_report(report, args.run_dir, chart)  # first: a reader that stops early loses nothing
    if report.unfinished:  # a run still going, or one that died: its steps so far
        out.print(report.unfinished, highlight=False, soft_wrap=True)
    used = report.steps_used
    out.print(f"{report.plan.id}: predicted vs measured, {_mode(report)} (steps "
              f"{used[0]}-{used[-1]} of {report.steps})", highlight=False, soft_wrap=True)
    print_table(device_table(report), lambda: device_lines(report))
    print_table(step_table(report), lambda: step_lines(report))
    print_table(stage_table(report), lambda: stage_lines(report))
    if report.links:
        print_table(link_table(report), lambda: link_lines(report))
    out.print(
        f"iteration: predicted {report.iteration_predicted_ms:.1f} ms (one isolated step), "
        f"{report.steady_predicted_ms:.1f} ms a step in a run; measured "
        f"{report.iteration_measured_ms:.1f} ms (median; x"
        f"{_ratio(report.iteration_measured_ms, report.steady_predicted_ms)} of the steady "
        f"step); {report.samples_per_s_predicted:.2f} vs "
        f"{report.samples_per_s_measured:.2f} samples/s",
        highlight=False,
    )
    if report.mode == "real":
        out.print(
            "[dim]real run: measured at this machine's speed, predicted for the plan's "
            "devices (run with --emulate or --lab to compare like with like)[/dim]",
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
