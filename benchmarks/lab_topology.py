"""The same plans on a shared medium and on a switch, in the lab (issue 25).

Question: is the shared medium's excess of measured over predicted stage compute
(session 20: every stage of ``lab-wifi-4`` +7% to +62% over its profile, the switch's
within -14% to +16%) the topology's (the kernel's work for the one shaped bottleneck,
charged to the devices) or the runs' and profiles' noise? One lab profile of
``lab-wifi-4``'s devices, the plans of its DP, data parallelism, ``gpipe`` and
``hetpipe`` (:func:`executor.lab.fidelity.lab_plans`), each run in the lab on the shared
medium and, with the same partition, on the same devices behind a switch of the same
bandwidth (:data:`SWITCHED`: only the topology differs; the cost model's prediction
differs where the medium's channel sharing does), alternately, ``--repeats`` times.
Printed per run: predicted and measured step and each stage's compute per micro-batch
(predicted / measured, :class:`executor.lab.fidelity.StageCompute`), with the load.

    .venv/bin/python benchmarks/lab_topology.py [--repeats 2] [--lab-share 0.5]
        [--out out/lab_topology]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

# the lab's store runs in a namespace that cannot resolve its peers' names (as
# benchmarks/lab_fidelity.py)
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

from edgepipe.executor.lab.fidelity import LabMeasurement, lab_plans, measure
from edgepipe.executor.lab.launch import DEFAULT_SHARE
from edgepipe.planner import api
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.plan import SolverInfo, make_plan
from lab_fidelity import GLOBAL_BATCH, profile

HERE = Path(__file__).resolve().parent
MEDIUM = HERE / "lab" / "lab-wifi-4.json"
#: the planners whose plans are run (their labels joined where plans coincide)
PLANNERS = ("dp", "data-parallel", "gpipe", "hetpipe")


def switched(out: Path) -> Path:
    """``lab-wifi-4``'s devices and bandwidth on a switch, written under ``out``."""
    doc = json.loads(MEDIUM.read_text())
    doc["name"] = "lab-wifi-4-switched"
    doc["description"] = "lab-wifi-4's devices behind a switch (benchmarks/lab_topology.py)"
    doc["network"]["topology"] = "switched"
    path = out / "lab-wifi-4-switched.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def line(repeat: int, label: str, topology: str, m: LabMeasurement) -> str:
    stages = " ".join(
        f"s{s.stage} {s.predicted_ms:.1f}/"
        + ("-" if s.measured_ms is None or s.error is None
           else f"{s.measured_ms:.1f} ({s.error:+.0%})")
        for s in m.stages)
    return (f"{repeat} {label:15s} {topology:7s} step {m.predicted_ms:7.1f} / "
            f"{m.measured_ms:7.1f} ({m.error:+.1%}) load {m.load:.1f} | {stages}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--lab-share", type=float, default=DEFAULT_SHARE)
    parser.add_argument("--out", type=Path, default=Path("out/lab_topology"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "profile.json"
    load = profile(MEDIUM, args.lab_share, path)
    print(f"profiled lab-wifi-4's devices, load {load:.1f}", flush=True)
    config = TrainingConfig(GLOBAL_BATCH, replication_interval=0)
    problems = {"medium": api.load_problem(path, MEDIUM, config),
                "switch": api.load_problem(path, switched(args.out), config)}
    plans = lab_plans(problems["medium"], planners=PLANNERS, time_limit=10)
    for repeat in range(args.repeats):
        for names in plans.labels.values():
            label = "=".join(names)
            for topology, problem in problems.items():
                plan = make_plan(problem, plans.plans[names[0]].partition,
                                 SolverInfo(names[0]))
                m = measure(plan, f"{label}-{topology}-{repeat}", args.out, args.lab_share)
                print(line(repeat, label, topology, m), flush=True)


if __name__ == "__main__":
    sys.exit(main())
