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

Two more branches, each a condition of the same form with its own A, fill and constant:

    drain:      F(a) + Bk(a) + 2 q hop + M sum t_j(l, y_d)  (after the stage's last
                backward, that of micro-batch M - 1, it goes back through blocks
                0 .. a - 1, each at its least backward time, Bk, over q cuts);
    round trip: F(a) + q hop + (M - n_q + 1) sum f_j(l, y_d) + M sum b_j(l, y_d) + ring
                + G(L) - G(b) + 2 (P - 1 - q) hop, with n_q the forwards stage q runs
                before its first backward in the schedule
                (:func:`planner.solvers.exact.tables.stage_orders`): that backward B(m)
                waits for micro-batch m to go through every later block and back (G:
                per block the least forward plus the least backward time over classes
                and y <= B;
                a hop per cut each way), and after it the device still runs all M
                backwards and M - n_q forwards, F(m) at least before it.

Relaxation (why the bound is a bound): a plan's integer cuts are fractional cuts whose
terms are exactly the above, so any plan meeting T meets the relaxed conditions; memory
is ignored; devices may stay unused. So the least T met by the relaxation is at most
every plan's iteration time (``iteration_ms``).

Feasibility of T (state: devices used per group n, one DP layer per stage): R_p(n) is
the furthest x such that blocks [0, x) can be covered by p stages with the devices n, and
covered prefixes are closed downwards (cut the last stage short: its term only falls).
So a stage may start anywhere in [0, R_{p-1}(n - g)], which gives it

    H(x) = max_{x0 <= x} (A(x0) - F(x0)),   x'_{j,y} = max {x' : A(x') <= T - c + H(x)}

per device of group j with y samples (the least over the branches); the stage of
composition g reaches the furthest x' at which its devices can take the micro-batch:
sum_j g_j Y_j(x') >= B, Y_j(x') the most samples a device of group j can take and still
reach x'. R_p(n) = max over compositions g <= n of that reach; T is met with P stages
when R_P(n) = L for some n.

Complexity: per T, O(P S G J B log L) (S states, G compositions as in the min-max bound,
J groups, B samples), vectorised over (states, compositions); tables O(J B N L).
Bisection: log2(1 / rel_tol) passes per micro-batch size, every P in each pass."""

from __future__ import annotations

import math

import numpy as np
from edgepipe.planner.solvers.exact.stage_bounds import bound_groups, compositions
from edgepipe.planner.solvers.exact.tables import Tables, stage_orders
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
        self.m_count, self.v_lo = m_count, tables.v_lo
        # per group, (L, B): least forward, backward and forward + backward time of each
        # block at y samples over the group's classes
        self.fwd = [np.min([tables.tf[k][:, cols] for k in grp], axis=0) for grp in groups]
        self.bwd = [np.min([tables.tb[k][:, cols] for k in grp], axis=0) for grp in groups]
        work = [
            np.min([tables.tf[k][:, cols] + tables.tb[k][:, cols] for k in grp], axis=0)
            for grp in groups
        ]
        least_f = np.min([tf[:, cols].min(axis=1) for tf in tables.tf], axis=0)
        least_b = np.min([tb[:, cols].min(axis=1) for tb in tables.tb], axis=0)
        pre_f = np.concatenate([[0.0], np.cumsum(least_f)])
        # the fills: forward only (ring and round-trip branches), forward and backward
        # (drain branch; also G of the round trip: below every group's f + b at any y,
        # so the round trip's A - G never falls)
        self.fills = (pre_f, pre_f + np.concatenate([[0.0], np.cumsum(least_b)]))
        self.trip = self.fills[1]
        bnd = np.asarray(tables.boundary, dtype=float)
        self.hop = float(tables.lat_lo + tables.v_lo * bnd[:-1].min()) if n_blocks > 1 else 0.0
        self.lat = tables.lat_lo
        self.grad = np.asarray(tables.grad, dtype=float)
        self.problem = tables.problem
        # per branch i, A[i, j, y - 1, s - 1] and H likewise, each (L + 1,)
        shape = (2, len(groups), batch, gmax, n_blocks + 1)
        self.prefix, self.hull = np.zeros(shape), np.zeros(shape)
        for j, w in enumerate(work):
            for s in range(1, gmax + 1):
                for i, extra in enumerate((self._ring(s), np.zeros(n_blocks))):
                    a_pre = np.vstack(
                        [np.zeros(batch), np.cumsum(m_count * w + extra[:, None], axis=0)]
                    ).T
                    self.prefix[i, j, :, s - 1] = a_pre
                    self.hull[i, j, :, s - 1] = np.maximum.accumulate(a_pre - self.fills[i], axis=1)
        self._trips: dict[tuple[int, int, int, int], tuple[np.ndarray, ...]] = {}
        self._firsts: dict[int, list[int]] = {}

    def _ring(self, s: int) -> np.ndarray:
        """Per block, the ring all-reduce's ms per stage of ``s`` devices (its bytes)."""
        return 2.0 * (s - 1.0) / s * self.v_lo * self.grad

    def forwards_first(self, num_stages: int) -> list[int]:
        """Per stage q of a ``num_stages`` schedule, the forwards its devices run before
        their first backward (n_q of the round-trip branch)."""
        if num_stages not in self._firsts:
            orders = stage_orders(self.problem, self.batch, num_stages)
            self._firsts[num_stages] = [
                next((i for i, (kind, _) in enumerate(acts) if kind == "B"), len(acts))
                for acts in orders
            ]
        return self._firsts[num_stages]

    def _trip_branch(self, j: int, y: int, s: int, n_first: int) -> tuple[np.ndarray, ...]:
        """The round-trip branch's (A - G, A, fill, H) for group ``j``, ``y`` samples,
        ``s`` devices and ``n_first`` forwards before the first backward (cached)."""
        key = (j, y, s, n_first)
        if key not in self._trips:
            per = ((self.m_count - n_first + 1) * self.fwd[j][:, y - 1]
                   + self.m_count * self.bwd[j][:, y - 1] + self._ring(s))  # fmt: skip
            a_pre = np.concatenate([[0.0], np.cumsum(per)])
            fill = self.fills[0]
            hull = np.maximum.accumulate(a_pre - fill)
            self._trips[key] = (a_pre - self.trip, a_pre, fill, hull)
        return self._trips[key]

    def _reach(
        self,
        start: np.ndarray,
        rooms: tuple[np.ndarray, np.ndarray, np.ndarray],
        n_first: np.ndarray,
        j: int,
        y: int,
        s: int,
    ) -> np.ndarray:
        """x'_{j,y} of the module docstring for stages of ``s`` devices starting at most at
        ``start`` (rows x ..., -inf: no prefix), the least over the three branches (T -
        c of each in ``rooms``, shaped as ``start``; ``n_first`` per row: the
        round-trip branch's forwards before the first backward); -inf where no x'
        meets them."""
        out = np.full(start.shape, np.inf)
        for i in (0, 1):
            a_pre, hull = self.prefix[i, j, y - 1, s - 1], self.hull[i, j, y - 1, s - 1]
            out = np.minimum(
                out, self._furthest(start, rooms[i], a_pre, a_pre, self.fills[i], hull)
            )
        for n in np.unique(n_first):
            rows = n_first == n
            got = self._furthest(start[rows], rooms[2][rows], *self._trip_branch(j, y, s, int(n)))
            out[rows] = np.minimum(out[rows], got)
        return np.where(np.isfinite(start), out, -np.inf)

    def _furthest(
        self,
        start: np.ndarray,
        room: np.ndarray,
        inverse: np.ndarray,
        a_pre: np.ndarray,
        fill: np.ndarray,
        hull: np.ndarray,
    ) -> np.ndarray:
        """max {x' : inverse(x') <= room + H(x)}, H(x) = max_{x0 <= x} (a_pre - fill)(x0)
        with ``hull`` its running max at the block ends; -inf where none."""
        n_blocks = self.n_blocks
        x = np.clip(start, 0.0, n_blocks)
        base = np.floor(x).astype(np.int64)
        grid = np.arange(n_blocks + 1, dtype=float)
        here = np.interp(x, grid, a_pre) - np.interp(x, grid, fill)
        value = room + np.maximum(hull[base], here)
        k = np.searchsorted(inverse, value, side="right") - 1
        inner = np.clip(k, 0, n_blocks - 1)
        step = inverse[inner + 1] - inverse[inner]
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(step > 0, (value - inverse[inner]) / np.where(step > 0, step, 1.0), 0.0)
        got = np.where(k >= n_blocks, float(n_blocks), inner + np.clip(frac, 0.0, 1.0))
        return np.where(k < 0, -np.inf, got)

    def feasible(
        self, targets: np.ndarray, limit: np.ndarray, deadline: Deadline | None = None
    ) -> np.ndarray:
        """Per row: can P = ``targets[i]`` stages meet T = ``limit[i]`` in the
        relaxation? One DP layer per stage up to the largest P.

        Raises:
            TimeoutError: ``deadline`` passed (checked before each layer)."""
        rows = len(targets)
        ok = np.zeros(rows, dtype=bool)
        reach = np.full((rows, self.n_states), -np.inf)
        reach[:, 0] = 0.0
        n_groups, batch = self.comps.shape[1], self.batch
        for p in range(1, int(targets.max()) + 1):
            if deadline is not None and deadline.passed():
                raise TimeoutError
            q = p - 1
            n_first = np.array([self.forwards_first(int(t))[q] if q < t else 1 for t in targets])
            # hops after stage q on the round trip, there and back
            after = 2.0 * np.maximum(targets - 1 - q, 0) * self.hop
            nxt = np.full_like(reach, -np.inf)
            for s in np.unique(self.sizes):
                sel = np.flatnonzero(self.sizes == s)
                start = np.where(self.back_ok[:, sel], reach[:, self.back[:, sel]], -np.inf)
                live = np.isfinite(start)  # (rows, S, Gs): only reached starts are priced
                if not live.any():
                    continue
                row, state, comp = np.nonzero(live)
                ring_lat = 2.0 * (s - 1) * self.lat
                room = limit[row] - q * self.hop
                rooms = (room - ring_lat, room - q * self.hop,
                         room - ring_lat - after[row] - self.trip[-1])  # fmt: skip
                if n_groups == 1:  # the stage's s devices: one takes >= ceil(B / s)
                    got = self._reach(start[live], rooms, n_first[row], 0, -(-batch // int(s)),
                                      int(s))  # fmt: skip
                else:
                    got = self._mixed(start[live], rooms, n_first[row], self.comps[sel][comp],
                                      int(s))  # fmt: skip
                np.maximum.at(nxt, (row, state), got)
            reach = nxt
            ok |= (targets == p) & (reach >= self.n_blocks * (1 - 1e-12)).any(axis=1)
        return ok

    def _mixed(
        self,
        start: np.ndarray,
        rooms: tuple[np.ndarray, np.ndarray, np.ndarray],
        n_first: np.ndarray,
        comps: np.ndarray,
        s: int,
    ) -> np.ndarray:
        """The reach of stages of several groups (``comps``: each start's composition,
        one row per start): the furthest x' where the devices' sample capacities
        sum_j g_j Y_j(x') reach B (module docstring)."""
        n_groups, batch = comps.shape[1], self.batch
        cand = np.empty((*start.shape, n_groups, batch))
        for j in range(n_groups):
            for y in range(1, batch + 1):
                cand[..., j, y - 1] = self._reach(start, rooms, n_first, j, y, s)
        # Y_j(x') = #{y : some y' >= y reaches x'}: make each group's reaches
        # non-increasing in y
        cand = np.maximum.accumulate(cand[..., ::-1], axis=-1)[..., ::-1]
        weight = np.broadcast_to(comps[..., None], cand.shape)
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
    try:
        sel = lo < ceiling
        if sel.any():  # first at the ceiling: an entry that cannot meet it is pruned
            met = fb.feasible(stages[sel], hi[sel], deadline)
            lo[np.flatnonzero(sel)[~met]] = ceiling
        while (sel := (hi - lo > rel_tol * hi) & (lo < ceiling)).any():
            mid = 0.5 * (lo + hi)[sel]
            met = fb.feasible(stages[sel], mid, deadline)
            idx = np.flatnonzero(sel)
            hi[idx[met]] = mid[met]
            lo[idx[~met]] = mid[~met]
    except TimeoutError:
        pass  # every entry of lo is still a valid bound
    known[1:] = np.maximum(known[1:], lo)
