"""Coarse-to-fine planning of long chains: the DP on merged blocks, then on the cuts
near the coarse plans' cuts (multilevel refinement, issue 10; docs/decisions.md).

Inputs: a :class:`~planner.inputs.problem.Problem` of L blocks, the DP's arguments.

Merging is exact. Every figure of a stage is a difference of prefix sums over its block
range (times per device type and batch, parameter and saved bytes: ``CostModel``'s
tables, reference/asteroid.md §3) or reads the output bytes of its last block (the
boundary after it), so a chain whose blocks between consecutive positions of a set of
cuts are merged into one block each prices every plan whose cuts lie in that set exactly
as the full chain does (:func:`merge_blocks`; a merged type's times are tabulated at
every batch 1..max micro-batch, so the cost model's batch curve reads the summed curves
of its members, not a curve fitted to summed measurements). Planning on a merged chain
is planning on the full one with stage boundaries restricted to the cuts, up to the DP's
own search heuristics that read a profile's measurements rather than its figures (the
speed that orders device classes, :func:`planner.solvers.dp.graph.device_orders`, reads the largest
candidate's time clamped to the measured sizes; whether a class's times never fall with
the batch is judged per block): they may search the merged chain in another order.

Steps (:func:`plan_multilevel`):

1. coarse: with k = ceil(L / ``COARSE_BLOCKS``), keep in every window of k consecutive
   cut positions the one whose boundary carries the fewest bytes (:func:`coarse_cuts`),
   merge the blocks between them and run the DP (:func:`planner.solvers.dp.sizes.best_plan`) on the
   ~``COARSE_BLOCKS`` merged blocks;
2. windows: among the plans the coarse run scored and the caller's warm start, the
   fastest of each micro-batch size, where it is within ``WINDOW_MARGIN`` of the fastest
   figure, votes its cuts; the allowed cuts are those within k blocks of a voted cut,
   plus every cut of the caller's warm start;
3. fine: run the DP on the chain merged at the allowed cuts, warm-started from the
   faster of the coarse plan and the caller's warm start (so the answer is never slower
   than either beyond the tie tolerance), and return the chosen plan (the DP's tie rule
   over the coarse and the fine plans) on the original blocks, scored by the cost model
   of the full chain.

A plan whose stage boundaries lie away from every good coarse plan's is not searched:
this is a heuristic where the DP is (its fronts are lossy too), measured against the DP
on every block in ``benchmarks/multilevel_quality.py`` (docs/benchmarks.md). When the
coarse chain has no plan that fits memory (a fit may need a cut off the coarse grid),
the DP runs on every block instead.

Complexity: the DP's, on ~``COARSE_BLOCKS`` blocks, then on W <= (2k + 1) x (the voted
cuts) + 1 merged blocks (about 2 P k per voting micro-batch size for plans of P stages),
the choice of the coarse cuts O(L); the DP's work grows as the
square of the blocks (its head ranges), so 400 blocks cost about two DPs of 100-200
instead of one of 400. Merging is O(L x max micro-batch) per type. The time limit is
shared: the fine run gets what the coarse one left, and is not begun when the coarse
run timed out (its plan is returned, ``timed_out``).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
from edgepipe.planner.cost.closed_form import pipeline_closed_form_ms
from edgepipe.planner.cost.model import CostModel, PlanCost
from edgepipe.planner.inputs.problem import Problem
from edgepipe.planner.inputs.profile import Block, Timing, batch_curve
from edgepipe.planner.partition import Partition
from edgepipe.planner.solvers.dp.sizes import (
    DEFAULT_TIME_LIMIT,
    DPResult,
    best_plan,
    check_incumbent,
    choose,
)
from edgepipe.planner.solvers.time_limit import Deadline

#: blocks of the coarse chain, about (ceil((L - 1) / k) + 1 for the width k =
#: ceil(L / COARSE_BLOCKS): 101 at 300 and 400 blocks)
COARSE_BLOCKS = 100

#: widths of the coarse views :func:`coarse_views` plans, and the most blocks a view may
#: have (as many as the coarse chain here: a view costs at most about the coarse run)
VIEW_WIDTHS = (2, 4, 8)
VIEW_MAX_BLOCKS = COARSE_BLOCKS

#: the fastest plan of each micro-batch size (coarse, or the caller's warm start) within
#: this fraction of the fastest figure votes its cuts
WINDOW_MARGIN = 0.05


def coarse_width(n_blocks: int) -> int:
    """The coarse run's window width k = ceil(L / ``COARSE_BLOCKS``) (step 1 above), the
    one :func:`plan_multilevel` plans and :func:`coarse_views` does not plan again."""
    return math.ceil(n_blocks / COARSE_BLOCKS)


def merge_blocks(problem: Problem, cuts: list[int]) -> Problem:
    """``problem`` with the blocks between consecutive ``cuts`` (0 = cuts[0] < .. <
    cuts[-1] = L) merged into one block each: parameter and saved bytes summed, the
    output bytes of the last member, and per device type the summed batch curves at every
    batch 1..max micro-batch candidate (exact for every plan whose cuts are in ``cuts``:
    module docstring). O(L x max micro-batch) per type."""
    blocks = problem.model.blocks
    spans = list(itertools.pairwise(cuts))
    merged = tuple(
        Block(
            name=blocks[a].name if b - a == 1 else f"{blocks[a].name}..{blocks[b - 1].name}",
            param_bytes=sum(x.param_bytes for x in blocks[a:b]),
            output_bytes_per_sample=blocks[b - 1].output_bytes_per_sample,
            saved_bytes_per_sample=sum(x.saved_bytes_per_sample for x in blocks[a:b]),
            members=tuple(m for x in blocks[a:b] for m in (x.members or (x.name,))),
        )
        for a, b in spans
    )
    max_batch = max(problem.config.micro_batch_sizes())
    sizes = tuple(range(1, max_batch + 1))
    at = np.array(cuts)

    def merge(timing: Timing) -> Timing:
        def summed(field: str) -> tuple[tuple[float, ...], ...]:
            curves = batch_curve(timing.batch_sizes, np.asarray(getattr(timing, field)), max_batch)
            prefix = np.vstack([np.zeros((1, max_batch + 1)), np.cumsum(curves, axis=0)])
            per_block = prefix[at[1:], 1:] - prefix[at[:-1], 1:]
            return tuple(tuple(float(v) for v in row) for row in per_block)

        return replace(timing, batch_sizes=sizes, forward_ms=summed("forward_ms"),
                       backward_ms=summed("backward_ms"), forward_spread_ms=None,
                       backward_spread_ms=None)  # fmt: skip

    # the problem's timings are mostly the profile's own objects: each merged once
    merged_of: dict[int, Timing] = {}
    for t in [*problem.model.timings.values(), *problem.timings.values()]:
        if id(t) not in merged_of:
            merged_of[id(t)] = merge(t)
    model = replace(problem.model, blocks=merged,
                    timings={k: merged_of[id(t)] for k, t in problem.model.timings.items()})
    return replace(problem, model=model,
                   timings={k: merged_of[id(t)] for k, t in problem.timings.items()})


def coarse_cuts(problem: Problem, width: int) -> list[int]:
    """The coarse chain's cuts: 0, L, and in every window of ``width`` consecutive cut
    positions (1..width, width+1..2 width, ...) the one whose boundary carries the fewest
    bytes per sample (the first such). A branchy graph imported node by node crosses
    cheaply only at a few positions (a cell's end): shifting such a cut by 1-3 blocks
    costs 27-31% of the iteration on the NASNet-like graph (docs/decisions.md), so a
    grid of every width-th position would hide them; the cheapest position of each
    window keeps them wherever they are. O(L)."""
    n_blk = problem.model.num_blocks
    out_bytes = [b.output_bytes_per_sample for b in problem.model.blocks]
    picks = [
        min(range(start, min(start + width, n_blk)), key=lambda c: out_bytes[c - 1])
        for start in range(1, n_blk, width)
    ]
    return [0, *picks, n_blk]


def expand(partition: Partition, cuts: list[int]) -> Partition:
    """A plan of the chain merged at ``cuts`` as a plan of the original blocks."""
    stages = tuple(replace(s, first=cuts[s.first], end=cuts[s.end]) for s in partition.stages)
    return replace(partition, stages=stages)


def known_figures(found: Sequence[tuple[PlanCost, Partition, float]],
                  cuts: list[int]) -> Callable[[Partition], PlanCost | None]:
    """For :func:`best_plan`'s ``known``: a plan of the chain merged at ``cuts`` looked up,
    on the original blocks (:func:`expand`), among ``found`` (figures, plan of the original
    blocks, DP value; another run's ``scored``). Merging prices every plan whose cuts it
    keeps as the full chain does (module docstring), so a plan scored on one merging has
    those figures on every other (up to the order of the sums: 93 of 94 repeats on the
    NASNet-like small mixed cases bit for bit, docs/decisions.md). O(P) a lookup."""
    table = {plan: cost for cost, plan, _ in found}
    return lambda partition: table.get(expand(partition, cuts))


def contract(partition: Partition, cuts: list[int]) -> Partition:
    """A plan of the original blocks whose cuts are all in ``cuts`` as a plan of the chain
    merged there (the inverse of :func:`expand`)."""
    index = {c: i for i, c in enumerate(cuts)}
    stages = tuple(replace(s, first=index[s.first], end=index[s.end]) for s in partition.stages)
    return replace(partition, stages=stages)


def plan_multilevel(
    problem: Problem,
    progress: Callable[[int, int], None] | None = None,
    time_limit: float | Deadline = DEFAULT_TIME_LIMIT,
    *,
    by_class: bool = True,
    incumbent: Partition | None = None,
) -> DPResult | None:
    """The DP coarse to fine (module docstring); ``None`` when nothing fits memory.
    Arguments as :func:`planner.solvers.dp.driver.plan_dp`'s; ``progress`` runs to half its total
    in the
    coarse run and on from there in the fine one (or the run on every block, where no
    coarse plan fits). ``coarse_to_fine`` in the result says whether the fine run's
    chain was the one searched last (False after the fallback to every block).

    Raises:
        PlanMismatchError: the incumbent is not a plan of ``problem``.
        InputError: the incumbent's micro-batch size is not a candidate.
    """
    start = time.perf_counter()
    n_blk = problem.model.num_blocks
    if incumbent is not None:
        check_incumbent(problem, incumbent)
    width = coarse_width(n_blk)
    grid = coarse_cuts(problem, width)

    def half(offset: int) -> Callable[[int, int], None] | None:
        if progress is None:
            return None
        return lambda done, total: progress(offset * total + done, 2 * total)

    # one running limit (wall clock, CPU time) for both runs
    left = time_limit if isinstance(time_limit, Deadline) else Deadline(time_limit)
    coarse = best_plan(merge_blocks(problem, grid), half(0), left, by_class=by_class)
    if coarse is None:
        # no coarse plan fits memory: one may need a cut off the grid
        return best_plan(problem, half(1), left, by_class=by_class, incumbent=incumbent)
    cm = CostModel(problem, max(problem.config.micro_batch_sizes()))
    found = [(cost, expand(p, grid), value) for cost, p, value in coarse.scored]
    if incumbent is not None:
        cost = cm.evaluate(incumbent)
        if cost.memory_ok:
            found.append((cost, incumbent, pipeline_closed_form_ms(cm, incumbent, cost)))
    ranked = sorted(found, key=lambda f: f[0].iteration_ms)
    fastest, warm = ranked[0][0].iteration_ms, ranked[0][1]
    # the fastest plan of each micro-batch size within the margin votes (plans of one size
    # mostly differ by a few cuts; more voters widen the fine chain for little: the
    # decision record)
    voters: dict[int, Partition] = {}
    for cost, p, _ in ranked:
        if cost.iteration_ms <= fastest * (1 + WINDOW_MARGIN):
            voters.setdefault(p.micro_batch_size, p)
    allowed = {0, n_blk}
    for plan in voters.values():
        for stage in plan.stages[1:]:
            allowed.update(range(max(1, stage.first - width), min(n_blk, stage.first + width + 1)))
    if incumbent is not None:
        allowed.update(s.first for s in incumbent.stages)
    cuts = sorted(allowed)
    status, graph = coarse.status, coarse.graph
    if status != "timed_out":
        fine = best_plan(merge_blocks(problem, cuts), half(1), left, by_class=by_class,
                         incumbent=contract(warm, cuts),
                         known=known_figures(found, cuts))  # fmt: skip
        # None only if the warm start fits the full chain's memory but not, by a rounding
        # of the merged sums, the fine chain's: the coarse plans stand
        if fine is not None:
            found += [(cost, expand(p, cuts), value) for cost, p, value in fine.scored]
            status = fine.status
            graph = graph if fine.graph == "none" else fine.graph
    candidates: dict[int, float] = {}
    for cost, plan, _ in found:
        batch = plan.micro_batch_size
        candidates[batch] = min(candidates.get(batch, math.inf), cost.iteration_ms)
    _, partition, value = choose(found)
    return DPResult(partition, cm.evaluate(partition), value, time.perf_counter() - start,
                    candidates, status, graph, tuple(found), coarse_to_fine=True)  # fmt: skip


def coarse_views(
    problem: Problem, time_limit: float, *, by_class: bool = True, coarse_run: bool = False,
    known: Sequence[tuple[PlanCost, Partition, float]] = (),
) -> list[tuple[PlanCost, Partition, float]]:
    """Plans of ``problem`` found by the DP on its coarse views: for each width w of
    ``VIEW_WIDTHS``, the chain merged at the cheapest crossing of every window of w
    positions (:func:`coarse_cuts`), planned by :func:`best_plan` and expanded to the
    original blocks (exact: merging prices every plan on the merged cuts as the full
    chain does), as ``(figures, plan, DP value)`` like ``DPResult.scored``.

    Why: the DP's fronts and its ranking by the closed form are heuristics, and on a
    finer chain (a finer import of the same model) they may settle on a plan slower
    than the one they find on the coarser chain, although every plan of the coarse chain
    is one of the fine chain's. Where the fine chain divides each coarse block into w
    blocks and a coarse block's end is its cheapest crossing (a residual block's end,
    a cell's output), the view of width w is the coarse chain itself, so the best of the
    views and the fine DP (the tie rule, :func:`choose`) is no slower than the coarse
    chain's DP plan beyond the tie tolerance (tests/unit/test_granularity.py). Views of
    fewer than 2 or more than ``VIEW_MAX_BLOCKS`` blocks are skipped.

    Complexity: one DP per width on about L / w blocks (the DP's work grows as the
    square of the blocks: the three views cost about a third of one DP on every block of
    a chain of at most ``VIEW_MAX_BLOCKS``),
    within ``time_limit`` seconds in all (a view not begun when it has passed). On a
    chain of more than 800 blocks no view is planned (the multilevel DP's coarse run is
    its own view). ``coarse_run``: the caller's DP ran coarse to fine
    (:func:`plan_multilevel`, whose ``scored`` holds its coarse run's plans): the view of
    the coarse run's width ceil(L / ``COARSE_BLOCKS``) is that run (the same merged chain
    planned by the same :func:`best_plan`, which counts work, not seconds), so it is not
    planned again (resnet50-like on home-mixed-5: views 1.44 -> 0.6 CPU s). ``known``:
    plans of the original blocks scored already (the caller's DP run's ``scored``), whose
    figures a view, like the plans of the views before it, does not evaluate again
    (:func:`known_figures`: 13-35 of the 25-52 evaluations of the views on the NASNet-like
    small mixed cases)."""
    start = time.perf_counter()
    found: list[tuple[PlanCost, Partition, float]] = []
    planned = coarse_width(problem.model.num_blocks) if coarse_run else None
    for width in VIEW_WIDTHS:
        grid = coarse_cuts(problem, width)
        left = time_limit - (time.perf_counter() - start)
        if not 2 <= len(grid) - 1 <= VIEW_MAX_BLOCKS or left <= 0 or width == planned:
            continue
        view = best_plan(merge_blocks(problem, grid), None, left, by_class=by_class,
                         known=known_figures([*known, *found], grid))  # fmt: skip
        if view is not None:
            found += [(cost, expand(p, grid), value) for cost, p, value in view.scored]
    return found
