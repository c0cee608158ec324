"""Predicted vs measured: what ``edgepipe report RUN_DIR`` shows (no torch).

Inputs, all files of a run directory written by the executor (docs/executor.md):
``plan.json`` (the plan as run; its predictions are recomputed by
:mod:`planner.cost.model` on load), ``metrics.jsonl`` (one line per step),
``timeline.jsonl`` (one line per timed action of each rank and step),
``transfers.jsonl`` (one line per transfer piece, post to delivery; missing in a run
written before transfers were stamped) and, for an emulated run,
``emulation/rank<r>.jsonl`` (per rank and step: compute budget, real compute, overruns,
time scale).

Figures (steps after the first, which carries start-up costs, when there are several):

* per device (:class:`DeviceFigures`): predicted forward and backward ms per micro-batch
  (``StageCost.device_forward_ms / device_backward_ms``) against the mean measured ``F``
  and ``B`` action; predicted all-reduce, its stage's ring under the plan's own traffic
  (the per-stage row's, :meth:`CostModel.stage_transfer_ms`: the steady step's ring from
  its start to its end, what ``edgepipe plan`` prints as ``ar ms``; not
  ``StageCost.allreduce_ms``, alone on an idle network), against the mean
  ``REDUCE_GRAD`` (which holds a member's wait for the others to join); the measured
  receive wait per step; per step, the compute ``M x (forward + backward)`` against the
  mean ``compute_ms``; **bubbles**, the time of a step in which the device neither
  computes, all-reduces nor steps its optimizer: predicted ``PlanCost.steady_ms - M x
  (forward + backward)`` less that ring and ``StageCost.device_optimizer_ms``, measured
  the mean ``wall_ms - compute_ms - allreduce_ms - optim_ms`` (a member's wait for the
  others to join its ring is bubble predicted, all-reduce measured); **memory**, the cost model's
  ``StageCost.memory_bytes`` (Eq. 3 plus ring replicas) against the largest
  ``peak_mem_bytes`` less ``baseline_mem_bytes`` where the run recorded one (CPU: the
  process's resident set before its model was built), else the peak (CUDA: allocated
  memory);
* per stage and per link: :mod:`planner.check.breakdown` (the slowest device, the ring
  all-reduce and the boundary's link on the shared clock; each device pair's transfers,
  post to delivery, against the cost model's piece);
* per run: predicted iteration (``PlanCost.iteration_ms``, one isolated step) and
  steady-state step (``PlanCost.steady_ms``, a step of a long run, where consecutive
  steps may overlap: docs/cost-model.md) against the median measured step wall time of
  the steps after the first, which are steady steps; samples/s of the steady step.

Predictions are multiplied by the emulation's time scale when the run was emulated (then
they are the emulated devices' budgets); a run that was not emulated ran at this
machine's speed (a lab run: confined like each device), so its ratios compare this
machine with the plan's devices. **Mode**: ``status.json``'s ``mode`` (emulated, lab or
real; :data:`planner.check.live.MODES`), else ``emulated`` where the folder has
emulation reports and ``real`` where it has none (an older run); the text and both chart
titles say it.

**Charts.** The predicted Gantt chart is the independent simulator's iteration
(:func:`planner.check.simulator.simulate`; its makespan is within the cost model's error of
``PlanCost.iteration_ms``, docs/cost-model.md). The measured one shows one step (the one
with the median wall time) as a :class:`planner.check.simulator.Timeline`: each device's
``F``, ``B`` and ``REDUCE_GRAD`` (as all-reduce) intervals. Where every device's step
line has ``started_at``, the devices are placed on the shared wall clock from the
step's earliest start, and each device pair's measured transfers (post to delivery)
get a channel row ``src -> dst``; else each rank's times are taken from its own step
start and there are no channel rows.

**Recovery events** (issue 8 item 5; docs/fault-tolerance.md, "Recovery"): the lines of
``metrics.jsonl`` with ``"type": "recovery"`` (the executor writes one per recovery:
generation, ``detected_at``, cause, device, old and new plan ids, the step replayed
from, blocks and bytes moved, and the seconds to detect, re-plan, rebuild, restore and
reach the first committed step) become :class:`RecoveryEvent` rows, in file order. A
run that recovered ran several plans: the predicted-vs-measured figures are those of
``plan.json``'s steps, the steps before the first recovery's replay; a step that was
replayed is counted once (its last line, the committed one). The chart then gets a
third panel, the whole run: every step's measured actions laid end to end on the
cumulative step wall time, with a marker where each recovery's replay begins
(:func:`run_timeline`).

**Dropped joins** (docs/fault-tolerance.md, "Joining"): each ``"type": "join_failed"``
line (a join the run went on without) gives its one-line ``reason``
(:attr:`RunReport.join_failures`, in file order), which ``edgepipe report`` prints as a
warning; the steps are not affected.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgepipe.planner.check.breakdown import (
    TRANSFER_KIND,
    LinkRow,
    StageRow,
    link_rows,
    stage_rows,
)
from edgepipe.planner.check.live import RunState, complete_lines, run_state
from edgepipe.planner.check.simulator import Interval, Timeline, Transfer, WorkKind, simulate
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.errors import InputError
from edgepipe.planner.plan import Plan, load_plan

if TYPE_CHECKING:  # gantt loads matplotlib: imported where a chart is drawn
    from edgepipe.planner.check.gantt import Marker

#: the state of a run whose folder has no status.json, or whose launcher finished
FINISHED = RunState("finished")

#: the keys of a recovery line of metrics.jsonl, all required (docs/fault-tolerance.md)
RECOVERY_KEYS = (
    "generation", "detected_at", "cause", "device", "old_plan", "new_plan",
    "replay_from_step", "blocks_moved", "bytes_moved", "t_detect_s", "t_replan_s",
    "t_rebuild_s", "t_restore_s", "t_first_commit_s",
)

#: what a chart calls a run of each mode (:data:`planner.check.live.MODES`)
MODE_TITLE = {"emulated": "emulated run", "lab": "lab run (real compute, confined)",
              "real": "real run (this machine's speed)"}

#: the timeline.jsonl event kinds drawn as intervals, and the interval kind of each
_WORK_KIND: dict[str, WorkKind] = {"F": "F", "B": "B", "REDUCE_GRAD": "AR"}


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
    #: per step: F + B of every micro-batch (M x (forward + backward) predicted)
    compute_predicted: float = 0.0
    compute_measured: float | None = None
    #: per step: neither computing nor all-reducing (module docstring, "Bubbles")
    bubble_predicted: float = 0.0
    bubble_measured: float | None = None
    #: bytes: the cost model's memory of the device (Eq. 3 plus ring replicas held)
    memory_predicted: float = 0.0
    #: bytes: the largest ``peak_mem_bytes`` over the steps compared
    memory_peak: int | None = None
    #: bytes: ``baseline_mem_bytes`` (CPU: the process before its model was built)
    memory_baseline: int | None = None

    @property
    def memory_measured(self) -> int | None:
        """The measured memory set against the prediction: the peak above the baseline
        where the run recorded one (CPU), else the peak (CUDA: allocated memory)."""
        if self.memory_peak is None or self.memory_baseline is None:
            return self.memory_peak
        return self.memory_peak - self.memory_baseline


@dataclass(frozen=True)
class RecoveryEvent:
    """One recovery of a run, as its ``metrics.jsonl`` line says (module docstring).
    ``blocks_moved`` is a count, or the moved block ranges ``[first, end)``; ``device``
    may name several (comma-separated); a phase the new generation never reached (it
    failed first) is None."""

    generation: int
    detected_at: float
    cause: str
    device: str
    old_plan: str
    new_plan: str
    replay_from_step: int
    blocks_moved: int | tuple[tuple[int, int], ...]
    bytes_moved: float
    t_detect_s: float
    t_replan_s: float
    t_rebuild_s: float | None
    t_restore_s: float | None
    t_first_commit_s: float | None
    #: the new plan leaves a stage unreplicated (optional key of the line)
    warning: str | None = None

    @property
    def num_blocks(self) -> int:
        """How many blocks moved."""
        if isinstance(self.blocks_moved, int):
            return self.blocks_moved
        return sum(end - first for first, end in self.blocks_moved)

    @classmethod
    def from_line(cls, line: dict[str, Any], where: str) -> RecoveryEvent:
        """Check and read one recovery line (``where`` names it in errors)."""
        missing = [k for k in RECOVERY_KEYS if k not in line]
        if missing:
            raise InputError(where, "", f"recovery line lacks {', '.join(missing)}")
        blocks = line["blocks_moved"]
        if not isinstance(blocks, int):
            blocks = tuple((int(a), int(b)) for a, b in blocks)
        values = {k: line[k] for k in RECOVERY_KEYS}
        return cls(**{**values, "blocks_moved": blocks}, warning=line.get("warning"))


@dataclass(frozen=True)
class RunReport:
    """Everything ``edgepipe report`` prints and draws."""

    plan: Plan
    time_scale: float
    emulated: bool
    steps: int
    steps_used: tuple[int, ...]
    iteration_predicted_ms: float
    #: the steady-state step (``PlanCost.steady_ms`` x the time scale): what the
    #: measured steps after the first are compared with
    steady_predicted_ms: float
    iteration_measured_ms: float
    samples_per_s_predicted: float
    samples_per_s_measured: float
    devices: tuple[DeviceFigures, ...]
    overrun_warning: str | None
    measured_step: int
    recoveries: tuple[RecoveryEvent, ...] = ()
    #: every committed step's metrics line, in step order (a replayed step once)
    step_lines: tuple[dict[str, Any], ...] = ()
    #: the ``reason`` of every ``join_failed`` line, in file order
    join_failures: tuple[str, ...] = ()
    #: whether the run finished, is still going or died (``status.json``)
    state: RunState = FINISHED
    #: how the devices ran: emulated | lab | real (:data:`planner.check.live.MODES`)
    mode: str = "real"
    stages: tuple[StageRow, ...] = ()
    links: tuple[LinkRow, ...] = ()

    @property
    def unfinished(self) -> str | None:
        """One line on a run still going or one that died (None: it finished)."""
        return self.state.describe(len(self.step_lines))


def _jsonl(path: Path) -> list[dict[str, Any]]:
    """The complete lines of ``path`` (:func:`planner.check.live.complete_lines`: a run
    still going, or one that died, may have half a last line)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(str(path), "", f"cannot read it ({exc.strerror}); is this a run "
                         "directory written by `edgepipe run --out DIR`?") from None
    return complete_lines(text, str(path))


def _transfers(run_dir: Path) -> list[dict[str, Any]]:
    """The lines of ``transfers.jsonl``; none for a run written before transfers were
    stamped (the file is missing)."""
    path = run_dir / "transfers.jsonl"
    return _jsonl(path) if path.exists() else []


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
    state = run_state(folder)
    steps, recoveries, join_failures = split_metrics(_jsonl(folder / "metrics.jsonl"),
                                                     str(folder / "metrics.jsonl"))
    first_plan_end = recoveries[0].replay_from_step if recoveries else None
    metrics = [m for m in steps if first_plan_end is None or m["step"] < first_plan_end]
    if not metrics:
        why = state.describe(0)
        raise InputError(str(folder / "metrics.jsonl"), "", "no steps recorded"
                         + (f": {why}" if why else ""))
    timeline = _jsonl(folder / "timeline.jsonl") + _transfers(folder)
    emulation = _emulation_lines(folder)
    scale = float(emulation[0]["time_scale"]) if emulation else 1.0
    used = tuple(m["step"] for m in metrics[1:]) if len(metrics) > 1 else (metrics[0]["step"],)
    chosen = set(used)
    walls = {m["step"]: m["wall_ms"] for m in metrics if m["step"] in chosen}
    median_wall = statistics.median(walls.values())
    measured_step = min(walls, key=lambda s: (abs(walls[s] - median_wall), s))

    events = [e for e in timeline if e["step"] in chosen]
    per_step = [m for m in metrics if m["step"] in chosen]
    started = {(d, m["step"]): float(fig["started_at"])
               for m in per_step for d, fig in m["devices"].items() if "started_at" in fig}
    batch = plan.partition.micro_batch_size * plan.partition.num_micro_batches
    predicted = scale * plan.cost.iteration_ms
    steady = scale * plan.cost.steady_ms
    cm = CostModel(plan.problem, plan.partition.micro_batch_size)  # one per report
    stages = stage_rows(plan, cm, events, started, scale)
    return RunReport(
        plan=plan,
        time_scale=scale,
        emulated=bool(emulation),
        steps=len(metrics),
        steps_used=used,
        iteration_predicted_ms=predicted,
        steady_predicted_ms=steady,
        iteration_measured_ms=median_wall,
        samples_per_s_predicted=batch / steady * 1e3 if steady > 0 else float("inf"),
        samples_per_s_measured=batch / median_wall * 1e3 if median_wall > 0 else float("inf"),
        devices=device_rows(plan, events, per_step, scale, stages),
        overrun_warning=emulation_overruns(folder) if emulation else None,
        measured_step=measured_step,
        recoveries=tuple(recoveries),
        step_lines=tuple(steps),
        join_failures=join_failures,
        state=state,
        mode=state.mode or ("emulated" if emulation else "real"),
        stages=stages,
        links=link_rows(plan, cm, events, scale),
    )


def device_rows(plan: Plan, events: list[dict[str, Any]], metrics: list[dict[str, Any]],
                scale: float, stages: Sequence[StageRow]) -> tuple[DeviceFigures, ...]:
    """One :class:`DeviceFigures` per device of ``plan`` from the timeline lines
    ``events`` and the metrics lines ``metrics`` of the steps compared (module
    docstring); predictions x ``scale``, each device's all-reduce its stage's
    ``StageRow.allreduce_predicted`` (:func:`stage_rows`, already scaled: the plan's one
    steady-state simulation). O(lines)."""
    durations: dict[tuple[str, str], list[float]] = defaultdict(list)
    for e in events:
        durations[(e["device"], e["kind"])].append(e["end_ms"] - e["start_ms"])
    figs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for m in metrics:
        for d, fig in m["devices"].items():
            figs[d].append(fig)
    m_count = plan.partition.num_micro_batches
    rows = []
    for p, (stage, cost, row) in enumerate(zip(plan.partition.stages, plan.cost.stages, stages,
                                                strict=True)):
        for j, device in enumerate(stage.devices):
            mine = figs[device]
            compute = m_count * (cost.device_forward_ms[j] + cost.device_backward_ms[j])
            peaks = [int(f["peak_mem_bytes"]) for f in mine]
            base = [int(f["baseline_mem_bytes"]) for f in mine if "baseline_mem_bytes" in f]
            rows.append(
                DeviceFigures(
                    stage=p,
                    device=device,
                    samples=stage.samples[j],
                    forward_predicted=scale * cost.device_forward_ms[j],
                    forward_measured=_mean(durations[(device, "F")]),
                    backward_predicted=scale * cost.device_backward_ms[j],
                    backward_measured=_mean(durations[(device, "B")]),
                    allreduce_predicted=row.allreduce_predicted,
                    allreduce_measured=_mean(durations[(device, "REDUCE_GRAD")]),
                    recv_wait_measured=_mean([f["recv_wait_ms"] for f in mine]),
                    compute_predicted=scale * compute,
                    compute_measured=_mean([f["compute_ms"] for f in mine]),
                    bubble_predicted=scale * (plan.cost.steady_ms - compute
                                              - cost.device_optimizer_ms[j])
                    - row.allreduce_predicted,
                    bubble_measured=_mean([f["wall_ms"] - f["compute_ms"] - f["allreduce_ms"]
                                           - f["optim_ms"] for f in mine]),
                    memory_predicted=cost.memory_bytes[j],
                    memory_peak=max(peaks, default=None),
                    memory_baseline=min(base, default=None),
                )
            )
    return tuple(rows)


def split_metrics(
    lines: list[dict[str, Any]], where: str
) -> tuple[list[dict[str, Any]], list[RecoveryEvent], tuple[str, ...]]:
    """The step lines (a step written twice, by an aborted try and its replay, once:
    the last) in step order, the recovery events and the dropped joins' reasons, both
    in file order. Raises :class:`InputError` for a join_failed line without a reason.
    O(lines)."""
    steps: dict[int, dict[str, Any]] = {}
    recoveries = []
    join_failures = []
    for n, line in enumerate(lines, 1):
        kind = line.get("type", "step")
        if kind == "recovery":
            recoveries.append(RecoveryEvent.from_line(line, f"{where} line {n}"))
        elif kind == "join_failed":
            if not isinstance(line.get("reason"), str):
                raise InputError(f"{where} line {n}", "", "a join_failed line lacks its "
                                 "reason; the file was not written by edgepipe run")
            join_failures.append(line["reason"])
        elif kind == "step":
            steps[line["step"]] = line
    return [steps[k] for k in sorted(steps)], recoveries, tuple(join_failures)


def predicted_timeline(plan: Plan) -> Timeline:
    """The simulated iteration of the plan under its configured schedule."""
    return simulate(plan.problem, plan.partition)


def measured_timeline(run_dir: str | Path, plan: Plan, step: int,
                      started: Mapping[str, float] | None = None) -> Timeline:
    """Step ``step`` of the run as a :class:`Timeline` of the plan's devices (module
    docstring, "Charts"): with every device's ``started`` (wall-clock s at its step
    start), the devices on the shared clock from the earliest start and a channel row
    per device pair with its measured transfers (post to delivery); else each rank from
    its own step start, no channel rows."""
    stages = tuple(s.devices for s in plan.partition.stages)
    aligned = started is not None and all(d in started for s in stages for d in s)
    t0 = min(started.values()) if started and aligned else 0.0

    def shift(device: str) -> float:
        return (started[device] - t0) * 1e3 if started and aligned else 0.0

    per_device: dict[str, list[Interval]] = defaultdict(list)
    transfers = []
    for e in _jsonl(Path(run_dir) / "timeline.jsonl") + _transfers(Path(run_dir)):
        if e["step"] != step:
            continue
        o = shift(e["device"])
        start, end = o + float(e["start_ms"]), o + float(e["end_ms"])
        if e["kind"] in _WORK_KIND:
            mb = -1 if e["kind"] == "REDUCE_GRAD" else int(e["micro_batch"])
            per_device[e["device"]].append(Interval(_WORK_KIND[e["kind"]], mb, start, end))
        elif e["kind"] in TRANSFER_KIND.values() and aligned:
            kind: WorkKind = "F" if e["kind"] == TRANSFER_KIND["activations"] else "B"
            transfers.append(Transfer(kind, int(e["micro_batch"]), e["device"], e["peer"], 0.0,
                                      (f"{e['device']} -> {e['peer']}",), start, start, end,
                                      end))
    devices = {
        d: tuple(sorted(per_device[d], key=lambda iv: iv.start_ms)) for s in stages for d in s
    }
    span = max((iv.end_ms for ivs in devices.values() for iv in ivs), default=0.0)
    return Timeline(
        topology=plan.problem.cluster.network.kind,
        stages=stages,
        devices=devices,
        transfers=tuple(transfers),
        makespan_ms=max([span, *(x.delivered_ms for x in transfers)]),
        num_micro_batches=plan.partition.num_micro_batches,
    )


def _last_tries(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Of each (device, step)'s timeline lines, those of its last try: an aborted try
    and its replay share the step, and a try's actions start in time order, so a line
    starting before its predecessor begins a new try. O(lines)."""
    tries: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        key = (e["device"], e["step"])
        if tries[key] and e["start_ms"] < tries[key][-1]["start_ms"]:
            tries[key] = []
        tries[key].append(e)
    return [e for lines in tries.values() for e in lines]


def run_timeline(report: RunReport, run_dir: str | Path) -> tuple[Timeline, list[Marker]]:
    """The whole run as one :class:`Timeline`: step ``s``'s measured F, B and
    REDUCE_GRAD of every device shifted by the summed wall times of the committed steps
    before it (of a replayed step only the committed try: the devices of its metrics
    line, each one's last try), and a :class:`planner.check.gantt.Marker` where each
    recovery's replay begins (at the run's end when nothing was replayed). Rows:
    ``plan.json``'s stages, then the devices that only later plans used, as one more
    group. O(timeline lines)."""
    from edgepipe.planner.check.gantt import Marker

    offsets: dict[int, float] = {}
    t = 0.0
    for line in report.step_lines:
        offsets[line["step"]] = t
        t += float(line["wall_ms"])
    stages = [tuple(s.devices) for s in report.plan.partition.stages]
    known = {d for s in stages for d in s}
    per_device: dict[str, list[Interval]] = defaultdict(list)
    later: list[str] = []
    # a device missing from a step's committed line ran only an aborted try of it
    ran = {line["step"]: set(line["devices"]) for line in report.step_lines}
    events = [e for e in _jsonl(Path(run_dir) / "timeline.jsonl")
              if e["step"] in offsets and e["device"] in ran[e["step"]]
              and e["kind"] in _WORK_KIND]
    for e in _last_tries(events):
        if e["device"] not in known and e["device"] not in later:
            later.append(e["device"])
        o = offsets[e["step"]]
        mb = -1 if e["kind"] == "REDUCE_GRAD" else int(e["micro_batch"])
        per_device[e["device"]].append(
            Interval(_WORK_KIND[e["kind"]], mb, o + float(e["start_ms"]), o + float(e["end_ms"]))
        )
    if later:
        stages.append(tuple(later))
    devices = {d: tuple(sorted(per_device[d], key=lambda iv: iv.start_ms))
               for s in stages for d in s}
    markers = [
        Marker(offsets.get(r.replay_from_step, t),
               f"gen {r.generation}: {r.cause} of {r.device}, replay from step "
               f"{r.replay_from_step}")
        for r in report.recoveries
    ]
    timeline = Timeline(
        topology=report.plan.problem.cluster.network.kind,
        stages=tuple(stages),
        devices=devices,
        transfers=(),
        makespan_ms=t,
        num_micro_batches=report.plan.partition.num_micro_batches,
    )
    return timeline, markers


def report_panels(report: RunReport, run_dir: str | Path
                  ) -> tuple[list[tuple[Timeline, str]], dict[int, list[Marker]]]:
    """The chart's panels, each a timeline and its title, and their markers: the
    predicted iteration (scaled like the report) and the measured step, both titled
    with the run's mode; a run that recovered gets the whole run as a third panel with
    a marker per recovery."""
    predicted = predicted_timeline(report.plan)
    if report.time_scale != 1.0:
        predicted = _scaled(predicted, report.time_scale)
    line = next(m for m in report.step_lines if m["step"] == report.measured_step)
    started = {d: float(f["started_at"]) for d, f in line["devices"].items()
               if "started_at" in f}
    measured = measured_timeline(run_dir, report.plan, report.measured_step, started)
    scale = f" x time scale {report.time_scale:g}" if report.time_scale != 1.0 else ""
    clock = ("every device on the shared clock; channel rows: measured transfers, post to "
             "delivery" if measured.transfers else "each rank from its step start")
    panels = [
        (
            predicted,
            f"{report.plan.id}, {MODE_TITLE[report.mode]}: predicted iteration (independent "
            f"simulator{scale}; cost model {report.iteration_predicted_ms:.1f} ms)",
        ),
        (measured, f"measured step {report.measured_step}, {MODE_TITLE[report.mode]}: {clock}"),
    ]
    markers: dict[int, list[Marker]] = {}
    if report.recoveries:
        run, markers[2] = run_timeline(report, run_dir)
        panels.append((run, f"the whole run: {len(report.step_lines)} committed steps end "
                             f"to end, {len(report.recoveries)} recovery(ies) marked"))
    return panels, markers


def draw_report(report: RunReport, run_dir: str | Path, path: str | Path) -> None:
    """:func:`report_panels` in one figure, the predicted iteration above the measured
    step on a common time axis (:func:`planner.check.gantt.draw_gantts`), the whole run
    of a run that recovered below, on its own axis."""
    from edgepipe.planner.check.gantt import draw_gantts

    panels, markers = report_panels(report, run_dir)
    draw_gantts(panels, path, markers, own_axis=(2,))


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
