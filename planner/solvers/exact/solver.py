"""The exact planner's driver, :func:`plan_milp`: the search space is the package's
(:mod:`planner.solvers.exact`); this module orders, prunes and runs its programs and
reports the plan with its proof status.

Decomposition: one program per (micro-batch size B, stage count P), P = 1 ..
min(L, N, max_stages); with B and P fixed the micro-batch count M = G/B, the warm-ups
K_p and the schedule's action order are constants. The DP's plan is the first
incumbent and its (B, P) program comes first, the others in the order of their
closed-form bound (the larger of :func:`~planner.solvers.exact.bounds.quick_bound` and
:func:`~planner.solvers.exact.bounds.program_bounds`: within BOUND_SHARE of the time
limit every micro-batch size's programs are tested at the incumbent, then the open
ones' bounds bisected), which also prunes every program that cannot beat the
incumbent; every program carries the incumbent's iteration time as an objective cutoff
(valid: a program never prices a plan above the cost model), so one that cannot beat
it is infeasible. Two programs run at a time (one solver thread each); a first pass
gives every program a short slice (the easy ones close, better incumbents appear
early), a second pass gives the open ones the time left, lowest bound first.

The program of one (B, P) is :mod:`planner.solvers.exact.formulation`; the solvers that
run it are :mod:`planner.solvers.exact.backends`; :mod:`planner.solvers.exact.search`
runs them, the bounds are :mod:`planner.solvers.exact.bounds`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
from edgepipe.planner.cost.model import CostModel, PlanCost
from edgepipe.planner.errors import InfeasibleError, InputError
from edgepipe.planner.inputs.problem import Problem
from edgepipe.planner.partition import Partition
from edgepipe.planner.solvers.classes import device_classes
from edgepipe.planner.solvers.diagnosis import diagnose_infeasible
from edgepipe.planner.solvers.dp.driver import plan_dp
from edgepipe.planner.solvers.exact.bounds import horizon, quick_bound, raise_least, test_at
from edgepipe.planner.solvers.exact.chain_bound import chain_bounds
from edgepipe.planner.solvers.exact.fractional import fractional_bounds
from edgepipe.planner.solvers.exact.search import (
    CUTOFF_SLACK,
    Incumbent,
    ProgramSearch,
    SubProblem,
)
from edgepipe.planner.solvers.exact.stage_bounds import StageBounds
from edgepipe.planner.solvers.exact.tables import Tables
from edgepipe.planner.solvers.improve import improve
from edgepipe.planner.solvers.time_limit import Deadline, check_time_limit

BACKENDS = ("cpsat", "cbc", "highs")

#: the backend used when none is named (fastest on the benchmark suite, docs/planners.md)
DEFAULT_BACKEND = "cpsat"

#: default wall-clock limit of a whole solve, seconds
DEFAULT_TIME_LIMIT = 60.0

#: share of the time limit spread over the first, quick pass over all programs
QUICK_SHARE = 0.25

#: share of the time limit the closed-form bounds
#: (:func:`planner.solvers.exact.bounds.program_bounds`) may take,
#: and the share by which they must have tested every program at the incumbent
BOUND_SHARE = 0.2
TEST_SHARE = 0.5

#: the fractional-cut bounds' bisection tolerances, one round over every size each
FRACTIONAL_TOLS = (1e-2, 1e-3)

#: share of the time limit (the warm start's included) by which the chain bounds
#: (:mod:`planner.solvers.exact.chain_bound`) of every micro-batch size must be done:
#: TEST_SHARE, the time the min-max bound had for the sizes the chain bound tests
#: (issue 29, session 21: 0.35 left the chain bound unfinished under load on the
#: fine suite's mixed clusters, its only proof there)
CHAIN_SHARE = 0.5

#: share of the time limits the warm start's DP may take
WARM_SHARE = 0.2


@dataclass(frozen=True)
class MILPResult:
    """The exact planner's plan, its cost-model figures and its proof status.

    ``status``: ``optimal`` (every program closed), ``feasible`` (time limit hit; every
    open program has a lower bound, at least its closed-form one, so ``bound_ms`` and
    ``gap`` are valid), ``timed_out`` (some program without a bound: no global bound; not
    reached while every program has a quick bound). ``bound_ms`` and
    ``gap`` = (iteration - bound) / iteration are in the cost model's figure (the
    programs relax it). ``program_ms``: the value the program gave the returned plan,
    beside its cost-model ``cost.iteration_ms`` (equal where the rows are exact)."""

    partition: Partition
    cost: PlanCost
    status: str
    bound_ms: float | None
    gap: float | None
    solve_time_s: float
    backend: str
    time_limit_s: float
    warm_start_ms: float | None
    subproblems: tuple[SubProblem, ...]
    program_ms: float | None = None  # the program's value of the plan (None: the warm start)


def plan_milp(
    problem: Problem,
    backend: str = DEFAULT_BACKEND,
    time_limit: float = DEFAULT_TIME_LIMIT,
    warm_start: Partition | None = None,
    progress: Callable[[int, int], None] | None = None,
    cpu_time_limit: float | None = None,
) -> MILPResult:
    """Best partition over the exact planner's space (:mod:`planner.solvers.exact`).

    Args:
        problem: the inputs.
        backend: ``cpsat``, ``cbc`` or ``highs``.
        time_limit: wall-clock seconds for everything: the warm start's DP, the
            tables, the closed-form bounds and the programs.
        warm_start: an initial plan; default: the DP's plan, improved by the local
            pass (:func:`_warm_start`, within ``WARM_SHARE`` of the limits).
        cpu_time_limit: optionally, this process's CPU seconds (solver threads included)
            as a second limit; the first to run out stops the search
            (:class:`~planner.solvers.time_limit.Deadline`).
        progress: optional ``callback(closed, total)`` after each attempt at a (B, P)
            program: how many of the ``total`` programs are closed (solved or proven
            unable to beat the incumbent).

    Raises:
        InputError: unknown backend, or a time limit that is not a finite number of
            seconds above 0 (:func:`planner.solvers.time_limit.check_time_limit`).
        InfeasibleError: no plan fits memory (proven: every program infeasible; the
            message names the binding figure) or none was found within the time limit
            (constraint ``time_limit``).
    """
    if backend not in BACKENDS:
        raise InputError(
            "--backend", "", f"unknown backend {backend!r}; available: {list(BACKENDS)}"
        )
    check_time_limit(time_limit)
    if cpu_time_limit is not None:
        check_time_limit(cpu_time_limit, "--cpu-time-limit")
    start = time.perf_counter()
    deadline = Deadline(time_limit, cpu_time_limit)
    sizes = problem.config.micro_batch_sizes()
    cm = CostModel(problem, max(sizes))
    if warm_start is None:
        warm_start = _warm_start(problem, cm, deadline)
    best = _warm_incumbent(cm, warm_start)
    warm_ms = best[0] if best else None

    tables = Tables(problem, cm, device_classes(problem))
    max_p = min(problem.model.num_blocks, len(problem.cluster.devices))
    if problem.config.max_stages:
        max_p = min(max_p, problem.config.max_stages)
    first = (warm_start.micro_batch_size, warm_start.num_stages) if warm_start else None
    quick = _closed_form_bounds(tables, sizes, max_p, best, deadline)
    jobs = sorted(quick, key=lambda j: (j != first, quick[j], j[0], j[1]))
    pruned = [
        SubProblem(*j, "pruned", None, quick[j], 0.0)
        for j in jobs
        if best is not None and quick[j] >= best[0] * (1 + CUTOFF_SLACK)
    ]
    jobs = [j for j in jobs if not any((s.batch, s.num_stages) == j for s in pruned)]
    search = ProgramSearch(tables, backend, deadline, best, horizon(tables, sizes))
    slice_s = min(max(QUICK_SHARE * deadline.left_s() / max(len(jobs), 1), 0.05), 2.0)
    done = [
        replace(s, bound_ms=max(s.bound_ms or 0.0, quick[s.batch, s.num_stages]))
        if not s.closed
        else s
        for s in search.run(jobs, slice_s, progress)
    ] + pruned
    best = search.best
    elapsed = time.perf_counter() - start
    if best is None:
        if all(s.closed for s in done):
            raise diagnose_infeasible(problem)
        raise InfeasibleError(
            f"no plan that fits memory was found within the time limit of {time_limit:g} s "
            "(infeasibility is not proven); raise the time limit",
            "time_limit",
        )
    value, partition, cost, program = best
    status, bound = _proof(value, done)
    gap = None if bound is None else max(0.0, (value - bound) / value)
    return MILPResult(
        partition,
        cost,
        status,
        bound,
        gap,
        elapsed,
        backend,
        time_limit,
        warm_ms,
        tuple(done),
        program,
    )


def _warm_start(problem: Problem, cm: CostModel, deadline: Deadline) -> Partition | None:
    """The default warm start, within ``WARM_SHARE`` of the ``deadline``'s limits: the
    DP's plan polished by the local improvement pass (:mod:`planner.solvers.improve`;
    it ranks by the steady step, this solver by the iteration, so the faster iteration of
    the two), None when the DP finds nothing that fits memory."""
    share = deadline.share(WARM_SHARE)
    cpu = None if deadline.cpu_s is None else WARM_SHARE * deadline.cpu_s
    try:
        plan = plan_dp(problem, time_limit=WARM_SHARE * deadline.wall_s,
                       cpu_time_limit=cpu).partition  # fmt: skip
    except InfeasibleError:
        return None
    if (left := share.left_s()) > 0:
        polished = improve(problem, plan, time_limit=left, cost_model=cm)
        if polished.cost.iteration_ms < cm.evaluate(plan).iteration_ms:
            plan = polished.partition
    return plan


def _warm_incumbent(cm: CostModel, warm_start: Partition | None) -> Incumbent | None:
    """The first incumbent: the warm start with its cost-model figure, if it fits memory."""
    if warm_start is not None:
        cost = cm.evaluate(warm_start)
        if cost.memory_ok:
            return (cost.iteration_ms, warm_start, cost, None)
    return None


def _closed_form_bounds(
    tables: Tables,
    sizes: list[int],
    max_p: int,
    best: Incumbent | None,
    deadline: Deadline,
) -> dict[tuple[int, int], float]:
    """Per (B, P) program (B in ``sizes``, P <= ``max_p``) a lower bound on its plans'
    cost-model figure: the larger of :func:`quick_bound` and, with an incumbent, the
    fractional-cut bound of :mod:`planner.solvers.exact.fractional` (milliseconds per
    size, computed first), the chain bound of :mod:`planner.solvers.exact.chain_bound`
    (by CHAIN_SHARE of the ``deadline``'s limits) and the min-max bound of
    :func:`planner.solvers.exact.bounds.program_bounds`, which gets BOUND_SHARE of the
    ``deadline``'s limits: first every micro-batch size's tables are built and tested at
    the incumbent (what prunes; a size whose tables are not built in time keeps its
    earlier bounds), then the open programs' bounds are bisected, one step for every size
    in turn. The sizes the chain bound did not test come first and have until TEST_SHARE
    (what is left of it: none where the chain bound ran to its own share, which ends
    there too); the sizes it tested only until BOUND_SHARE. Why: there the min-max bound adds only
    what memory binds (its sample caps; the chain bound relaxes memory), while its
    O(L^2) tables took 4-9 CPU s per size at 257 blocks: on the fine suite it ran to
    TEST_SHARE (30 s of 60) in each of six instances and raised no program below the
    incumbent, time the programs' solver then lacked (issue 29, session 21)."""
    jobs = [(b, p) for b in sizes for p in range(1, max_p + 1)]
    quick = {j: quick_bound(tables, *j) for j in jobs}
    known = {b: np.array([0.0, *(quick[b, p] for p in range(1, max_p + 1))]) for b in sizes}
    if best is not None:
        ceiling = best[0] * (1 + CUTOFF_SLACK)
        tested, until = deadline.share(TEST_SHARE), deadline.share(BOUND_SHARE)
        # the cheap relaxation first (no table over block pairs), coarse for every size,
        # then finer: the global bound is the least of them
        for tol in FRACTIONAL_TOLS:
            for b in sizes:
                fractional_bounds(tables, b, max_p, known[b], ceiling, tested, tol)
        # integer cuts, the later stages' round trip stage by stage (O(L^2) tables: only
        # where they fit CHAIN_BYTES)
        chained = chain_bounds(tables, known, max_p, ceiling, deadline.share(CHAIN_SHARE))
        searches = []
        for b in sorted(sizes, key=lambda b: b in chained):  # those it did not test first
            by = until if b in chained else tested
            if not by.passed():
                try:
                    bounds = StageBounds(tables, b, max_p, by)
                except TimeoutError:
                    continue
                if bounds.stages:
                    searches.append((bounds, known[b], test_at(bounds, known[b], ceiling, by)))
        raise_least(searches, until)
    return {j: max(quick[j], float(known[j[0]][j[1]])) for j in jobs}


def _proof(value: float, done: list[SubProblem]) -> tuple[str, float | None]:
    """The search's status and bound (:class:`MILPResult`) from its programs' results."""
    if all(s.closed for s in done):
        return "optimal", value
    open_bounds = [s.bound_ms for s in done if not s.closed]
    known = [b for b in open_bounds if b is not None]
    if len(known) < len(open_bounds):
        return "timed_out", None
    # every program's bound is a lower bound on the cost-model figure of the plans it
    # has not excluded (the rows relax the cost model), so the gap is one of the
    # reported iteration time
    return "feasible", min([value, *known])
