"""CBC under a limit of a fraction of a second (the exact search's first-pass slices):
pulp raised PulpSolverError when CBC stopped before writing a solution file; such a
solve is now an answer-less ``unknown`` (or whatever CBC found)."""

from __future__ import annotations

from edgepipe.planner import api
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.solvers.classes import device_classes
from edgepipe.planner.solvers.dp.driver import plan_dp
from edgepipe.planner.solvers.exact.backends import solve_pulp
from edgepipe.planner.solvers.exact.bounds import horizon
from edgepipe.planner.solvers.exact.formulation import Builder
from edgepipe.planner.solvers.exact.solutions import solution_hint
from edgepipe.planner.solvers.exact.tables import Tables


def test_a_warm_started_cbc_solve_under_a_tiny_limit_does_not_raise():
    # pipedream-vgg16 on jetson-testbed-6, the DP plan's program with its hint: at
    # 0.05 s pulp raised (seen 1 in 3 limits of 0.01-0.08 s); now each ends in a status
    problem = api.load_problem("pipedream-vgg16", "jetson-testbed-6")
    sizes = problem.config.micro_batch_sizes()
    tables = Tables(problem, CostModel(problem, max(sizes)), device_classes(problem))
    top = horizon(tables, sizes)
    plan = plan_dp(problem).partition
    form = Builder(tables, plan.micro_batch_size, plan.num_stages).build(
        top, top, (), lambda: False
    )
    hint = solution_hint(form, tables, plan)
    for limit in (0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08):
        outcome = solve_pulp(form.model, hint, limit, "cbc")
        assert outcome.status in ("unknown", "feasible", "optimal")
