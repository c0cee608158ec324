"""Fingerprints of the DP's plans on the solver_vs_dp and planner_scaling instances:
the plan ``edgepipe plan`` returns (``solve(problem, "dp")``: the DP, its coarse views
and the local improvement pass, issue 29), or with ``--dp-only`` the DP's own
(``plan_dp``).

A refactor that must change no behaviour prints the same lines before and after:

    .venv/bin/python benchmarks/plan_fingerprints.py > before.txt
    ... change ...
    .venv/bin/python benchmarks/plan_fingerprints.py > after.txt && diff before.txt after.txt

Each line: instance, status, the partition (micro-batch, stages as blocks / devices /
samples), the DP value (with ``--dp-only``; else the steady step the improvement pass
started from and ended at) and the cost model's iteration time to the last digit (repr),
and a short hash of all of it. The exact solver is not fingerprinted: it stops on a wall
clock. The DP and the improvement pass count their budgets in work (evaluations), not
seconds, so their plans do not depend on the machine's load.

    .venv/bin/python benchmarks/plan_fingerprints.py [--dp-only] [SKIP ...]
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgepipe.planner.solvers.dp.driver import plan_dp
from edgepipe.planner.solvers.solve import solve

from benchmarks import planner_scaling, solver_vs_dp


def fingerprint(label: str, problem, dp_only: bool = False) -> str:
    if dp_only:
        result = plan_dp(problem, time_limit=3600.0)
        p, status, dp, cost = result.partition, result.status, result.dp_value_ms, result.cost
        head = f"dp={dp!r}"
    else:
        plan = solve(problem, "dp", time_limit=3600.0)
        p, status, cost = plan.partition, plan.solver.status, plan.cost
        start = plan.solver.settings["improve"]["from_steady_ms"]
        head = f"start={start!r} steady={cost.steady_ms!r}"
    stages = ";".join(f"{s.first}-{s.end}:{','.join(s.devices)}={s.samples}" for s in p.stages)
    text = (
        f"{status} B={p.micro_batch_size} M={p.num_micro_batches} [{stages}] "
        f"{head} iter={cost.iteration_ms!r}"
    )
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return f"{digest}  {label}  {text}"


def main() -> None:
    dp_only = "--dp-only" in sys.argv
    # substrings of planner_scaling case names to leave out
    skip = [a for a in sys.argv[1:] if a != "--dp-only"]
    for label, problem in solver_vs_dp.instances():
        print(fingerprint(label, problem, dp_only), flush=True)
    for name, (spec, _, _) in planner_scaling.cases().items():
        if any(s in name for s in skip):
            continue
        print(fingerprint(name, planner_scaling.build(spec), dp_only), flush=True)


if __name__ == "__main__":
    main()
