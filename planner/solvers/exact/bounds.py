"""Bounds on the iteration time of the plans of a (B, P) program without a solver: the
closed-form lower bound :func:`quick_bound`, the min-max lower bounds of
:func:`program_bounds` (a bisection on T over the feasibility DP of
:mod:`planner.solvers.exact.stage_bounds`, with the steps :func:`test_at`,
:func:`bisect_bounds` and :func:`raise_least` the planner drives itself), and the upper
bound :func:`horizon` on every plan (the time variables' range)."""

from __future__ import annotations

import math

import numpy as np
from edgepipe.planner.solvers.exact.stage_bounds import StageBounds
from edgepipe.planner.solvers.exact.tables import Tables
from edgepipe.planner.solvers.time_limit import Deadline


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


def program_bounds(
    tables: Tables,
    batch: int,
    max_stages: int,
    ceiling: float | None = None,
    rel_tol: float = 1e-3,
    known: np.ndarray | None = None,
    deadline: Deadline | None = None,
) -> np.ndarray:
    """Lower bounds on the cost model's iteration time of every plan with micro-batch
    ``batch`` and P = 1 .. ``max_stages`` stages (entry P; entry 0 unused), from a
    min-max over block partitions and per-class device counts, without a solver.

    ``known``: valid lower bounds already known (entry P), where the bisection starts; an
    entry at or above ``ceiling`` (what pruning needs) only says so; the others are
    within ``rel_tol`` (relative) below the min-max, or wherever the bisection stood at
    ``deadline`` (a :class:`~planner.solvers.time_limit.Deadline`; None: no limit; the
    tables' set-up stops at it too, then every entry is 0): every returned entry is a
    valid bound.

    Per stage q of blocks [a, b) served by g_j devices of class group j
    (:func:`planner.solvers.exact.stage_bounds.bound_groups`; every device takes >= 1
    sample, so 1 <= g = sum g_j <= B; a device of group j fits at most y_j samples
    (Eq. 3, one micro-batch in flight, the group's largest budget, no replica), so sum
    g_j y_j >= B), take any sample j of a micro-batch and the device d(j) of stage q
    that holds it (the same for every micro-batch: the slicing is fixed). The round ends
    no earlier than

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
          (:func:`planner.cost.channels.fair_shares`), and a device sends nothing before its first
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
    :func:`planner.solvers.exact.tables.stage_orders`), and between F(m) and B(m) sample j of
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
    :data:`planner.solvers.exact.stage_bounds.BOUND_STATES` beside the device-count
    DP's (N + 1) min(B, N)): one DP pass per bisection step, all P together, vectorised
    over (b, states, compositions)."""
    out = np.full(max_stages + 1, np.inf)
    if deadline is None:
        deadline = Deadline(math.inf)
    try:
        bounds = StageBounds(tables, batch, max_stages, deadline)
    except TimeoutError:
        return np.zeros(max_stages + 1)
    if not bounds.stages or max_stages < 1:
        return out
    lo = np.zeros(max_stages + 1)
    if known is not None:
        lo[1:] = np.maximum(known[1 : max_stages + 1], 0.0)
    hi = (
        test_at(bounds, lo, ceiling, deadline)
        if ceiling is not None
        else _upper_ends(bounds, tables, lo, deadline)
    )
    if hi is not None:
        bisect_bounds(bounds, lo, hi, rel_tol, deadline)
    out[1:] = lo[1:]
    return out


def _upper_ends(
    bounds: StageBounds, tables: Tables, lo: np.ndarray, deadline: Deadline
) -> np.ndarray | None:
    """Upper ends for :func:`bisect_bounds` without a ceiling (entries 1..P of ``lo``):
    per P a T some partition into P stages meets, doubling a guess from :func:`horizon`;
    where no partition fits memory, ``lo`` = inf and no upper end (NaN), in place.
    None when the ``deadline`` passes (``lo`` then stands where it was)."""
    max_stages = len(lo) - 1
    every = list(range(1, max_stages + 1))
    try:
        structural = bounds.feasible(every, np.full(max_stages, 1e300), deadline)
    except TimeoutError:
        return None
    hi = np.full(max_stages + 1, np.inf)
    hi[0] = np.nan
    lo[1:][~structural] = np.inf  # no partition fits memory
    hi[1:][~structural] = np.nan
    guess = max(horizon(tables, [bounds.batch]), 1.0)
    while (sel := np.isinf(hi)).any():  # an upper end: double a guess
        if not _narrow(bounds, sel, np.full(int(sel.sum()), guess), lo, hi, deadline):
            return None
        guess *= 2.0
    return hi


def bisect_bounds(
    bounds: StageBounds,
    lo: np.ndarray,
    hi: np.ndarray,
    rel_tol: float,
    deadline: Deadline,
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
        mid = 0.5 * (lo[sel] + hi[sel])
        if not _narrow(bounds, sel, mid, lo, hi, deadline):
            return False
        done += 1


def _narrow(
    bounds: StageBounds,
    sel: np.ndarray,
    at: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    deadline: Deadline,
) -> bool:
    """Test the entries P of ``sel`` (at least one) at T = ``at`` (one value each): where
    some partition meets it, ``hi`` falls to it, elsewhere ``lo`` rises to it (in place).
    False when the ``deadline`` passed (then nothing changed)."""
    idx = np.flatnonzero(sel)
    try:
        ok = bounds.feasible([int(t) for t in idx], at, deadline)
    except TimeoutError:
        return False
    hi[idx[ok]] = at[ok]
    lo[idx[~ok]] = at[~ok]
    return True


def open_intervals(lo: np.ndarray, hi: np.ndarray, rel_tol: float) -> np.ndarray:
    """Entries P >= 1 whose bisection interval [lo, hi] is wider than ``rel_tol`` x hi."""
    with np.errstate(invalid="ignore"):  # NaN: nothing to bisect
        sel = ~np.isnan(hi) & (hi - lo > rel_tol * hi)
    sel[0] = False
    return sel


def raise_least(
    searches: list[tuple[StageBounds, np.ndarray, np.ndarray]],
    until: Deadline,
    rel_tol: float = 1e-3,
) -> None:
    """Bisection steps (:func:`bisect_bounds`, in place) where they lift the least open
    bound over all micro-batch sizes (the global bound is the least of the open
    programs'): each step bisects, in the size holding the least open ``lo``, every P
    whose ``lo`` is at most the least of the other sizes', until ``until`` or no interval
    is open."""
    while not until.passed():
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


def test_at(
    bounds: StageBounds, lo: np.ndarray, ceiling: float, deadline: Deadline
) -> np.ndarray:
    """Test every P with ``lo`` below ``ceiling`` at T = ceiling: returns the upper ends
    for :func:`bisect_bounds` (``ceiling`` where feasible, NaN where not, and there ``lo``
    rises to the ceiling, in place); on timeout nothing is known (all NaN)."""
    hi = np.full(len(lo), np.nan)
    sel = lo < ceiling
    sel[0] = False
    if sel.any():
        _narrow(bounds, sel, np.full(int(sel.sum()), ceiling), lo, hi, deadline)
    return hi


def horizon(tables: Tables, sizes: list[int]) -> float:
    """An upper bound on any plan's iteration time (bounds the time variables): every
    action of the longest chain at its largest duration, plus the largest all-reduce."""
    problem = tables.problem
    n_dev = tables.n_devices
    worst = 0.0
    for batch in sizes:
        m_count = problem.config.global_batch // batch
        steps = 2 * min(problem.model.num_blocks, n_dev) - 1
        compute = max(  # with the runtime's work per micro-batch (CostModel.device_times)
            float(tf[:, 1 : batch + 1].sum(axis=0).max() + tb[:, 1 : batch + 1].sum(axis=0).max())
            + wf + wb
            for tf, tb, wf, wb in zip(tables.tf, tables.tb, tables.wf, tables.wb, strict=True)
        )
        slowest = max(tables.inv_values) if tables.inv_values else 0.0
        lat = float(np.nanmax(tables.lat)) if tables.inv_values else 0.0
        link = lat + batch * float(tables.boundary.max()) * slowest
        ring = 2.0 * n_dev * (float(tables.grad.sum()) * slowest + lat)
        worst = max(worst, m_count * steps * (compute + 2 * link) + ring)
    return worst * 1.01 + 1.0
