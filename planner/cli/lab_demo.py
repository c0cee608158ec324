"""``edgepipe demo`` in the lab (docs/usage.md, "The demo"): profile the demo's lab model
in each device type's lab confinement, plan it with every planner, and run the DP plan,
the exact solver's, data parallelism and the best pipeline baseline in the lab, setting
predicted against measured steps and the measured speed-ups against the seed's claims.

The problem is embedded (:data:`LAB_CLUSTER`, :data:`LAB_MODEL`): VGG-16 at 96 x 96,
width 1/8, global batch 32, on an Orin Nano, a Xavier NX and two TX2s on a 200 Mbit/s
switch. Its best plans are hybrid: the convolutions (few parameters, most of the
compute) on a data-parallel group, the fully connected layers (most of the parameters)
pipelined after them.

:func:`four_plans` is the demo's flow wherever its plans run: the lab's profile and
runs here (:func:`lab_demo`), emulated ones in :mod:`planner.cli.emulated_demo`; both
print one table, the speed-ups and one chart (:class:`DemoRuns` says where, in every
line). The executor, and with it torch, is imported inside the functions only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edgepipe.planner.cli.console import compact_table, err, out, print_table, warn
from edgepipe.planner.cli.plan_views import gantt_title, print_plan
from edgepipe.planner.cli.torch_imports import executor_imports
from edgepipe.planner.errors import EdgepipeError
from edgepipe.planner.inputs.cluster import Cluster
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import make_problem
from edgepipe.planner.inputs.profile import ModelProfile
from edgepipe.planner.plan import Plan

if TYPE_CHECKING:
    from edgepipe.executor.lab.fidelity import LabMeasurement, PlanSet

#: the demo's lab cluster (written to ``--out`` as ``lab-cluster.json``)
LAB_CLUSTER = {
    "schema_version": 1,
    "kind": "edgepipe.cluster",
    "name": "lab-demo-4",
    "description": "edgepipe demo's lab cluster: an Orin Nano, a Xavier NX and two TX2s on "
    "one 200 Mbit/s switch, latency 0 (the lab runs latency 0).",
    "devices": [{"id": "orin-0", "type": "jetson-orin-nano"},
                {"id": "nx-0", "type": "jetson-xavier-nx"},
                {"id": "tx2-0", "type": "jetson-tx2"},
                {"id": "tx2-1", "type": "jetson-tx2"}],
    "network": {"bandwidth_mbps": 200, "latency_ms": 0, "topology": "switched"},
}
#: the demo's lab model: a zoo name and its sizes, the batch sizes profiled
LAB_MODEL, LAB_SIZES, LAB_BATCH_SIZES = "vgg16", ("resolution=96", "width=0.125"), (2, 4, 8, 16)
LAB_GLOBAL_BATCH = 32
#: the share of this machine's cores the emulated demo's device quotas are scaled to (the
#: lab demo uses the lab's own default, ``executor.lab.launch.DEFAULT_SHARE``: at 0.9 four
#: lab devices and their runtimes' threads oversubscribed two cores; emulated devices
#: only sleep, so there a larger share just shortens the run)
EMULATED_SHARE = 0.9
#: profile rounds at most (each type's, until the last 3 agree within 5%)
LAB_PROFILE_ROUNDS = 4
#: the seed's headline claims: the DP plan's speed-up over conventional (data)
#: parallelism and over the best hybrid baseline
CLAIMS = {"data parallelism": 12.2, "the best baseline": 2.1}


def lab_unavailable() -> str | None:
    """Why this machine cannot host the lab (one line), or None."""
    # the lab's store, in its control namespace, cannot resolve its peers' names and
    # torch warns for each unless told otherwise when it loads (as `run --lab` does)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    try:
        with executor_imports():
            from edgepipe.executor.lab import cgroups, network
        network.check_available()
        cgroups.check_available()
    except EdgepipeError as exc:
        return str(exc)
    return None


def hybrid_note(plan: Plan) -> str:
    """Whether ``plan`` is hybrid: >= 2 stages on >= 3 devices, a data-parallel group
    with an uneven split."""
    parts = plan.partition
    uneven = [i for i, s in enumerate(parts.stages) if len(set(s.samples)) > 1]
    devices = len(parts.used_devices())
    if parts.num_stages >= 2 and devices >= 3 and uneven:
        s = parts.stages[uneven[0]]
        split = ", ".join(f"{d} {n}" for d, n in zip(s.devices, s.samples, strict=True))
        return (f"the DP plan is hybrid: {parts.num_stages} stages on {devices} devices, "
                f"stage {uneven[0]} a data-parallel group split unevenly ({split} samples "
                "of each micro-batch)")
    return (f"the DP plan is not hybrid this time ({parts.num_stages} stages on {devices} "
            "devices, no uneven data-parallel group): the profile measured now decides")


@dataclass(frozen=True)
class DemoRuns:
    """Where the demo's four plans run: ``where`` ("in the lab", "emulated") says so in
    every line, table and chart; ``profile(cluster, outdir)`` gives the model's profile
    on ``cluster``; ``measure(plan, label)`` runs one plan and sets its measured step
    against the predicted one; the chart is written to ``outdir / chart``; ``loaded``
    says what a loaded machine does to the measurements."""

    where: str
    profile: Callable[[Cluster, Path], ModelProfile]
    measure: Callable[[Plan, str], LabMeasurement]
    chart: str
    loaded: str


def lab_demo(outdir: Path, time_limit: float, backend: str) -> None:
    """The demo in the lab (module docstring), writing into ``outdir``."""
    with executor_imports():
        from edgepipe.executor.lab import fidelity
        from edgepipe.executor.lab.launch import DEFAULT_SHARE

    def measure(plan: Plan, label: str) -> LabMeasurement:
        steps = fidelity.steps_for(plan)
        err.print(f"running {label} in the lab: {steps} steps, {plan.partition.num_stages} "
                  f"stage(s) on {len(plan.partition.used_devices())} device(s)",
                  highlight=False)
        return fidelity.measure(plan, label, outdir / "lab", DEFAULT_SHARE, steps)

    four_plans(outdir, time_limit, backend, DemoRuns(
        "in the lab", _lab_profile, measure, "lab.png",
        "the quotas hold each device to its share, but other processes still delay it "
        "within a period"))


def four_plans(outdir: Path, time_limit: float, backend: str, runs_as: DemoRuns,
               run: bool = True) -> None:
    """The demo's problem (:data:`LAB_MODEL` on :data:`LAB_CLUSTER`, profiled by
    ``runs_as.profile``) planned with every planner, and (``run``) the DP plan, the
    exact solver's, data parallelism and the best pipeline baseline run by
    ``runs_as.measure``, each plan once: predicted against measured steps, the DP plan's
    speed-ups beside the seed's claims, and a chart. Writes into ``outdir``."""
    from edgepipe.planner.check.gantt import draw_gantt
    from edgepipe.planner.check.simulator import simulate

    with executor_imports():
        from edgepipe.executor.lab import fidelity
    where = runs_as.where
    cluster_path = outdir / "lab-cluster.json"
    cluster_path.write_text(json.dumps(LAB_CLUSTER, indent=1) + "\n")
    cluster = Cluster.load(cluster_path)
    out.rule(f"edgepipe demo, {where}: {LAB_MODEL} ({', '.join(LAB_SIZES)}) on "
             f"{cluster.name}")
    profile = runs_as.profile(cluster, outdir)
    problem = make_problem(profile, cluster,
                           TrainingConfig(LAB_GLOBAL_BATCH, replication_interval=0))
    err.print(f"planning with every planner (the exact solver {backend}, <= {time_limit:g} s)",
              highlight=False)
    plans = fidelity.lab_plans(problem, time_limit=time_limit)
    dp = plans.plans["dp"]
    print_plan(dp)
    draw_gantt(simulate(dp.problem, dp.partition), outdir / "gantt.png", title=gantt_title(dp))
    out.print(hybrid_note(dp), highlight=False)
    if not run:
        return
    best = fidelity.best_baseline(plans)
    runs: dict[str, LabMeasurement] = {}
    for planner in ("dp", "milp", fidelity.DATA_PARALLEL, best):
        if planner not in plans.plans:
            warn(f"{planner} found no plan")
            continue
        label = plans.label(planner)
        if label not in runs:
            runs[label] = runs_as.measure(plans.plans[planner], label)
    _print_runs(list(runs.values()), where, runs_as.loaded)
    _print_speedups(plans, runs, best, where)
    chart = outdir / runs_as.chart
    fidelity.draw_measurements(list(runs.values()), chart,
                               f"{LAB_MODEL} on {cluster.name}: predicted vs measured, {where}")
    folder = chart.with_suffix("")
    out.print(f"wrote {chart}, {outdir / 'gantt.png'} and each run's folder under "
              f"{folder} (`edgepipe report` for the per-device, stage and link table)",
              highlight=False)


def _lab_profile(cluster: Cluster, outdir: Path) -> ModelProfile:
    """The demo model's lab profile on ``cluster``, written to ``lab-profile.json``."""
    with executor_imports():
        from edgepipe.executor.lab.launch import DEFAULT_SHARE
        from edgepipe.executor.lab.profiling import Job, lab_profile
        from edgepipe.executor.profiling.noise import NoisePolicy
        from edgepipe.executor.profiling.sources import ModelSource
    source = ModelSource(LAB_MODEL, LAB_SIZES)
    policy = NoisePolicy(max_rounds=LAB_PROFILE_ROUNDS)
    err.print(f"profiling {LAB_MODEL} in each device type's lab confinement ({DEFAULT_SHARE:g} "
              "of this machine's cores for the cluster; ~1 min)", highlight=False)

    def job(device_type: str) -> Job:
        return Job(source, device_type, LAB_BATCH_SIZES, 2, 5, policy)

    result = lab_profile(source, cluster, DEFAULT_SHARE, job)
    for line in result.warnings:
        warn(line)
    for name, t in sorted(result.profile.timings.items()):
        if t.lab is not None and t.noise is not None:
            err.print(f"  {name}: {t.lab.cpu_cores:.3g} core, {t.noise.rounds} rounds, spread "
                      f"{t.noise.spread:.1%}, load {t.noise.load_average:.1f}", highlight=False)
    path = outdir / "lab-profile.json"
    path.write_text(json.dumps(result.profile.to_dict(), indent=1) + "\n")
    return result.profile


def _print_runs(runs: list[LabMeasurement], where: str, loaded_note: str) -> None:
    """Each run's predicted and measured step, error and load, as a table; a warning
    (ending in ``loaded_note``) naming those measured on a loaded machine."""
    out.print(f"each plan's step, predicted and measured {where}:", highlight=False)
    table = compact_table()
    for col in ("plan", "stages", "devices", "predicted ms", "measured ms", "error", "load"):
        table.add_column(col, justify="left" if col == "plan" else "right")
    lines = []
    for r in runs:
        cells = (r.label, str(r.plan.partition.num_stages),
                 str(len(r.plan.partition.used_devices())), f"{r.predicted_ms:.1f}",
                 f"{r.measured_ms:.1f}", f"{r.error:+.0%}", f"{r.load:.1f}")
        table.add_row(*cells)
        lines.append(f"{r.label}: {cells[1]} stage(s) on {cells[2]} device(s), predicted "
                     f"{cells[3]} ms, measured {cells[4]} ms {where} ({cells[5]}), load "
                     f"{cells[6]}")
    print_table(table, lambda: lines)
    loaded = [r.label for r in runs if r.loaded()]
    if loaded:
        warn(f"measured on a loaded machine (1-minute load above its cores): "
             f"{', '.join(loaded)}; {loaded_note}")


def _print_speedups(plans: PlanSet, runs: dict[str, LabMeasurement], best: str,
                    where: str) -> None:
    """The DP plan's measured speed-ups next to the predicted ones and the seed's."""
    from edgepipe.executor.lab.fidelity import DATA_PARALLEL, speedup

    dp = runs[plans.label("dp")]
    for planner, claim in zip((DATA_PARALLEL, best), CLAIMS, strict=True):
        if planner not in plans.plans:
            continue
        predicted, measured = speedup(runs[plans.label(planner)], dp)
        out.print(f"the DP plan over {claim} ({planner}): predicted {predicted:.2f}x, measured "
                  f"{measured:.2f}x {where} (the seed claims {CLAIMS[claim]}x)",
                  highlight=False)
