"""The lab's verdict on the cost model: plans made from lab profiles, run in the lab,
measured step against predicted (issue 25, "Must show").

Problems: VGG-16 at 96 x 96, width 1/8 (16 blocks; big fully connected layers after
cheap-to-share convolutions, so the best plans are hybrid) with global batch 32, on the
lab clusters of ``benchmarks/lab/``: ``lab-switched-4`` (Orin Nano, Xavier NX, 2 TX2 on a
200 Mbit/s switch), ``lab-p2p-3`` (Orin Nano, 2 TX2, a 300 Mbit/s link per pair) and
``lab-wifi-4`` (Orin Nano, 2 Xavier NX, TX2 on one shared 300 Mbit/s medium); latency
0 (the lab runs latency 0), no replication (the lab does not recover).

Per cluster: ``edgepipe lab profile`` measures the model in each device type's
confinement (``--lab-share``, default the lab's own, ``DEFAULT_SHARE`` of
:mod:`executor.lab.launch`: 0.5 of this machine's cores for the cluster; at 0.9 the
devices' concurrent demand and their runtimes' unpaced threads exceeded 2 cores, the load
reading 2.7-3.9 while the plans ran against 1.6-2.2 at 0.5), every
planner plans from that profile (:func:`executor.lab.fidelity.lab_plans`: the DP, the
exact solver within ``--time-limit``, data parallelism, the pipeline baselines), and
each distinct plan runs in the lab (:func:`executor.lab.fidelity.measure`; every device
paced to its quota, :mod:`executor.lab.pacing`, and profiled paced) for about 3 s
of steps (6-15 steps, the first a warm-up). Printed per plan: stages, devices, predicted
and measured step (median of the steps after the first), the error, and the 1-minute load
average while measured; a figure measured at a load above this machine's cores is
marked ``*`` (the lab's quotas hold a device to its share, but its top CPU weight only
wins it back from other processes within the CFS period). Then per problem the ranking
(Spearman's rank correlation of predicted and measured steps, by hand, average ranks
for ties; whether the plan predicted fastest is measured fastest or within 5% of it) and
the measured speed-ups of the DP plan over data parallelism and the best baseline next
to the predicted ones; per stage, compute per micro-batch predicted against measured;
per plan, transfers (post to delivery, and after both sides had posted) against their
link figures; per device, the plan's memory against its cgroup's measured peak.

Writes ``benchmarks/results/lab_fidelity.png`` (measured against predicted step, every
plan), ``benchmarks/results/lab_fidelity.md`` (the tables printed) and
``benchmarks/results/lab_fidelity.json`` (every figure).

    .venv/bin/python benchmarks/lab_fidelity.py [--clusters lab-switched-4,...]
        [--lab-share 0.5] [--time-limit 20] [--out out/lab_fidelity]
        [--results benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# the lab's store runs in a namespace that cannot resolve its peers' names: torch warns
# for each unless told otherwise when it loads (as `run --lab` does)
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

from edgepipe.executor.lab.fidelity import (
    DATA_PARALLEL,
    LabMeasurement,
    PlanSet,
    best_baseline,
    lab_plans,
    measure,
    speedup,
)
from edgepipe.executor.lab.launch import DEFAULT_SHARE
from edgepipe.planner import api
from edgepipe.planner.check.breakdown import EXACT_WAIT_MS
from edgepipe.planner.check.report import build_report
from edgepipe.planner.inputs.config import TrainingConfig
from markdown_table import emit

HERE = Path(__file__).resolve().parent
CLUSTERS = ("lab-switched-4", "lab-p2p-3", "lab-wifi-4")
MODEL = ["--model", "vgg16", "--size", "resolution=96", "--size", "width=0.125",
         "--batch-sizes", "2,4,8,16", "--max-rounds", "5"]
GLOBAL_BATCH = 32
CORES = len(os.sched_getaffinity(0))


@dataclass
class Problem:
    """One cluster's plans and their lab runs (by planner label)."""

    cluster: str
    plans: PlanSet
    runs: list[LabMeasurement]
    profile_load: float


def rank(values: list[float]) -> list[float]:
    """Ranks 1..n of ``values``, ties sharing their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation: Pearson's correlation of the ranks."""
    rx, ry = rank(xs), rank(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sx = sum((a - mx) ** 2 for a in rx) ** 0.5
    sy = sum((b - my) ** 2 for b in ry) ** 0.5
    return cov / (sx * sy) if sx and sy else float("nan")


def mark(run: LabMeasurement) -> str:
    return "*" if run.loaded(CORES) else ""


def profile(cluster: Path, share: float, out: Path) -> float:
    """``edgepipe lab profile`` of the model on ``cluster``; returns the load after."""
    edgepipe = str(Path(sys.executable).with_name("edgepipe"))
    subprocess.run([edgepipe, "lab", "profile", *MODEL, "--cluster", str(cluster),
                    "--lab-share", str(share), "-o", str(out)], check=True)
    return os.getloadavg()[0]


def run_problem(name: str, share: float, time_limit: float, out: Path) -> Problem:
    cluster = HERE / "lab" / f"{name}.json"
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    load = profile(cluster, share, folder / "profile.json")
    problem = api.load_problem(folder / "profile.json", cluster,
                               TrainingConfig(GLOBAL_BATCH, replication_interval=0))
    plans = lab_plans(problem, time_limit=time_limit)
    runs = []
    for names in plans.labels.values():
        label = "=".join(names)
        print(f"[{name}] running {label} in the lab", file=sys.stderr, flush=True)
        runs.append(measure(plans.plans[names[0]], label, folder, share))
    return Problem(name, plans, runs, load)


def plan_table(p: Problem) -> list[str]:
    lines = [f"### {p.cluster} (profiled at load {p.profile_load:.1f})", "",
             "| plan | stages (devices) | predicted ms | measured ms | error | load | steps |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in sorted(p.runs, key=lambda r: r.predicted_ms):
        stages = " / ".join(",".join(s.devices) for s in r.plan.partition.stages)
        lines.append(f"| {r.label} | {stages} | {r.predicted_ms:.1f} | {r.measured_ms:.1f} | "
                     f"{r.error:+.1%} | {r.load:.1f}{mark(r)} | {r.steps} |")
    return lines


def by_planner(p: Problem, planner: str) -> LabMeasurement:
    label = p.plans.label(planner)
    return next(r for r in p.runs if r.label == label)


def ranking_lines(p: Problem) -> tuple[list[str], dict[str, object]]:
    pred = [r.predicted_ms for r in p.runs]
    meas = [r.measured_ms for r in p.runs]
    rho = spearman(pred, meas)
    fastest_pred = min(p.runs, key=lambda r: r.predicted_ms)
    fastest_meas = min(p.runs, key=lambda r: r.measured_ms)
    behind = fastest_pred.measured_ms / fastest_meas.measured_ms - 1
    dp, dpar = by_planner(p, "dp"), by_planner(p, DATA_PARALLEL)
    base = by_planner(p, best_baseline(p.plans))
    over_dpar, over_base = speedup(dpar, dp), speedup(base, dp)
    lines = [
        "",
        f"ranking of {len(p.runs)} plans: Spearman {rho:.2f}; predicted fastest "
        f"{fastest_pred.label}"
        f" measured {behind:+.1%} behind the measured fastest ({fastest_meas.label})",
        f"DP plan over data parallelism: predicted {over_dpar[0]:.2f}x, measured "
        f"{over_dpar[1]:.2f}x; over the best baseline ({base.label}): predicted "
        f"{over_base[0]:.2f}x, measured {over_base[1]:.2f}x",
    ]
    figures = {"spearman": rho, "fastest_predicted": fastest_pred.label,
               "fastest_measured": fastest_meas.label, "behind": behind,
               "speedup_over_data_parallel": over_dpar, "best_baseline": base.label,
               "speedup_over_best_baseline": over_base}
    return lines, figures


def compute_lines(problems: list[Problem]) -> tuple[list[str], list[float]]:
    lines = ["", "### Per-stage compute (forward + backward per micro-batch, ms)", "",
             "| cluster | plan | stage | devices | predicted | measured | error | load |",
             "|---|---|---:|---|---:|---:|---:|---:|"]
    errors = []
    for p in problems:
        for r in p.runs:
            for s in r.stages:
                if s.measured_ms is None or s.error is None:
                    continue
                errors.append(s.error)
                lines.append(f"| {p.cluster} | {r.label} | {s.stage} | {','.join(s.devices)}"
                             f" | {s.predicted_ms:.1f} | {s.measured_ms:.1f} | {s.error:+.1%} "
                             f"| {r.load:.1f}{mark(r)} |")
    return lines, errors


def link_split(run: LabMeasurement) -> list[tuple[float, float, float]]:
    """Per piece the receiver waited for (after the warm-up step): (predicted, post to
    delivery, after both had posted) ms. gloo moves a piece only once its receiver has
    posted the receive (docs/lab.md, "What the lab measured"), so post to delivery splits
    into the wait for the receiver's post and the time after both had posted; the
    receiver's post is ``recv_posted_ms`` of the piece's transfers.jsonl line (runs
    before receives were posted ahead have none: they posted at the wait,
    ``waited_ms``)."""
    report = build_report(run.run_dir)
    predicted = {(r.src, r.dst, r.direction): r.predicted_ms for r in report.links}
    pieces = []
    with open(run.run_dir / "transfers.jsonl") as fh:
        for line in fh:
            t = json.loads(line)
            waited = t["end_ms"] - t["waited_ms"]
            if t["step"] == 0 or waited <= EXACT_WAIT_MS:
                continue
            direction = "activations" if t["kind"] == "TRANSFER_F" else "gradients"
            both = max(t["start_ms"], t.get("recv_posted_ms", t["waited_ms"]))
            pieces.append((predicted[(t["device"], t["peer"], direction)],
                           t["end_ms"] - t["start_ms"], t["end_ms"] - both))
    return pieces


def link_lines(problems: list[Problem]) -> list[str]:
    lines = ["", "### Transfers (pieces the receiver waited for; median of measured / "
             "predicted, and of the time after both sides had posted / predicted)", "",
             "| cluster | plan | pieces | post to delivery | after both posted | load |",
             "|---|---|---:|---:|---:|---:|"]
    for p in problems:
        for r in p.runs:
            pieces = link_split(r)
            if not pieces:
                continue
            whole = statistics.median(m / pred for pred, m, _ in pieces)
            after = statistics.median(a / pred for pred, _, a in pieces)
            lines.append(f"| {p.cluster} | {r.label} | {len(pieces)} | {whole:.2f}x | "
                         f"{after:.2f}x | {r.load:.1f}{mark(r)} |")
    return lines


def memory_lines(problems: list[Problem]) -> list[str]:
    lines = ["", "### Peak memory per device (MiB; measured: the device's cgroup peak, "
             "its whole process; the rest: measured less predicted)", "",
             "| cluster | plan | device | predicted | measured | rest | load |",
             "|---|---|---|---:|---:|---:|---:|"]
    for p in problems:
        for r in p.runs:
            for m in r.memory:
                pred, meas = m.predicted_bytes / 2**20, m.measured_bytes / 2**20
                lines.append(f"| {p.cluster} | {r.label} | {m.device} | {pred:.1f} | "
                             f"{meas:.1f} | {meas - pred:.1f} | {r.load:.1f}{mark(r)} |")
    return lines


def draw(problems: list[Problem], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    everything = [r for p in problems for r in p.runs]
    lo = min(min(r.predicted_ms, r.measured_ms) for r in everything) * 0.8
    hi = max(max(r.predicted_ms, r.measured_ms) for r in everything) * 1.25
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8, label="measured = predicted")
    ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="0.9",
                    label="within 10%")
    for p in problems:
        ax.scatter([r.predicted_ms for r in p.runs], [r.measured_ms for r in p.runs],
                   label=p.cluster, s=22)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("predicted step, ms")
    ax.set_ylabel("measured step in the lab, ms")
    loads = [r.load for r in everything]
    ax.set_title(f"lab fidelity: VGG-16 (96px, 1/8 width), {len(everything)} plans; "
                 f"load {min(loads):.1f}-{max(loads):.1f} on {CORES} cores", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clusters", default=",".join(CLUSTERS))
    p.add_argument("--lab-share", type=float, default=DEFAULT_SHARE)
    p.add_argument("--time-limit", type=float, default=20.0)
    p.add_argument("--out", default="out/lab_fidelity")
    p.add_argument("--results", default=str(HERE / "results"))
    args = p.parse_args()
    out, results = Path(args.out), Path(args.results)
    problems = [run_problem(c, args.lab_share, args.time_limit, out)
                for c in args.clusters.split(",")]
    lines: list[str] = []
    figures: dict[str, object] = {}
    for prob in problems:
        lines += ["", *plan_table(prob)]
        more, figures[prob.cluster] = ranking_lines(prob)
        lines += more
    stage_lines, stage_errors = compute_lines(problems)
    lines += stage_lines + link_lines(problems) + memory_lines(problems)
    errors = [abs(r.error) for prob in problems for r in prob.runs]
    loads = [r.load for prob in problems for r in prob.runs]
    within = sum(abs(e) <= 0.15 for e in stage_errors)
    lines += ["", f"{len(errors)} plans: median |error| {statistics.median(errors):.1%}, "
              f"worst {max(errors):.1%}; per-stage compute within 15%: {within} of "
              f"{len(stage_errors)}; load {min(loads):.1f}-{max(loads):.1f} on {CORES} cores "
              "(* above the cores)"]
    results.mkdir(parents=True, exist_ok=True)
    emit(lines, str(results / "lab_fidelity.md"))
    draw(problems, results / "lab_fidelity.png")
    doc = {"cores": CORES, "share": args.lab_share, "problems": figures, "runs": [
        {"cluster": prob.cluster, "label": r.label, "plan": r.plan.id,
         "stages": r.plan.partition.num_stages, "predicted_ms": r.predicted_ms,
         "measured_ms": r.measured_ms, "load_before": r.load_before,
         "load_after": r.load_after, "steps": r.steps}
        for prob in problems for r in prob.runs]}
    (results / "lab_fidelity.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {results / 'lab_fidelity.png'}, lab_fidelity.md and lab_fidelity.json there")


if __name__ == "__main__":
    main()
