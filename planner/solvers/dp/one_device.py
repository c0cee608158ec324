"""When nothing can displace a one-device plan: a lower bound on the iteration of every
plan that uses two or more devices, from the two resources every such plan loads, the
test built on it (:func:`nothing_displaces`), and the plan it settles without a DP run
(:func:`settled_alone`: :func:`planner.solvers.dp.driver.plan_dp` on a long chain, and
:func:`planner.solvers.solve.solve`'s coarse views, issue 29 item 5: small problems are
cheap).

Inputs: a :class:`~planner.cost.model.CostModel` (its prefix tables, per-device slowdown
and runtime work, pair rates, boundary and parameter bytes), the micro-batch candidates
and a threshold T in ms.

Resources (planner/cost, docs/cost-model.md; each argument holds for the isolated
iteration and, per iteration, for the steady period lim T_n / n of
:mod:`planner.cost.steady`):

* a device runs its actions one at a time: a stage on g devices has one with y >=
  ceil(B / g) samples, whose M forward and backward actions take at least M (sum over
  the stage's blocks of the least time of any device at any batch >= ceil(B / g), plus
  the least runtime work per micro-batch of any device) (``CostModel.device_times``);
* on a shared medium (``network.shared_medium``) the transfers in progress share one
  channel, each at a fair share of its pair's rate, the shares summing to at most 1
  (:func:`planner.cost.channels.medium_shares`), so the channel time of all an
  iteration's transfers, each priced at the fastest pair's rate, fits in it: a cut
  after block j carries B a_j bytes forward and back per micro-batch (2 G a_j in all, G
  the global batch; :meth:`CostModel.link_transfer`) and a stage of g >= 2 devices rings
  2 (g - 1) W bytes (its parameters W; :meth:`CostModel.ring`). Elsewhere this term is 0.

Bound (:func:`multi_device_at_least`): a plan of two or more devices whose every stage
keeps its device term below T still puts its stages' rings and its cuts on the medium;
the least such channel time over all chains of stages (a DP over the cut positions,
stage sizes g <= N free: a relaxation, the devices are not counted) is at least T, or
there is no such plan, exactly when every plan of two or more devices takes at least T.

One-device plans (:func:`settled_alone`): at each micro-batch size the device of least
M x (forward + backward + runtime work) at the whole micro-batch runs every block; those
plans are scored by the cost model, and when :func:`nothing_displaces` holds for them, the
tie rule's pick among them is the pick among every plan of the problem with them: the
DP's searches, its coarse to fine runs and the coarse views could not change it.

Complexity: O(|B| min(N, 2 sqrt(B)) L^2) numpy work and O(L^2) memory for L blocks, N
devices and |B| micro-batch sizes (B the largest; a stage's group sizes only through
their share ceil(B / g)), O(|B| min(N, 2 sqrt(B)) N L B) for the per-block least
figures, and |B| evaluations of one-stage plans. A deadline, where given, is checked
before each size and each share (a time-limited caller's first step, issue 29: the
limit covers everything).
"""

from __future__ import annotations

import time

import numpy as np
from edgepipe.planner.cost.closed_form import pipeline_closed_form_ms
from edgepipe.planner.cost.model import CostModel, PlanCost
from edgepipe.planner.inputs.problem import Problem
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.solvers.dp.sizes import TIE_TOLERANCE, DPResult, choose
from edgepipe.planner.solvers.time_limit import Deadline

#: relative slack for sums of the same figures taken in other orders than the cost model's
SLACK = 1e-9

INF = np.inf


def _per_block_least(cm: CostModel, share: int) -> np.ndarray:
    """(L,) each block's least forward + backward ms on any device at any batch >= share."""
    out = np.full(len(cm.boundary), INF)
    for dev, name in enumerate(cm.device_type):
        fb = cm.fwd[name] + cm.bwd[name]
        per = np.diff(fb, axis=0)[:, share:].min(axis=1) * cm.slowdown[dev]
        out = np.minimum(out, per)
    return out


def _least_groups(fewest: int, n_dev: int, batch: int) -> dict[int, int]:
    """Per per-device share ceil(``batch`` / g) of a stage of g = ``fewest`` .. ``n_dev``
    devices, the least such g: the stages of g devices at one share have the same device
    term, and the least g the least ring, so only it can give a stage's least channel
    time. At most 2 sqrt(``batch``) entries."""
    least: dict[int, int] = {}
    for g in range(fewest, n_dev + 1):
        least.setdefault(-(-batch // g), g)
    return least


def multi_device_at_least(cm: CostModel, batch: int, threshold: float,
                          deadline: Deadline | None = None) -> bool:  # fmt: skip
    """Whether every plan of two or more devices at micro-batch ``batch`` has an
    iteration (and a steady period) of at least ``threshold`` ms (module docstring).
    The group sizes g are those of :func:`_least_groups`, each share's per-block least
    figures computed once.

    Raises:
        TimeoutError: ``deadline`` passed (checked before each share)."""
    problem = cm.problem
    n_dev, n_blk = len(cm.device_type), len(cm.boundary)
    m = problem.config.global_batch // batch
    work = min(sum(cm.work[name]) * cm.slowdown[d] for d, name in enumerate(cm.device_type))
    if cm.shared_medium and n_dev > 1:
        off = ~np.eye(n_dev, dtype=bool)
        rate = float(cm.bw[off].max())
        cut = 2.0 * problem.config.global_batch * cm.boundary / rate  # cut after block j: [j - 1]
        ring_per_byte = 2.0 / rate
    else:
        cut, ring_per_byte = np.zeros(n_blk), 0.0
    first, end = np.triu_indices(n_blk + 1, k=1)
    params = cm.param_prefix[end] - cm.param_prefix[first]
    # stage [a, e): the least channel time of a group size whose device term stays below T
    stage = np.full((n_blk + 1, n_blk + 1), INF)
    prefixes: dict[int, np.ndarray] = {}  # per share: the prefix sums of its least figures
    for share, g in _least_groups(1, n_dev, batch).items():
        if deadline is not None and deadline.passed():
            raise TimeoutError
        prefix = np.concatenate([[0.0], np.cumsum(_per_block_least(cm, share))])
        prefixes[share] = prefix
        busy = m * (prefix[end] - prefix[first] + work)
        ring = ring_per_byte * (g - 1) * params
        here = np.where(busy < threshold * (1 + SLACK), ring, INF)
        stage[first, end] = np.minimum(stage[first, end], here)
    # chains of stages covering [0, e): least summed stage channel time plus inner cuts
    chain = np.full(n_blk + 1, INF)
    for e in range(1, n_blk + 1):
        inner = chain[1:e] + cut[: e - 1] + stage[1:e, e]
        chain[e] = min(stage[0, e], float(inner.min(initial=INF)))
    several = chain[1:n_blk] + cut[: n_blk - 1] + stage[1:n_blk, n_blk]
    one_stage = INF  # one stage on g >= 2 devices (every share of g >= 2 is one of g >= 1)
    for share, g in _least_groups(2, n_dev, batch).items():
        if m * (prefixes[share][-1] + work) < threshold * (1 + SLACK):
            one_stage = min(one_stage, ring_per_byte * (g - 1) * float(cm.param_prefix[-1]))
    least = min(float(several.min(initial=INF)), one_stage)
    return least >= threshold * (1 + SLACK)


def nothing_displaces(cm: CostModel, found: list[tuple[PlanCost, Partition, float]],
                      deadline: Deadline | None = None) -> bool:  # fmt: skip
    """Whether no plan of ``cm``'s problem, added to ``found`` (figures, plan, DP value),
    can change the tie rule's pick among them (:func:`planner.solvers.dp.sizes.choose`):
    a plan C on one device, of steady step s, where the fastest step in ``found`` is f,
    when (``TIE_TOLERANCE`` t):

    * every plan of two or more devices takes at least s / (1 + t)
      (:func:`multi_device_at_least`): it cannot push C out of the tie window, and
      within it the tie rule prefers C's fewer devices;
    * every one-device plan at a smaller micro-batch size takes more than f (1 + t): it
      stays out of the window, where it would rank first;
    * every one-device plan at C's size on another device takes more than s: the tie
      rule's last key, the step, keeps C;
    * every one-device plan at a larger size takes at least s / (1 + t) (it ranks after
      C by its micro-batch).

    A one-device plan takes M times its device's forward, backward and runtime work at
    the whole micro-batch, nothing else running (its iteration and its step).
    O(|B| min(N, 2 sqrt(B)) L^2) (:func:`multi_device_at_least`).

    Raises:
        TimeoutError: ``deadline`` passed (:func:`multi_device_at_least`)."""
    cost, plan, _ = choose(found)
    if len(plan.used_devices()) != 1:
        return False
    fastest = min(c.steady_ms for c, _, _ in found)
    own = cm.problem.cluster.index(plan.stages[0].devices[0])
    batch, step = plan.micro_batch_size, cost.steady_ms
    window = step / (1 + TIE_TOLERANCE)
    for b in cm.problem.config.micro_batch_sizes():
        least = (fastest * (1 + TIE_TOLERANCE) if b < batch else step if b == batch
                 else window) * (1 + SLACK)  # fmt: skip
        for dev in range(len(cm.device_type)):
            if (b != batch or dev != own) and _alone_ms(cm, dev, b) < least:
                return False
        if not multi_device_at_least(cm, b, window, deadline):
            return False
    return True


def _alone_ms(cm: CostModel, dev: int, batch: int) -> float:
    """M x (forward + backward + runtime work) of every block on device ``dev`` at
    micro-batch ``batch``: a one-device plan's iteration and step, nothing else running."""
    name = cm.device_type[dev]
    whole = cm.fwd[name][-1, batch] + cm.bwd[name][-1, batch] + sum(cm.work[name])
    return float(cm.problem.config.global_batch // batch * whole * cm.slowdown[dev])


def settled_alone(problem: Problem, deadline: Deadline | None = None) -> DPResult | None:
    """The tie rule's pick among the one-device plans of ``problem`` (module docstring),
    as the DP's result (``graph`` "none": no search ran), where no plan of the problem
    could change it (:func:`nothing_displaces`); else None, also once ``deadline``
    passed (checked before each micro-batch size and each share of the bound)."""
    start = time.perf_counter()
    sizes = problem.config.micro_batch_sizes()
    cm = CostModel(problem, max(sizes))
    devices = problem.cluster.devices
    found: list[tuple[PlanCost, Partition, float]] = []
    for b in sizes:
        if deadline is not None and deadline.passed():
            return None
        dev = min(range(len(devices)), key=lambda d: (_alone_ms(cm, d, b), d))
        stage = StageAssignment(0, problem.model.num_blocks, (devices[dev].id,), (b,))
        plan = Partition(b, problem.config.global_batch // b, (stage,))
        cost = cm.evaluate(plan)
        if cost.memory_ok:
            found.append((cost, plan, pipeline_closed_form_ms(cm, plan, cost)))
    try:
        if not found or not nothing_displaces(cm, found, deadline):
            return None
    except TimeoutError:
        return None
    cost, plan, value = choose(found)
    per_size = {p.micro_batch_size: c.iteration_ms for c, p, _ in found}
    return DPResult(plan, cost, value, time.perf_counter() - start, per_size, "complete",
                    "none", tuple(found))  # fmt: skip
