"""``edgepipe demo`` in emulation, where this machine cannot host the lab (or with
``--emulate``): the lab demo's problem and its four plans (:func:`planner.cli.lab_demo.
four_plans`), each run here on emulated devices and links (``run --emulate``) and marked
"emulated" in every line, table and chart.

The profile needs no lab: the lab model's blocks are timed here as ``edgepipe profile``
times them (one torch thread, the thread's CPU time, rounds until they agree), and each
device type's times are those divided by the CPU quota the type's devices get in the
lab (:func:`executor.lab.cgroups.type_quotas`): what the lab profile measures where its
quotas hold. Each plan runs twice: 2 steps at the time scale its host times suggest
(:func:`executor.core.emulation.time_scale_for`), then ``steps`` steps at the scale
that calibration measured (:func:`executor.core.emulation.calibrated_time_scale`); its
measured step is the run's median step after the first, divided by that scale. Where the
machine got busier between the two, so that a device's real compute overran its whole
step's budget, the run is kept (``overran-x<scale>``) and made again at the scale that
run measured (:func:`executor.core.emulation.rerun_time_scale`), at most :data:`RERUNS`
times; a last run that still overran is reported so.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from edgepipe.planner.cli.console import err, warn
from edgepipe.planner.cli.lab_demo import (
    EMULATED_SHARE,
    LAB_BATCH_SIZES,
    LAB_MODEL,
    LAB_PROFILE_ROUNDS,
    LAB_SIZES,
    DemoRuns,
)
from edgepipe.planner.cli.torch_imports import executor_imports
from edgepipe.planner.inputs.cluster import Cluster
from edgepipe.planner.inputs.profile import ModelProfile, Timing
from edgepipe.planner.plan import Plan, save_plan

if TYPE_CHECKING:
    from edgepipe.executor.lab.fidelity import LabMeasurement

#: the timing key of this machine's own times in the emulated demo's profile
HOST = "host-cpu"
#: steps of each plan's calibration run
CALIBRATION_STEPS = 2
#: runs again, at the scale the overrunning run measured, of a plan whose run overran
RERUNS = 2


def emulated_runs(outdir: Path, steps: int) -> DemoRuns:
    """The demo's four plans run emulated here, ``steps`` steps each (module
    docstring), their folders under ``outdir/emulated``."""

    def measure(plan: Plan, label: str) -> LabMeasurement:
        return _measure(plan, label, outdir / "emulated", steps)

    return DemoRuns("emulated", _profile, measure, "emulated.png",
                    "each plan's time scale is calibrated under the load of its calibration "
                    "run, but a load that changes between the two runs still shows")


def _per_core(t: Timing, cores: float) -> Timing:
    """``t`` (one core's times) on a device that gets ``cores`` of a core."""

    def scale(m: tuple[tuple[float, ...], ...]) -> tuple[tuple[float, ...], ...]:
        return tuple(tuple(round(x / cores, 4) for x in row) for row in m)

    return replace(t, forward_ms=scale(t.forward_ms), backward_ms=scale(t.backward_ms),
                   forward_spread_ms=None, backward_spread_ms=None, source="measured")


def _profile(cluster: Cluster, outdir: Path) -> ModelProfile:
    """The lab model timed here and scaled to each device type's lab quota (module
    docstring); written to ``emulated-profile.json``."""
    with executor_imports():
        from edgepipe.executor.lab.cgroups import type_quotas
        from edgepipe.executor.profiling.noise import NoisePolicy, measure_until_stable, warnings
        from edgepipe.executor.profiling.profiler import profile_model
        from edgepipe.executor.profiling.sources import ModelSource, build_source
    built = build_source(ModelSource(LAB_MODEL, LAB_SIZES))
    policy = NoisePolicy(max_rounds=LAB_PROFILE_ROUNDS)
    err.print(f"profiling {LAB_MODEL} here (one thread, CPU time; no lab: each device type's "
              "times are these over its lab quota)", highlight=False)
    host = measure_until_stable(
        lambda: profile_model(built.model, built.example, list(LAB_BATCH_SIZES), HOST,
                              name=built.name, warmup=2, repeats=5, num_threads=1,
                              build=built.build, clock="thread"),
        HOST, policy)
    for line in warnings(host, HOST, policy, wall_clock=False):
        warn(line)
    timing = host.timings[HOST]
    quotas = type_quotas(cluster, EMULATED_SHARE)
    err.print("  " + ", ".join(f"{n}: {q:.3g} core" for n, q in sorted(quotas.items()))
              + (f"; spread {timing.noise.spread:.1%}, load {timing.noise.load_average:.1f}"
                 if timing.noise is not None else ""), highlight=False)
    profile = replace(host, timings={HOST: timing, **{
        name: _per_core(timing, q) for name, q in quotas.items()}})
    path = outdir / "emulated-profile.json"
    path.write_text(json.dumps(profile.to_dict(), indent=1) + "\n")
    return profile


def _measure(plan: Plan, label: str, folder: Path, steps: int) -> LabMeasurement:
    """Run ``plan`` emulated here (module docstring) under ``folder/label``: its
    calibration, then ``steps`` steps; its measured step against the predicted one."""
    from edgepipe.planner.check.report import build_report

    with executor_imports():
        from edgepipe.executor import launch
        from edgepipe.executor.core import emulation
        from edgepipe.executor.core.options import WorkerOptions
        from edgepipe.executor.lab.fidelity import LabMeasurement
    where = folder / label
    where.mkdir(parents=True, exist_ok=True)
    path = where / "plan.json"
    save_plan(plan, path)
    first = emulation.time_scale_for(plan, plan.problem.model, HOST)  # its host timing
    used = len(plan.partition.used_devices())
    err.print(f"running {label} emulated: {plan.partition.num_stages} stage(s) on {used} "
              f"local process(es); calibrating {CALIBRATION_STEPS} steps at time scale "
              f"{first:.1f}", highlight=False)
    # the plans replicate nothing (replication interval 0): no recovery to set up
    launch.launch(WorkerOptions(str(path), CALIBRATION_STEPS, str(where / "calibration"),
                                emulate=True, time_scale=first, timeout_s=120), recover=False)
    k = emulation.calibrated_time_scale(plan, emulation.read_reports(where / "calibration"))
    for attempt in range(RERUNS + 1):
        err.print(f"  then {steps} steps, every emulated time x {k:.1f}", highlight=False)
        before = os.getloadavg()[0]
        launch.launch(WorkerOptions(str(path), steps, str(where / "run"), emulate=True,
                                    time_scale=k, timeout_s=120), recover=False)
        after = os.getloadavg()[0]
        again = emulation.rerun_time_scale(plan, emulation.read_reports(where / "run"), k)
        if again is None or attempt == RERUNS:
            break
        kept = where / f"overran-x{k:.1f}"  # kept beside the next run
        shutil.rmtree(kept, ignore_errors=True)  # an earlier demo's, in the same --out
        (where / "run").rename(kept)
        err.print("  a device's real compute overran its whole step's budget (the machine "
                  "got busier): again", highlight=False)
        k = again
    if again is not None:
        warn(f"{label}: a device's real compute still overran its whole step's budget after "
             f"{RERUNS} runs again: its measured step is this machine's, not the plan's")
    report = build_report(where / "run")
    if report.overrun_warning:
        warn(report.overrun_warning)
    return LabMeasurement(label, plan, where / "run", steps, plan.cost.steady_ms,
                          report.iteration_measured_ms / k, before, after, (), ())
