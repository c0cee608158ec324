"""Zw: the weighted bound Z with its block weights chosen by subgradient ascent (a
Lagrangian dual of the closed form's two maxima).

Z (:func:`planner.solvers.dp.bounds._weighted`) bounds a plan's D + X (the closed form of
:func:`planner.cost.closed_form.pipeline_closed_form_ms`) from two families of inequalities, one per
stage s of the plan:

    D >= S + (M - 1) b'_s        (S the whole traversal; b'_s = E_b^s, or E_f + E_b for
                                  the last stage; reference/asteroid.md §4.2 as extended
                                  in planner.solvers.dp.recurrence)
    X >= T_a^s - PB_s            (PB_s the backward traversal before stage s)

and replaces each maximum over s by an average with the weights of the stages' block
counts. Any two distributions over the blocks do as well: with w for the D family and v
for the X family (a stage's weight the sum of its blocks' weights; W_s, V_s; V(> s) the
weight of the blocks after it),

    D + X >= sum_s [ c_s + 2 o_s + (M - 1) W_s b'_s + V_s T_a^s - (E_b^s + o_s) V(> s) ]

(o_s the link after stage s one way; the sums of W and V over the stages are 1, so the
two averages are at most the two maxima). Every figure's coefficient is >= 0 (E_b's is
1 + (M - 1) W_s - V(> s)), so each may take its relaxed least value and the right side
is additive over the stages: the same DP over (first block, devices) as Z,

    Zw(w, v)[a, n] = min over a < e <= L, shares i with need_i <= n of
                     Zw[e, n - need_i] + cost_{w,v}[i, a, e],   Zw[L, n] = 0,

and Zw(w, v) = Zw[0, N] is a lower bound on every plan's D + X for every (w, v); the
uniform weights give Z. Zw(w, v) is concave (a minimum of functions linear in (w, v));
the plan p attaining the minimum gives a supergradient: block j's entry in w is
S + (M - 1) b'_s of its stage in p, in v T_a^s - PB_s (constants along the simplex drop
out). Projected ascent on the two simplices from the uniform weights, with Polyak's step
toward 1.05 x ``target``, halved after 3 steps without a new best; it stops once the best
exceeds ``target`` (the caller then skips the micro-batch size), after ``ITERATIONS``
steps, or when the step has shrunk below ``MIN_STEP``.

Why: the averages lose where one stage's term stands out. On 100 blocks x 64 identical
devices at B = 16 (benchmarks/planner_scaling.py) Z is 1,625 ms, Zs (planner.solvers.dp.bounds's
staged bound) 1,651, the search bound U 1,698 (1,672 once micro-batch 2 is scored), and the
best plan the DP finds 1,984: the search ran 0.4 s for nothing. The ascent passes either
bound within a few dozen steps (0.06-0.08 s).

Complexity: per step O(L^2 S N) for the DP (S the distinct shares ceil(B / g), at most
2 sqrt(B); N the devices), O(L) for the supergradient and the projections; at most
``ITERATIONS`` steps.
"""

from __future__ import annotations

import numpy as np
from edgepipe.planner.solvers.dp.ascent import StepScale

#: at most this many ascent steps per bound
ITERATIONS = 40
#: the step scale below which the ascent stops (it starts at 1 and halves)
MIN_STEP = 1e-3


def _simplex(x: np.ndarray) -> np.ndarray:
    """The Euclidean projection of ``x`` onto the probability simplex (sort-based: the
    threshold theta with sum(max(x - theta, 0)) = 1)."""
    x = x - x.max()  # the projection ignores a shift along (1, .., 1); this keeps 0 > -1
    desc = np.sort(x)[::-1]
    run = np.cumsum(desc) - 1.0
    k = np.arange(1, len(x) + 1)
    last = int(np.flatnonzero(desc * k > run)[-1])
    return np.maximum(x - run[last] / (last + 1), 0.0)


def stage_costs(
    w_stage: np.ndarray,
    v_stage: np.ndarray,
    v_after: np.ndarray,
    m: int,
    fits: np.ndarray,
    ef: np.ndarray,
    eb: np.ndarray,
    ta: np.ndarray,
    one_way: np.ndarray,
) -> np.ndarray:
    """(S, L + 1, L + 1) each stage's term in the weighted sum (module docstring) per
    share and block range [first, end), inf where it does not fit: ``w_stage`` and
    ``v_stage`` [first, end] the range's D and X weights, ``v_after`` [end] the X weight
    of the blocks after it; the other arrays as :func:`block_weighted_bound`'s."""
    last = np.arange(ef.shape[1]) == ef.shape[1] - 1  # [end]: the stage that ends the chain
    with np.errstate(invalid="ignore"):
        cost = (
            ef * (1 + (m - 1) * w_stage * last)
            + eb * (1 - v_after + (m - 1) * w_stage)
            + one_way[:, None, :] * (2 - v_after)
            + v_stage * ta
        )
    return np.where(fits, cost, np.inf)


def chain(cost: np.ndarray, need: np.ndarray, n_dev: int) -> tuple[np.ndarray, np.ndarray]:
    """The DP over (first block, devices) of the module docstring on stage costs
    ``cost`` (S, L + 1, L + 1), a stage of share i using ``need[i]`` devices: the table
    [a, n] (L + 1, N + 2; column N + 1 the inf pad) of the least sum over chains of
    stages covering the blocks [a, L) on at most n devices, and per (a, n) the flat
    (end - a - 1, share) index of its first stage. O(L^2 S N)."""
    size = cost.shape[1]
    big_l = size - 1
    shift = np.arange(n_dev + 1)[None, :] - need[:, None]  # (share, n): devices left
    shift = np.where(shift >= 0, shift, n_dev + 1)  # n_dev + 1: the inf column
    table = np.full((size, n_dev + 2), np.inf)
    table[big_l, : n_dev + 1] = 0.0
    pick = np.zeros((big_l, n_dev + 1), dtype=np.int64)
    for a in range(big_l - 1, -1, -1):
        step = table[a + 1 :][:, shift] + cost[:, a, a + 1 :].T[:, :, None]
        flat = step.reshape(-1, n_dev + 1)
        pick[a] = flat.argmin(axis=0)
        table[a, : n_dev + 1] = flat[pick[a], np.arange(n_dev + 1)]
    return table, pick


def block_weighted_bound(
    need: np.ndarray,
    fits: np.ndarray,
    ef: np.ndarray,
    eb: np.ndarray,
    ta: np.ndarray,
    one_way: np.ndarray,
    m: int,
    n_dev: int,
    target: float,
    iterations: int = ITERATIONS,
) -> float:
    """Zw (module docstring), the best lower bound max over the weights tried of
    Zw(w, v), from Z's relaxed figures per share (:func:`planner.solvers.dp.bounds.
    _share_figures`): ``need`` (S,) the least devices of each share, ``fits``,
    ``ef``, ``eb``, ``ta`` (S, L + 1, L + 1) over [first, end) (whether the stage fits
    memory, least E_f, E_b and all-reduce), ``one_way`` (S, L + 1) the link after a
    cut one way; M = ``m`` micro-batches on ``n_dev`` devices. It stops early once above
    ``target``, and after ``iterations`` steps; inf when no chain of stages that fit
    covers the blocks."""
    n_sh, size, _ = ef.shape
    big_l = size - 1
    w = v = np.full(big_l, 1.0 / big_l)
    steps = StepScale()
    for _ in range(min(iterations, ITERATIONS)):
        cum_w, cum_v = np.r_[0.0, np.cumsum(w)], np.r_[0.0, np.cumsum(v)]
        cost = stage_costs(
            cum_w[None, :] - cum_w[:, None], cum_v[None, :] - cum_v[:, None],
            cum_v[big_l] - cum_v, m, fits, ef, eb, ta, one_way,
        )  # fmt: skip
        table, pick = chain(cost, need, n_dev)
        value = float(table[0, n_dev])
        if not np.isfinite(value):
            return np.inf
        steps.record(value)
        if steps.done(target, MIN_STEP):
            break
        # the minimising plan's stages and their two terms
        stages, a, n = [], 0, n_dev
        while a < big_l:
            e, i = divmod(int(pick[a, n]), n_sh)
            stages.append((a, a + 1 + e, i))
            a, n = a + 1 + e, n - int(need[i])
        traversal = sum(ef[i, a, e] + eb[i, a, e] + 2 * one_way[i, e] for a, e, i in stages)
        grad_w, grad_v = np.empty(big_l), np.empty(big_l)
        before = 0.0
        for a, e, i in stages:
            grad_w[a:e] = traversal + (m - 1) * (eb[i, a, e] + (ef[i, a, e] if e == big_l else 0.0))
            grad_v[a:e] = ta[i, a, e] - before
            before += eb[i, a, e] + one_way[i, e]
        grad_w -= grad_w.mean()
        grad_v -= grad_v.mean()
        norm = float(grad_w @ grad_w + grad_v @ grad_v)
        if norm <= 1e-12 * value * value:
            break  # every block's terms equal (up to rounding): no direction to climb
        step_size = steps.scale * (1.05 * target - value) / norm
        w, v = _simplex(w + step_size * grad_w), _simplex(v + step_size * grad_v)
    return steps.best
