"""A cheap lower bound on the iteration time of every plan of a (B, P) program whose
stages may be cut inside a block (fractional cuts): :class:`FractionalBounds`, and
:func:`fractional_bounds`, its bisection on T. It needs no table over block pairs, so it
costs the same on a chain of 1,000 blocks as on one of 30, where the min-max bound of
:mod:`planner.solvers.exact.stage_bounds` costs O(L^2) per micro-batch size.

Inputs: the problem's :class:`~planner.solvers.exact.tables.Tables`, a micro-batch size B
(M = G / B micro-batches) and the stage counts P = 1 .. ``max_stages``.

Stage terms. A device d of class group j (the classes of
:func:`planner.solvers.exact.stage_bounds.bound_groups`, priced at their members' least
time per block and sample count: a relaxation) serving stage q = blocks [a, b) of a stage
of s devices with y_d samples per micro-batch ends the round no earlier than

    F(a) + q hop + M sum_{l in [a, b)} t_j(l, y_d) + 2 (s - 1) (W[a, b) / s v + lat)

F(a): micro-batch 0 went forward through blocks 0 .. a - 1 first, each at its least
forward time over classes and y <= B; hop: each of the q cuts before it takes at least
one sample of the smallest boundary at the fastest pair plus the least latency (v,
lat); then d runs its M forwards and M backwards one after the other (the cost model's
stage time is the sum of its blocks' times, :class:`~planner.solvers.exact.tables.Tables`);
then, after the stage's last backward, its ring all-reduce: 2 (s - 1) steps of a chunk
W / s each at the fastest pair plus the least latency (the point-to-point formula of
:func:`planner.cost.formulas.ring_allreduce_ms`; fair sharing and the shared medium
only slow it). Every term but F is a sum over the stage's blocks plus a constant of
(s, q), so with x the fractional block position (a block's figures spread evenly over
[l, l + 1]) the condition is

    A(x') <= T - c(s, q) + A(x) - F(x),  A = prefix of M t_j(., y) + 2 (s - 1) / s v W(.)

Relaxation (why the bound is a bound): a plan's integer cuts are fractional cuts whose
terms are exactly the above, so any plan meeting T meets the relaxed conditions; memory
is ignored; devices may stay unused. So the least T met by the relaxation is at most
every plan's iteration time (``iteration_ms``).

Feasibility of T (state: devices used per group n, one DP layer per stage): R_p(n) is
the furthest x such that blocks [0, x) can be covered by p stages with the devices n, and
covered prefixes are closed downwards (cut the last stage short: its term only falls).
So a stage may start anywhere in [0, R_{p-1}(n - g)], which gives it

    H(x) = max_{x0 <= x} (A(x0) - F(x0)),   x'_{j,y} = max {x' : A(x') <= T - c + H(x)}

per device of group j with y samples; the stage of composition g reaches the furthest
x' at which its devices can take the micro-batch: sum_j g_j Y_j(x') >= B, Y_j(x') the
most samples a device of group j can take and still reach x'. R_p(n) = max over
compositions g <= n of that reach; T is met with P stages when R_P(n) = L for some n.

Complexity: per T, O(P S G J B log L) (S states, G compositions as in the min-max bound,
J groups, B samples), vectorised over (states, compositions); tables O(J B N L).
Bisection: log2(1 / rel_tol) passes per micro-batch size, every P in each pass."""

from __future__ import annotations

import math

import numpy as np
from edgepipe.planner.solvers.exact.stage_bounds import bound_groups, compositions
from edgepipe.planner.solvers.exact.tables import Tables
from edgepipe.planner.solvers.time_limit import Deadline


class FractionalBounds:
    """The relaxation's tables for one micro-batch size and its feasibility DP
    (:meth:`feasible`); the module docstring has the terms and the recurrence."""

    def __init__(self, tables: Tables, batch: int, max_stages: int) -> None:
        self.batch, self.max_stages = batch, max_stages
        self.n_blocks = n_blocks = tables.n_blocks
        m_count = tables.problem.config.global_batch // batch
        groups = bound_groups(tables, batch)
        counts = [sum(tables.classes[k].count for k in grp) for grp in groups]
        gmax = min(batch, tables.n_devices)
        self.comps = np.array(compositions(counts, gmax), dtype=np.int64).reshape(-1, len(groups))
        self.sizes = self.comps.sum(axis=1)
        radix = np.cumprod([1, *(c + 1 for c in counts[:-1])])
        self.n_states = n_states = math.prod(c + 1 for c in counts)
        digits = (np.arange(n_states)[:, None] // radix[None, :]) % (np.array(counts) + 1)
        self.back_ok = (digits[:, None, :] >= self.comps[None, :, :]).all(axis=2)
        self.back = np.where(self.back_ok, np.arange(n_states)[:, None] - self.comps @ radix, 0)
        cols = slice(1, batch + 1)
        # per group, (L, B): least forward + backward time of each block at y samples
        work = [
            np.min([tables.tf[k][:, cols] + tables.tb[k][:, cols] for k in grp], axis=0)
            for grp in groups
        ]
        least_f = np.min([tf[:, cols].min(axis=1) for tf in tables.tf], axis=0)
        least_b = np.min([tb[:, cols].min(axis=1) for tb in tables.tb], axis=0)
        pre_f = np.concatenate([[0.0], np.cumsum(least_f)])
        # the two conditions' fills: forward only (ring branch), forward and backward
        # (drain branch)
        self.fills = (pre_f, pre_f + np.concatenate([[0.0], np.cumsum(least_b)]))
        bnd = np.asarray(tables.boundary, dtype=float)
        self.hop = float(tables.lat_lo + tables.v_lo * bnd[:-1].min()) if n_blocks > 1 else 0.0
        self.lat = tables.lat_lo
        grad = np.asarray(tables.grad, dtype=float)
        # per branch i, A[i, j, y - 1, s - 1] and H likewise, each (L + 1,)
        shape = (2, len(groups), batch, gmax, n_blocks + 1)
        self.prefix, self.hull = np.zeros(shape), np.zeros(shape)
        for j, w in enumerate(work):
            for s in range(1, gmax + 1):
                ring = 2.0 * (s - 1.0) / s * tables.v_lo * grad
                for i, extra in enumerate((ring, np.zeros_like(ring))):
                    a_pre = np.vstack(
                        [np.zeros(batch), np.cumsum(m_count * w + extra[:, None], axis=0)]
                    ).T
                    self.prefix[i, j, :, s - 1] = a_pre
                    self.hull[i, j, :, s - 1] = np.maximum.accumulate(a_pre - self.fills[i], axis=1)

    def _reach(
        self, start: np.ndarray, budget: tuple[np.ndarray, np.ndarray], j: int, y: int, s: int
    ) -> np.ndarray:
        """x'_{j,y} of the module docstring for stages of ``s`` devices starting at most at
        ``start`` (-inf: no prefix), the least over the two branches (T - c of each in
        ``budget``, shaped as ``start``); -inf where no x' meets them."""
        n_blocks = self.n_blocks
        x = np.clip(start, 0.0, n_blocks)
        base = np.floor(x).astype(np.int64)
        grid = np.arange(n_blocks + 1, dtype=float)
        out = np.full(start.shape, np.inf)
        for i, room in enumerate(budget):
            a_pre, hull = self.prefix[i, j, y - 1, s - 1], self.hull[i, j, y - 1, s - 1]
            here = np.interp(x, grid, a_pre) - np.interp(x, grid, self.fills[i])
            value = room + np.maximum(hull[base], here)
            k = np.searchsorted(a_pre, value, side="right") - 1
            inner = np.clip(k, 0, n_blocks - 1)
            step = a_pre[inner + 1] - a_pre[inner]
            with np.errstate(divide="ignore", invalid="ignore"):
                frac = np.where(step > 0, (value - a_pre[inner]) / np.where(step > 0, step, 1.0),
                                0.0)  # fmt: skip
            got = np.where(k >= n_blocks, float(n_blocks), inner + np.clip(frac, 0.0, 1.0))
            out = np.minimum(out, np.where(k < 0, -np.inf, got))
        return np.where(np.isfinite(start), out, -np.inf)

    def feasible(self, targets: np.ndarray, limit: np.ndarray) -> np.ndarray:
        """Per row: can P = ``targets[i]`` stages meet T = ``limit[i]`` in the
        relaxation? One DP layer per stage up to the largest P."""
        rows = len(targets)
        ok = np.zeros(rows, dtype=bool)
        reach = np.full((rows, self.n_states), -np.inf)
        reach[:, 0] = 0.0
        n_groups, batch = self.comps.shape[1], self.batch
        for p in range(1, int(targets.max()) + 1):
            nxt = np.full_like(reach, -np.inf)
            for s in np.unique(self.sizes):
                sel = np.flatnonzero(self.sizes == s)
                start = np.where(self.back_ok[:, sel], reach[:, self.back[:, sel]], -np.inf)
                zero = np.zeros_like(start)
                budget = (limit[:, None, None] - (p - 1) * self.hop
                          - 2.0 * (s - 1) * self.lat + zero,
                          limit[:, None, None] - 2.0 * (p - 1) * self.hop + zero)  # fmt: skip
                comps = self.comps[sel]  # (Gs, J)
                if n_groups == 1:  # the stage's s devices: one takes >= ceil(B / s)
                    got = self._reach(start, budget, 0, -(-batch // int(s)), int(s))
                else:
                    got = self._mixed(start, budget, comps, int(s))
                nxt = np.maximum(nxt, got.max(axis=2))
            reach = nxt
            ok |= (targets == p) & (reach >= self.n_blocks * (1 - 1e-12)).any(axis=1)
        return ok

    def _mixed(
        self, start: np.ndarray, budget: tuple[np.ndarray, np.ndarray], comps: np.ndarray, s: int
    ) -> np.ndarray:
        """The reach of stages of several groups: the furthest x' where the devices'
        sample capacities sum_j g_j Y_j(x') reach B (module docstring)."""
        n_groups, batch = comps.shape[1], self.batch
        cand = np.empty((*start.shape, n_groups, batch))
        for j in range(n_groups):
            for y in range(1, batch + 1):
                cand[..., j, y - 1] = self._reach(start, budget, j, y, s)
        # Y_j(x') = #{y : some y' >= y reaches x'}: make each group's reaches
        # non-increasing in y
        cand = np.maximum.accumulate(cand[..., ::-1], axis=-1)[..., ::-1]
        weight = np.broadcast_to(comps[None, None, :, :, None], cand.shape)
        cand = np.where(weight > 0, cand, -np.inf).reshape(*start.shape, -1)
        weight = weight.reshape(*start.shape, -1)
        order = np.argsort(-cand, axis=-1)
        filled = np.cumsum(np.take_along_axis(weight, order, axis=-1), axis=-1) >= batch
        first = np.argmax(filled, axis=-1)[..., None]
        value = np.take_along_axis(np.take_along_axis(cand, order, axis=-1), first, axis=-1)
        return np.where(filled.any(axis=-1), value[..., 0], -np.inf)


def fractional_bounds(
    tables: Tables,
    batch: int,
    max_stages: int,
    known: np.ndarray,
    ceiling: float,
    deadline: Deadline,
    rel_tol: float = 1e-3,
) -> None:
    """Raise ``known`` (entry P: a valid lower bound on every plan of (``batch``, P);
    entry 0 unused) in place to the relaxation's least feasible T, by bisection below
    ``ceiling`` (an entry the relaxation cannot meet at the ceiling rises to it: what
    prunes), each entry within ``rel_tol`` of it or wherever the bisection stood when
    ``deadline`` passed (every entry stays a valid bound). O(log2(1 / rel_tol)) passes
    of :meth:`FractionalBounds.feasible`."""
    if deadline.passed():
        return
    fb = FractionalBounds(tables, batch, max_stages)
    stages = np.arange(1, max_stages + 1)
    lo = known[1:].copy()
    hi = np.full(max_stages, ceiling)
    sel = lo < ceiling
    if sel.any():  # first at the ceiling: an entry that cannot meet it is pruned
        met = fb.feasible(stages[sel], hi[sel])
        lo[np.flatnonzero(sel)[~met]] = ceiling
    while (sel := (hi - lo > rel_tol * hi) & (lo < ceiling)).any() and not deadline.passed():
        mid = 0.5 * (lo + hi)[sel]
        met = fb.feasible(stages[sel], mid)
        idx = np.flatnonzero(sel)
        hi[idx[met]] = mid[met]
        lo[idx[~met]] = mid[~met]
    known[1:] = np.maximum(known[1:], lo)
