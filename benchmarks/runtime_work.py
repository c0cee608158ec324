"""The runtime's own work per micro-batch in the cost model, before and after, against
lab runs (issue 25 item 4; docs/lab.md, "Runtime work per action").

Per cluster: ``edgepipe lab profile`` of the lab fidelity benchmark's model
(``benchmarks/lab_fidelity.py``: VGG-16 at 96 x 96, width 1/8, global batch 32), which
now also measures each device type's ``runtime_work``; the same profile without it is
the "before" model (the block times are the same measurement, so the two predictions
differ by the term alone). The planners named by ``--planners`` plan from the "before"
profile, the DP also from the "after" one; each distinct plan runs once in the lab, and
its measured step (median after the first) and per-stage compute (forward + backward
per micro-batch) are set against both predictions of the same run: before and after
are interleaved by construction. Every figure carries the 1-minute load average.

    .venv/bin/python benchmarks/runtime_work.py [--clusters lab-switched-4,lab-wifi-4]
        [--planners hetpipe,gpipe,torchgpipe,dp] [--lab-share 0.9] [--time-limit 10]

Writes ``benchmarks/results/runtime_work.md`` (the tables printed) and
``benchmarks/results/runtime_work.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # as lab_fidelity.py

from edgepipe.executor.lab.fidelity import LabMeasurement, lab_plans, measure
from edgepipe.planner import api
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import Problem
from lab_fidelity import GLOBAL_BATCH, HERE, profile

CORES = len(os.sched_getaffinity(0))


def predictions(problem: Problem, run: LabMeasurement) -> tuple[float, list[float]]:
    """``problem``'s steady step of the run's partition and each stage's forward +
    backward per micro-batch (its slowest device's)."""
    cost = CostModel(problem).evaluate(run.plan.partition)
    return cost.steady_ms, [s.forward_ms + s.backward_ms for s in cost.stages]


def run_cluster(name: str, planners: list[str], share: float, time_limit: float,
                out: Path) -> dict[str, object]:
    """Profile, plan and run one cluster (module docstring); its figures."""
    cluster = HERE / "lab" / f"{name}.json"
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    load = profile(cluster, share, folder / "profile.json")
    doc = json.loads((folder / "profile.json").read_text())
    work = {t: d["runtime_work"] for t, d in doc["timings"].items()}
    for d in doc["timings"].values():
        del d["runtime_work"]
    (folder / "profile_before.json").write_text(json.dumps(doc))
    config = TrainingConfig(GLOBAL_BATCH, replication_interval=0)
    before = api.load_problem(folder / "profile_before.json", cluster, config)
    after = api.load_problem(folder / "profile.json", cluster, config)
    plans = dict(lab_plans(before, planners, time_limit).plans)
    plans["dp (after)"] = lab_plans(after, ["dp"], time_limit).plans["dp"]
    runs, seen = [], set()
    for label, plan in plans.items():
        if plan.partition in seen:
            continue
        seen.add(plan.partition)
        print(f"[{name}] running {label} in the lab", file=sys.stderr, flush=True)
        run = measure(plan, label.replace(" ", "_"), folder, share)
        (step_b, stages_b), (step_a, stages_a) = predictions(before, run), predictions(after, run)
        runs.append({
            "label": label, "m": plan.partition.num_micro_batches,
            "stages": " / ".join(",".join(s.devices) for s in plan.partition.stages),
            "before_ms": step_b, "after_ms": step_a, "measured_ms": run.measured_ms,
            "load": run.load, "steps": run.steps,
            "stage_rows": [
                {"stage": s.stage, "devices": ",".join(s.devices), "before_ms": b,
                 "after_ms": a, "measured_ms": s.measured_ms}
                for s, b, a in zip(run.stages, stages_b, stages_a, strict=True)],
        })
    return {"cluster": name, "profile_load": load, "runtime_work": work, "runs": runs}


def tables(results: list[dict[str, object]]) -> list[str]:
    """The markdown tables of every cluster, then the summary."""
    lines: list[str] = []
    step_b, step_a, stage_b, stage_a = [], [], [], []
    for r in results:
        lines += ["", f"### {r['cluster']} (profiled at load {r['profile_load']:.1f})", "",
                  "runtime work per micro-batch (ms, forward + backward, per quota): " + ", ".join(
                      f"{t} {w['forward_ms']:.2f} + {w['backward_ms']:.2f} (spread "
                      f"{w['spread']:.0%}, {w['rounds']} rounds)"
                      for t, w in r["runtime_work"].items()),  # type: ignore[attr-defined]
                  "", "| plan | M | stages | predicted before | after | measured | error "
                  "before | after | load |", "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
        for run in r["runs"]:  # type: ignore[attr-defined]
            eb = run["measured_ms"] / run["before_ms"] - 1
            ea = run["measured_ms"] / run["after_ms"] - 1
            step_b.append(abs(eb))
            step_a.append(abs(ea))
            star = "*" if run["load"] > CORES else ""
            lines.append(f"| {run['label']} | {run['m']} | {run['stages']} | "
                         f"{run['before_ms']:.1f} | {run['after_ms']:.1f} | "
                         f"{run['measured_ms']:.1f} | {eb:+.1%} | {ea:+.1%} | "
                         f"{run['load']:.1f}{star} |")
        lines += ["", "| plan | stage | devices | compute before | after | measured | "
                  "error before | after |", "|---|---:|---|---:|---:|---:|---:|---:|"]
        for run in r["runs"]:  # type: ignore[attr-defined]
            for s in run["stage_rows"]:
                if s["measured_ms"] is None:
                    continue
                eb = s["measured_ms"] / s["before_ms"] - 1
                ea = s["measured_ms"] / s["after_ms"] - 1
                stage_b.append(abs(eb))
                stage_a.append(abs(ea))
                lines.append(f"| {run['label']} | {s['stage']} | {s['devices']} | "
                             f"{s['before_ms']:.1f} | {s['after_ms']:.1f} | "
                             f"{s['measured_ms']:.1f} | {eb:+.1%} | {ea:+.1%} |")
    if step_b:
        lines += ["", f"{len(step_b)} runs: median |step error| before "
                  f"{statistics.median(step_b):.1%}, after {statistics.median(step_a):.1%}; "
                  f"worst before {max(step_b):.1%}, after {max(step_a):.1%}"]
    if stage_b:
        lines.append(
            f"{len(stage_b)} stages: within 15% before {sum(e <= 0.15 for e in stage_b)}, "
            f"after {sum(e <= 0.15 for e in stage_a)}; median |error| before "
            f"{statistics.median(stage_b):.1%}, after {statistics.median(stage_a):.1%}")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clusters", default="lab-switched-4,lab-wifi-4")
    p.add_argument("--planners", default="hetpipe,gpipe,torchgpipe,dp")
    p.add_argument("--lab-share", type=float, default=0.9)
    p.add_argument("--time-limit", type=float, default=10.0)
    p.add_argument("--out", default="out/runtime_work")
    p.add_argument("--results", default=str(HERE / "results"))
    args = p.parse_args()
    results = [run_cluster(c, args.planners.split(","), args.lab_share, args.time_limit,
                           Path(args.out)) for c in args.clusters.split(",")]
    lines = tables(results)
    print("\n".join(lines))
    results_dir = Path(args.results)
    (results_dir / "runtime_work.md").write_text("\n".join(lines) + "\n")
    (results_dir / "runtime_work.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
