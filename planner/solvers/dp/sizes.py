"""The DP over every micro-batch size: which sizes to search and in what order, the bound
each search runs under, the re-scoring of the answers by the exact makespan, the tie rule
and the time limit (:func:`best_plan`).

Inputs: a :class:`~planner.inputs.problem.Problem` (its micro-batch candidates B), a
wall-clock limit and optionally a warm start (``incumbent``).

Bound U, per size: ``RESCORE_MARGIN`` above the fastest exact figure of the sizes already
searched, and of the warm start's plan (which re-planning gives: its fast-path plan) when
there is one; for the first search without a warm start, which has no figure, a guess,
``FIRST_GUESS`` x its relaxed bound max(Q(L, N), Z) (:mod:`planner.solvers.dp.bounds`);
whenever the margin of the figure it found exceeds the guess, the size is searched again
after the other sizes, under the bound then (or skipped by it), and at once without a
bound when it found none (under a time limit the other sizes' plans come first: 512 x 8
at 30 s, 937 ms, not the first size's 1,081). No answer whose DP value exceeds U is ever
scored, so the search drops what cannot finish below it.

Order: sizes are searched in order of max(Q(L, N), Z) and a size whose bound exceeds U is
skipped: every size's Z first (a tenth of its tables' time; in order of
:func:`~planner.solvers.dp.bounds.lower_bound` while the time limit lasts), then the
relaxed tables in order of Z until no size left can have a lesser max(Q, Z) than the
least found (the first search: that size, or on the ordered graph the smallest size
whose max(Q, Z) is within ``FIRST_NEAR`` of it, as a smaller size has fewer groups to
search and its figure then bounds the larger sizes' searches; on the complete graph
searches are cheap and the least bound's figure prunes best), and after it only those of
sizes whose Z is within U (U only falls) and whose skip-only bounds are: Zc on two device
classes, Zp on three or more (before its tables are built and again when its turn comes
under a bound fallen since; on ``PRICED_MIN_DEVICES`` or more devices), and where max(Q,
Z) is within ``STAGED_NEAR`` of U, Zs and
Zw (before the size's relaxed tables are built). The skip-only bounds never change which
sizes are searched in which order, only whether.

Answer: each search's answers (:mod:`planner.solvers.dp.search`) are reconstructed and
deduplicated; each B's best is re-scored at once by the exact schedule makespan of the
cost model (:meth:`CostModel.evaluate`; it prunes the sizes still to come), the others
after all B in order of D + X, at most ``RESCORE`` of them, none above the fastest figure
by ``RESCORE_MARGIN``, within a budget of work, not of seconds, so that the same input
gives the same plan at any load (the evaluations' actions, stages x micro-batches of each
plan, up to max(``RESCORE_MIN_ACTIONS``, the searches' cells / ``RESCORE_CELLS_PER_ACTION``):
about a quarter of the search's time, as the wall-clock share it replaced; an exact
evaluation of a 64-device plan takes tenths of a second), and not one whose lower bound
(:meth:`CostModel.round_lower_bound_ms`) exceeds both the tie window of the fastest
figure and its size's best figure so far (it could change neither); plans the cost model
finds overflowing are dropped; among plans within ``TIE_TOLERANCE`` of the fastest
steady-state step (``PlanCost.steady_ms``: a run's step, shorter than the isolated
iteration where consecutive steps overlap, :mod:`planner.cost.steady`) the one using
fewest devices wins, then fewest stages, then the smallest B (:func:`choose`; a plan
that leaves devices free is worth more than one fewer stage: seen, 16-way data parallel
chosen over a 4-device plan 0.04% slower). The bounds, margins and skips above stay on
the isolated iteration (``iteration_ms``; the lower bounds bound it, not the steady
step, which can be below it): a plan they drop can be a few per cent faster in steady
state than the one chosen (steady / iteration down to 0.946 among the DP's scored plans
over the shipped profiles and clusters).

Time limit: a safety stop, which nothing else reads (the budgets above count work): when
it expires inside a search the DP returns the best plan of the levels completed (status
``timed_out``, as whenever the limit cut anything short: a size's bounds, a size, the
re-scoring). The sizes' Z and relaxed tables are built before the
first search only while the limit lasts, and once it has passed with a plan found no
further micro-batch size is begun (neither its relaxed tables, nor its graph, nor its
first level): the overshoot is bounded by one size's relaxed tables and skip bounds (Zw
at most ``REWEIGHT_WORK``), one level's state (or the first size's first level) and the
final re-scoring, which stops at the limit too.

Complexity: per size, its bounds and its search (their modules); then at most (number of
B) + ``RESCORE`` exact evaluations (each O(A log A) events for A transfers and
computations of the plan, for the iteration and ``steady.ITERATIONS`` chained ones,
:mod:`planner.cost.model`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from edgepipe.planner.cost.closed_form import pipeline_closed_form_ms
from edgepipe.planner.cost.model import CostModel, PlanCost
from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.problem import Problem
from edgepipe.planner.partition import Partition
from edgepipe.planner.plan import check_partition
from edgepipe.planner.solvers.classes import DeviceClass, device_classes
from edgepipe.planner.solvers.dp.allocator import retain_freed_memory
from edgepipe.planner.solvers.dp.bounds import (
    _Relaxed,
    class_weighted_bound,
    lower_bound,
    priced_weighted_bound,
    relaxed_bounds,
    reweighted_bound,
    staged_weighted_bound,
    weighted_bound,
)
from edgepipe.planner.solvers.dp.graph import complete_fits, device_orders, state_graph
from edgepipe.planner.solvers.dp.search import _BatchSearch, _Timeout
from edgepipe.planner.solvers.dp.tables import _Tables
from edgepipe.planner.solvers.time_limit import Deadline

#: at most RESCORE waiting answers (the searches' answers after each size's best, of all
#: sizes, in order of DP value) are re-scored by the exact makespan, none whose DP value
#: is above the fastest figure found by more than RESCORE_MARGIN, and only while the
#: re-scored plans' actions (stages x micro-batches each) are within the budget of
#: RESCORE_MIN_ACTIONS, or the searches' cells / RESCORE_CELLS_PER_ACTION when more. The
#: DP value under-predicts the exact figure by up to ~20% but over-predicts it by at most
#: 4.4% on every plan re-scored on the solver_vs_dp suite and the planner_scaling cases
#: (docs/decisions.md), so on those measured plans an answer 6% above the fastest figure
#: did not win or tie it (0.5%); a measurement, not a proof (on tiny brute-force
#: instances some feasible non-answers are over-predicted far more, review 8 F6); the
#: margin is also the search's bound U (pruning), hence its time
RESCORE = 40
RESCORE_MARGIN = 0.06
#: The budget counts work so that load cannot change the plan (issue 29: under load the
#: wall-clock share it replaced, max(0.25 s, a quarter of the search), stopped earlier and
#: changed plans). Measured (CPU): an evaluation costs 40-170 us per action, a search
#: 120-380 ns per cell composed, so cells / 1,000 are about a quarter of the search's
#: time; 2,500 actions are 0.1-0.4 s, and no DP fingerprint case re-scored past 2,288
#: before its last re-scored plan (synthetic 100 x 64 identical stops at 4 plans, as the
#: wall-clock budget did at load 11; 6,000 took 8: 0.86 -> 1.22 CPU s; docs/decisions.md)
RESCORE_MIN_ACTIONS = 2500
RESCORE_CELLS_PER_ACTION = 1000
#: relative slack of a comparison between two figures of one plan summed in different
#: orders (a bound and the figure it bounds may differ in the last digits)
ROUNDING_SLACK = 1e-9

#: plans within this relative margin of the fastest count as tied; among them the one
#: using fewest devices, then fewest stages, then smallest micro-batch wins
TIE_TOLERANCE = 0.005


#: Zs and Zw (:func:`~planner.solvers.dp.bounds.staged_weighted_bound`,
#: :func:`~planner.solvers.dp.bounds.reweighted_bound`) are computed for a size only when
#: its max(Q, Z) is within this factor below the bound U (Zs lifted Z by 1-6% where
#: measured; docs/decisions.md, session 9)
STAGED_NEAR = 1.1

#: the first micro-batch size is searched under this multiple of its relaxed bound
#: (:func:`best_plan`), and again after the other sizes when its figure's margin exceeds it
#: (figure / bound was 1.05-1.37 on the planner_scaling cases, so U / bound up to 1.57:
#: at 1.3 most first searches ran twice)
FIRST_GUESS = 1.7
#: on the ordered graph the first search is the smallest size whose relaxed bound lies
#: within this fraction of the least (the figure of a smaller, cheaper search bounds the
#: larger ones: 512 x 8 searched 4 before 16, 42 -> 32 s; 100 x 64 2 before 4, -7%;
#: 100 x 16 mixed 2 before 4, -10%; same plans; docs/decisions.md, session 13)
FIRST_NEAR = 0.15


#: Zp is computed only on clusters of at least this many devices: below, it skipped no
#: size on any of the 116 solver_vs_dp and small mixed planner_scaling cases (<= 8
#: devices) and cost 15% of the DP (nasnet-like 152 blocks on home-mixed-5: 3.30 -> 2.79
#: CPU s at load 19, same plans; docs/benchmarks.md, issue 29)
PRICED_MIN_DEVICES = 9

#: default wall-clock limit of one DP run, seconds
DEFAULT_TIME_LIMIT = 60.0

INF = np.inf


@dataclass(frozen=True)
class DPResult:
    """The DP's plan, its cost-model figures and search statistics.

    ``status``: ``complete`` (every level searched) or ``timed_out`` (the best plan of
    the levels finished before the time limit)."""

    partition: Partition
    cost: PlanCost
    dp_value_ms: float
    solve_time_s: float
    candidates: dict[int, float]  # micro-batch size -> best predicted iteration ms
    status: str
    graph: str  # complete | ordered | none (no search ran: a warm start none could beat)
    #: every plan the cost model scored and found fitting memory: (figures, plan, DP value)
    scored: tuple[tuple[PlanCost, Partition, float], ...] = ()
    #: planned coarse to fine (:mod:`planner.solvers.dp.multilevel`), not on every block
    coarse_to_fine: bool = False


def choose(
    found: list[tuple[PlanCost, Partition, float]],
) -> tuple[PlanCost, Partition, float]:
    """The tie rule: among the plans within ``TIE_TOLERANCE`` of the fastest exact
    steady-state step (``PlanCost.steady_ms``, what a run's steps take; the isolated
    iteration where steps do not overlap), the one using fewest devices, then fewest
    stages, then the smallest micro-batch, then the fastest."""
    fastest = min(cost.steady_ms for cost, _, _ in found)
    return min(
        (c for c in found if c[0].steady_ms <= fastest * (1 + TIE_TOLERANCE)),
        key=lambda c: (
            len(c[1].used_devices()),
            c[1].num_stages,
            c[1].micro_batch_size,
            c[0].steady_ms,
        ),
    )


def check_incumbent(problem: Problem, incumbent: Partition) -> None:
    """Raise unless ``incumbent`` is a plan of ``problem`` at one of its micro-batch
    candidates (:class:`~planner.errors.PlanMismatchError`, :class:`InputError`)."""
    check_partition(problem, incumbent)
    sizes = problem.config.micro_batch_sizes()
    if incumbent.micro_batch_size not in sizes:
        raise InputError(
            "incumbent",
            str(incumbent.micro_batch_size),
            f"the warm start's micro-batch size is not one of the config's "
            f"candidates {list(sizes)}; give a plan of the DP's space",
        )


def best_plan(
    problem: Problem,
    progress: Callable[[int, int], None] | None = None,
    time_limit: float | Deadline = DEFAULT_TIME_LIMIT,
    *,
    by_class: bool = True,
    incumbent: Partition | None = None,
    known: Callable[[Partition], PlanCost | None] | None = None,
) -> DPResult | None:
    """:func:`planner.solvers.dp.driver.plan_dp` without the diagnosis (nor the coarse to
    fine planning of long chains): ``None`` when nothing fits. ``time_limit``: wall-clock
    seconds from now, or a running :class:`~planner.solvers.time_limit.Deadline` (wall
    clock and CPU time) shared with the caller. ``known``: the figures of a plan scored
    already (by a run on another merging of the same chain, which prices it alike:
    :mod:`planner.solvers.dp.multilevel`), or None; a plan it knows is not evaluated
    again."""
    run = _Sizes(problem, progress, time_limit, by_class, incumbent, known)
    for i, batch in enumerate(run.micro_batches()):
        if run.found and run.deadline.passed():
            run.status = "timed_out"  # a plan exists: the sizes left are not searched
            break
        bound = run.bound_for(batch)
        if bound is not None:
            run.search(i, batch, bound)
    run.rescore()
    return run.result()


class _Sizes:
    """One run of :func:`best_plan`: the plans scored so far, each size's bounds (module
    docstring), and the steps of its loop over the micro-batch sizes."""

    def __init__(
        self,
        problem: Problem,
        progress: Callable[[int, int], None] | None,
        time_limit: float | Deadline,
        by_class: bool,
        incumbent: Partition | None,
        known: Callable[[Partition], PlanCost | None] | None = None,
    ) -> None:
        # the searches' arrays stay on mapped pages (planner.solvers.dp.allocator)
        retain_freed_memory()
        self.known = known
        self.start = time.perf_counter()
        self.deadline = time_limit if isinstance(time_limit, Deadline) else Deadline(time_limit)
        self.progress = progress
        self.sizes = problem.config.micro_batch_sizes()
        self.cm = CostModel(problem, max(self.sizes))
        classes = device_classes(problem)
        if not by_class:
            classes = [
                DeviceClass(c.type, c.budget, c.slowdown, (i,)) for c in classes for i in c.members
            ]
        self.tables = _Tables(problem, self.cm, classes)
        self.orders = device_orders(problem, classes)
        n_dev = self.n_dev = len(problem.cluster.devices)
        self.per_batch_levels = min(
            problem.model.num_blocks, n_dev, problem.config.max_stages or n_dev
        )
        self.total = self.per_batch_levels * len(self.sizes)
        self.done = 0
        self.found: list[tuple[PlanCost, Partition, float]] = []
        self.per_batch: dict[int, float] = {}
        self.seen: set[Partition] = set()
        self.waiting: list[tuple[float, int, Partition]] = []
        if incumbent is not None:
            # the warm start: its exact figure bounds every search from the first on
            # (module docstring, "Bound U"), and it competes in the final choice
            check_incumbent(problem, incumbent)
            self.seen.add(incumbent)
            cost = self.evaluate(incumbent)
            self.score(
                pipeline_closed_form_ms(self.cm, incumbent, cost),
                incumbent.micro_batch_size,
                incumbent,
                cost,
            )
        self.status, self.kind = "complete", "none"  # the graph searched; none: no search
        self.bounds = {b: lower_bound(self.tables, b, self.per_batch_levels) for b in self.sizes}
        # micro-batch sizes: first the one of least lower bound on the exact figure (a
        # small size, whose search is cheap: a first plan early, also under a time
        # limit), then in order of the relaxed bound on their DP values, so that the
        # likeliest figures come early and prune the later searches (or skip them)
        self.relaxed: dict[int, _Relaxed] = {}
        self.weighted: dict[int, float] = {}  # Z alone, of the sizes whose tables are not built
        self.class_counted: dict[int, float] = {}  # Zc of the sizes after the first (skips only)
        self.staged: dict[int, float] = {}  # Zs of the sizes after the first near U (skips only)
        self.reweighted: dict[int, float] = {}  # Zw where Zs is computed (skips only)
        self.priced: dict[int, tuple[float, float]] = {}  # Zp, the bound its ascent rose toward
        self.deferred: list[int] = []  # the first size, searched again after the others
        self.cells = 0  # cells the searches composed: the re-scoring's budget (rescore)

    def tick(self) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(min(self.done, self.total), self.total)

    def evaluate(self, partition: Partition) -> PlanCost:
        """``partition``'s figures: known already (``best_plan``'s ``known``), or the
        cost model's."""
        cost = None if self.known is None else self.known(partition)
        return self.cm.evaluate(partition) if cost is None else cost

    def fastest(self) -> float:
        """The fastest exact figure scored so far (inf before the first)."""
        return min((c.iteration_ms for c, _, _ in self.found), default=INF)

    def score(
        self, value: float, batch: int, partition: Partition, cost: PlanCost | None = None
    ) -> bool:
        """Score one plan by the cost model (``cost``: its figures, when evaluated
        already); whether it fits memory (the search checks stage memory and ring
        replicas with a conservative holder; this is the figure)."""
        cost = cost if cost is not None else self.evaluate(partition)
        if not cost.memory_ok:
            return False
        self.per_batch[batch] = min(self.per_batch.get(batch, INF), cost.iteration_ms)
        self.found.append((cost, partition, value))
        return True

    def priced_above(self, b: int, bound: float) -> bool:
        """Whether Zp exceeds ``bound``; Zp is raised toward ``bound`` unless a value
        raised toward it, or one above it, is known (any Zp is a bound on every plan)."""
        if self.n_dev < PRICED_MIN_DEVICES:
            return False
        if b not in self.priced or self.priced[b][0] <= bound != self.priced[b][1]:
            self.priced[b] = (priced_weighted_bound(self.tables, b, bound), bound)
        return self.priced[b][0] > bound

    def root(self, b: int) -> float:
        """max(Q(L, N), Z), or Z (a lower bound on it) where the tables are not built."""
        if b in self.relaxed:
            return max(self.relaxed[b].q_root, self.relaxed[b].z)
        return self.weighted[b]

    def micro_batches(self) -> Iterator[int]:
        """The sizes in the order they are searched (module docstring, "Order")."""
        # every size's Z first (a tenth of its tables' time), in order of the cheap bound
        # and while the time limit lasts; then the tables in order of Z until no size
        # left can have a lesser max(Q, Z) (>= Z) than the least found, and the search
        # of that least relaxed bound: its figure is likeliest to be low and prune the
        # others (the cheap bound ties on every size whose share ceil(B / N) is 1); on
        # the ordered graph the smallest size near it (FIRST_NEAR), a cheaper search
        tables, sizes = self.tables, self.sizes
        for b in sorted(sizes, key=lambda b: (self.bounds[b], b)):
            self.weighted[b] = weighted_bound(tables, b)
            if self.deadline.passed() and len(self.weighted) < len(sizes):
                self.status = "timed_out"
                break
        for b in sorted(self.weighted, key=lambda b: (self.weighted[b], b)):
            lowest = min(((self.root(a), a) for a in self.relaxed), default=None)
            if lowest is not None and (self.weighted[b], b) > lowest:
                break
            self.relaxed[b] = relaxed_bounds(tables, b)
            if self.deadline.passed():
                self.status = "timed_out"  # the least relaxed bound may be among those left
                break
        least = min(self.root(b) for b in self.relaxed)
        near = 0.0 if complete_fits(tables.counts) else FIRST_NEAR
        first = min(b for b in self.relaxed if self.root(b) <= least * (1 + near))
        yield first
        if self.found and self.deadline.passed():
            self.status = "timed_out"
            return  # out of time with a plan: no other size's tables are built
        # a size whose Z exceeds the bound now is skipped whenever it comes (the bound
        # only falls), so its tables are not built and its place does not matter
        left = [b for b in sizes if b not in self.weighted]
        self.weighted.update({b: weighted_bound(tables, b) for b in left})
        bound = self.fastest() * (1 + RESCORE_MARGIN)
        for b in sizes:
            # Zc (devices counted per class) is no bound on the order, which stays that
            # of max(Q, Z): it only skips, so the sizes searched and their order are the
            # same as without it
            if b not in self.relaxed and self.weighted[b] <= bound:
                self.prepare(b, bound)
        yield from sorted((b for b in sizes if b != first), key=lambda b: (self.root(b), b))
        yield from self.deferred  # the first size, when its guess proved low (search)

    def prepare(self, b: int, bound: float) -> None:
        """Build size ``b``'s relaxed tables unless a skip-only bound (Zc; near ``bound``
        Zs and Zw; Zp) already rules it out under ``bound``."""
        tables = self.tables
        self.class_counted[b] = class_weighted_bound(tables, b)
        if self.weighted[b] * STAGED_NEAR > bound:
            self.staged[b] = staged_weighted_bound(tables, b)
        if max(self.class_counted[b], self.staged.get(b, 0.0)) > bound:
            return
        if b in self.staged:  # near the bound: Zw, as Zs
            self.reweighted[b] = reweighted_bound(tables, b, bound)
        if self.reweighted.get(b, 0.0) > bound:
            return
        # Zp too (skips only): a size it skips now is skipped at its turn (U only
        # falls), so its tables are not built
        if not self.priced_above(b, bound):
            self.relaxed[b] = relaxed_bounds(tables, b)

    def bound_for(self, batch: int) -> float | None:
        """The bound U size ``batch`` is searched under (inf: none yet), or None when a
        bound rules out every answer it could have that would be re-scored."""
        fastest = self.fastest()
        if self.bounds[batch] > fastest * (1 + TIE_TOLERANCE):
            return None  # no plan at this micro-batch size can win or tie
        # no answer whose DP value exceeds the fastest figure by RESCORE_MARGIN is ever
        # re-scored, so the search drops what cannot finish below that
        bound = fastest * (1 + RESCORE_MARGIN)
        if max(self.root(batch), self.class_counted.get(batch, 0.0)) > bound:
            return None  # no answer at this micro-batch size could be re-scored
        # Zs (warm-up bubbles at their depth, the first stage's all-reduce) only skips, as
        # Zc: the sizes searched keep their order; computed where max(Q, Z) is near U
        if batch not in self.staged and self.root(batch) * STAGED_NEAR > bound:
            self.staged[batch] = staged_weighted_bound(self.tables, batch)
        if self.staged.get(batch, 0.0) > bound:
            return None
        # Zw (block weights by ascent) only skips too, computed where Zs is
        if batch in self.staged and batch not in self.reweighted:
            self.reweighted[batch] = reweighted_bound(self.tables, batch, bound)
        if self.reweighted.get(batch, 0.0) > bound:
            return None
        # Zp (stages priced per device class, three or more classes) is computed for a
        # size that would be searched now, against the bound it would be searched under
        # (unless known above it since its tables were considered); like Zc it only skips
        if np.isfinite(bound) and self.priced_above(batch, bound):
            return None
        return bound

    def search(self, i: int, batch: int, bound: float) -> None:
        """Search size ``batch`` (the ``i``-th) under ``bound`` and score its best answer;
        queue the others for :meth:`rescore`."""
        tables = self.tables
        tables.clear()
        graph = state_graph(tables, batch, self.orders)
        self.kind = graph.kind
        # the first size searched has no figure to prune by: it searches under a guess,
        # FIRST_GUESS x its relaxed bound, and again (after the other sizes, or at once
        # without a bound when it found nothing) when its figure's margin is above it
        guessed = not np.isfinite(bound)
        if guessed:
            bound = self.root(batch) * FIRST_GUESS
        while True:
            search = _BatchSearch(tables, graph, batch, self.deadline, self.tick, bound,
                                  self.relaxed[batch], guessed)  # fmt: skip
            try:
                answers = search.run()
            except _Timeout:
                self.status = "timed_out"
                answers = getattr(search, "answers", [])
            self.cells += search.cells
            self.done = min((i + 1) * self.per_batch_levels, self.total)
            if self.progress is not None:
                self.progress(self.done, self.total)
            self.score_answers(search, answers, batch)
            fastest = self.fastest()
            if not guessed or self.status == "timed_out" or fastest * (1 + RESCORE_MARGIN) <= bound:
                break
            if np.isfinite(fastest):
                # the guess lay below the figure's margin: the size is searched again after
                # the others, under the bound then (or skipped by it), so that a time
                # limit finds the other sizes' plans first
                self.deferred.append(batch)
                break
            bound, guessed = INF, False  # nothing found: again at once, without a bound

    def score_answers(self, search: _BatchSearch, answers: list, batch: int) -> None:
        """The best answer of each micro-batch size is scored at once (its figure prunes
        the sizes still to come) unless its DP value is already RESCORE_MARGIN above the
        fastest figure; the others wait for the final re-scoring."""
        evaluated_here = False
        for answer in answers:
            partition = search.reconstruct(answer)
            if partition in self.seen:
                continue
            self.seen.add(partition)
            if evaluated_here or answer[0] > self.fastest() * (1 + RESCORE_MARGIN):
                self.waiting.append((answer[0], batch, partition))
                continue
            evaluated_here = self.score(answer[0], batch, partition)

    def rescore(self) -> None:
        """Re-score the waiting answers in order of their DP value while they can still
        win: at most RESCORE of them, none whose value exceeds the fastest figure found
        by RESCORE_MARGIN (the DP value over-predicts by less: RESCORE_MARGIN's comment),
        within the budget of actions (RESCORE_MIN_ACTIONS' comment); past the time limit,
        none more (status ``timed_out``)."""
        self.waiting.sort(key=lambda w: w[0])
        budget = max(RESCORE_MIN_ACTIONS, self.cells / RESCORE_CELLS_PER_ACTION)
        spent = 0
        for k, (value, batch, partition) in enumerate(self.waiting):
            fastest = self.fastest()
            if self.found and value > fastest * (1 + RESCORE_MARGIN):
                break
            if self.found and (k >= RESCORE or spent > budget):
                break
            if self.found and self.deadline.passed():
                self.status = "timed_out"
                break
            # a plan whose figure is provably above the tie window and above its size's
            # best figure so far (CostModel.round_lower_bound_ms, ~10x cheaper) changes
            # neither the fastest, nor the plans within the tie tolerance (the fastest only
            # falls), nor the per-size figures: it is not scored. The bound and the figure
            # add the same terms in other orders (a last-digit difference was seen: review 9
            # F1), hence the relative slack ROUNDING_SLACK
            least = max(fastest * (1 + TIE_TOLERANCE), self.per_batch.get(batch, INF))
            if np.isfinite(least) and (
                self.cm.round_lower_bound_ms(partition) > least * (1 + ROUNDING_SLACK)
            ):
                continue
            self.score(value, batch, partition)
            spent += partition.num_stages * partition.num_micro_batches

    def result(self) -> DPResult | None:
        """The chosen plan (:func:`choose`), or None when nothing fits."""
        if not self.found:
            return None
        cost, partition, value = choose(self.found)
        return DPResult(partition, cost, value, time.perf_counter() - self.start,
                        self.per_batch, self.status, self.kind, tuple(self.found))  # fmt: skip
