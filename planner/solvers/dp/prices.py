"""Zp: the weighted bound Z with a price per device class, so that stages compete for the
fast classes on any number of classes (a Lagrangian relaxation of Zc).

Z (:func:`planner.solvers.dp.bounds._weighted`) bounds a plan's D + X (the closed form of
:func:`planner.cost.closed_form.pipeline_closed_form_ms`: D + X >= C_s + D_s and X >=
T_a^s - PB_s for every stage s, averaged over the stages with the weights of their block counts)
by a sum over its stages of one figure each, alpha E_f + beta E_b + (the link after it) + mu
T_a, but lets every stage run each block at the fastest class's time, with as many devices
of it as the whole cluster holds. Zc (:func:`planner.solvers.dp.bounds.class_bound`) keys
Z's DP by the devices left of each class, which on two classes is cheap and on eight classes
of 64 is 65^8 states. Zp keeps Zc's stage figures and dualises the class counts instead:

    Zp(lambda) = min over chains of ranges [a_0, a_1), .., [a_{P-1}, L) of
                 sum_s H_lambda(range_s)  -  sum_k lambda_k c_k,       lambda >= 0,

    H_lambda(r) = min over classes k and y = 1..B of costs[r, k, y - 1] + lambda_k B / y

(costs: :func:`planner.solvers.dp.bounds.priced_costs`). Why it is a lower bound on every
plan's
D + X at micro-batch B, for every lambda >= 0: take a plan; each stage s has a figure
level v*_s (the largest w_k(y_d) of its devices d with samples, w the per-class least
times of :func:`planner.solvers.dp.bounds.class_terms`) and places its B samples on its
group
g_s with every class-k device holding at most Y_k(v*_s) = #{y : w_k(y) <= v*_s} of them,
so sum_k g_sk Y_k >= B and lambda . g_s >= B min_k lambda_k / Y_k (the fractional
knapsack, over the classes with Y_k >= 1); with k that class and y = Y_k, the stage's
term in Z's sum is at least costs[r, k, y - 1] (priced_costs' docstring), so it is at
least H_lambda(r) - lambda . g_s. The plan's groups are disjoint, sum_s g_s <= c, so
sum_s (H_lambda - lambda . g_s) >= sum_s H_lambda - lambda . c, which is at least
Zp(lambda). Hence D + X >= Z's sum >= Zp(lambda), the DP value of every answer too (it
is the closed form or above it): a micro-batch size whose Zp exceeds the search bound U
has no answer that could be re-scored, and skipping it changes no plan. Every lambda
gives a bound; the best found is returned.

The multipliers: projected subgradient ascent from lambda = 0 (Zp(0) is Z with Zc's
per-class figures), the step Polyak's toward 1.05 x ``target`` along the subgradient
(the chain's fractional devices per class, sum_s B / y_s of its class, minus c), halved
after 3 steps without a new best (:class:`planner.solvers.dp.ascent.StepScale`); it stops once the
best exceeds ``target`` (the size is skipped), after ``ITERATIONS`` steps or when the
step has shrunk below ``MIN_STEP``.

Complexity: per step O(R K B) for H (R = L (L + 1) / 2 ranges) and O(L^2) for the chain;
at most ``ITERATIONS`` steps (100 blocks x 8 classes x B = 64: about 5 ms a step).
"""

from __future__ import annotations

import numpy as np
from edgepipe.planner.solvers.dp.ascent import StepScale

#: at most this many subgradient steps per bound
ITERATIONS = 100
#: the step scale below which the ascent stops (it starts at 1 and halves)
MIN_STEP = 1e-3


def priced_bound(
    costs: np.ndarray, first: np.ndarray, end: np.ndarray, counts: tuple[int, ...],
    target: float,
) -> float:  # fmt: skip
    """Zp (module docstring): the best lower bound max over the lambda tried of
    Zp(lambda), from ``costs`` (ranges, K, B) of the block ranges [``first``, ``end``)
    (every range of L blocks) and the devices per class ``counts``; it stops early once
    above ``target``. inf when no chain of finite costs covers the blocks."""
    n_rng, n_cls, batch = costs.shape
    big_l = int(end.max())
    devices = batch / np.arange(1, batch + 1)  # class-k devices of a stage at y samples
    have = np.asarray(counts, dtype=float)
    flat = costs.reshape(n_rng, n_cls * batch)
    table = np.full((big_l + 1, big_l + 1), np.inf)
    rng_at = np.full((big_l + 1, big_l + 1), -1)
    rng_at[first, end] = np.arange(n_rng)
    price = np.zeros(n_cls)
    steps = StepScale()
    for _ in range(ITERATIONS):
        total = flat + (price[:, None] * devices[None, :]).reshape(-1)
        pick = total.argmin(axis=1)
        table[first, end] = total[np.arange(n_rng), pick]
        chain = np.full(big_l + 1, np.inf)
        chain[big_l] = 0.0
        nxt = np.zeros(big_l + 1, dtype=np.int64)
        for a in range(big_l - 1, -1, -1):
            step = table[a, a + 1 :] + chain[a + 1 :]
            e = int(step.argmin())
            chain[a], nxt[a] = step[e], a + 1 + e
        if not np.isfinite(chain[0]):
            return np.inf
        value = float(chain[0] - price @ have)
        steps.record(value)
        if steps.done(target, MIN_STEP):
            break
        used = np.zeros(n_cls)
        a = 0
        while a < big_l:
            j = pick[rng_at[a, nxt[a]]]
            used[j // batch] += devices[j % batch]
            a = nxt[a]
        slope = used - have
        norm = float(slope @ slope)
        if norm == 0.0:
            break
        price = np.maximum(0.0, price + steps.scale * (1.05 * target - value) / norm * slope)
    return steps.best
