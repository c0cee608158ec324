"""Run one named planner on a problem and score its partition as a :class:`Plan`.

The planners: ``"dp"`` (Asteroid's DP, :mod:`planner.solvers.dp.driver`), ``"milp"``
(the exact solver, :mod:`planner.solvers.exact.solver`) and the baselines of
:mod:`planner.solvers.baselines`. :mod:`planner.api` exports :func:`solve` and
:func:`planners`; :mod:`planner.solvers.comparison` runs them side by side.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.problem import Problem
from edgepipe.planner.partition import Partition
from edgepipe.planner.plan import Plan, SolverInfo, make_plan
from edgepipe.planner.solvers.baselines import BASELINES, plan_baseline
from edgepipe.planner.solvers.dp.driver import plan_dp
from edgepipe.planner.solvers.dp.multilevel import coarse_views
from edgepipe.planner.solvers.dp.one_device import nothing_displaces
from edgepipe.planner.solvers.dp.sizes import DPResult, choose
from edgepipe.planner.solvers.exact.solver import DEFAULT_BACKEND, plan_milp
from edgepipe.planner.solvers.improve import improve as improve_plan
from edgepipe.planner.solvers.time_limit import Deadline, check_time_limit, default_time_limit


def planners() -> list[str]:
    """Names accepted by :func:`solve`: the DP, the exact solver and the baselines."""
    return ["dp", "milp", *BASELINES]


def _with_views(problem: Problem, result: DPResult, left: float) -> Partition:
    """The tie rule's choice among the DP's plans and its coarse views' (granularity never
    costs: :func:`planner.solvers.dp.multilevel.coarse_views`, within ``left`` seconds);
    the views are not planned where a bound shows that no plan could change the choice
    among the DP's own (:func:`planner.solvers.dp.one_device.nothing_displaces`; shown
    already where the DP settled a one-device plan: graph ``none``, which
    :func:`planner.solvers.dp.driver.plan_dp` without a warm start gives only then), nor
    where ``left`` ran out during the bound. The views do not evaluate again a plan the
    DP scored (``known``)."""
    found = [*result.scored, (result.cost, result.partition, 0.0)]
    try:
        settled = result.graph == "none" or nothing_displaces(CostModel(problem), found,
                                                               Deadline(left))  # fmt: skip
    except TimeoutError:
        settled = True  # no time left for the views
    if settled:
        return choose(found)[1]
    views = coarse_views(problem, left, by_class=True, coarse_run=result.coarse_to_fine,
                         known=found)  # fmt: skip
    return choose([*result.scored, *views, (result.cost, result.partition, 0.0)])[1]


def solve(
    problem: Problem,
    solver: str = "dp",
    progress: Callable[[int, int], None] | None = None,
    *,
    backend: str = DEFAULT_BACKEND,
    time_limit: float | None = None,
    multilevel: bool = True,
    improve: bool = True,
    cpu_time_limit: float | None = None,
) -> Plan:
    """Plan ``problem`` with ``solver`` and return the scored :class:`Plan`.

    ``solver``: ``"dp"`` (Asteroid's DP, :mod:`planner.solvers.dp.driver`; past ``time_limit``
    seconds
    it returns its best plan so far with status ``timed_out``), ``"milp"`` (the exact
    solver, :mod:`planner.solvers.exact.solver`, with ``backend`` in cpsat | cbc | highs and a
    wall-clock
    ``time_limit`` in seconds, warm-started from the DP) or a baseline of
    :mod:`planner.solvers.baselines`. ``progress(done, total)`` is called as the DP finishes each
    level of a micro-batch candidate or the exact solver each (micro-batch, stage count)
    program. ``multilevel`` (dp only): plan a model of more than
    ``dp.driver.multilevel_above(problem)`` blocks coarse to fine
    (:mod:`planner.solvers.dp.multilevel`; the default), or on every block.
    ``improve`` (dp only, default on): also plan the chain's coarse views
    (:func:`planner.solvers.dp.multilevel.coarse_views`: a finer import never plans worse
    than a coarser one), take the tie rule's choice among the DP's and the views' plans,
    and polish it by local moves priced by the cost model
    (:func:`planner.solvers.improve.improve`, from that plan and from the DP's, within
    its budget of ``improve.DEFAULT_MAX_EVALUATIONS`` evaluations; what is left of
    ``time_limit`` only stops it early, and the plan then says ``timed_out``); the
    baselines are never improved (they stand for the published algorithms,
    docs/decisions.md).
    ``time_limit`` defaults to :func:`planner.solvers.time_limit.default_time_limit` of
    the cluster's size; ``cpu_time_limit`` (dp and milp) adds a budget of this process's
    CPU seconds: the first limit to run out stops the search. A search stopped by a
    limit says so in the plan (``solver.status`` ``timed_out``, or ``feasible`` with the
    proven ``gap`` for milp; ``settings`` hold how far it got); the library never prints.

    Raises:
        InfeasibleError: nothing fits memory (the message names the binding figure).
        InputError: unknown solver or backend name, or a time limit that is not a finite
            number of seconds above 0.
        TypeError: ``problem`` is not a :class:`Problem`.
    """
    if not isinstance(problem, Problem):
        raise TypeError(f"solve() takes a Problem (api.load_problem), got a "
                        f"{type(problem).__name__}")
    if time_limit is None:
        time_limit = default_time_limit(len(problem.cluster.devices))
    check_time_limit(time_limit)
    if cpu_time_limit is not None:
        check_time_limit(cpu_time_limit, "--cpu-time-limit")
    if solver == "dp":
        deadline = Deadline(time_limit, cpu_time_limit)
        start = time.perf_counter()
        result = plan_dp(problem, progress=progress, time_limit=time_limit,
                         multilevel=multilevel, cpu_time_limit=cpu_time_limit)  # fmt: skip
        partition, cost, polish = result.partition, result.cost, None
        if improve and deadline.left_s() > 0:
            # restarts from the DP's own plan too (local optima differ by start); the
            # pass's budget is evaluations, the deadline (CPU budget's too) a safety stop
            polish = improve_plan(problem, _with_views(problem, result, deadline.left_s()),
                                  starts=[result.partition], time_limit=deadline)  # fmt: skip
            partition, cost = polish.partition, polish.cost
        info = SolverInfo(
            name="dp",
            settings={
                "micro_batch_sizes": problem.config.micro_batch_sizes(),
                "time_limit_s": time_limit,
                "cpu_time_limit_s": cpu_time_limit,
                "sizes_planned": sorted(result.candidates),
                "state_graph": result.graph,
                "coarse_to_fine": result.coarse_to_fine,
                "improve": None if polish is None else polish.summary(),
            },
            solve_time_s=time.perf_counter() - start,
            status="timed_out" if result.status == "timed_out"
            or (polish is not None and polish.status == "time_limit") else "heuristic",
        )
        return make_plan(problem, partition, info, cost=cost)
    if solver == "milp":
        exact = plan_milp(problem, backend=backend, time_limit=time_limit, progress=progress,
                          cpu_time_limit=cpu_time_limit)  # fmt: skip
        info = SolverInfo(
            name="milp",
            settings={
                "backend": exact.backend,
                "time_limit_s": exact.time_limit_s,
                "cpu_time_limit_s": cpu_time_limit,
                "micro_batch_sizes": problem.config.micro_batch_sizes(),
                "warm_start": "dp+improve",
                "warm_start_ms": exact.warm_start_ms,
                "programs": len(exact.subproblems),
                "programs_closed": sum(s.closed for s in exact.subproblems),
                "program_ms": exact.program_ms,
            },
            solve_time_s=exact.solve_time_s,
            status=exact.status,
            objective_bound_ms=exact.bound_ms,
            gap=exact.gap,
        )
        return make_plan(problem, exact.partition, info, cost=exact.cost)
    if solver in BASELINES:
        start = time.perf_counter()
        partition, cost = plan_baseline(problem, solver)
        info = SolverInfo(
            name=solver,
            settings={"micro_batch_sizes": problem.config.micro_batch_sizes()},
            solve_time_s=time.perf_counter() - start,
            status="heuristic",
        )
        return make_plan(problem, partition, info, cost=cost)
    raise InputError("--solver", "", f"unknown solver {solver!r}; available: {planners()}")
