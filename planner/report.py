"""Predicted vs measured: what ``edgepipe report RUN_DIR`` shows (no torch).

Inputs, all files of a run directory written by the executor (docs/executor.md):
``plan.json`` (the plan as run; its predictions are recomputed by :mod:`planner.cost`
on load), ``metrics.jsonl`` (one line per step), ``timeline.jsonl`` (one line per timed
action of each rank and step) and, for an emulated run, ``emulation/rank<r>.jsonl``
(per rank and step: compute budget, real compute, overruns, time scale).

Figures (steps after the first, which carries start-up costs, when there are several):

* per stage and device: predicted forward and backward ms per micro-batch
  (``StageCost.device_forward_ms / device_backward_ms``) against the mean measured ``F``
  and ``B`` action; predicted all-reduce (``StageCost.allreduce_ms``) against the mean
  ``REDUCE_GRAD``; the measured receive wait per step;
* per run: predicted iteration (``PlanCost.iteration_ms``) against the median measured
  step wall time, and samples/s.

Predictions are multiplied by the emulation's time scale when the run was emulated (then
they are the emulated devices' budgets); a run that was not emulated ran at this
machine's speed, so its ratios compare this machine with the plan's devices.

The predicted Gantt chart is the independent simulator's iteration
(:func:`planner.simulator.simulate`; its makespan is within the cost model's error of
``PlanCost.iteration_ms``, docs/cost-model.md). The measured one shows one step (the one
with the median wall time) as a :class:`planner.simulator.Timeline`: each device's
``F``, ``B`` and ``REDUCE_GRAD`` (as all-reduce) intervals, each rank's times taken from
its own step start (ranks are not clock-aligned; a later stage's first action is its
wait for activations, so the offsets line up to within that rank's step start). It has
no channel rows: the executor measures transfers at their ends only.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from planner.errors import InputError
from planner.plan import Plan, load_plan
from planner.simulator import Interval, Timeline, Transfer, simulate


@dataclass(frozen=True)
class DeviceFigures:
    """Predicted vs measured figures of one device of one stage (ms)."""

    stage: int
    device: str
    samples: int
    forward_predicted: float
    forward_measured: float | None
    backward_predicted: float
    backward_measured: float | None
    allreduce_predicted: float
    allreduce_measured: float | None
    recv_wait_measured: float | None


@dataclass(frozen=True)
class RunReport:
    """Everything ``edgepipe report`` prints and draws."""

    plan: Plan
    time_scale: float
    emulated: bool
    steps: int
    steps_used: tuple[int, ...]
    iteration_predicted_ms: float
    iteration_measured_ms: float
    samples_per_s_predicted: float
    samples_per_s_measured: float
    devices: tuple[DeviceFigures, ...]
    overrun_warning: str | None
    measured_step: int


def _jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(str(path), "", f"cannot read it ({exc.strerror}); is this a run "
                         "directory written by `edgepipe run --out DIR`?") from None
    try:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise InputError(str(path), "", f"line {exc.lineno} is not JSON") from None


def _emulation_lines(run_dir: Path) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    for path in sorted((run_dir / "emulation").glob("rank*.jsonl")):
        lines += _jsonl(path)
    return lines


def emulation_overruns(run_dir: str | Path) -> str | None:
    """One line saying which devices' real compute exceeded the emulated budget (how
    often, by how much at worst), or None when it never did."""
    per_device: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in _emulation_lines(Path(run_dir)):
        per_device[line["device"]].append(line)
    hit = {
        d: (sum(x["overruns"] for x in xs), max(x["worst_overrun_ms"] for x in xs))
        for d, xs in per_device.items()
        if any(x["overruns"] for x in xs)
    }
    if not hit:
        return None
    parts = ", ".join(f"{d} {n}x (worst +{w:.1f} ms)" for d, (n, w) in sorted(hit.items()))
    return (
        f"real compute exceeded the emulated budget on {parts}: those devices ran at "
        "this machine's speed, not the plan's; raise --time-scale"
    )


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def build_report(run_dir: str | Path) -> RunReport:
    """Read run directory ``run_dir`` and set its measurements against the plan's
    prediction (module docstring). O(timeline lines)."""
    folder = Path(run_dir)
    plan = load_plan(folder / "plan.json")
    metrics = _jsonl(folder / "metrics.jsonl")
    if not metrics:
        raise InputError(str(folder / "metrics.jsonl"), "", "no steps recorded")
    timeline = _jsonl(folder / "timeline.jsonl")
    emulation = _emulation_lines(folder)
    scale = float(emulation[0]["time_scale"]) if emulation else 1.0
    used = tuple(m["step"] for m in metrics[1:]) if len(metrics) > 1 else (metrics[0]["step"],)
    chosen = set(used)
    walls = {m["step"]: m["wall_ms"] for m in metrics if m["step"] in chosen}
    median_wall = statistics.median(walls.values())
    measured_step = min(walls, key=lambda s: (abs(walls[s] - median_wall), s))

    durations: dict[tuple[str, str], list[float]] = defaultdict(list)
    for e in timeline:
        if e["step"] in chosen:
            durations[(e["device"], e["kind"])].append(e["end_ms"] - e["start_ms"])
    recv_wait = defaultdict(list)
    for m in metrics:
        if m["step"] in chosen:
            for d, fig in m["devices"].items():
                recv_wait[d].append(fig["recv_wait_ms"])

    rows = []
    for p, (stage, cost) in enumerate(zip(plan.partition.stages, plan.cost.stages, strict=True)):
        for j, device in enumerate(stage.devices):
            rows.append(
                DeviceFigures(
                    stage=p,
                    device=device,
                    samples=stage.samples[j],
                    forward_predicted=scale * cost.device_forward_ms[j],
                    forward_measured=_mean(durations[(device, "F")]),
                    backward_predicted=scale * cost.device_backward_ms[j],
                    backward_measured=_mean(durations[(device, "B")]),
                    allreduce_predicted=scale * cost.allreduce_ms,
                    allreduce_measured=_mean(durations[(device, "REDUCE_GRAD")]),
                    recv_wait_measured=_mean(recv_wait[device]),
                )
            )
    batch = plan.partition.micro_batch_size * plan.partition.num_micro_batches
    predicted = scale * plan.cost.iteration_ms
    return RunReport(
        plan=plan,
        time_scale=scale,
        emulated=bool(emulation),
        steps=len(metrics),
        steps_used=used,
        iteration_predicted_ms=predicted,
        iteration_measured_ms=median_wall,
        samples_per_s_predicted=batch / predicted * 1e3 if predicted > 0 else float("inf"),
        samples_per_s_measured=batch / median_wall * 1e3 if median_wall > 0 else float("inf"),
        devices=tuple(rows),
        overrun_warning=emulation_overruns(folder) if emulation else None,
        measured_step=measured_step,
    )


def predicted_timeline(plan: Plan) -> Timeline:
    """The simulated iteration of the plan under its configured schedule."""
    return simulate(plan.problem, plan.partition)


def measured_timeline(run_dir: str | Path, plan: Plan, step: int) -> Timeline:
    """Step ``step`` of the run as a :class:`Timeline` of the plan's devices (module
    docstring: per-rank clocks, no channel rows)."""
    stages = tuple(s.devices for s in plan.partition.stages)
    per_device: dict[str, list[Interval]] = defaultdict(list)
    kinds = {"F": "F", "B": "B", "REDUCE_GRAD": "AR"}
    for e in _jsonl(Path(run_dir) / "timeline.jsonl"):
        if e["step"] == step and e["kind"] in kinds:
            mb = -1 if e["kind"] == "REDUCE_GRAD" else int(e["micro_batch"])
            per_device[e["device"]].append(
                Interval(kinds[e["kind"]], mb, float(e["start_ms"]), float(e["end_ms"]))
            )
    devices = {
        d: tuple(sorted(per_device[d], key=lambda iv: iv.start_ms)) for s in stages for d in s
    }
    span = max((iv.end_ms for ivs in devices.values() for iv in ivs), default=0.0)
    return Timeline(
        topology=plan.problem.cluster.network.kind,
        stages=stages,
        devices=devices,
        transfers=(),
        makespan_ms=span,
        num_micro_batches=plan.partition.num_micro_batches,
    )


def draw_report(report: RunReport, run_dir: str | Path, path: str | Path) -> None:
    """The predicted iteration (scaled like the report) above the measured step, one
    figure on a common time axis (:func:`planner.gantt.draw_gantts`)."""
    from planner.gantt import draw_gantts

    predicted = predicted_timeline(report.plan)
    if report.time_scale != 1.0:
        predicted = _scaled(predicted, report.time_scale)
    measured = measured_timeline(run_dir, report.plan, report.measured_step)
    scale = f" x time scale {report.time_scale:g}" if report.time_scale != 1.0 else ""
    draw_gantts(
        [
            (
                predicted,
                f"{report.plan.id}: predicted iteration (independent simulator{scale}; cost "
                f"model {report.iteration_predicted_ms:.1f} ms)",
            ),
            (measured, f"measured step {report.measured_step} (each rank from its step start)"),
        ],
        path,
    )


def _scaled(t: Timeline, k: float) -> Timeline:
    def iv(x: Interval) -> Interval:
        return Interval(x.kind, x.micro_batch, x.start_ms * k, x.end_ms * k)

    def tr(x: Transfer) -> Transfer:
        return replace(
            x,
            posted_ms=x.posted_ms * k,
            start_ms=x.start_ms * k,
            end_ms=x.end_ms * k,
            delivered_ms=x.delivered_ms * k,
        )

    return replace(
        t,
        devices={d: tuple(iv(x) for x in xs) for d, xs in t.devices.items()},
        transfers=tuple(tr(x) for x in t.transfers),
        makespan_ms=t.makespan_ms * k,
    )
