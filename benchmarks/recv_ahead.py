"""Receives posted at their action against posted ahead (executor/core/receives.py), in
the lab: the same plans run with ``recv_ahead = 0`` (each receive posted at its RECV
action, the executor before) and with the default (the stage's warm-up), interleaved
round by round, each run's load recorded.

Per run: the median step after the first (``edgepipe report``'s measured iteration),
samples/s, the step's measured / predicted, and per link the pieces the receiver waited
for (``transfers.jsonl``, after the first step): median post to delivery over the
prediction, and the median time from the sender's post to the receiver's post of the
piece (``recv_posted_ms``; positive: the sender's data waited for the receiver).

Writes ``benchmarks/results/recv_ahead.md`` (the table printed) and ``.json``.

    .venv/bin/python benchmarks/recv_ahead.py PLAN.json [PLAN.json ...] [--rounds 2]
        [--steps 8] [--lab-share 0.9] [--out out/recv_ahead]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

# the lab's store runs in a namespace that cannot resolve its peers' names (as
# benchmarks/lab_fidelity.py)
warnings.filterwarnings("ignore", message=".*hostname.*")

from edgepipe.executor.core.options import WorkerOptions  # noqa: E402
from edgepipe.executor.lab.launch import LabOptions, run_lab  # noqa: E402
from edgepipe.planner.check.breakdown import EXACT_WAIT_MS  # noqa: E402
from edgepipe.planner.check.report import build_report  # noqa: E402
from edgepipe.planner.plan import load_plan, save_plan  # noqa: E402

HERE = Path(__file__).resolve().parent
VARIANTS = {"at action": 0, "ahead": None}


def link_figures(run_dir: Path, predicted: dict[tuple[str, str, str], float]
                 ) -> tuple[float | None, float | None, int]:
    """Median (post to delivery / predicted) and median sender-post to receiver-post
    (ms) over the pieces the receiver waited for after step 0, and their count."""
    ratios, lead = [], []
    for line in (run_dir / "transfers.jsonl").read_text().splitlines():
        t = json.loads(line)
        if t["step"] == 0 or t["end_ms"] - t["waited_ms"] <= EXACT_WAIT_MS:
            continue
        direction = "activations" if t["kind"] == "TRANSFER_F" else "gradients"
        ratios.append((t["end_ms"] - t["start_ms"]) / predicted[(direction, t["device"],
                                                                  t["peer"])])
        lead.append(t.get("recv_posted_ms", t["waited_ms"]) - t["start_ms"])
    return (statistics.median(ratios) if ratios else None,
            statistics.median(lead) if lead else None, len(ratios))


def run_once(plan_path: Path, label: str, variant: str, where: Path, steps: int,
             share: float) -> dict[str, Any]:
    before = os.getloadavg()[0]
    run_dir = where / "run"
    run_lab(WorkerOptions(str(plan_path), steps, str(run_dir), timeout_s=120.0,
                          recv_ahead=VARIANTS[variant]), LabOptions(share=share))
    after = os.getloadavg()[0]
    report = build_report(run_dir)
    predicted = {(r.direction, r.src, r.dst): r.predicted_ms for r in report.links}
    ratio, lead, pieces = link_figures(run_dir, predicted)
    return {"plan": label, "variant": variant, "step_ms": report.iteration_measured_ms,
            "predicted_ms": report.steady_predicted_ms,
            "samples_per_s": report.samples_per_s_measured,
            "link_ratio": ratio, "recv_post_lag_ms": lead, "pieces": pieces,
            "load": max(before, after)}


def row(r: dict[str, Any]) -> str:
    ratio = "-" if r["link_ratio"] is None else f"{r['link_ratio']:.2f}x"
    lead = "-" if r["recv_post_lag_ms"] is None else f"{r['recv_post_lag_ms']:.1f}"
    return (f"| {r['plan']} | {r['round']} | {r['variant']} | {r['predicted_ms']:.1f} | "
            f"{r['step_ms']:.1f} ({r['step_ms'] / r['predicted_ms'] - 1:+.0%}) | "
            f"{r['samples_per_s']:.1f} | {ratio} | {lead} | {r['pieces']} | "
            f"{r['load']:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plans", nargs="+", type=Path)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--lab-share", type=float, default=0.9)
    ap.add_argument("--out", type=Path, default=Path("out/recv_ahead"))
    args = ap.parse_args()
    results = []
    for rnd in range(args.rounds):
        # alternate which variant goes first, so neither always meets the same load
        order = list(VARIANTS) if rnd % 2 == 0 else list(reversed(VARIANTS))
        for plan_path in args.plans:
            label = f"{plan_path.parent.parent.name}/{plan_path.parent.name}"
            for variant in order:
                where = args.out / label.replace("/", "_") / f"r{rnd}-{variant.replace(' ', '_')}"
                where.mkdir(parents=True, exist_ok=True)
                local = where / "plan.json"
                save_plan(load_plan(plan_path), local)
                print(f"[round {rnd}] {label} {variant}", file=sys.stderr, flush=True)
                results.append({**run_once(local, label, variant, where, args.steps,
                                           args.lab_share), "round": rnd})
    lines = ["| plan | round | receives | predicted ms | measured ms | samples/s | "
             "link post->delivery / predicted | sender post -> receiver post, ms | "
             "pieces | load |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [row(r) for r in results]
    lines += ["", "| plan | receives | median step ms | median samples/s | "
              "median link post->delivery / predicted | loads |", "|---|---|---|---|---|---|"]
    for label in dict.fromkeys(r["plan"] for r in results):
        for variant in VARIANTS:
            mine = [r for r in results if r["plan"] == label and r["variant"] == variant]
            links = [r["link_ratio"] for r in mine if r["link_ratio"] is not None]
            lines.append(
                f"| {label} | {variant} | {statistics.median(r['step_ms'] for r in mine):.1f} | "
                f"{statistics.median(r['samples_per_s'] for r in mine):.1f} | "
                + (f"{statistics.median(links):.2f}x" if links else "-")
                + f" | {min(r['load'] for r in mine):.1f}-{max(r['load'] for r in mine):.1f} |")
    print("\n".join(lines))
    out = HERE / "results"
    (out / "recv_ahead.md").write_text("\n".join(lines) + "\n")
    (out / "recv_ahead.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
