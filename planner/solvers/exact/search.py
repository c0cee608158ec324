"""The exact planner's search over its (B, P) programs: :class:`ProgramSearch` builds each
program (:mod:`planner.solvers.exact.formulation`) under the incumbent's cutoff, solves it
(:mod:`planner.solvers.exact.backends`), re-scores every solution by the cost model and
shares the incumbent between programs; :class:`SubProblem` records what happened to one
program. Two passes: a short slice for every program, then the time left for the open
ones, lowest bound first (:meth:`ProgramSearch.run`). An exception in the caller's
thread (Ctrl-C) stops the search: no program starts, the running solves are stopped
(:class:`~planner.solvers.exact.backends.Halt`) and the exception goes on once their
threads are done."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass

from edgepipe.planner.cost.model import PlanCost
from edgepipe.planner.partition import Partition
from edgepipe.planner.solvers.exact.backends import Halt, HighsWorkers, solve_cpsat, solve_pulp
from edgepipe.planner.solvers.exact.formulation import Builder
from edgepipe.planner.solvers.exact.solutions import decision, extract, solution_hint
from edgepipe.planner.solvers.exact.tables import Tables
from edgepipe.planner.solvers.time_limit import Deadline

#: CP-SAT time resolution: the incumbent is about this many integer time units
CPSAT_UNITS = 1e8

#: an incumbent must improve by more than this relative amount to replace the last one
IMPROVEMENT = 1e-9

#: programs solved at the same time (one solver thread each)
PARALLEL = 2

#: seconds between the stops of an interrupted search (:meth:`ProgramSearch.stop`)
HALT_POLL_S = 0.05

#: the objective cutoff sits this far (relative) above the incumbent, so that CP-SAT's
#: rounded times cannot cut off the incumbent's own program
CUTOFF_SLACK = 1e-4

#: a solution's cost-model figure within this (relative) of the program's value counts
#: as equal (CP-SAT's time resolution, :mod:`planner.solvers.exact.backends`)
EXACT = 1e-4

#: the incumbent: (cost-model iteration ms, plan, its cost, the program's value of it;
#: None for the warm start)
Incumbent = tuple[float, Partition, PlanCost, float | None]


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


class ProgramSearch:
    """Runs the (B, P) programs, PARALLEL at a time (each solver call releases the GIL;
    CBC runs as a subprocess, HiGHS in worker processes), sharing the incumbent: a
    program is built with the incumbent's value at its start as cutoff, and an
    improving solution, re-scored by the cost model, replaces the incumbent at once."""

    def __init__(
        self,
        tables: Tables,
        backend: str,
        deadline: Deadline,
        best: Incumbent | None,
        horizon: float,
    ) -> None:
        self.tables, self.backend, self.deadline, self.horizon = tables, backend, deadline, horizon
        self.best = best
        self.excluded: dict[tuple[int, int], list[dict[int, float]]] = {}
        self.lock = threading.Lock()
        self.highs: HighsWorkers | None = None  # set while run() uses the highs backend
        self.halt = Halt()
        #: the slowest program build so far, seconds per (stage x block)
        self.build_rate = 0.0

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
        stop = t0 + cap
        if self.deadline.passed():
            return before or SubProblem(*job, "skipped", None, None, 0.0)
        found = before.best_ms if before else None
        program = before.program_ms if before else None
        outcome_status, bound = (before.status, before.bound_ms) if before else ("unknown", None)
        excluded = self.excluded.setdefault(job, [])
        # the solver's limit: the slice's wall clock or the deadline's (a CPU budget
        # shared by the PARALLEL solves), whichever is less, after the program is built;
        # a program whose build (estimated from the builds so far) would not end within
        # it is not begun: on long chains a build takes seconds
        lowered = [0.0]  # when the solver was last asked for its limit

        def left() -> float:
            lowered[0] = time.perf_counter()  # CP-SAT asks once its model is lowered
            return self._left(stop)

        begun = False
        while self._left(stop) > self._build_estimate(job) and not self.halt.stopped:
            begun = True
            with self.lock:
                best = self.best
            ref = best[0] if best else self.horizon
            built = time.perf_counter()
            try:
                form = Builder(self.tables, *job).build(
                    ref * (1 + CUTOFF_SLACK), self.horizon, tuple(excluded),
                    lambda: self._left(stop) <= 0 or self.halt.stopped,
                )  # fmt: skip
            except TimeoutError:
                self._learn_build(job, time.perf_counter() - built)
                break
            hint = {}
            if best and (best[1].micro_batch_size, best[1].num_stages) == job:
                hint = solution_hint(form, self.tables, best[1])
            lowered[0] = time.perf_counter()
            if self.backend == "cpsat":
                outcome = solve_cpsat(form.model, hint, left, CPSAT_UNITS / ref, self.halt)
                self._learn_build(job, lowered[0] - built)
            else:
                limit = left()
                self._learn_build(job, lowered[0] - built)
                if limit <= 0:
                    break
                if self.highs is not None:
                    outcome = self.highs.solve(form.model, hint, limit)
                else:
                    outcome = solve_pulp(form.model, hint, limit, self.backend)
            if outcome.status != "unknown" or outcome.bound_ms is not None:
                # (an unknown without a bound, e.g. not solved for want of time, keeps
                # what an earlier pass proved)
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
        if not begun and before is None:
            # not begun: its build would not end within the time left (or halted)
            return SubProblem(*job, "skipped", None, None, spent)
        return SubProblem(*job, outcome_status, found, bound, spent, program, len(excluded))

    def _left(self, stop: float) -> float:
        """Seconds a solver may still be given: to ``stop`` (the slice's end) or the
        deadline (its CPU budget shared by the PARALLEL solves), whichever is sooner."""
        return min(stop - time.perf_counter(), self.deadline.left_s(PARALLEL))

    def _build_estimate(self, job: tuple[int, int]) -> float:
        """Seconds the program of ``job`` is expected to take to build: the slowest build
        so far per (stage x block), times its P x L (a build's rows grow with both), 0
        before the first. A build counts until the solver starts (for CP-SAT, its
        lowering included)."""
        return self.build_rate * job[1] * self.tables.n_blocks

    def _learn_build(self, job: tuple[int, int], seconds: float) -> None:
        with self.lock:
            self.build_rate = max(self.build_rate, seconds / (job[1] * self.tables.n_blocks))

    def run(
        self,
        jobs: list[tuple[int, int]],
        quick: float,
        progress: Callable[[int, int], None] | None,
    ) -> list[SubProblem]:
        """Pass 1 gives every program a short slice ``quick`` (closing the easy ones and
        improving the incumbent early, which strengthens the cutoff of every later
        proof); pass 2 gives the open ones the time left, lowest bound first. Any
        exception here (Ctrl-C) halts the search (:meth:`stop`) and goes on."""
        results: dict[tuple[int, int], SubProblem] = {}
        order = jobs
        workers = HighsWorkers(PARALLEL) if self.backend == "highs" else None
        self.highs = workers
        futures: dict[Future[SubProblem], tuple[int, int]] = {}
        with (
            workers or contextlib.nullcontext(),
            self.halt.during(workers.kill if workers else lambda: None),
            ThreadPoolExecutor(max_workers=PARALLEL) as pool,
        ):
            try:
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
            except BaseException:
                self.stop(pool, list(futures))
                raise
        return [results[j] for j in jobs]

    def stop(self, pool: ThreadPoolExecutor, futures: list[Future[SubProblem]]) -> None:
        """Halt the search: cancel the programs not yet started and stop the running
        solves, again every HALT_POLL_S until their threads are done (a solve that had
        not quite started when stopped, :class:`~planner.solvers.exact.backends.Halt`)."""
        pool.shutdown(wait=False, cancel_futures=True)
        # not wait(): it counts a future cancelled here as done only once a worker thread
        # has seen it, and none will
        while not all(f.done() for f in futures):
            self.halt.stop()
            time.sleep(HALT_POLL_S)
