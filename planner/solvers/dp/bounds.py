"""Lower bounds on the DP value of every plan at one micro-batch size, from a relaxed
plan space; the search prunes by them (:mod:`planner.solvers.dp.search`) and the loop over
the sizes skips and orders sizes by them (:mod:`planner.solvers.dp.sizes`).

Inputs: the cost tables (:class:`planner.solvers.dp.tables._Tables`), a micro-batch size
B (M = G / B micro-batches) and the heads' warm-ups K(p).

Relaxation (reference/asteroid.md §3-§4): a stage on g devices has one with at least s =
ceil(B / g) samples, so its c = E_f + E_b is at least its blocks' least time on any class
at any batch >= s (E_f, E_b alike), it fits only if Eq. 3 holds for s samples on the
largest memory at its warm-up K(p) (a stage before a suffix: K(2)), its all-reduce (§3.3)
is at least the ring's over g devices on the fastest pair, and a boundary's occupancy at
least its bytes x (s on a switch, ceil(B / N) point to point, B on a shared medium) / the
fastest pair's rate. Along a chain (the recurrence of :mod:`planner.solvers.dp.recurrence`)
D' >= max(M c0, c0 + tau1 + (M - 1) o, c0 + tau1 + D, (M - k + 1) E_f0 + M E_b0 + tau1 +
S) (the last: the head's bubble with k = min(K, M) in flight), and the root's D + X >=
D_s + T_a^s + (the E_f and one-way links before stage s) for every stage s (X >= T_a^s -
PB_s). Solved exactly by small DPs over (blocks, devices used) (:func:`relaxed_tables`):

* F[j, n], the least summed c + tau of stages holding blocks [0, j) on at most n devices
  plus the first stage's T_a; E[j, n], the least max over them of (what comes before) +
  M c;
* G[p, l, n], the least D of a suffix of l blocks in p stages (p >= pc merged:
  ``RELAX_LEVELS``, ``RELAX_WORK``); Q[p, l, n], the least max over its stages of the D_s
  + T_a^s term (each a min of maxima taken term by term, which only lowers it);
* PF[j, n], the least summed E_f + one-way link of stages holding blocks [0, j) on at
  most n devices: unrolling D' >= c0 + tau1 + D and X' >= X - E_b0 - (o + lam), the
  root's D + X is at least PF + the D + X of any suffix (entry) it is built on;
* Z, a bound on the root's D + X that prices each plan's traversal, bubbles and
  all-reduces together (:func:`_weighted`; :func:`weighted_bound` alone costs a tenth
  of the tables).

Bounds that only skip a size (never reorder the sizes): Zc (:func:`class_bound`: Z with
the DP keyed by the devices left per class, two classes), Zs (:func:`staged_bound`: each
stage's warm-up bubble at its own depth and part of the first stage's all-reduce counted
whole), Zp (:func:`priced_weighted_bound`, :mod:`planner.solvers.dp.prices`: Z's sum with a
price per device class, a Lagrangian relaxation of Zc's class counts, three or more
classes) and Zw (:func:`reweighted_bound`, :mod:`planner.solvers.dp.block_weights`: Z's
block weights raised by subgradient ascent). :func:`lower_bound` bounds the exact
iteration time itself (the sizes' first order).

Complexity per B: Z, O(L^2 N sqrt(B)) numpy work; the relaxed tables O(pc L^2 N
sqrt(B)) (pc <= ``RELAX_LEVELS``; an O(N L) weak form beyond ``RELAX_MAX``); Zc, O(B L^2
(c_1 + 1)(c_2 + 1) + L^2 P2) (P2 the pairs of a state and a group it holds, at most (c_1
+ 1)^2 (c_2 + 1)^2 / 4); Zs, O(J L^2 N sqrt(B)) (J the stage levels whose warm-up is
below M); Zw, O(L^2 N sqrt(B)) per ascent step (at most ``REWEIGHT_WORK`` in all); Zp,
O(R K B log(K B)) for its stage costs and O(R K B + L^2) per ascent step (at most
:data:`planner.solvers.dp.prices.ITERATIONS`; R = L (L + 1) / 2 ranges).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from edgepipe.planner.cost.formulas import ring_allreduce_ms, samples_that_fit
from edgepipe.planner.solvers.dp.block_weights import block_weighted_bound, chain, stage_costs
from edgepipe.planner.solvers.dp.graph import _Graph
from edgepipe.planner.solvers.dp.prices import priced_bound
from edgepipe.planner.solvers.dp.tables import _Tables

#: the relaxed lower bound (:func:`relaxed_tables`) tracks the suffix's stage count p
#: (whose warm-up K(p) its memory check and bubble read) while pc x L^2 N sqrt(B) / 2
#: stays within this; beyond, p >= pc share K(pc)'s memory and K(P)'s bubble (3e7 until
#: session 13: on 100 x 64 identical its 4 levels cost 7% of the planning instructions
#: and pruned nothing the 2 or 3 levels of 1e6 do not; the same plans on all 121
#: solver_vs_dp rows, whose tables stay within it, and the 34 ordered-graph instances)
RELAX_WORK = 1e6
RELAX_LEVELS = 4
#: above this work the relaxed bound takes its weak O(N L) form (:func:`relaxed_tables`)
RELAX_MAX = 2e8
#: Zc (:func:`class_bound`) is computed while its DP's (state, group) pairs x
#: L^2 / 2 stay within this (100 blocks, 8 + 8 devices: 1,944 pairs, 1e7)
CLASS_BOUND_WORK = 3e7
#: Zs (:func:`staged_bound`) takes this weight on the first stage's all-reduce
#: (docs/decisions.md, session 9)
STAGED_FIRST = 0.25
#: Zw (:func:`reweighted_bound`) is computed with at most this much DP work (about 0.5 s
#: here: a step on 100 blocks x 64 devices at B = 16 takes 5 ms), and not where that
#: allows fewer than ``REWEIGHT_STEPS`` steps of its ascent
REWEIGHT_WORK = 2e8
REWEIGHT_STEPS = 10

INF = np.inf

#: entries (ranges x classes x sizes) of :func:`priced_costs` computed at a time
PRICED_CHUNK = 2**18


@dataclass(frozen=True)
class _Relaxed:
    """The relaxed lower bounds of :func:`relaxed_tables`: F, E, PF (prefixes) indexed
    [blocks, devices], G, Q (suffixes) [p - 1, blocks, devices]."""

    f: np.ndarray
    e: np.ndarray
    g: np.ndarray
    q: np.ndarray
    z: float
    pf: np.ndarray

    @property
    def q_root(self) -> float:
        """Q(L, N): the least over the stage counts."""
        return float(self.q[:, -1, -1].min())


def lower_bound(tables: _Tables, batch: int, max_stages: int) -> float:
    """A lower bound on the exact iteration time of every plan at micro-batch
    ``batch``: with s = ceil(B / N), every stage's c = E_f + E_b is at least its
    blocks' time at >= s samples on the fastest class, so sum_p c_p >= T_min, the
    sum over blocks of the least time of any class at any batch >= s. The schedule
    runs one micro-batch forward and back through every step (>= T_min) and each
    step M times (>= M max_p c_p >= M T_min / P). O(K L max_batch)."""
    t_min = float(prefix_bound(tables, batch)[-1])
    m = tables.problem.config.global_batch // batch
    return max(t_min, m * t_min / max_stages)


def prefix_bound(tables: _Tables, batch: int, devices: int | None = None) -> np.ndarray:
    """(L + 1,) entry j: a lower bound on the summed c = E_f + E_b of any stages that
    together hold blocks [0, j) at micro-batch ``batch`` on at most ``devices``
    devices (default all): the prefix sum of each block's least time on any class at
    any batch >= ceil(B / devices) (some device of a stage holds at least that share,
    and its time bounds the stage's E_f + E_b). O(K L max_batch), cached per share."""
    return tables.share_prefix(-(-batch // (devices or sum(tables.counts))))


def relaxed_tables(
    tables: _Tables, batch: int, m: int, warmups: list[int], in_flight: list[int]
) -> _Relaxed:
    """Lower bounds from a relaxed plan space (module docstring), on at most n
    devices of the N (``warmups``: K(1), .., K(pc), the heads' warm-ups by the
    number of stages from the end, the last one standing for every p >= pc):

    * F[j, n]: the least summed c + tau of stages holding blocks [0, j) with a suffix
      after them, plus the first stage's all-reduce T_a (D' >= c0 + tau1 + D, and
      the root's X >= its head's T_a);
    * E[j, n]: the least max over those stages of (what the stages before it add)
      + M c, plus that T_a (the root's D holds each stage's M c shifted);
    * G[p, l, n]: the least D of a suffix of the last l blocks in p stages (pc: p >=
      pc), by the recurrence D' >= max(M c0, c0 + tau1 + (M - 1) o, c0 + tau1 + D);
    * Q[p, l, n]: the least max over its stages s of D_s + T_a^s (the root's D + X
      is at least that: X >= T_a^s - PB_s and D >= PB_s + D_s);
    * PF[j, n]: the least summed E_f + one-way link (occupancy + latency) of stages
      holding blocks [0, j) with a suffix after them (the root's D + X is at least
      PF + the suffix's D + X: D' >= c0 + tau1 + D, X' >= X - E_b0 - one way);
    * Z: a bound on the root's D + X that prices every plan's stages together
      (:func:`_weighted`; Q's min of maxima lets the suffixes that give its D, S and
      all-reduce terms their least values be different plans).

    Relaxation: a stage on g devices has one with at least s = ceil(B / g) samples,
    so its c is at least the summed least time of its blocks on any class at any
    batch >= s, it fits memory only if Eq. 3 holds for s samples on the largest
    memory at its warm-up (a prefix stage: K(2)), and its T_a is at least the ring's
    over g devices on the fastest pair; a boundary's occupancy is at least its bytes
    per sample x (s on a switch, the sender's busiest port; ceil(B / N) point to
    point; B on a shared medium) / the fastest pair's bandwidth, its latency the
    least pair's. Only the least g of each share matters (fewer devices leave more
    to the rest). Exact DPs over (blocks, devices) of that relaxation (min of a max
    taken term by term, which only lowers it): O(pc L^2 N sqrt(B)) numpy work."""
    big_l, n_dev = tables.n_blk, sum(tables.counts)
    shares = sorted({-(-batch // g) for g in range(1, min(batch, n_dev) + 1)})
    if len(warmups) * (big_l + 1) ** 2 * (n_dev + 1) * len(shares) / 2 > RELAX_MAX:
        return _relaxed_cheap(tables, batch, m)
    need, c_tab, ef, eb, ta, occ, tau, lat_min = _share_figures(tables, batch, warmups)
    depth = len(warmups)
    # shift[share, n] = n - need[share], or the inf pad column when negative
    shift = np.arange(n_dev + 1)[None, :] - need[:, None]
    shift = np.where(shift >= 0, shift, n_dev + 1)
    width = n_dev + 2
    f_tab = np.full((big_l + 1, width), INF)
    e_tab = np.full((big_l + 1, width), INF)
    pf_tab = np.full((big_l + 1, width), INF)
    f_tab[0, : n_dev + 1] = e_tab[0, : n_dev + 1] = pf_tab[0, : n_dev + 1] = 0.0
    mid = c_tab[min(1, depth - 1)]
    ef_mid = np.where(np.isfinite(mid), ef, INF)  # E_f of the stages that fit
    ok = np.where(shift <= n_dev, 0.0, INF)  # (share, n): enough devices
    for j in range(1, big_l + 1):
        c0 = mid[:, 0, j][:, None]  # (share, 1): the first stage [0, j)
        t0 = ta[:, 0, j][:, None]
        f_first = (c0 + tau[:, j][:, None] + t0 + ok).min(axis=0)
        e_first = (m * c0 + t0 + ok).min(axis=0)
        pf_first = (ef_mid[:, 0, j][:, None] + tau[:, j][:, None] / 2 + ok).min(axis=0)
        f_tab[j, : n_dev + 1], e_tab[j, : n_dev + 1] = f_first, e_first
        pf_tab[j, : n_dev + 1] = pf_first
        if j > 1:
            f_sub = f_tab[1:j][:, shift]  # (i, share, n)
            e_sub = e_tab[1:j][:, shift]
            c = mid[:, 1:j, j].T[:, :, None]  # (i, share, 1)
            step = c + tau[:, j][None, :, None]
            f_tab[j, : n_dev + 1] = np.minimum(f_first, (f_sub + step).min(axis=(0, 1)))
            e_tab[j, : n_dev + 1] = np.minimum(
                e_first, np.maximum(e_sub, f_sub + m * c).min(axis=(0, 1))
            )
            step = ef_mid[:, 1:j, j].T[:, :, None] + tau[:, j][None, :, None] / 2
            pf_sub = pf_tab[1:j][:, shift] + step
            pf_tab[j, : n_dev + 1] = np.minimum(pf_first, pf_sub.min(axis=(0, 1)))
    g_tab, q_tab, s_tab = (np.full((depth + 1, big_l + 1, width), INF) for _ in range(3))
    for suffix in range(1, big_l + 1):
        head = big_l - suffix  # the suffix's first block
        c = c_tab[0, :, head, big_l][:, None]
        s_tab[1, suffix, : n_dev + 1] = (c + ok).min(axis=0)
        g_tab[1, suffix, : n_dev + 1] = (m * c + ok).min(axis=0)
        q_tab[1, suffix, : n_dev + 1] = (m * c + ta[:, head, big_l][:, None] + ok).min(axis=0)
        if suffix == 1:
            continue
        cuts = big_l - np.arange(1, suffix)  # first block of the sub-suffix, l' = 1..l-1
        t = tau[:, cuts].T[:, :, None]  # (l', share, 1)
        o = occ[:, cuts].T[:, :, None]
        t_a = ta[:, head, cuts].T[:, :, None]
        f0 = ef[:, head, cuts].T[:, :, None]
        b0 = eb[:, head, cuts].T[:, :, None]
        for p in range(2, depth + 1):
            c = c_tab[p - 1][:, head, cuts].T[:, :, None]
            g_sub, q_sub, s_sub = (v[p - 1, 1:suffix] for v in (g_tab, q_tab, s_tab))
            if p == depth:  # p >= pc: the sub-suffix has p - 1 or more stages
                g_sub, q_sub, s_sub = (
                    np.minimum(w, v[p, 1:suffix])
                    for w, v in ((g_sub, g_tab), (q_sub, q_tab), (s_sub, s_tab))
                )
            s_sub = s_sub[:, shift]  # (l', share, n)
            s_new = c + t + s_sub
            # the head's bubble: M c0 + tau1 + S - (k - 1) E_f0 with k <= M in flight
            # (inf where the head does not fit: c inf)
            bubble = (m - in_flight[p - 1] + 1) * f0 + m * b0 + t
            bubble = bubble + np.where(np.isfinite(c), 0.0, INF) + s_sub
            d = np.maximum(
                np.maximum(m * c, c + t + (m - 1) * o),
                np.maximum(c + t + g_sub[:, shift], bubble),
            )
            s_tab[p, suffix, : n_dev + 1] = s_new.min(axis=(0, 1))
            g_tab[p, suffix, : n_dev + 1] = d.min(axis=(0, 1))
            q = np.maximum(d + t_a, (f0 + o + lat_min) + q_sub[:, shift])
            q_tab[p, suffix, : n_dev + 1] = q.min(axis=(0, 1))
    key = (batch, m, warmups[0])
    if key not in tables.z_cache:  # Z, unless :func:`z_bound` gave it already
        tables.z_cache[key] = _weighted(tables, m, need, c_tab[0], ef, eb, ta, tau / 2)
    return _Relaxed(f_tab[:, :-1], e_tab[:, :-1], g_tab[1:, :, :-1], q_tab[1:, :, :-1],
                    tables.z_cache[key], pf_tab[:, :-1])  # fmt: skip


def _share_figures(tables: _Tables, batch: int, warmups: list[int]) -> tuple:
    """The relaxed stage and link figures per share s (:func:`relaxed_tables`): the least
    devices of each share, c [warm-up, share, first, end] where it fits memory (inf
    elsewhere), E_f, E_b and T_a [share, first, end], the boundaries' occupancy and
    traversal [share, cut] (0 at the ends) and the least latency."""
    big_l, n_dev = tables.n_blk, sum(tables.counts)
    cm = tables.cm
    shares = sorted({-(-batch // g) for g in range(1, min(batch, n_dev) + 1)})
    need = np.array([-(-batch // s) for s in shares])  # least devices of each share
    blocks = np.arange(big_l + 1)
    first, end = blocks[:, None], blocks[None, :]
    static = cm.state_factor * (cm.param_prefix[end] - cm.param_prefix[first])
    saved = cm.saved_prefix[end] - cm.saved_prefix[first]
    grad = np.where(first < end, cm.param_prefix[end] - cm.param_prefix[first], 0.0)
    budget = float(tables.budget.max())
    bw_max, lat_min = tables.bw_max, tables.lat_min
    per_sample = np.concatenate([[0.0], cm.boundary[: big_l - 1], [0.0]])  # by cut
    n_s, depth = len(shares), len(warmups)
    # [warm-up, share, first, end]: stage c where it fits memory (inf elsewhere)
    c_tab = np.full((depth, n_s, big_l + 1, big_l + 1), INF)
    ef = np.zeros((n_s, big_l + 1, big_l + 1))  # least E_f and E_b alone
    eb = np.zeros((n_s, big_l + 1, big_l + 1))
    ta = np.zeros((n_s, big_l + 1, big_l + 1))
    occ = np.zeros((n_s, big_l + 1))  # [share, cut]
    for i, s in enumerate(shares):
        cum = tables.share_prefix(s)
        c = np.where(first < end, cum[end] - cum[first], INF)
        cum = tables.share_prefix(s, "f")
        ef[i] = np.where(first < end, cum[end] - cum[first], INF)
        cum = tables.share_prefix(s, "b")
        eb[i] = np.where(first < end, cum[end] - cum[first], INF)
        for k, warm in enumerate(warmups):
            fits = samples_that_fit(budget, static, warm, saved, batch) >= s
            c_tab[k, i] = np.where(fits, c, INF)
        ta[i] = ring_allreduce_ms(grad, need[i], bw_max, lat_min, tables.cm.shared_medium)
        occ[i] = per_sample * tables.carried(batch, s) / bw_max
    tau = 2 * (occ + lat_min)
    tau[:, [0, big_l]] = 0.0
    return need, c_tab, ef, eb, ta, occ, tau, lat_min


def z_bound(tables: _Tables, batch: int, m: int, warmups: list[int]) -> float:
    """Z alone (:func:`_weighted`), as :func:`relaxed_tables` gives it (0 beyond
    ``RELAX_MAX``), without its other tables: a few DPs less."""
    big_l, n_dev = tables.n_blk, sum(tables.counts)
    shares = len({-(-batch // g) for g in range(1, min(batch, n_dev) + 1)})
    if len(warmups) * (big_l + 1) ** 2 * (n_dev + 1) * shares / 2 > RELAX_MAX:
        return 0.0
    key = (batch, m, warmups[0])
    if key not in tables.z_cache:
        need, c_tab, ef, eb, ta, _, tau, _ = _share_figures(tables, batch, warmups[:1])
        tables.z_cache[key] = _weighted(tables, m, need, c_tab[0], ef, eb, ta, tau / 2)
    return tables.z_cache[key]


def _weighted(
    tables: _Tables, m: int, need: np.ndarray, c: np.ndarray, ef: np.ndarray, eb: np.ndarray,
    ta: np.ndarray, one_way: np.ndarray,
) -> float:  # fmt: skip
    """Z, a lower bound on the root's D + X of every plan on at most N devices, from
    the relaxed figures per share (:func:`relaxed_tables`; ``c`` inf where the stage cannot
    fit even at the least warm-up K(1), ``one_way`` the link after a stage by its
    cut).

    Along the chain D >= C_s + D_s for every stage s (C_s: the summed c + tau before
    it), and D_s >= (M - 1) c_s + tau_s + max(0, R_s - (k - 1) E_f^s) >= c_s + R_s +
    (M - 1) E_b^s (its bubble, k = min(K, M) <= M; R_s the traversal after it); the
    last stage's D_s = M c_s. So D >= S + (M - 1) b'_s for every s, S the whole
    traversal, b'_s = E_b^s (E_f + E_b for the last stage); and X >= T_a^s - PB_s for
    every s (module docstring). Averaged over the stages with the weights of their
    block counts (block j votes for its stage; the uniform weights 1 / L of each
    block; max >= any average):

        D + X >= sum_s [c_s + tau_s + (M - 1) mu_s b'_s + mu_s T_a^s
                        - (E_b^s + o_s) mu(> s)]

    mu_s: the stage's blocks / L, mu(> s): the blocks after it / L, o_s the link
    after it one way. Every figure's coefficient is >= 0 (E_b's is 1 - mu(> s) + ...),
    so each may take its relaxed least value, and the sum is additive over stages:
    an exact DP over (first block, devices), O(L^2 N sqrt(B)). Unlike Q it cannot
    give the all-reduces and the traversal to different plans: on 100 blocks x 64
    identical devices at B = 32 (M = 2) it gives 1,984 ms where Q gives 1,734 (the
    best plan the DP finds: 2,258), above the bound U = 1,814 of that search."""
    big_l, n_dev = tables.n_blk, sum(tables.counts)
    cut = np.arange(big_l + 1)
    mu = (cut[None, :] - cut[:, None]) / big_l  # [first, end): its blocks' weight
    after = (big_l - cut) / big_l  # [end]
    cost = stage_costs(mu, mu, after, m, np.isfinite(c), ef, eb, ta, one_way)
    return float(chain(cost, need, n_dev)[0][0, n_dev])


def staged_bound(tables: _Tables, batch: int, m: int, warmups: list[int], lam: float) -> float:
    """Zs: Z (:func:`_weighted`) with each stage's warm-up bubble at its own depth and
    part of the first stage's all-reduce counted whole (0 beyond ``RELAX_MAX``).

    A stage with n stages after it has k_n = min(K, M) micro-batches in flight, K =
    ``warmup_depth`` of the stage n + 1 from the end (a function of n alone). The
    closed form (:func:`planner.cost.closed_form.pipeline_closed_form_ms`) gives D >= C_s +
    (M - 1) c_s + tau_s + max(0, R_s - (k_n - 1) E_f^s) >= S + (M - 1) E_b^s + (M -
    k_n) E_f^s (S the whole traversal), and for the last stage D >= C_s + M c_s = S +
    (M - 1) (E_f + E_b): Z's bound, which takes k_n = M for every stage but the last,
    plus (M - k_n) E_f^s. And X >= lam (T_a of the first stage, before which PB = 0)
    + (1 - lam) (Z's block-weighted average of T_a^s - PB_s), for lam in [0, 1]. The
    block-weighted average of the D terms plus that X bound is additive over stages
    with coefficients >= 0, so each figure takes its relaxed least value (Z's); a DP
    over (first block, devices, stages after it up to the first n with k_n = M):

        Zs_0[a, n] = min_g cost_0[a, L] (the last stage),
        Zs_j[a, n] = min_{e < L, g} Zs_{j-1}[e, n - g] + cost_j[a, e]   (j < J),
        Zs_J[a, n] = min_{e < L, g} min(Zs_{J-1}, Zs_J)[e, n - g] + cost_J[a, e],

    cost_j Z's stage cost with E_f's coefficient 1 + (M - k_j) mu (mu: the stage's
    blocks / L) and X's terms times 1 - lam, plus lam T_a where a = 0; answer the
    least Zs_j[0, N]. Every plan's D + X is at least its value, so a size whose Zs
    exceeds the bound U has no answer that can be re-scored. O(J L^2 N sqrt(B))."""
    big_l, n_dev = tables.n_blk, sum(tables.counts)
    shares = len({-(-batch // g) for g in range(1, min(batch, n_dev) + 1)})
    if len(warmups) * (big_l + 1) ** 2 * (n_dev + 1) * shares / 2 > RELAX_MAX:
        return 0.0
    need, c_tab, ef, eb, ta, _, tau, _ = _share_figures(tables, batch, warmups[:1])
    config = tables.problem.config
    max_p = min(big_l, n_dev, config.max_stages or n_dev)
    in_flight = [1]  # the last stage: D >= C + M c, as with one in flight
    for n in range(1, max_p):
        k = min(config.warmup_depth(max_p - 1 - n, max_p, m), m)
        if k >= m:
            break
        in_flight.append(k)
    in_flight.append(m)
    cut = np.arange(big_l + 1)
    mu = (cut[None, :] - cut[:, None]) / big_l  # [first, end): its blocks' weight
    after = (big_l - cut) / big_l  # [end]
    one_way = tau[:, None, :] / 2
    with np.errstate(invalid="ignore"):
        x_terms = (1 - lam) * (mu * ta - (eb + one_way) * after)
        rest = eb * (1 + (m - 1) * mu) + 2 * one_way + x_terms
        costs = [np.where(np.isfinite(c_tab[0]), ef * (1 + (m - k) * mu) + rest, INF)
                 for k in in_flight]  # fmt: skip
    first = lam * ta  # added to the stage that starts at block 0
    shift = np.arange(n_dev + 1)[None, :] - need[:, None]
    shift = np.where(shift >= 0, shift, n_dev + 1)
    top = len(in_flight) - 1
    z = np.full((top + 1, big_l + 1, n_dev + 2), INF)
    for a in range(big_l - 1, -1, -1):
        extra = first[:, a] if a == 0 else np.zeros_like(first[:, a])  # (share, end)
        last = (costs[0][:, a, big_l] + extra[:, big_l])[:, None]  # (share, 1)
        z[0, a, : n_dev + 1] = (last + np.where(shift <= n_dev, 0.0, INF)).min(axis=0)
        if a + 1 == big_l:
            continue
        for j in range(1, top + 1):
            sub = z[j - 1, a + 1 : big_l]
            if j == top:
                sub = np.minimum(sub, z[j, a + 1 : big_l])
            step = costs[j][:, a, a + 1 : big_l] + extra[:, a + 1 : big_l]
            z[j, a, : n_dev + 1] = (sub[:, shift] + step.T[:, :, None]).min(axis=(0, 1))
    return float(z[:, 0, n_dev].min())


def class_bound(tables: _Tables, batch: int, m: int, warmups: list[int]) -> float:
    """Zc: Z (:func:`_weighted`) with the devices counted per class, for two classes
    (0 otherwise, or beyond ``CLASS_BOUND_WORK``). Z lets every stage take each block's
    least time on any class, so on a mixed cluster it prices every stage as if it ran
    on the fastest class, all N devices of it; Zc keys its DP by how many devices of
    each class remain, so the fast class's devices are spent once.

    A stage's weighted figure alpha E_f + beta E_b (Z's coefficients, >= 0) on a group
    of g_k devices of class k (its used devices: every device holds a sample) is at
    least v whenever the devices cannot place the B samples with each below v: a
    class-k device with y samples has alpha E_f + beta E_b >= w_k(y), its blocks'
    least forward and backward times on class k at any batch >= y (inf where y
    samples do not fit its memory at the least warm-up K(1)), non-decreasing in y. So
    for any s_0, s_1 >= 1 with g_0 (s_0 - 1) + g_1 (s_1 - 1) <= B - 1 some class-0
    device holds >= s_0 samples or some class-1 device >= s_1, and the figure is at
    least min(w_0(s_0), w_1(s_1)); the bound is the largest of these over s_0 (s_1
    the largest its s_0 allows), or w_k(ceil(B / g_k)) for a one-class group. The
    link and all-reduce terms are Z's, at the group's size g_0 + g_1. DP over
    (first block, devices left per class):

        Zc[a, n] = min over a < e <= L, g <= n, 1 <= |g| <= B of
                   Zc[e, n - g] + cost_g[a, e],   Zc[L, n] = 0,

    answer Zc[0, counts]. Every plan's D + X is at least its value (Z's argument,
    term by term), so a micro-batch size whose Zc exceeds the bound U has no answer
    that can be re-scored. O(B L^2 prod(c_k + 1)) for the stage costs and O(L^2 P)
    for the DP, P the (state, group) pairs, sum_n prod(n_k + 1)."""
    big_l = tables.n_blk
    # (state, group) pairs g <= n, g != 0: prod over classes of (c + 1)(c + 2) / 2,
    # less the states (before the |g| <= B filter)
    most = math.prod((c + 1) * (c + 2) // 2 for c in tables.counts)
    most -= math.prod(c + 1 for c in tables.counts)
    if len(tables.classes) != 2 or most * (big_l + 1) ** 2 / 2 > CLASS_BOUND_WORK:
        return 0.0
    states = list(itertools.product(*(range(c + 1) for c in tables.counts)))
    groups = [g for g in states if 1 <= sum(g) <= batch]
    index = {s: i for i, s in enumerate(states)}
    # (state, group) pairs with g <= n, by state: Zc[a, n] is the least over its pairs
    pairs = [(i, j) for i, n in enumerate(states) for j, g in enumerate(groups)
             if all(a >= b for a, b in zip(n, g, strict=True))]  # fmt: skip
    w, lr = class_terms(tables, batch, m, warmups[0])
    first, end = tables.rows_first, tables.rows_end
    cost = np.full((len(groups), big_l + 1, big_l + 1), INF)
    for j, (g0, g1) in enumerate(groups):
        if g1 == 0:
            v = w[0, -(-batch // g0)]
        elif g0 == 0:
            v = w[1, -(-batch // g1)]
        else:
            s0 = np.arange(1, -(-batch // g0) + 1)
            s1 = (batch - 1 - g0 * (s0 - 1)) // g1 + 1
            v = np.minimum(w[0, s0], w[1, s1]).max(axis=0)
        cost[j, first, end] = v + lr[g0 + g1]
    target = np.array([i for i, _ in pairs])
    source = np.array([index[tuple(a - b for a, b in zip(states[i], groups[j], strict=True))]
                       for i, j in pairs])  # fmt: skip
    group = np.array([j for _, j in pairs])
    starts = np.flatnonzero(np.r_[True, target[1:] != target[:-1]])
    z = np.full((big_l + 1, len(states)), INF)
    z[big_l] = 0.0
    for a in range(big_l - 1, -1, -1):
        best = (z[a + 1 :, source] + cost[group, a, a + 1 :].T).min(axis=0)  # (pairs,)
        z[a, target[starts]] = np.minimum.reduceat(best, starts)
    return float(z[0, index[tables.counts]])


def class_terms(tables: _Tables, batch: int, m: int, warmup: int) -> tuple[np.ndarray, np.ndarray]:
    """The per-class stage terms of Zc and Zp (:func:`class_bound`, :func:`priced_costs`),
    with Z's coefficients (:func:`_weighted`; M = ``m``):

    * w[k, y, range]: a lower bound on alpha E_f + beta E_b of a class-k device with y
      samples on the range, its blocks' least forward and backward times on class k
      at any batch >= y (inf where y samples do not fit its memory at ``warmup``,
      the least warm-up K(1)); non-decreasing in y;
    * lr[n, range]: the link after the range and its share of the all-reduce, for a
      group of n devices (Z's: the one-way occupancy at share ceil(B / n) plus the
      least latency, times (2 - after); mu x the ring over n devices on the fastest
      pair), n = 1..min(B, N); inf at n = 0.

    O(K B L^2 + min(B, N) L^2)."""
    big_l, n_dev = tables.n_blk, sum(tables.counts)
    tau = _share_figures(tables, batch, [warmup])[6]
    first, end = tables.rows_first, tables.rows_end
    mu = (end - first) / big_l
    after = (big_l - end) / big_l
    alpha = 1 + (m - 1) * mu * (end == big_l)
    beta = 1 - after + (m - 1) * mu
    w = np.empty((len(tables.classes), batch + 1, len(first)))
    y = np.arange(batch + 1)
    for k in range(len(tables.classes)):
        least = []
        for table in (tables.fwd[k], tables.bwd[k]):
            per = np.diff(table[:, : batch + 1], axis=0)  # (L, B + 1) (blocks, batch)
            above = np.minimum.accumulate(per[:, ::-1], axis=1)[:, ::-1]  # batch >= y
            cum = np.concatenate([np.zeros((1, batch + 1)), above.cumsum(axis=0)])
            least.append(cum[end] - cum[first])  # (ranges, B + 1)
        cap = samples_that_fit(tables.budget[k], tables.static, warmup, tables.saved, batch)
        value = alpha[:, None] * least[0] + beta[:, None] * least[1]
        w[k] = np.where(y[None, :] <= cap[:, None], value, INF).T
    bw_max, lat_min = tables.bw_max, tables.lat_min
    most = min(batch, n_dev)
    shares = sorted({-(-batch // g) for g in range(1, most + 1)})
    one_way = tau / 2
    lr = np.full((most + 1, len(first)), INF)
    for n in range(1, most + 1):
        link = one_way[shares.index(-(-batch // n)), end] * (2 - after)
        reduce = ring_allreduce_ms(tables.grad, n, bw_max, lat_min, tables.cm.shared_medium)
        lr[n] = link + mu * reduce
    return w, lr


def priced_costs(tables: _Tables, batch: int, m: int, warmup: int) -> np.ndarray:
    """(ranges, K, B) the stage costs of Zp (:func:`planner.solvers.dp.prices.priced_bound`):
    entry [range, k, y - 1] is the least, over the levels v >= w[k, y] of the range
    (its w values, :func:`class_terms`), of v + lr's least over the group sizes
    n >= ceil(B / h(v)), h(v) the most samples one device of any class holds at
    level v (w <= v). A stage on the range whose devices' largest w is v* and whose
    class-k devices hold at most y samples at that level (#{y' : w[k, y'] <= v*} =
    y, so v* >= w[k, y]) costs at least that in Z's sum: its n devices with samples
    place B, so n >= ceil(B / h(v*)). inf where w[k, y] is. O(R K B log(K B)), R =
    L (L + 1) / 2 ranges."""
    w, lr = class_terms(tables, batch, m, warmup)
    n_cls, n_rng = len(tables.classes), len(tables.rows_first)
    most = lr.shape[0] - 1
    # least link and all-reduce over every size n' >= n (and inf beyond min(B, N))
    lr_from = np.minimum.accumulate(lr[::-1], axis=0)[::-1]
    lr_from = np.concatenate([lr_from, np.full((batch + 1 - most, n_rng), INF)])
    out = np.empty((n_rng, n_cls, batch))
    # ranges are independent: done PRICED_CHUNK entries at a time, the ten temporaries
    # of a chunk stay small (all ranges at once: 0.2 GB at 152 blocks, 5 classes, B 32)
    step = max(1, PRICED_CHUNK // (n_cls * batch))
    for lo in range(0, n_rng, step):
        part = slice(lo, min(lo + step, n_rng))
        out[part] = _priced_ranges(w[:, 1:, part], lr_from[:, part], batch)
    return out


def _priced_ranges(w: np.ndarray, lr_from: np.ndarray, batch: int) -> np.ndarray:
    """:func:`priced_costs` of some ranges: ``w`` (K, B, R) their class terms at y = 1..B,
    ``lr_from`` (B + 1, R) their least link and all-reduce from each group size on."""
    n_cls, _, n_rng = w.shape
    levels = w.transpose(2, 0, 1).reshape(n_rng, n_cls * batch)
    order = np.argsort(levels, axis=1, kind="stable")
    v = np.take_along_axis(levels, order, 1)
    # the most samples one device of any class holds at or below each level (ties
    # count fully at the last of their run, which the suffix minimum below reaches)
    holds = np.zeros(v.shape, dtype=np.int64)
    for k in range(n_cls):
        holds = np.maximum(holds, np.cumsum(order // batch == k, axis=1))
    fewest = -(-batch // holds)  # the fewest devices that place B samples below v
    at_level = np.where(np.isfinite(v), v + lr_from[fewest, np.arange(n_rng)[:, None]], INF)
    from_level = np.minimum.accumulate(at_level[:, ::-1], axis=1)[:, ::-1]
    place = np.empty_like(order)
    np.put_along_axis(place, order, np.arange(n_cls * batch)[None, :], 1)
    costs = np.take_along_axis(from_level, place, 1).reshape(n_rng, n_cls, batch)
    return np.where(np.isfinite(w.transpose(2, 0, 1)), costs, INF)


def _relaxed_cheap(tables: _Tables, batch: int, m: int) -> _Relaxed:
    """The relaxed bounds' weak form, O(N L) (beyond ``RELAX_MAX``): F[j, n] the
    blocks' least times at share ceil(B / n) (:func:`prefix_bound`), E[j, n] M times
    the largest of at most min(n, j) stages summing to it, G = Q = 0."""
    big_l, n_dev = tables.n_blk, sum(tables.counts)
    f_tab = np.full((big_l + 1, n_dev + 1), INF)
    f_tab[0] = 0.0
    for n in range(1, n_dev + 1):
        f_tab[:, n] = prefix_bound(tables, batch, n)
    stages = np.maximum(np.minimum(np.arange(big_l + 1)[:, None], np.arange(n_dev + 1)), 1)
    zeros = np.zeros((1, big_l + 1, n_dev + 1))
    return _Relaxed(f_tab, m * f_tab / stages, zeros, zeros, 0.0, np.zeros_like(f_tab))


def _relax_levels(tables: _Tables, batch: int) -> tuple[int, list[int], list[int]]:
    """M, the warm-ups K(1..pc) of the relaxed bounds' suffix levels and the in-flight
    micro-batches min(K, M) their bubble term may assume per level (the last level
    stands for every p >= pc: K(P)). pc: up to where K stops growing, within
    ``RELAX_WORK`` and ``RELAX_LEVELS`` (at least 2)."""
    config = tables.problem.config
    n_dev = sum(tables.counts)
    m = config.global_batch // batch
    max_p = min(tables.n_blk, n_dev, config.max_stages or n_dev)

    def warmup(p: int) -> int:
        return config.warmup_depth(max_p - min(p, max_p), max_p, m)

    shares = len({-(-batch // g) for g in range(1, min(batch, n_dev) + 1)})
    work = (tables.n_blk + 1) ** 2 * (n_dev + 1) * shares / 2
    grows = [p for p in range(2, max_p + 1) if warmup(p) > warmup(p - 1)]
    pc = max(2, min(max(grows, default=1), int(RELAX_WORK // work), RELAX_LEVELS))
    warmups = [warmup(p) for p in range(1, pc + 1)]
    in_flight = [min(k, m) for k in warmups]
    in_flight[-1] = min(warmup(max_p), m)
    return m, warmups, in_flight


def relaxed_bounds(tables: _Tables, batch: int) -> _Relaxed:
    """The relaxed lower bounds (:func:`relaxed_tables`) at micro-batch ``batch``, over
    the levels of :func:`_relax_levels`."""
    m, warmups, in_flight = _relax_levels(tables, batch)
    return relaxed_tables(tables, batch, m, warmups, in_flight)


def weighted_bound(tables: _Tables, batch: int) -> float:
    """Z of :func:`relaxed_bounds` alone (:func:`z_bound`)."""
    m, warmups, _ = _relax_levels(tables, batch)
    return z_bound(tables, batch, m, warmups)


def staged_weighted_bound(tables: _Tables, batch: int) -> float:
    """Zs of :func:`staged_bound` at micro-batch ``batch``, ``STAGED_FIRST`` of
    the first stage's all-reduce counted whole."""
    m, warmups, _ = _relax_levels(tables, batch)
    return staged_bound(tables, batch, m, warmups, STAGED_FIRST)


def reweighted_bound(tables: _Tables, batch: int, target: float) -> float:
    """Zw (:func:`planner.solvers.dp.block_weights.block_weighted_bound`: Z with its block weights
    raised by subgradient ascent) at micro-batch ``batch``; its ascent stops once above
    ``target``. 0 beyond ``RELAX_MAX`` (Z's cap) or where ``REWEIGHT_WORK`` allows fewer
    than ``REWEIGHT_STEPS`` steps."""
    m, warmups, _ = _relax_levels(tables, batch)
    big_l, n_dev = tables.n_blk, sum(tables.counts)
    shares = len({-(-batch // g) for g in range(1, min(batch, n_dev) + 1)})
    per_step = (big_l + 1) ** 2 * (n_dev + 1) * shares / 2
    if per_step > RELAX_MAX or per_step * REWEIGHT_STEPS > REWEIGHT_WORK:
        return 0.0
    need, c_tab, ef, eb, ta, _, tau, _ = _share_figures(tables, batch, warmups[:1])
    return block_weighted_bound(need, np.isfinite(c_tab[0]), ef, eb, ta, tau / 2, m, n_dev,
                                target, int(REWEIGHT_WORK // per_step))  # fmt: skip


def class_weighted_bound(tables: _Tables, batch: int) -> float:
    """Zc of :func:`class_bound` at micro-batch ``batch`` (0 where not computed)."""
    m, warmups, _ = _relax_levels(tables, batch)
    return class_bound(tables, batch, m, warmups)


def priced_weighted_bound(tables: _Tables, batch: int, target: float) -> float:
    """Zp (:func:`planner.solvers.dp.prices.priced_bound`) at micro-batch ``batch``, on three or
    more
    device classes (0 otherwise: one class has no competition Z does not see, and two
    classes have Zc, the exact DP over the class counts that Zp relaxes); its ascent
    stops once above ``target``."""
    if len(tables.classes) < 3:
        return 0.0
    m, warmups, _ = _relax_levels(tables, batch)
    costs = priced_costs(tables, batch, m, warmups[0])
    return priced_bound(costs, tables.rows_first, tables.rows_end, tables.counts, target)


def cell_bounds(
    tables: _Tables,
    relaxed: _Relaxed,
    prefix: np.ndarray,
    sizes: np.ndarray,
    bound: float,
    by_pf: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Two (states, L + 1) tables: for a suffix of l blocks on devices drawn from
    state r, lower bounds on what the blocks before it add to the DP value of a
    complete plan, or inf where no such plan can stay within the bound
    (:mod:`planner.solvers.dp.search`, pruning). The blocks before it run on the n = N -
    |r| devices outside r and add at least max(F[L - l, n], Fg[r, l]) to the suffix's D
    (:func:`graph_prefix_bound`), and PF[L - l, n] to its D + X (:func:`relaxed_tables`);
    the cell holds nothing when the root's D + X must exceed the bound: E[L - l, n],
    that first bound + G[l, |r|], Q[l, |r|] or PF[L - l, n] + Q[l, |r|] (least over the
    stage counts p) above it."""
    t = tables
    big_l, n_dev = t.n_blk, sum(t.counts)
    rows = np.arange(big_l + 1)
    g_least, q_least = relaxed.g.min(axis=0), relaxed.q.min(axis=0)
    out = np.full((len(sizes), big_l + 1), INF)
    out_pf = np.full((len(sizes), big_l + 1), INF)
    for size in np.unique(sizes):
        at = sizes == size
        n_pre = n_dev - int(size)
        here = np.maximum(relaxed.f[big_l - rows, n_pre][None, :], prefix[at])
        forward = relaxed.pf[big_l - rows, n_pre] if by_pf else np.zeros(big_l + 1)
        least = np.maximum(
            np.maximum(relaxed.e[big_l - rows, n_pre], q_least[rows, size])[None, :],
            here + g_least[rows, size][None, :],
        )
        if by_pf:
            least = np.maximum(least, (forward + q_least[rows, size])[None, :])
        out[at] = np.where(least <= bound, here, INF)
        out_pf[at] = np.where(least <= bound, forward[None, :], INF)
    return out, out_pf


def graph_prefix_bound(
    tables: _Tables, graph: _Graph, batch: int, warm: int, per_sample: np.ndarray
) -> np.ndarray:
    """Fg (states, L + 1): for a suffix of l blocks on devices drawn from state r, a
    lower bound on the summed c + tau of the stages before it, over this graph's own
    paths from the root to r (F relaxes which devices those stages have; Fg keeps
    each path's groups, so the classes and counts outside r). A move r -> r' with
    group g heading [L-l, L-l') adds at least c_lb + tau_lb: c_lb the head's
    :meth:`_Tables.head_bound`, inf where the range cannot fit even the fewest
    samples its busiest device holds, ceil(B / |g|), on the group's largest memory at
    the least warm-up any level uses, K(1); tau_lb = 2 (its cut's bytes per sample
    x the fewest samples the link carries (ceil(B / |g|) on a switch, ceil(B / N)
    point to point, B on a shared medium) / the fastest pair's rate + the least
    latency). D' >= c0 + tau1 + D along the chain, so the root's D is at least Fg[r,
    l] + the entry's D. Recurrence from Fg[root, L] = 0, states in descending size:
    Fg[r', l'] = min over edges r -> r' of Fg[r, l'] (a skip) or min over l > l' of
    Fg[r, l] + c_lb + tau_lb. O(E L^2) numpy work, E the moves."""
    t, root = tables, len(graph.states) - 1
    big_l = t.n_blk
    per_sample = np.where(np.arange(big_l + 1) > 0, per_sample, 0.0)  # by l'
    cost: dict[tuple[tuple[int, ...], int], np.ndarray] = {}
    out = np.full((len(graph.states), big_l + 1), INF)
    out[root, big_l] = 0.0
    for s in range(root, -1, -1):
        if not np.isfinite(out[s]).any():
            continue
        for e in graph.out[s]:
            _, cid, sub = graph.edges[e]
            if cid < 0:
                np.minimum(out[sub], out[s], out=out[sub])
                continue
            g = t.comps[cid]
            present = tuple(int(k) for k in np.flatnonzero(g))
            share = -(-batch // sum(g))
            if (present, share) not in cost:
                fits = samples_that_fit(float(t.budget[list(present)].max()), t.dense_static,
                                        warm, t.dense_saved, batch) >= share  # fmt: skip
                carried = t.carried(batch, share)
                tau = 2 * (per_sample * carried / t.bw_max + t.lat_min)
                cost[present, share] = np.where(fits, t.head_bound(cid, batch) + tau[None, :], INF)
            step = (out[s][:, None] + cost[present, share]).min(axis=0)
            np.minimum(out[sub], step, out=out[sub])
    return out


def hidden_bound(tables: _Tables, sizes: np.ndarray, batch: int) -> np.ndarray:
    """(states, L + 1): for a suffix of l blocks on devices drawn from state r, a lower
    bound on the backward traversal PB of the stages before it (the blocks [0, L - l)
    on the n = N - |r| devices outside r, each stage with one device of at least
    ceil(B / n) samples: their least backward times at such a share,
    :meth:`_Tables.share_prefix`; 0 when n = 0). An entry's X enters the root's X
    as X - PB <= X - hidden, and the root's X is at least its first stage's
    T_a >= 0, so X below ``hidden`` never shows: fronts compare max(X, hidden)."""
    t = tables
    big_l, n_dev = t.n_blk, sum(t.counts)
    out = np.zeros((len(sizes), big_l + 1))
    for size in np.unique(sizes):
        n_pre = n_dev - int(size)
        if n_pre > 0:
            cum = t.share_prefix(-(-batch // n_pre), "b")
            out[sizes == size] = cum[big_l - np.arange(big_l + 1)]
    return out
