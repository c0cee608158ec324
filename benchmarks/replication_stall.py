"""A short emulated run against its replication points (issue 28).

The two plans of :mod:`tests.helpers.stall_runs` (a replica's transfer of about 21 of
their predicted steps, interval ``auto``): ``standbys``, the toy model on one device
with its replica on standby processes (the demo's kind of plan), and ``two-stages``,
two stages holding each other's ring replica. Each runs ``--steps`` emulated steps of
``--step-s`` seconds, recovering with its replicas on (``executor.launch.launch``, as
``edgepipe run --emulate`` does), ``--repeats`` times, the plans alternating. Figures:
the points the run takes and skips and whether the final one is sent
(:func:`planner.plan.replication_schedule`), the run's wall time from its first step's
start to the launcher's return, its steps' time (each step's ``wall_ms`` less its wait
for a point, from ``metrics.jsonl``), their ratio, and the load average around the run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgepipe.executor.core.options import WorkerOptions
from edgepipe.executor.launch import launch
from edgepipe.planner.plan import replication_schedule, save_plan

from benchmarks.markdown_table import emit
from tests.helpers.stall_runs import one_device, transfer_ms, two_stages, wall_and_steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--step-s", type=float, default=0.5)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--markdown", help="also write the table to this file")
    a = p.parse_args()
    lines = ["| plan | transfer (steps) | interval | points taken | skipped | final sent "
             "| wall s | steps s | wall / steps | load |", "|" + "---|" * 10]
    plans = {"standbys": one_device(), "two-stages": two_stages()}
    for _ in range(a.repeats):
        for name, plan in plans.items():
            schedule = replication_schedule(plan, 0, a.steps)
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "plan.json"
                save_plan(plan, path)
                before = os.getloadavg()[0]
                launch(WorkerOptions(str(path), a.steps, tmp, emulate=True,
                                     time_scale=a.step_s * 1e3 / plan.cost.iteration_ms))
                wall, steps = wall_and_steps(Path(tmp), time.time(), a.steps)
            lines.append(
                f"| {name} | {transfer_ms(plan) / plan.cost.iteration_ms:.1f} | "
                f"{plan.problem.config.replication_interval} | {list(schedule.points)} | "
                f"{list(schedule.skipped)} | {schedule.final_sent} | {wall:.1f} | "
                f"{steps:.1f} | {wall / steps:.2f}x | {before:.1f}-{os.getloadavg()[0]:.1f} |")
    emit(lines, a.markdown)


if __name__ == "__main__":
    main()
