"""The exact planner: a mixed-integer program over a larger space than the DP's.

Search space (larger than :mod:`planner.solvers.dp.driver`'s): any device may serve any stage in any
order (no fixed device order, no contiguous device runs), stages take contiguous block
ranges, every device of a stage takes an integer number of samples >= 1 of each
micro-batch (devices may stay idle), the micro-batch size comes from the candidates, and
every device must fit its stage's weights, gradients, optimizer state and K_p in-flight
micro-batches of activations (Eq. 3, K_p from :meth:`TrainingConfig.warmup_depth`)
plus, with ring replication on, the replica it holds (:mod:`planner.replan.replicas`).
Every figure is the one of :mod:`planner.cost.model`. The programs' rows price a plan at or
below the cost model's iteration time (``PlanCost.iteration_ms``), equal on the class of
plans :mod:`planner.solvers.exact.formulation` names, so a program's bound is a bound on the cost
model's figure. Incumbents, the cutoff, the bound and the gap are all in that figure; a
solution is re-scored by the cost model, and a program counts as solved only when its
optimum's re-scored figure equals the program's value; a solution it priced too low is
excluded (a no-good cut) and the program solved again.

Symmetry: devices with the same type, usable memory and slowdown and no per-pair link
override are interchangeable (same times, memory and network figures), so they form a
*class* k with ``count_k`` members and the program counts devices per (stage, class,
samples) instead of naming them: a plan and every renaming of devices within their
classes are one assignment of the decision variables (block cuts, counts, replica
holder), so the search has no symmetric copies to break, and its size does not grow
with the class counts. A device with a per-pair link override is a class of
its own, which keeps every network figure a function of the classes involved.

Decomposition: one program per (micro-batch size B, stage count P), P = 1 ..
min(L, N, max_stages); with B and P fixed the micro-batch count M = G/B, the warm-ups
K_p and the schedule's action order are constants. The DP's plan is the first
incumbent and its (B, P) program comes first, the others in the order of their closed-form
bound (the larger of :func:`quick_bound` and :func:`program_bounds`: within BOUND_SHARE
of the time limit every micro-batch size's programs are tested at the incumbent, then
the open ones' bounds bisected), which also prunes every program that cannot beat the
incumbent; every program carries the incumbent's
iteration time as an objective cutoff (valid: a program never prices a plan above the
cost model), so one that cannot beat it is infeasible. Two programs run at a time (one
solver thread each); a first pass gives every program a short slice (the easy ones
close, better incumbents appear early), a second pass gives
the open ones the time left, lowest bound first.

The program of one (B, P) is :mod:`planner.solvers.exact.formulation`; the solvers that run it
are :mod:`planner.solvers.exact.backends`; this module is the search driver over all programs.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace

import numpy as np
from edgepipe.planner.cost.model import CostModel, PlanCost, samples_that_fit
from edgepipe.planner.errors import InfeasibleError, InputError
from edgepipe.planner.inputs.problem import Problem
from edgepipe.planner.partition import Partition
from edgepipe.planner.solvers.classes import device_classes
from edgepipe.planner.solvers.diagnosis import diagnose_infeasible
from edgepipe.planner.solvers.dp.driver import plan_dp
from edgepipe.planner.solvers.exact.backends import HighsWorkers, solve_cpsat, solve_pulp
from edgepipe.planner.solvers.exact.formulation import (
    Builder,
    Tables,
    decision,
    extract,
    solution_hint,
    stage_orders,
)

BACKENDS = ("cpsat", "cbc", "highs")

#: the backend used when none is named (fastest on the benchmark suite, docs/planners.md)
DEFAULT_BACKEND = "cpsat"

#: default wall-clock limit of a whole solve, seconds
DEFAULT_TIME_LIMIT = 60.0

#: CP-SAT time resolution: the incumbent is about this many integer time units
CPSAT_UNITS = 1e8

#: an incumbent must improve by more than this relative amount to replace the last one
IMPROVEMENT = 1e-9

#: programs solved at the same time (one solver thread each)
PARALLEL = 2

#: share of the time limit spread over the first, quick pass over all programs
QUICK_SHARE = 0.25

#: the objective cutoff sits this far (relative) above the incumbent, so that CP-SAT's
#: rounded times cannot cut off the incumbent's own program
CUTOFF_SLACK = 1e-4

#: share of the time limit the closed-form bounds (:func:`program_bounds`) may take,
#: and the share by which they must have tested every program at the incumbent
BOUND_SHARE = 0.2
TEST_SHARE = 0.5

#: the class-vector DP of :func:`program_bounds` keeps at most about this many (state,
#: stage composition) pairs; classes of similar speed merge until it fits
BOUND_STATES = 8192

#: a solution's cost-model figure within this (relative) of the program's value counts
#: as equal (CP-SAT's time resolution, milp_backends)
EXACT = 1e-4


# --------------------------------------------------------------------------------------
# the planner
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SubProblem:
    """What happened to the program of one (micro-batch size, stage count).

    ``best_ms``: the least cost-model iteration time of the plans read from its
    solutions; ``bound_ms``: the solver's lower bound on the program's optimum, which is
    a lower bound on the cost-model iteration time of every plan of its space not yet
    evaluated (the program's rows are a relaxation, :mod:`planner.solvers.exact.formulation`);
    ``program_ms``: the program's own value of its last solution (equal to that plan's
    cost-model figure where the rows are exact, below it where they relax);
    ``excluded``: plans evaluated and then excluded by a no-good cut."""

    batch: int
    num_stages: int
    # optimal | feasible | infeasible (cannot beat the incumbent) | unknown | skipped
    # (time was up) | pruned (its closed-form bound alone cannot beat the incumbent)
    status: str
    best_ms: float | None
    bound_ms: float | None
    solve_time_s: float
    program_ms: float | None = None
    excluded: int = 0

    @property
    def closed(self) -> bool:
        """Solved to optimality, or proven unable to beat the incumbent."""
        return self.status in ("optimal", "infeasible", "pruned")


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


class _Search:
    """Runs the (B, P) programs, PARALLEL at a time (each solver call releases the GIL;
    CBC runs as a subprocess, HiGHS in worker processes), sharing the incumbent: a
    program is built with the incumbent's value at its start as cutoff, and an
    improving solution, re-scored by the cost model, replaces the incumbent at once."""

    def __init__(
        self,
        tables: Tables,
        backend: str,
        deadline: float,
        best: tuple[float, Partition, PlanCost, float | None] | None,
        horizon: float,
    ) -> None:
        self.tables, self.backend, self.deadline, self.horizon = tables, backend, deadline, horizon
        self.best = best
        self.excluded: dict[tuple[int, int], list[dict[int, float]]] = {}
        self.lock = threading.Lock()
        self.highs: HighsWorkers | None = None  # set while run() uses the highs backend

    def attempt(self, job: tuple[int, int], cap: float, before: SubProblem | None) -> SubProblem:
        """Solve program ``job`` for at most ``cap`` seconds (and never past the
        deadline); ``before`` is its result from an earlier pass.

        Loop: solve the program under the incumbent's cutoff; re-score the solution by
        the cost model (it may become the incumbent). If the solver proved it optimal
        and the cost model's figure equals the program's value (within EXACT), the
        program is solved: no plan of its space is faster. If the figure is higher (a
        relaxed row was loose for that plan), exclude the plan (:func:`no_good`) and
        solve again: the remaining plans' bound can only rise."""
        t0 = time.perf_counter()
        stop = min(t0 + cap, self.deadline)
        if stop - t0 <= 0:
            return before or SubProblem(*job, "skipped", None, None, 0.0)
        found = before.best_ms if before else None
        program = before.program_ms if before else None
        outcome_status, bound = (before.status, before.bound_ms) if before else ("unknown", None)
        excluded = self.excluded.setdefault(job, [])
        while (limit := stop - time.perf_counter()) > 0:
            with self.lock:
                best = self.best
            ref = best[0] if best else self.horizon
            form = Builder(self.tables, *job).build(
                ref * (1 + CUTOFF_SLACK), self.horizon, tuple(excluded)
            )
            hint = {}
            if best and (best[1].micro_batch_size, best[1].num_stages) == job:
                hint = solution_hint(form, self.tables, best[1])
            if self.backend == "cpsat":
                outcome = solve_cpsat(form.model, hint, limit, CPSAT_UNITS / ref)
            elif self.highs is not None:
                outcome = self.highs.solve(form.model, hint, limit)
            else:
                outcome = solve_pulp(form.model, hint, limit, self.backend)
            outcome_status, bound = outcome.status, outcome.bound_ms
            if outcome.values is None:
                break
            partition = extract(form, self.tables, outcome.values)
            cost = self.tables.cm.evaluate(partition)
            program = outcome.values[form.model.objective]
            if cost.memory_ok:
                found = cost.iteration_ms if found is None else min(found, cost.iteration_ms)
                with self.lock:
                    if self.best is None or cost.iteration_ms < self.best[0] * (1 - IMPROVEMENT):
                        self.best = (cost.iteration_ms, partition, cost, program)
            if outcome.status != "optimal":
                break
            if cost.memory_ok and cost.iteration_ms <= program * (1 + EXACT):
                break  # the program's optimum, and the cost model agrees: solved
            outcome_status = "feasible"  # not proven until the loose plan is excluded
            excluded.append(decision(form, outcome.values))
        spent = time.perf_counter() - t0 + (before.solve_time_s if before else 0.0)
        return SubProblem(*job, outcome_status, found, bound, spent, program, len(excluded))

    def run(
        self,
        jobs: list[tuple[int, int]],
        quick: float,
        progress: Callable[[int, int], None] | None,
    ) -> list[SubProblem]:
        """Pass 1 gives every program a short slice ``quick`` (closing the easy ones and
        improving the incumbent early, which strengthens the cutoff of every later
        proof); pass 2 gives the open ones the time left, lowest bound first."""
        results: dict[tuple[int, int], SubProblem] = {}
        order = jobs
        workers = HighsWorkers(PARALLEL) if self.backend == "highs" else None
        self.highs = workers
        with workers or contextlib.nullcontext(), ThreadPoolExecutor(max_workers=PARALLEL) as pool:
            for cap in (quick, math.inf):
                futures = {pool.submit(self.attempt, j, cap, results.get(j)): j for j in order}
                for future in as_completed(futures):
                    results[futures[future]] = future.result()
                    if progress is not None:
                        progress(sum(r.closed for r in results.values()), len(jobs))
                order = sorted(
                    (j for j in jobs if not results[j].closed),
                    key=lambda j: results[j].bound_ms or 0.0,
                )
        return [results[j] for j in jobs]


def plan_milp(
    problem: Problem,
    backend: str = DEFAULT_BACKEND,
    time_limit: float = DEFAULT_TIME_LIMIT,
    warm_start: Partition | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> MILPResult:
    """Best partition over the exact planner's space (module docstring).

    Args:
        problem: the inputs.
        backend: ``cpsat``, ``cbc`` or ``highs``.
        time_limit: wall-clock seconds for the whole search (all programs together).
        warm_start: an initial plan; default: the DP's plan (if the DP finds one).
        progress: optional ``callback(closed, total)`` after each attempt at a (B, P)
            program: how many of the ``total`` programs are closed (solved or proven
            unable to beat the incumbent).

    Raises:
        InputError: unknown backend or a non-positive time limit.
        InfeasibleError: no plan fits memory (proven: every program infeasible; the
            message names the binding figure) or none was found within the time limit
            (constraint ``time_limit``).
    """
    if backend not in BACKENDS:
        raise InputError(
            "--backend", "", f"unknown backend {backend!r}; available: {list(BACKENDS)}"
        )
    if not time_limit > 0:
        raise InputError("--time-limit", "", f"must be positive seconds, got {time_limit!r}")
    start = time.perf_counter()
    deadline = start + time_limit
    sizes = problem.config.micro_batch_sizes()
    cm = CostModel(problem, max(sizes))
    if warm_start is None:
        try:
            warm_start = plan_dp(problem).partition
        except InfeasibleError:
            warm_start = None
    best: tuple[float, Partition, PlanCost, float | None] | None = None
    if warm_start is not None:
        cost = cm.evaluate(warm_start)
        if cost.memory_ok:
            best = (cost.iteration_ms, warm_start, cost, None)
    warm_ms = best[0] if best else None

    tables = Tables(problem, cm, device_classes(problem))
    max_p = min(problem.model.num_blocks, len(problem.cluster.devices))
    if problem.config.max_stages:
        max_p = min(max_p, problem.config.max_stages)
    jobs = [(b, p) for b in sizes for p in range(1, max_p + 1)]
    first = (warm_start.micro_batch_size, warm_start.num_stages) if warm_start else None
    quick = {j: quick_bound(tables, *j) for j in jobs}
    known = {b: np.array([0.0, *(quick[b, p] for p in range(1, max_p + 1))]) for b in sizes}
    if best is not None:
        # the closed-form bounds (program_bounds) get BOUND_SHARE of the time: first
        # every micro-batch size is tested at the incumbent (what prunes), then the open
        # programs' bounds are bisected, one step for every size in turn
        ceiling = best[0] * (1 + CUTOFF_SLACK)
        tested = start + TEST_SHARE * time_limit
        until = start + BOUND_SHARE * time_limit
        searches = []
        for b in sizes:
            if time.perf_counter() < tested:
                bounds = StageBounds(tables, b, max_p)
                if bounds.stages:
                    searches.append((bounds, known[b], test_at(bounds, known[b], ceiling, tested)))
        raise_least(searches, until)
    quick = {j: max(quick[j], float(known[j[0]][j[1]])) for j in jobs}
    jobs.sort(key=lambda j: (j != first, quick[j], j[0], j[1]))
    pruned = [
        SubProblem(*j, "pruned", None, quick[j], 0.0)
        for j in jobs
        if best is not None and quick[j] >= best[0] * (1 + CUTOFF_SLACK)
    ]
    jobs = [j for j in jobs if not any((s.batch, s.num_stages) == j for s in pruned)]
    search = _Search(tables, backend, deadline, best, _horizon(tables, sizes))
    slice_s = min(max(QUICK_SHARE * time_limit / max(len(jobs), 1), 0.05), 2.0)
    done = [
        replace(s, bound_ms=max(s.bound_ms or 0.0, quick[s.batch, s.num_stages]))
        if not s.closed
        else s
        for s in search.run(jobs, slice_s, progress)
    ] + pruned
    best = search.best
    elapsed = time.perf_counter() - start
    closed = all(s.closed for s in done)
    if best is None:
        if closed:
            raise diagnose_infeasible(problem)
        raise InfeasibleError(
            f"no plan that fits memory was found within the time limit of {time_limit:g} s "
            "(infeasibility is not proven); raise the time limit",
            "time_limit",
        )
    value, partition, cost, program = best
    if closed:
        status, bound = "optimal", value
    else:
        open_bounds = [s.bound_ms for s in done if not s.closed]
        if any(b is None for b in open_bounds):
            status, bound = "timed_out", None
        else:
            # every program's bound is a lower bound on the cost-model figure of the
            # plans it has not excluded (the rows relax the cost model), so the gap is
            # one of the reported iteration time
            status, bound = "feasible", min([value, *open_bounds])  # type: ignore[list-item]
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


def quick_bound(tables: Tables, batch: int, num_stages: int) -> float:
    """A lower bound on the cost model's iteration time of every plan with micro-batch
    ``batch`` and ``num_stages`` stages, without a solver (what a program that got no
    bound of its own reports, and what prunes programs that cannot beat the incumbent):

        work: every device runs its M forwards and M backwards one after the other, so
              T >= M (t_f + t_b)(d) >= M y_d s_p for each device d of stage p, with s_p
              the stage's least per-sample time (sum over its blocks of the least
              (t_f + t_b)(l, k, y) / y over classes k and y <= B); the slowest device of
              a stage is at least the average, T >= G s_p / g_p for every p, and the
              largest of these ratios is at least G sum_p s_p / sum_p g_p >= G S / N
              (S = the least per-sample time of the whole model, N devices);
        fill: micro-batch 0 goes forward through every stage and back, each block at
              its least time at some y <= B, and crosses each of the P - 1 boundaries
              twice, at least one sample of the smallest boundary at the fastest pair
              plus the least latency.

    O(K L B)."""
    problem = tables.problem
    g_batch = problem.config.global_batch
    ys = np.arange(1, batch + 1)
    per_block = [
        (tf[:, 1 : batch + 1] + tb[:, 1 : batch + 1])
        for tf, tb in zip(tables.tf, tables.tb, strict=True)
    ]
    per_sample = np.min([(t / ys).min(axis=1) for t in per_block], axis=0)
    work = g_batch * float(per_sample.sum()) / tables.n_devices
    least = np.min([t.min(axis=1) for t in per_block], axis=0)
    hop = tables.lat_lo + tables.v_lo * float(tables.boundary[:-1].min(initial=0.0))
    fill = float(least.sum()) + 2.0 * (num_stages - 1) * hop
    return max(work, fill)


def bound_groups(tables: Tables, batch: int) -> list[list[int]]:
    """The classes :func:`program_bounds` keeps apart: groups of classes (indices into
    ``tables.classes``), in order of speed (least per-sample time over the whole model,
    y <= ``batch``). The bound's DP state counts the devices used per group, so it has
    prod(count_j + 1) states and a stage one of the group compositions (g_j <= count_j,
    1 <= sum g_j <= min(B, N)); while their product exceeds :data:`BOUND_STATES`, the two
    adjacent groups of the closest speeds merge (a merged group counts its devices
    together and prices them at its fastest member's times: a relaxation). One group is
    the device-count DP. O(K^2 + BOUND_STATES)."""
    classes = tables.classes
    ys = np.arange(1, batch + 1)
    speed = [
        float(((tf[:, 1 : batch + 1] + tb[:, 1 : batch + 1]).sum(axis=0) / ys).min())
        for tf, tb in zip(tables.tf, tables.tb, strict=True)
    ]
    groups = [[k] for k in sorted(range(len(classes)), key=lambda k: speed[k])]
    gmax = min(batch, tables.n_devices)

    def size(parts: list[list[int]]) -> float:
        counts = [sum(classes[k].count for k in part) for part in parts]
        states = math.prod(c + 1 for c in counts)
        if len(parts) == 1 or states > BOUND_STATES:
            return states * (gmax if len(parts) == 1 else BOUND_STATES)
        return states * len(compositions(counts, gmax))

    while len(groups) > 1 and size(groups) > BOUND_STATES:
        i = min(
            range(len(groups) - 1),
            key=lambda i: speed[groups[i + 1][0]] / max(speed[groups[i][-1]], 1e-300),
        )
        groups[i : i + 2] = [groups[i] + groups[i + 1]]
    return groups


def compositions(counts: list[int], most: int) -> list[tuple[int, ...]]:
    """Every (g_1 .. g_J) with 0 <= g_j <= counts[j] and 1 <= sum <= ``most``."""
    return [g for g in itertools.product(*(range(c + 1) for c in counts)) if 1 <= sum(g) <= most]


def program_bounds(
    tables: Tables,
    batch: int,
    max_stages: int,
    ceiling: float | None = None,
    rel_tol: float = 1e-3,
    known: np.ndarray | None = None,
    deadline: float = math.inf,
) -> np.ndarray:
    """Lower bounds on the cost model's iteration time of every plan with micro-batch
    ``batch`` and P = 1 .. ``max_stages`` stages (entry P; entry 0 unused), from a
    min-max over block partitions and per-class device counts, without a solver.

    ``known``: valid lower bounds already known (entry P), where the bisection starts; an
    entry at or above ``ceiling`` (what pruning needs) only says so; the others are
    within ``rel_tol`` (relative) below the min-max, or wherever the bisection stood at
    ``deadline`` (``time.perf_counter()``): every returned entry is a valid bound.

    Per stage q of blocks [a, b) served by g_j devices of class group j
    (:func:`bound_groups`; every device takes >= 1 sample, so 1 <= g = sum g_j <= B; a
    device of group j fits at most y_j samples (Eq. 3, one micro-batch in flight, the
    group's largest budget, no replica), so sum g_j y_j >= B), take any sample j of a
    micro-batch and the device d(j) of stage q that holds it (the same for every
    micro-batch: the slicing is fixed). The round ends no earlier than

        fill_f(j) + work(d(j)) + max(ring, fill_b(j)):

    fill: before d(j)'s first forward, sample j's piece went through every earlier
          stage i on the device d_i(j) that holds it there (its forward of that
          micro-batch) and over every cut (a hop each: at least one sample at the
          fastest pair plus the least latency; the cut at a exactly); after d(j)'s last
          backward its gradient goes down the same way (backward times, the same hops);
        work: d(j) runs M forwards and M backwards one after the other;
        ring: after the last member's last backward, each member's 2(g - 1) ring steps
          (§3.3) follow one another, each a chunk W / g at the fastest pair plus the
          least latency (fair sharing only slows a transfer);
        sent: a channel gives at most one ms of channel time per ms
          (:func:`planner.cost.model.fair_shares`), and a device sends nothing before its first
          forward ends. A device of y samples sends M y samples of each of the stage's
          boundaries (activations forward, gradients back) and 2(g - 1) ring chunks: on a
          switch all on its own uplink (the largest of g uplinks at least M B / g samples'
          worth plus the chunks), on a shared medium every device's on the one medium (the
          stage's total); on point-to-point links a device's pairs run in parallel (0).

    Averaging over the B samples j (the bound holds for each, so for their mean): a
    device d of stage i with y_d samples holds y_d of them, and its time is at least
    y_d s_d (s_d: its group's least per-sample time over y <= B for the stage's blocks)
    and at least its group's least per-micro-batch time l_d, so the mean of t(d(j)) is
    at least

        mean(s, l) = max(B / sum_j (g_j / s_j),  ybar(g) min s_j,  min l_j)

    (the first: sum_d y_d^2 s_d / B is least with y_d proportional to 1 / s_d; the
    second: every device at the fastest group's rate, ybar(g) = (r (k + 1)^2 +
    (g - r) k^2) / B with B = k g + r the least sum of squares of g positive integers
    summing to B; minima over the groups present). So a stage i contributes
    c_i = mean(s_f, l_f) + mean(s_b, l_b) to the fill of every later stage, and its own
    term is the largest of

        C_q + 2 hops_q + M mean(s, l)                 (the backward branch)
        F_q + hops_q + M mean(s, l) + ring            (the ring branch)
        F_q + hops_q + sent                           (the channel branch)
        C'_q + max_m (f_m mean(s_f, l_f) + b_m mean(s_b, l_b)) + 2 (P - 1) hops
                                                      (the round-trip branch)

    The round trip: d(j) runs, before and including F(m), and from B(m) on, f_m forwards
    and b_m backwards (counted in the stage's action list of the schedule,
    :func:`planner.solvers.exact.formulation.stage_orders`), and between F(m) and B(m) sample j of
    micro-batch m goes through every later stage and back; with j's way in and out,
    every other stage's c_i is on that path: C'_q = sum_{i != q} c_i, the stages before
    q from the DP's state, those after at least the least fill of any partition of the
    blocks left into the stages left with the devices left (a min-sum DP backwards,
    ``suffix``); the hops of all 2 (P - 1) crossings (the cuts at a and b exactly).

    with C_q = sum_{i < q} c_i and F_q >= max(the per-block least forward times of the
    blocks before a, alpha C_q), alpha = rho / (1 + rho), rho the least forward /
    backward ratio of s_j and of l_j over the stage ranges and groups (so that the
    backward part of c_i is at most its forward part / rho). A plan's time is at least
    its largest stage term. The least over partitions (sum over stages of g_j <=
    count_j) of that largest term is found by bisection on T: for a target T, a DP over
    (block prefix b, devices used per group n, stages p) keeps the least fill C of a
    prefix whose stage terms are all <= T (a larger fill never helps a later stage),
    and T is feasible for P when some state (L, n, P) is reached:

        C_p(b, n) = min over a < b, compositions g <= n with every term of stage
            (a, b, g) at C_{p-1}(a, n - g) <= T of C_{p-1}(a, n - g) + c(a, b, g),
        C_0(0, 0) = 0;  suffix_r(a, n) = min over b > a, g <= counts - n of
            c(a, b, g) + suffix_{r-1}(b, n + g), suffix_0(L, n) = 0.

    O(log(1 / rel_tol) P L^2 S G) array work (S states, G compositions, S G <=
    :data:`BOUND_STATES` beside the device-count DP's (N + 1) min(B, N)): one DP pass per
    bisection step, all P together, vectorised over (b, states, compositions)."""
    out = np.full(max_stages + 1, np.inf)
    bounds = StageBounds(tables, batch, max_stages)
    if not bounds.stages or max_stages < 1:
        return out
    lo = np.zeros(max_stages + 1)
    if known is not None:
        lo[1:] = np.maximum(known[1 : max_stages + 1], 0.0)
    if ceiling is not None:
        hi = test_at(bounds, lo, ceiling, deadline)
    else:
        every = list(range(1, max_stages + 1))
        try:
            structural = bounds.feasible(every, np.full(max_stages, 1e300), deadline)
        except TimeoutError:
            out[1:] = lo[1:]
            return out
        hi = np.full(max_stages + 1, np.inf)
        hi[0] = np.nan
        lo[1:][~structural] = np.inf  # no partition fits memory
        hi[1:][~structural] = np.nan
        guess = max(_horizon(tables, [batch]), 1.0)
        while (sel := np.isinf(hi)).any():  # an upper end: double a guess
            targets = [int(t) for t in np.flatnonzero(sel)]
            try:
                ok = bounds.feasible(targets, np.full(len(targets), guess), deadline)
            except TimeoutError:
                out[1:] = lo[1:]
                return out
            idx = np.flatnonzero(sel)
            hi[idx[ok]] = guess
            lo[idx[~ok]] = guess
            guess *= 2.0
    bisect_bounds(bounds, lo, hi, rel_tol, deadline)
    out[1:] = lo[1:]
    return out


class StageBounds:
    """The tables and the feasibility DP of :func:`program_bounds` for one micro-batch
    size (its docstring has the terms, the recurrence and the complexity); built once,
    then :meth:`feasible` answers "is every stage term of some partition into P stages
    <= T?" for several (P, T) at a time."""

    def __init__(self, tables: Tables, batch: int, max_stages: int) -> None:
        problem, cm = tables.problem, tables.cm
        self.n_blocks = n_blocks = tables.n_blocks
        self.max_stages = max_stages
        self.problem, self.batch = problem, batch
        m_count = problem.config.global_batch // batch
        gmax = min(batch, tables.n_devices)
        cols = slice(1, batch + 1)
        ys = np.arange(1, batch + 1, dtype=float)
        zero = np.zeros((1, batch))
        groups = bound_groups(tables, batch)
        counts = [sum(tables.classes[k].count for k in grp) for grp in groups]
        comps = np.array(compositions(counts, gmax), dtype=np.int64).reshape(-1, len(groups))
        present = comps > 0
        size = comps.sum(axis=1)  # g of each composition
        radix = np.cumprod([1, *(c + 1 for c in counts[:-1])])
        self.n_states = n_states = math.prod(c + 1 for c in counts)
        digits = (np.arange(n_states)[:, None] // radix[None, :]) % (np.array(counts) + 1)
        offset = (comps @ radix)[None, :]
        # state s - g (the state before a stage of composition g) and s + g (after)
        self.back_ok = (digits[:, None, :] >= comps[None, :, :]).all(axis=2)
        self.back = np.where(self.back_ok, np.arange(n_states)[:, None] - offset, 0)
        ahead_ok = (digits[:, None, :] + comps[None, :, :] <= np.array(counts)).all(axis=2)
        ahead = np.where(ahead_ok, np.arange(n_states)[:, None] + offset, 0)
        k_div, r_mod = np.divmod(batch, size)
        ybar = (r_mod * (k_div + 1.0) ** 2 + (size - r_mod) * k_div**2.0) / batch

        def prefix(tables_k: list[np.ndarray]) -> list[np.ndarray]:
            return [np.vstack([zero, np.cumsum(t[:, cols], axis=0)]) for t in tables_k]

        def mean(s: np.ndarray, least: np.ndarray) -> np.ndarray:
            """mean(s, l) of the docstring per composition, from per-group s and l."""
            with np.errstate(divide="ignore", invalid="ignore"):
                rate = np.where(present, comps / np.where(s > 0, s, 0.0)[None, :], 0.0)
                frac = batch / rate.sum(axis=1)
            fastest = np.where(present, s[None, :], np.inf).min(axis=1)
            return np.maximum(np.maximum(frac, ybar * fastest),
                              np.where(present, least[None, :], np.inf).min(axis=1))  # fmt: skip

        fwd_prefix, bwd_prefix = prefix(tables.tf), prefix(tables.tb)
        least_f = np.min([tf[:, cols].min(axis=1) for tf in tables.tf], axis=0)
        self.pre_f = np.concatenate([[0.0], np.cumsum(least_f)])
        bnd = np.asarray(tables.boundary, dtype=float)
        self.cut_hop = tables.lat_lo + tables.v_lo * bnd
        self.hop_min = float(self.cut_hop[:-1].min(initial=np.inf)) if n_blocks > 1 else 0.0
        grad_prefix = np.concatenate([[0.0], np.cumsum(tables.grad)])
        budgets = [max(tables.classes[k].budget for k in grp) for grp in groups]
        warmup = m_count if problem.config.schedule == "gpipe" else 1
        ring_steps = 2.0 * (size - 1.0)
        # per first block a: the stage ends b (> a) that fit memory, and per (b,
        # composition) the stage's work, fill contribution, ring and sent terms and its
        # mean forward and backward, shape (len(ends), G)
        self.stages: dict[int, tuple[np.ndarray, ...]] = {}
        rho = np.inf
        for a in range(n_blocks):
            rows = []
            for b in range(a + 1, n_blocks + 1):
                fit = np.array([
                    samples_that_fit(budget, cm.static_bytes(a, b), warmup,
                                     cm.saved_bytes(a, b), batch)
                    for budget in budgets
                ])  # fmt: skip
                room = np.where(present, comps * fit[None, :], 0).sum(axis=1)
                usable = (room >= batch) & ~(present & (fit[None, :] < 1)).any(axis=1)
                if not usable.any():
                    continue
                span_f = np.array([w[b] - w[a] for w in fwd_prefix])  # (K, B) per class
                span_b = np.array([w[b] - w[a] for w in bwd_prefix])
                figures = []
                for span in (span_f, span_b, span_f + span_b):
                    per_sample = (span / ys).min(axis=1)
                    least = span.min(axis=1)
                    figures.append((np.array([per_sample[grp].min() for grp in groups]),
                                    np.array([least[grp].min() for grp in groups])))  # fmt: skip
                (s_f, l_f), (s_b, l_b), (s_t, l_t) = figures
                for num, den in ((s_f, s_b), (l_f, l_b)):
                    with np.errstate(divide="ignore", invalid="ignore"):
                        ratio = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.inf)
                    rho = min(rho, float(ratio.min()))
                w = np.where(usable, m_count * mean(s_t, l_t), np.inf)
                mean_f, mean_b = mean(s_f, l_f), mean(s_b, l_b)
                chunk = (grad_prefix[b] - grad_prefix[a]) / size
                ring = ring_steps * (chunk * tables.v_lo + tables.lat_lo)
                crossing = float(bnd[b - 1] if b < n_blocks else 0.0) + (bnd[a - 1] if a else 0.0)
                if tables.topology == "switched":
                    sent = (m_count * batch * crossing / size + ring_steps * chunk) * tables.v_lo
                elif tables.topology == "shared_medium":
                    sent = (m_count * batch * crossing + ring_steps * chunk * size) * tables.v_lo
                else:
                    sent = np.zeros(len(comps))
                mean_f = np.where(usable, mean_f, np.inf)
                rows.append((b, w, mean_f + mean_b, ring, sent, mean_f, mean_b))
            if rows:
                self.stages[a] = tuple(np.array(x) for x in zip(*rows, strict=True))
        self.alpha = rho / (1.0 + rho) if math.isfinite(rho) else 1.0
        # suffix[r, b, s]: the least fill of r stages over blocks [b, L) with the devices
        # state s leaves (a min-sum DP backwards), what the round-trip branch adds
        suffix = np.full((max_stages + 1, n_blocks + 1, n_states), np.inf)
        suffix[0, n_blocks] = 0.0
        for r in range(1, max_stages + 1):
            for a, (ends, _, fill, *_) in self.stages.items():
                later = suffix[r - 1][ends.astype(int)]  # (E, S)
                cand = np.where(ahead_ok[None], later[:, ahead] + fill[:, None, :], np.inf)
                suffix[r, a] = cand.min(axis=(0, 2))
        self.suffix = suffix
        self._pairs: dict[int, np.ndarray] = {}

    def pairs(self, num_stages: int) -> np.ndarray:
        """Per stage q of a P-stage schedule the (forwards, backwards) a device runs up
        to and including F(m) and from B(m) on, for every micro-batch m, Pareto-maximal
        ones only, padded with (0, 0): shape (P, most, 2)."""
        if num_stages not in self._pairs:
            per_stage = []
            for acts in stage_orders(self.problem, self.batch, num_stages):
                kinds = np.array([k == "F" for k, _ in acts])
                f_before = np.cumsum(kinds)  # forwards up to and including position i
                b_before = np.cumsum(~kinds)
                pos = {a: i for i, a in enumerate(acts)}
                found = set()
                for kind, m in acts:
                    if kind != "F" or ("B", m) not in pos:
                        continue
                    i, j = pos["F", m], pos["B", m]
                    f_from = int(f_before[-1] - (f_before[j - 1] if j else 0))
                    b_from = int(b_before[-1] - (b_before[j - 1] if j else 0))
                    found.add((int(f_before[i]) + f_from, int(b_before[i]) + b_from))
                top = [x for x in found if not any(y != x and y[0] >= x[0] and y[1] >= x[1]
                                                   for y in found)]  # fmt: skip
                per_stage.append(top or [(0, 0)])
            most = max(len(x) for x in per_stage)
            arr = np.zeros((num_stages, most, 2))
            for q, top in enumerate(per_stage):
                arr[q, : len(top)] = top
            self._pairs[num_stages] = arr
        return self._pairs[num_stages]

    def feasible(self, targets: list[int], limit: np.ndarray, deadline: float) -> np.ndarray:
        """Per target P (with its T in ``limit``): does a partition into P stages have
        every stage term <= T? One DP pass over the layers p = 1 .. max(targets).

        Raises:
            TimeoutError: ``time.perf_counter()`` passed ``deadline``."""
        n_blocks, alpha = self.n_blocks, self.alpha
        ok = np.zeros(len(targets), dtype=bool)
        want = np.array(targets)
        t_col = limit[:, None, None]
        start = np.where(np.arange(self.n_states) == 0, 0.0, np.inf)
        prev = {0: np.repeat(start[None, :], len(targets), axis=0)}
        schedules = {t: self.pairs(t) for t in set(targets)}
        most = max(x.shape[1] for x in schedules.values())
        for p in range(1, max(targets) + 1):
            if time.perf_counter() > deadline:
                raise TimeoutError
            q = p - 1
            # per target row: its stage q's schedule pairs, remaining stages, cuts
            pairs = np.zeros((len(targets), most, 2))
            for i, t in enumerate(targets):
                if q < t:
                    pairs[i, : schedules[t].shape[1]] = schedules[t][q]
            left = np.clip(want - p, 0, None)
            cuts = np.maximum(want - 1, 0)
            cur: dict[int, np.ndarray] = {}
            for a, c_prev in prev.items():
                if a not in self.stages:
                    continue
                ends, w, fill, ring, sent, mean_f, mean_b = self.stages[a]
                ends_i = ends.astype(int)
                hops = (q - 1) * self.hop_min + float(self.cut_hop[a - 1]) if q else 0.0
                branch = np.maximum(hops + w + ring, hops + sent)  # (E, G)
                # C_prev + 2 hops + w <= T; max(pre_f, alpha C_prev) + branch <= T
                cap = t_col - 2 * hops - w
                if alpha > 0:
                    cap = np.minimum(cap, (t_col - branch) / alpha)
                cap = np.where(self.pre_f[a] + branch <= t_col, cap, -np.inf)  # (T, E, G)
                # round trip: C_prev + suffix + max_m (alpha_m f + beta_m b) + hops <= T
                exact = int(a > 0) + (ends_i < n_blocks).astype(int)  # cuts priced exactly
                after = np.where(ends_i < n_blocks, self.cut_hop[np.clip(ends_i - 1, 0, None)], 0.0)
                before = float(self.cut_hop[a - 1]) if a else 0.0
                trip_hops = 2.0 * (
                    (cuts[:, None] - exact[None, :]) * self.hop_min + before + after[None, :]
                )  # (T, E)
                with np.errstate(invalid="ignore"):  # 0 x inf: a composition that cannot fit
                    runs = pairs[:, :, 0, None, None] * mean_f + pairs[:, :, 1, None, None] * mean_b
                chain = runs.max(axis=1)  # (T, E, G)
                trip = self.suffix[left[:, None], ends_i[None, :]]  # (T, E, S)
                cap_trip = (t_col[:, :, :, None] - trip[:, :, :, None]
                            - (chain + trip_hops[:, :, None])[:, :, None, :])  # fmt: skip
                gathered = np.where(self.back_ok, c_prev[:, self.back], np.inf)  # (T, S, G)
                limit_all = np.minimum(cap[:, :, None, :], cap_trip)  # (T, E, S, G)
                grown = gathered[:, None] + fill[None, :, None, :]
                grown = np.where(gathered[:, None] <= limit_all, grown, np.inf)
                best = grown.min(axis=3)  # (T, E, S)
                for e, b in enumerate(ends_i):
                    cur[b] = best[:, e] if b not in cur else np.minimum(cur[b], best[:, e])
            if n_blocks in cur:
                ok |= (want == p) & np.isfinite(cur[n_blocks]).any(axis=1)
            prev = {b: v for b, v in cur.items() if b < n_blocks}
            if not prev:
                break
        return ok


def bisect_bounds(
    bounds: StageBounds,
    lo: np.ndarray,
    hi: np.ndarray,
    rel_tol: float,
    deadline: float,
    steps: float = math.inf,
    only: np.ndarray | bool = True,
) -> bool:
    """Bisection on T per P (entries 1..max_stages of ``lo`` / ``hi``, in place): ``lo``
    not feasible (a valid lower bound), ``hi`` feasible (NaN: no upper end, nothing to
    bisect; ``only``: the entries to bisect), until every open interval is within
    ``rel_tol`` of its ``hi``, ``steps`` passes are done or the ``deadline`` passes (then
    ``lo`` is where it stood). Returns whether intervals are still open (False after a
    timeout)."""
    done = 0
    while True:
        sel = open_intervals(lo, hi, rel_tol) & only
        if not sel.any():
            return False
        if done >= steps:
            return True
        targets = [int(t) for t in np.flatnonzero(sel)]
        mid = 0.5 * (lo[sel] + hi[sel])
        try:
            ok = bounds.feasible(targets, mid, deadline)
        except TimeoutError:
            return False
        idx = np.flatnonzero(sel)
        hi[idx[ok]] = mid[ok]
        lo[idx[~ok]] = mid[~ok]
        done += 1


def open_intervals(lo: np.ndarray, hi: np.ndarray, rel_tol: float) -> np.ndarray:
    """Entries P >= 1 whose bisection interval [lo, hi] is wider than ``rel_tol`` x hi."""
    with np.errstate(invalid="ignore"):  # NaN: nothing to bisect
        sel = ~np.isnan(hi) & (hi - lo > rel_tol * hi)
    sel[0] = False
    return sel


def raise_least(
    searches: list[tuple[StageBounds, np.ndarray, np.ndarray]], until: float, rel_tol: float = 1e-3
) -> None:
    """Bisection steps (:func:`bisect_bounds`, in place) where they lift the least open
    bound over all micro-batch sizes (the global bound is the least of the open
    programs'): each step bisects, in the size holding the least open ``lo``, every P
    whose ``lo`` is at most the least of the other sizes', until ``until`` or no interval
    is open."""
    while time.perf_counter() < until:
        least = [
            (float(lo[sel].min()), i)
            for i, (_, lo, hi) in enumerate(searches)
            if (sel := open_intervals(lo, hi, rel_tol)).any()
        ]
        if not least:
            return
        value, i = min(least)
        others = min((v for v, j in least if j != i), default=math.inf)
        bounds, lo, hi = searches[i]
        bisect_bounds(bounds, lo, hi, rel_tol, until, steps=1, only=lo <= max(value, others))


def test_at(bounds: StageBounds, lo: np.ndarray, ceiling: float, deadline: float) -> np.ndarray:
    """Test every P with ``lo`` below ``ceiling`` at T = ceiling: returns the upper ends
    for :func:`bisect_bounds` (``ceiling`` where feasible, NaN where not, and there ``lo``
    rises to the ceiling, in place); on timeout nothing is known (all NaN)."""
    hi = np.full(len(lo), np.nan)
    sel = lo < ceiling
    sel[0] = False
    targets = [int(t) for t in np.flatnonzero(sel)]
    if not targets:
        return hi
    try:
        ok = bounds.feasible(targets, np.full(len(targets), ceiling), deadline)
    except TimeoutError:
        return hi
    idx = np.flatnonzero(sel)
    hi[idx[ok]] = ceiling
    lo[idx[~ok]] = ceiling
    return hi


def _horizon(tables: Tables, sizes: list[int]) -> float:
    """An upper bound on any plan's iteration time (bounds the time variables): every
    action of the longest chain at its largest duration, plus the largest all-reduce."""
    problem = tables.problem
    n_dev = tables.n_devices
    worst = 0.0
    for batch in sizes:
        m_count = problem.config.global_batch // batch
        steps = 2 * min(problem.model.num_blocks, n_dev) - 1
        compute = max(
            float(tf[:, 1 : batch + 1].sum(axis=0).max() + tb[:, 1 : batch + 1].sum(axis=0).max())
            for tf, tb in zip(tables.tf, tables.tb, strict=True)
        )
        slowest = max(tables.inv_values) if tables.inv_values else 0.0
        lat = float(np.nanmax(tables.lat)) if tables.inv_values else 0.0
        link = lat + batch * float(tables.boundary.max()) * slowest
        ring = 2.0 * n_dev * (float(tables.grad.sum()) * slowest + lat)
        worst = max(worst, m_count * steps * (compute + 2 * link) + ring)
    return worst * 1.01 + 1.0
