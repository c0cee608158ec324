"""The DP planner's entry point: :func:`plan_dp` runs the DP over every micro-batch size
(:func:`planner.solvers.dp.sizes.best_plan`) or, on long chains, coarse to fine
(:mod:`planner.solvers.dp.multilevel`), and explains an infeasible problem
(:func:`planner.solvers.diagnosis.diagnose_infeasible`).

Long chains: on more than ``MULTILEVEL_ABOVE`` blocks (``SMALL_MULTILEVEL_ABOVE`` on a
cluster of fewer than ``SMALL_CLUSTER_BELOW`` devices) the DP runs twice, on ~100 merged
blocks and then on the cuts within one merge width of the good coarse plans' cuts (merging
is exact for every plan on the merged cuts, so only the cut positions are restricted);
``multilevel=False`` runs it on every block. Before that (without a warm start), each
micro-batch size's fastest one-device plan is scored, and their tie-rule pick is the
answer without a search where a lower bound shows no plan of the problem could change it
(:func:`planner.solvers.dp.one_device.settled_alone`: each stage's busiest device and, on
a shared medium, the one channel every cut and ring loads; issue 29 item 5).
"""

from __future__ import annotations

from collections.abc import Callable

from edgepipe.planner.inputs.problem import Problem
from edgepipe.planner.partition import Partition
from edgepipe.planner.solvers.diagnosis import diagnose_infeasible
from edgepipe.planner.solvers.dp.multilevel import plan_multilevel
from edgepipe.planner.solvers.dp.one_device import settled_alone
from edgepipe.planner.solvers.dp.sizes import DEFAULT_TIME_LIMIT, DPResult, best_plan
from edgepipe.planner.solvers.time_limit import Deadline, check_time_limit

#: chains of more blocks than this are planned coarse to fine by default
#: (:mod:`planner.solvers.dp.multilevel`, docs/decisions.md)
MULTILEVEL_ABOVE = 200
#: on a cluster of fewer than SMALL_CLUSTER_BELOW devices, chains of more blocks than
#: SMALL_MULTILEVEL_ABOVE are planned coarse to fine (issue 29, small problems are cheap:
#: resnet50-like, 158 blocks, on home-mixed-5, edgepipe plan 3.93 -> 2.77 CPU s and 182 ->
#: 85 MB, same plan; docs/decisions.md)
SMALL_MULTILEVEL_ABOVE = 100
SMALL_CLUSTER_BELOW = 9


def multilevel_above(problem: Problem) -> int:
    """The block count above which ``problem`` is planned coarse to fine by default."""
    small = len(problem.cluster.devices) < SMALL_CLUSTER_BELOW
    return SMALL_MULTILEVEL_ABOVE if small else MULTILEVEL_ABOVE


def plan_dp(
    problem: Problem,
    progress: Callable[[int, int], None] | None = None,
    time_limit: float = DEFAULT_TIME_LIMIT,
    *,
    by_class: bool = True,
    incumbent: Partition | None = None,
    multilevel: bool = True,
    cpu_time_limit: float | None = None,
) -> DPResult:
    """Best partition found by the DP over every micro-batch candidate.

    Args:
        problem: the inputs.
        progress: optional ``callback(done, total)`` after each level of each micro-batch
            candidate.
        time_limit: wall-clock seconds; when they run out the best plan so far is
            returned with status ``timed_out``.
        cpu_time_limit: optionally, this process's CPU seconds as a second limit (the
            first to run out stops the search; :class:`~planner.solvers.time_limit.Deadline`):
            the same plan however busy the machine is.
        by_class: key states by device class (default); ``False`` makes every device a
            class of its own (the device-by-device DP, for tests and benchmarks).
        incumbent: a warm start, a known plan of ``problem`` at one of its micro-batch
            candidates (re-planning passes its fast-path plan): scored first, so that
            every search, the first included, runs under the bound of its exact figure
            instead of a guess, and kept as a candidate, so the answer is never slower
            than it beyond the tie tolerance (:func:`planner.solvers.dp.sizes.choose` may
            prefer a plan within ``TIE_TOLERANCE`` on fewer devices); it is returned,
            with its closed form as the DP value, when the search finds nothing better.
        multilevel: on a chain of more than :func:`multilevel_above` blocks, plan coarse
            to fine (:func:`planner.solvers.dp.multilevel.plan_multilevel`: the DP on
            merged blocks, then on the cuts near the coarse plans' cuts), unless
            (without ``incumbent``) a one-device plan is settled by the bound of
            :func:`planner.solvers.dp.one_device.settled_alone` (graph ``none``: no
            search ran); ``False`` runs the DP on every block.

    Raises:
        InfeasibleError: no candidate fits memory (message names the binding figure).
        PlanMismatchError: the incumbent is not a plan of ``problem``.
        InputError: the incumbent's micro-batch size is not a candidate, or the time
            limit (or the CPU-time limit) is not a finite number of seconds above 0.
    """
    check_time_limit(time_limit)
    if cpu_time_limit is not None:
        check_time_limit(cpu_time_limit, "--cpu-time-limit")
    deadline = Deadline(time_limit, cpu_time_limit)
    if multilevel and problem.model.num_blocks > multilevel_above(problem):
        # a one-device plan no plan could displace is the answer without a search
        settled = None if incumbent is not None else settled_alone(problem, deadline)
        result = settled or plan_multilevel(problem, progress, deadline, by_class=by_class,
                                            incumbent=incumbent)  # fmt: skip
    else:
        result = best_plan(problem, progress, deadline, by_class=by_class,
                           incumbent=incumbent)  # fmt: skip
    if result is None:
        raise diagnose_infeasible(problem)
    return result
