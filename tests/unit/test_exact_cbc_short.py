"""CBC under a limit of a fraction of a second (the exact search's first-pass slices):
pulp raised PulpSolverError when CBC stopped before writing a solution file; such a
solve is now an answer-less ``unknown`` (or whatever CBC found)."""

from __future__ import annotations

from edgepipe.planner import api
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.solvers.classes import device_classes
from edgepipe.planner.solvers.dp.driver import plan_dp
from edgepipe.planner.solvers.exact.backends import cbc_result, infeasible_proved, solve_pulp
from edgepipe.planner.solvers.exact.bounds import horizon
from edgepipe.planner.solvers.exact.formulation import Builder
from edgepipe.planner.solvers.exact.linear_model import BIN, TIME, Model
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


#: the tail of CBC 2.10.3's log under a 0.03 s limit, two cores busy, on the program
#: above with its warm start (which satisfies it): pulp read the solution file's status
#: as infeasible, so the search took a feasible program for an infeasible one
STOPPED_IN_PRE_PROCESSING = """\
Continuous objective value is 2499.18 - 0.01 seconds
Cgl0000I Cut generators found to be infeasible! (or unbounded)
Pre-processing says infeasible or unbounded
Option for printingOptions changed from normal to all
Total time (CPU seconds):       0.02   (Wallclock seconds):       0.04
"""


def test_an_infeasible_verdict_of_a_run_the_limit_stopped_is_no_answer():
    verdict, _ = cbc_result(STOPPED_IN_PRE_PROCESSING)
    assert verdict == "stopped"  # no "Result - ..." line: CBC itself proved nothing
    # pulp's infeasible from that run (0.04 s of wall against its 0.03 s limit) is no answer
    assert not infeasible_proved(verdict, True, 0.04, 0.03)
    # the same words from a run that ended within its limit are CBC's proof
    assert infeasible_proved(verdict, True, 0.02, 1.0)
    assert infeasible_proved("infeasible", False, 5.0, 1.0)


def test_cbc_still_proves_a_program_with_no_solution_infeasible():
    # x + y >= 3 with x, y binary: no solution, whatever the search does
    md = Model()
    x, y, t = md.var(BIN, 0, 1), md.var(BIN, 0, 1), md.var(TIME, 0, 10)
    md.add({x: 1.0, y: 1.0}, ">=", 3.0, "count")
    md.add({t: 1.0, x: -1.0}, ">=", 0.0, "ms")
    md.objective = t
    assert solve_pulp(md, {}, 5.0, "cbc").status == "infeasible"
