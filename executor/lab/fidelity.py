"""Plans run in the lab, each measured step set against its prediction: what
``benchmarks/lab_fidelity.py`` and ``edgepipe demo`` measure (docs/lab.md, "What the lab
measured").

- :func:`lab_plans` plans one problem with every planner (the DP, the exact solver, data
  parallelism and the pipeline baselines, :func:`planner.api.compare`) and groups the
  planners by the plan they found (two planners with one plan are run once);
- :func:`measure` runs one plan in the lab (:func:`executor.lab.launch.run_lab`) for a
  few steps and reads its run folder back (:func:`planner.check.report.build_report`):
  the predicted step (``PlanCost.steady_ms``) against the median measured step after
  the first (the warm-up), per-stage compute, per-device peak memory (its cgroup's), and
  the machine's
  1-minute load average before and after the run;
- :func:`best_baseline` names the fastest predicted pipeline baseline;
- :func:`draw_measurements` draws predicted and measured steps side by side (PNG).

The library never prints: callers say what is measured.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from edgepipe.executor.core.options import WorkerOptions
from edgepipe.executor.lab.launch import LabOptions, run_lab
from edgepipe.planner import api
from edgepipe.planner.check.breakdown import StageRow
from edgepipe.planner.check.report import RunReport, build_report
from edgepipe.planner.inputs.problem import Problem
from edgepipe.planner.plan import Plan, save_plan
from edgepipe.planner.solvers.baselines import BASELINES

#: the data-parallel baseline's planner name
DATA_PARALLEL = "data-parallel"
#: a run is kept to about this many seconds of steps (:func:`steps_for`)
RUN_SECONDS = 3.0


@dataclass(frozen=True)
class PlanSet:
    """A problem's plans: ``plans[planner]``, and ``labels[plan id]`` the planners (in
    the order asked) that found that plan."""

    problem: Problem
    plans: dict[str, Plan]
    labels: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def label(self, planner: str) -> str:
        """``dp=milp`` for a plan two planners found."""
        return "=".join(self.labels[self.plans[planner].id])


def lab_plans(problem: Problem, planners: Sequence[str] | None = None,
              time_limit: float = 20.0) -> PlanSet:
    """Every planner's plan of ``problem`` (:func:`planner.api.compare`; the exact
    solver and the DP within ``time_limit`` s), infeasible ones left out. O(the
    planners' solve times)."""
    result = api.compare(problem, None if planners is None else list(planners),
                         time_limit=time_limit)
    labels: dict[str, tuple[str, ...]] = {}
    for name, plan in result.plans.items():
        labels[plan.id] = (*labels.get(plan.id, ()), name)
    return PlanSet(problem, dict(result.plans), labels)


def best_baseline(plans: PlanSet) -> str:
    """The pipeline baseline (not data parallelism) with the least predicted step."""
    names = [n for n in plans.plans if n in BASELINES and n != DATA_PARALLEL]
    if not names:
        raise ValueError("no pipeline baseline found a feasible plan")
    return min(names, key=lambda n: plans.plans[n].cost.steady_ms)


def steps_for(plan: Plan, seconds: float = RUN_SECONDS, least: int = 6, most: int = 15) -> int:
    """Steps for a run of about ``seconds`` of predicted steps, within [least, most]
    (the first step is the warm-up)."""
    return max(least, min(most, math.ceil(seconds * 1e3 / plan.cost.steady_ms) + 1))


@dataclass(frozen=True)
class StageCompute:
    """One stage's compute per micro-batch (forward + backward, ms): predicted (the
    slowest member's) and measured (the largest member mean)."""

    stage: int
    devices: tuple[str, ...]
    predicted_ms: float
    measured_ms: float | None

    @property
    def error(self) -> float | None:
        return None if self.measured_ms is None else self.measured_ms / self.predicted_ms - 1


@dataclass(frozen=True)
class DeviceMemory:
    """A device's memory under the plan (the cost model's) and the measured peak of its
    cgroup (bytes): the whole process's charge, torch and gloo included (about 146 MiB
    on a warm page cache, docs/lab.md, "Compute"): what the memory limit is held
    against, page cache included, rather than the run's ``peak_mem_bytes`` (the
    process's resident high-water mark)."""

    device: str
    predicted_bytes: float
    measured_bytes: int


@dataclass(frozen=True)
class LabMeasurement:
    """One plan's lab run (module docstring); loads are 1-minute load averages."""

    label: str
    plan: Plan
    run_dir: Path
    steps: int
    predicted_ms: float
    measured_ms: float
    load_before: float
    load_after: float
    stages: tuple[StageCompute, ...]
    memory: tuple[DeviceMemory, ...]

    @property
    def error(self) -> float:
        """Measured over predicted step, less 1."""
        return self.measured_ms / self.predicted_ms - 1

    @property
    def load(self) -> float:
        """The larger of the loads before and after."""
        return max(self.load_before, self.load_after)

    def loaded(self, cores: int | None = None) -> bool:
        """Measured while more runnable tasks than cores were waiting (1-minute load
        above the cores this process may use)."""
        return self.load > (cores or len(os.sched_getaffinity(0)))


def stage_compute(rows: Sequence[StageRow]) -> tuple[StageCompute, ...]:
    """Per stage: forward + backward per micro-batch, predicted against measured."""
    return tuple(
        StageCompute(
            r.stage, r.devices, r.forward_predicted + r.backward_predicted,
            None if r.forward_measured is None or r.backward_measured is None
            else r.forward_measured + r.backward_measured)
        for r in rows)


def device_memory(report: RunReport, peaks: Mapping[str, int]) -> tuple[DeviceMemory, ...]:
    """Per device: the plan's memory against its cgroup's measured peak."""
    return tuple(DeviceMemory(d.device, d.memory_predicted, peaks[d.device])
                 for d in report.devices)


def measure(plan: Plan, label: str, folder: Path, share: float, steps: int | None = None,
            timeout_s: float = 120.0, pace: bool = True) -> LabMeasurement:
    """Run ``plan`` in the lab (``share`` of this machine's cores for the cluster, each
    device paced to its quota unless ``pace`` is off: :class:`LabOptions`) for
    ``steps`` steps (default :func:`steps_for`), its files under ``folder/label``, and
    set the median step after the first against the prediction. Raises what
    :func:`executor.lab.launch.run_lab` raises."""
    where = folder / label
    where.mkdir(parents=True, exist_ok=True)
    path = where / "plan.json"
    save_plan(plan, path)
    n = steps_for(plan) if steps is None else steps
    before = os.getloadavg()[0]
    run = run_lab(WorkerOptions(str(path), n, str(where / "run"), timeout_s=timeout_s),
                  LabOptions(share=share, pace=pace))
    after = os.getloadavg()[0]
    report = build_report(where / "run")
    return LabMeasurement(label, plan, where / "run", n, plan.cost.steady_ms,
                          report.iteration_measured_ms, before, after,
                          stage_compute(report.stages),
                          device_memory(report, run.peak_memory_bytes))


def speedup(slow: LabMeasurement, fast: LabMeasurement) -> tuple[float, float]:
    """``fast``'s speed-up over ``slow``: (predicted, measured) ratios of step times."""
    return slow.predicted_ms / fast.predicted_ms, slow.measured_ms / fast.measured_ms


def draw_measurements(runs: Sequence[LabMeasurement], path: Path, title: str) -> None:
    """Bars of each run's predicted and measured step (ms), its error above the pair
    and the load it was measured at below its label; written to ``path`` (PNG)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(5.0, 1.3 * len(runs) + 2), 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    xs = range(len(runs))
    ax.bar([x - 0.2 for x in xs], [r.predicted_ms for r in runs], 0.4, label="predicted",
           color="#9ecae1")
    ax.bar([x + 0.2 for x in xs], [r.measured_ms for r in runs], 0.4, label="measured",
           color="#3182bd")
    for x, r in zip(xs, runs, strict=True):
        ax.annotate(f"{r.error:+.0%}", (x + 0.2, r.measured_ms), ha="center",
                    va="bottom", fontsize=8)
    ax.set_xticks(list(xs), [f"{r.label}\nload {r.load:.1f}" for r in runs], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("step, ms (log)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
