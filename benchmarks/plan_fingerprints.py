"""Fingerprints of the DP's plans on the solver_vs_dp and planner_scaling instances.

A refactor that must change no behaviour prints the same lines before and after:

    .venv/bin/python benchmarks/plan_fingerprints.py > before.txt
    ... change ...
    .venv/bin/python benchmarks/plan_fingerprints.py > after.txt && diff before.txt after.txt

Each line: instance, status, the partition (micro-batch, stages as blocks / devices /
samples), the DP value and the cost model's iteration time to the last digit (repr), and a
short hash of all of it. The exact solver is not fingerprinted: it stops on a wall clock.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgepipe.planner.solvers.dp.driver import plan_dp

from benchmarks import planner_scaling, solver_vs_dp


def fingerprint(label: str, problem) -> str:
    result = plan_dp(problem, time_limit=3600.0)
    p = result.partition
    stages = ";".join(f"{s.first}-{s.end}:{','.join(s.devices)}={s.samples}" for s in p.stages)
    text = (
        f"{result.status} B={p.micro_batch_size} M={p.num_micro_batches} [{stages}] "
        f"dp={result.dp_value_ms!r} iter={result.cost.iteration_ms!r}"
    )
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return f"{digest}  {label}  {text}"


def main() -> None:
    skip = sys.argv[1:]  # substrings of planner_scaling case names to leave out
    for label, problem in solver_vs_dp.instances():
        print(fingerprint(label, problem), flush=True)
    for name, (spec, _, _) in planner_scaling.cases().items():
        if any(s in name for s in skip):
            continue
        print(fingerprint(name, planner_scaling.build(spec)), flush=True)


if __name__ == "__main__":
    main()
