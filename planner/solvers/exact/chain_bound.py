"""A lower bound on the iteration time of every plan of a micro-batch size's (B, P)
programs over integer cuts, the later stages' round trip priced stage by stage:
:class:`ChainBound` (the feasibility DP) and :func:`chain_bounds` (its bisection on T).
Where :mod:`planner.solvers.exact.fractional` lets a stage end inside a block and prices
every later stage at one sample per device and the smallest boundary, this DP runs from
the last stage back, so a stage knows the cuts and device counts of every stage after
it: a single-device stage takes all B samples, each boundary is the cut's own, and the
first micro-batch's round trip through the later stages waits for each of them to run
its warm-up forwards.

Inputs: the problem's :class:`~planner.solvers.exact.tables.Tables`, a micro-batch size B
(M = G / B micro-batches) and the stage counts P = 1 .. ``max_stages``. The device classes
form the groups of :func:`chain_groups` (classes of close speed merge while the states
times the stage compositions exceed :data:`CHAIN_STATES`; a group is priced at the least
time over its classes per block: a relaxation), and the state counts the devices used
per group. Memory is ignored (a relaxation).

Stage terms (cost model: :func:`planner.cost.makespan.round_makespan`; each device runs
its stage's actions in the schedule's order, :func:`planner.solvers.exact.tables.stage_orders`;
a transfer of ``x`` bytes over a channel lasts at least ``x v + lat``, v the fastest
ms per byte and lat the least latency of any pair; a channel carries at most one ms of
channel time per ms, :func:`planner.cost.channels.fair_shares`). Stage q = blocks [a, b)
with s devices, r = P - 1 - q stages after it; n_r the forwards a device of stage q runs
before its first backward (the schedule's warm-up) and t_r the backwards it runs after its
last forward (micro-batch M - 1's on every stage, in 1F1B and GPipe). A
split (s, y_lo): the stage's fewest samples on a device are y_lo (1 .. B / s; B for
s = 1), so another holds y_d >= max(y_lo, ceil((B - y_lo) / (s - 1))); every figure of
a device is a sum over the stage's blocks, least over classes and over the y it may
hold and over the groups of the split's composition g (which devices of each group serve
the stage: g_j <= count_j, sum g_j = s), plus the runtime's work per action
(:meth:`planner.cost.model.CostModel.device_times`).
h(c, y) = lat + v y bytes(c): y samples of cut c's boundary through one device's
downlink or uplink (switched) or the medium, one sample point to point (a device's
pairs run in parallel); 0 at c = 0.

- d, the device with y_d samples (f_d, b_d its forward and backward, w_d its f + b;
  every group of g also has a device of >= y_lo samples, so the work + ring and drain
  terms hold too for the largest over g's groups of M (f + b) at y >= y_lo, with S_e
  and h(a, y_lo) for S_d and h(a, y_d), and the round trip's tail for any group's at
  y_lo with h(b, y_lo)):

      work + ring:  S_d + M w_d + ring_s(a, b)
      drain:        S_d + M w_d + h(a, y_d) + D(a, K - n)
      round trip:   S_e + f_e + U' + h(b, y_d) + (M - n_r) f_d + M b_d
                    + max(ring_s(a, b), h(a, y_d) + D(a, K - n))
      last forward: S_d + M f_d + (M - t_r) b_d + h(b, y_d) + X'
      uplink:       S_d + f_d + M (h(a, y_d) + h(b, y_d) - 2 lat) + ring_s - 2 (s - 1) lat
                    + lat

  S_d = E(a, K - n) + h(a, y_d): d's first forward starts once the earliest forward of
  micro-batch 0 on the stage before ended (E, below, with the K - n devices per group, K
  the counts, the stages before a may have) and d's samples came over its downlink; S_e
  likewise with y_lo (the stage's earliest first forward). ring_s: after the stage's
  last backward, 2 (s - 1) steps of a chunk W[a, b) / s at the fastest pair plus the
  least latency (the point-to-point formula of
  :func:`planner.cost.formulas.ring_allreduce_ms`; sharing only slows it). Drain: d's
  last backward's gradient leaves over its uplink and goes back through the stages
  before (D). Round trip: d's first backward starts after the gradient of its micro-
  batch came back: the earliest first forward on stage q ends at S_e + f_e, U' later the
  earliest first backward on stage q + 1 has ended, then d's samples' gradients come
  over its downlink; after it d still runs M - n_r forwards and M backwards, then the
  ring and, beside it, its last gradient's way back (as in the drain; with n_r forwards
  before it, S_d + M w_d is the work term). Last forward: d's last forward ends after all
  its forwards and the M - t_r backwards before it, its output leaves over its uplink
  (the last piece delivered h(b, y_d) later) to a device of stage q + 1, whose own last
  forward waits for it: X' is that stage's value below. Uplink: from the end
  of d's first forward on, its uplink (switched) or the medium carries M y_d samples of
  each of the stage's boundaries (activations on, gradients back) and its ring chunks,
  at most one ms of channel time per ms, the last one delivered a latency later (point
  to point: its ring chunks only, all to one pair);
- after a device's last backward, max(ring_s, h(a, y) + D) in the terms above (and in
  D, below) is also at least ring_s - 2 (s - 1) lat + lat + v y bytes(a) (s >= 2,
  switched or medium; :func:`_after`): its ring chunks and its last gradient both
  leave over its uplink, the later delivered a latency after both channel times;
- balance (a split of several groups, :meth:`ChainBound._balanced`): every term above
  holds for each device k of the stage at its own y_k samples (S_k from h(a, y_k), the
  round trip's tail from h(b, y_k)), so a device of group j holds at most cap_j, the most
  y >= y_lo at which all of them fit T (each rises with y); one device holds y_lo and
  the stage holds B, so y_lo + sum_j g_j cap_j - min_j cap_j >= B. (The terms of d and
  e price d at the fastest group: a stage of an Orin, a TX2 and a Nano at B = 16 met T
  with 8 samples on an Orin and one on the Nano, leaving 7 to a TX2 that cannot take
  them; inception-like x 4 mixed, (B 16, P 2): 0.933 -> 0.999 of the incumbent);
- the DP's value for stage q's start: U(a) = h(a, y_lo) + R, the least time from the
  end of the earliest first forward on stage q - 1 to the end of the earliest first
  backward on stage q: R = max(n_r f_e, f_e + U' + h(b, y_lo)) + b_e for the device e
  that ends it (y_e >= y_lo: it waits for its n_r forwards and for its gradient), U'
  the next stage's value (0, and no hop, for the last stage); and X(a), the least time
  from the delivery of the last activation to a device e of stage q (y_e >= y_lo) to the
  end of the round: X = f_e + max(t_r b_e + max(ring_s, h(a, y_lo) + D(a, K - n)),
  h(b, y_lo) + X') (its last forward, then its trailing backwards and its ring or its
  gradient's way back, or its output's way through the later stages; the last stage
  without the second);
- the stages before a (:meth:`ChainBound._prefixes`, no term checked: a relaxation), over
  prefixes of exactly q stages (those before stage q of a P-stage plan) and at most k
  devices:

      E_q(b, k) = min over a < b, splits of E_{q-1}(a, k - s) + h(a, y_lo) + f_e[a, b]
      D_q(b, k) = min over a < b, splits of b_e[a, b]
                  + max(ring_s(a, b), h(a, y_lo) + D_{q-1}(a, k - s))

  (E: the earliest first forward of the prefix's last stage ends; D: from a gradient's
  arrival there to the end of stage 0's backward and of every ring it passes: every
  stage's last backward is of micro-batch M - 1, so the gradient that drains is the one
  a stage's ring waits for), E_0(0, .) = D_0(0, .) = 0.

Why it is a bound: every plan's stages are integer cuts with these figures at least,
each term is a path of the cost model's event schedule made only of actions a device
runs one after the other and transfers that last at least what is counted, so a plan's
iteration time is at least its largest term; the DP relaxes memory and merges classes.

Feasibility of T (state: start block a and devices n per group used by the stages from
q on, one layer per r = 0 .. P - 1, from the last stage back; s, g a split's):

    U_0(a, g) = min over stages [a, L) and splits of composition g whose terms are <= T
                of h(a, y_lo) + R
    U_r(a, n) = min over b > a, splits with g <= n, n != g, U_{r-1}(b, n - g) finite
                and every term of stage [a, b) <= T (U' = U_{r-1}(b, n - g),
                X' = X_{r-1}(b, n - g)) of h(a, y_lo) + R

and X_r(a, n) likewise the least X. Every term and R rise with U' and X', so the least
of each per state is all a later stage needs (keeping the two apart relaxes). One pass
of P layers per P, the prefixes before stage q = P - 1 - r those of q stages and n_r,
t_r the P-stage schedule's; T is met with P stages when U_{P-1}(0, n) is finite for
some n <= the counts.

Complexity: per T and P, O(P X S L^2) (numpy over block pairs, only the b a later stage
can start at and the a from the first to the last at which a prefix ends before T: a = 0
for stage 0; X states, S splits: compositions times the y_lo of each), and for the
splits of several groups O(J B) more per pair still feasible (the balance); the tables
O(J B L^2) memory (J groups) and the prefixes O(P X S L^2) time. Bisection: log2(1 / tol)
passes per micro-batch size and tolerance, each P still below the midpoint in each pass
(:func:`chain_bounds`)."""

from __future__ import annotations

import math

import numpy as np
from edgepipe.planner.solvers.exact.stage_bounds import bound_groups, compositions
from edgepipe.planner.solvers.exact.tables import Tables, stage_orders
from edgepipe.planner.solvers.time_limit import Deadline

#: the most bytes the tables of one micro-batch size may take ((L + 1)^2 floats per
#: group, y and figure); :func:`chain_bounds` leaves a size beyond it as it is (2^28:
#: 366 blocks x 4 groups at B = 16 take 151 MB, and that size held a mixed-4 cluster's
#: least bound)
CHAIN_BYTES = 2**28

#: the class groups the DP keeps apart (:func:`planner.solvers.exact.stage_bounds.bound_groups`)
#: have at most about this many (state, stage composition) pairs
CHAIN_STATES = 256


def table_bytes(n_blocks: int, batch: int, n_groups: int) -> int:
    """The bytes of :class:`ChainBound`'s tables: two figures per group and y <=
    ``batch``, and the work of the DP's layers."""
    return 8 * (n_blocks + 1) ** 2 * (2 * n_groups * batch + 12)


#: a stage split: devices per group g, their count s, the fewest samples y_lo on one of
#: them and the most y_d the split forces on another
Split = tuple[np.ndarray, int, int, int]

#: a split's figures over block pairs: M w_d, the most M (f + b) of a device of any of its
#: groups at >= y_lo, f_d, b_d, f_e, b_e, ring, sent, and per group its (f, b) at y_lo
Figures = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                np.ndarray, np.ndarray, list[tuple[np.ndarray, np.ndarray]]]  # fmt: skip


class ChainBound:
    """The DP's tables for one micro-batch size and its feasibility test
    (:meth:`feasible`); the module docstring has the terms and the recurrence."""

    def __init__(self, tables: Tables, batch: int, max_stages: int,
                 deadline: Deadline | None = None) -> None:  # fmt: skip
        """Build the tables (O(J B L^2)) and the prefixes (O(P X S L^2)).

        Raises:
            TimeoutError: ``deadline`` passed (checked before each y of each table and
                each state of :meth:`_prefixes`)."""
        self.batch, self.max_stages = batch, max_stages
        self.deadline = deadline
        self.n_blocks = n_blocks = tables.n_blocks
        self.m_count = tables.problem.config.global_batch // batch
        groups = chain_groups(tables, batch)
        self.counts = counts = [sum(tables.classes[k].count for k in grp) for grp in groups]
        self.radix = np.cumprod([1, *(c + 1 for c in counts[:-1])])
        self.n_states = math.prod(c + 1 for c in counts)
        self.digits = (np.arange(self.n_states)[:, None] // self.radix) % (np.array(counts) + 1)
        self.pair = np.triu(np.ones((n_blocks + 1, n_blocks + 1), dtype=bool), k=1)  # a < b
        # per group, per y - 1: (L + 1, L + 1) least over y' >= y (and the group's
        # classes) of the blocks [a, b)'s forward / backward ms, with the runtime's work
        # per action of a used device (CostModel.device_times)
        self.f_from = [self._from_y(tables.tf, grp, tables.wf) for grp in groups]
        self.b_from = [self._from_y(tables.tb, grp, tables.wb) for grp in groups]
        self.v, self.lat = v, lat = tables.v_lo, tables.lat_lo
        self.aggregate = tables.topology != "point_to_point"
        self.bnd = np.concatenate([[0.0], np.asarray(tables.boundary, dtype=float)[:-1], [0.0]])
        self.hops = {y: self._hop(y) for y in range(1, batch + 1)}
        # per y: v y bytes(c) per cut c on a device's uplink (switched) or the medium, 0
        # point to point (a device's pairs run in parallel) and at c = 0, L
        cut = np.where(self.bnd > 0, lat, 0.0)
        self.chans = {y: (h - cut) if self.aggregate else 0.0 * h for y, h in self.hops.items()}
        grad = np.concatenate([[0.0], np.cumsum(np.asarray(tables.grad, dtype=float))])
        self.weights = np.where(self.pair, grad[None, :] - grad[:, None], 0.0) * v
        # per split: (composition g, s, y_lo, y_d): the stage's fewest samples on a device
        # are y_lo, so another holds y_d >= max(y_lo, ceil((B - y_lo) / (s - 1)))
        self.splits: list[Split] = []
        for g in compositions(counts, min(batch, tables.n_devices)):
            s = sum(g)
            for y_lo in range(batch if s == 1 else 1, batch // s + 1):
                y_d = batch if s == 1 else max(y_lo, -(-(batch - y_lo) // (s - 1)))
                self.splits.append((np.array(g), s, y_lo, y_d))
        self.fill, self.drain = self._prefixes()
        #: per P, per stage: the forwards it runs before its first backward and the
        #: backwards after its last forward
        self.counts_of = {p: _schedule_counts(tables, batch, p) for p in range(1, max_stages + 1)}

    def _from_y(self, per_class: list[np.ndarray], grp: list[int], work: list[float]
                ) -> list[np.ndarray]:  # fmt: skip
        """Entry y - 1: (L + 1, L + 1), least over y' >= y and the classes of ``grp`` of
        the blocks [a, b)'s sum plus the class's work per action (inf where a >= b)."""
        batch = self.batch
        least = np.min([per_class[k][:, 1 : batch + 1] for k in grp], axis=0)
        pre = np.vstack([np.zeros(batch), np.cumsum(least, axis=0)])
        out = [pre[None, :, -1] - pre[:, None, -1]]
        for y in range(batch - 1, 0, -1):
            self._check()
            out.append(np.minimum(out[-1], pre[None, :, y - 1] - pre[:, None, y - 1]))
        extra = min(work[k] for k in grp)
        return [np.where(self.pair, t + extra, np.inf) for t in out[::-1]]

    def _hop(self, y: int) -> np.ndarray:
        """Per cut c (0 .. L): h(c, y) = lat + v y' bytes(c), y' = y over a device's own
        downlink or uplink or the medium, 1 point to point; 0 at c = 0 and L."""
        got = self.lat + self.v * (y if self.aggregate else 1) * self.bnd
        got[0] = got[-1] = 0.0
        return got

    def _check(self) -> None:
        """Raise TimeoutError once the construction's deadline passed."""
        if self.deadline is not None and self.deadline.passed():
            raise TimeoutError

    def figures(self, split: Split, rows: slice, cols: np.ndarray) -> Figures:
        """A split's :data:`Figures` over the block pairs (a, b), a in ``rows`` and b in
        ``cols``: a device's figures the least over the composition's groups."""
        g, s, y_lo, y_d = split
        used = np.flatnonzero(g)
        pairs = (rows, cols)

        def least(table: list[list[np.ndarray]], y: int) -> np.ndarray:
            return np.min([table[j][y - 1][pairs] for j in used], axis=0)

        f_d, b_d, f_e, b_e = (least(self.f_from, y_d), least(self.b_from, y_d),
                              least(self.f_from, y_lo), least(self.b_from, y_lo))  # fmt: skip
        # the y_d device, of some group; and each group's devices hold >= y_lo samples
        lows = [(self.f_from[j][y_lo - 1][pairs], self.b_from[j][y_lo - 1][pairs])
                for j in used]  # fmt: skip
        work = self.m_count * np.min(
            [self.f_from[j][y_d - 1][pairs] + self.b_from[j][y_d - 1][pairs] for j in used],
            axis=0)  # fmt: skip
        work_lo = self.m_count * np.max([f + b for f, b in lows], axis=0)
        ring = 2.0 * (s - 1) * (self.weights[pairs] / s + self.lat)
        # d's uplink: from its first forward's end on, M y_d samples of both boundaries
        # and its ring chunks, then a latency
        chan = self.chans[y_d]
        sent = (f_d + self.m_count * (chan[rows][:, None] + chan[cols][None, :]) + ring
                - 2.0 * (s - 1) * self.lat + self.lat)  # fmt: skip
        return work, work_lo, f_d, b_d, f_e, b_e, ring, sent, lows

    def _prefixes(self) -> tuple[np.ndarray, np.ndarray]:
        """(max_stages, L + 1, states) each, per stage count q, block a and devices k
        per group: the least over prefixes [0, a) of q stages and at most k devices
        (terms unchecked: a relaxation) of the end of the earliest forward of
        micro-batch 0 on their last stage (E), and of the time from a gradient's
        arrival at their last stage to the end of stage 0's backward (D), every stage
        at its split's fewest samples:

            E_q(b, k) = min over a < b, splits g <= k of E_{q-1}(a, k - g) + h(a, y_lo) + f_e[a, b]
            D_q(b, k) = min over a < b, splits g <= k of D_{q-1}(a, k - g) + h(a, y_lo) + b_e[a, b]

        (the earliest device of a stage holds >= y_lo samples and receives them over
        its downlink; a gradient leaves a device over its uplink), E_0(0, 0) = D_0(0, 0)
        = 0, inf elsewhere. O(P x states x splits x L^2); the deadline checked before
        each split's figures and each (q, state)."""
        shape = (self.max_stages, self.n_blocks + 1, self.n_states)
        fill, drain = np.full(shape, np.inf), np.full(shape, np.inf)
        fill[0, 0, 0] = drain[0, 0, 0] = 0.0
        order = np.argsort(self.digits.sum(axis=1), kind="stable")
        steps = []
        for split in self.splits:
            self._check()
            figs = self.figures(split, slice(None), np.arange(self.n_blocks + 1))
            steps.append((split, figs[4], figs[5], figs[6]))
        for q in range(1, self.max_stages):
            for k in order[1:]:
                self._check()
                for (g, s, y_lo, _), f_e, b_e, ring in steps:
                    if (self.digits[k] >= g).all():
                        back = k - int(g @ self.radix)
                        hop = self.hops[y_lo]
                        step = (fill[q - 1, :, back] + hop)[:, None] + f_e
                        fill[q, :, k] = np.minimum(fill[q, :, k], step.min(axis=0))
                        # after the stage's backward: its ring, and the way further back
                        way = (drain[q - 1, :, back] + hop)[:, None]
                        step = _after(ring, s, self.lat, way, self.chans[y_lo][:, None]) + b_e
                        drain[q, :, k] = np.minimum(drain[q, :, k], step.min(axis=0))
        # at most k per group: the least over every k' <= k, one group axis at a time
        grid = (self.max_stages, self.n_blocks + 1, *(c + 1 for c in reversed(self.counts)))
        out = []
        for table in (fill, drain):
            t = table.reshape(grid)
            for axis in range(2, t.ndim):
                t = np.minimum.accumulate(t, axis=axis)
            out.append(t.reshape(shape))
        return out[0], out[1]

    def feasible(self, limit: float, deadline: Deadline | None = None) -> np.ndarray:
        """Per P = 1 .. ``max_stages`` (entry P - 1): can P stages meet T = ``limit``
        in the relaxation? One DP pass of P layers per P (:meth:`_meets`).

        Raises:
            TimeoutError: ``deadline`` passed (checked before each split of each
                layer)."""
        ok = np.zeros(self.max_stages, dtype=bool)
        for p in range(1, self.max_stages + 1):
            ok[p - 1] = self._meets(p, limit, deadline)
        return ok

    def meets_any(self, limit: float, stages: np.ndarray, deadline: Deadline | None = None
                  ) -> bool:  # fmt: skip
        """Whether some P of ``stages`` (a mask, entry P - 1) can meet T = ``limit``:
        :meth:`feasible`'s answer for them, the fewest stages (the cheapest pass) tested
        first and none after the first that meets it."""
        return any(self._meets(p, limit, deadline)
                   for p in range(1, self.max_stages + 1) if stages[p - 1])  # fmt: skip

    def _meets(self, num_stages: int, limit: float, deadline: Deadline | None) -> bool:
        """Whether ``num_stages`` stages can meet T = ``limit``: one DP layer per stage
        from the last back (r = 0 .. P - 1), the stages before stage q = P - 1 - r the
        prefixes of q stages, its warm-up forwards the schedule's."""
        n_blocks, m, inf = self.n_blocks, self.m_count, np.inf
        full = self.n_states - 1  # every device of every group
        # value[a, n]: U_r(a, n), n the devices per group of the stages from a on;
        # tails[a, n]: X_r(a, n)
        value = np.full((n_blocks + 1, self.n_states), inf)
        tails = np.full_like(value, inf)
        last = np.where(np.arange(n_blocks + 1) == n_blocks, 0.0, inf)
        for r in range(num_stages):
            stage = num_stages - 1 - r
            warm, trailing = self.counts_of[num_stages][stage]
            before_fill, before_drain = self.fill[stage], self.drain[stage]
            # the blocks a stage q may start at: from the first to the last at which
            # some prefix of q stages ends before T (stage 0: a = 0 only)
            reach = np.flatnonzero(before_fill.min(axis=1) <= limit)
            if not reach.size:
                return False
            rows = slice(int(reach[0]), int(reach[-1]) + 1)
            nxt, nxt_tails = np.full_like(value, inf), np.full_like(value, inf)
            for split in self.splits:
                if deadline is not None and deadline.passed():
                    raise TimeoutError
                g, s, y_e, y_d = split
                gi, used = int(g @ self.radix), np.flatnonzero(g)
                # states n = n' + g of the stages from q on, n' the later stages' (none
                # for the last stage, which ends at L)
                fit = (self.digits + g <= self.counts).all(axis=1)
                later_states = (np.flatnonzero(fit & (np.arange(self.n_states) > 0)) if r
                                else np.zeros(1, dtype=np.int64))  # fmt: skip
                after = value[:, later_states] if r else last[:, None]
                cols = np.flatnonzero(np.isfinite(after).any(axis=1))
                if not cols.size:
                    continue
                after = after[cols]
                later_tails = tails[cols][:, later_states] if r else 0.0 * after
                figs = self.figures(split, rows, cols)
                work, work_lo, f_d, b_d, f_e, b_e, ring, sent, lows = figs
                hop_d, hop_e = self.hops[y_d], self.hops[y_e]
                # per start block a in rows
                at_d, at_e = hop_d[rows], hop_e[rows]
                chan_d, chan_e = self.chans[y_d][rows], self.chans[y_e][rows]
                # d's round trip, and any group's device (>= y_lo samples)'s: from its
                # first backward on, the forwards after the warm-up and every backward
                rest = max(m - warm, 0)
                tail_d = hop_d[cols][None, :] + _times(rest, f_d) + m * b_d
                tail_e = hop_e[cols][None, :] + np.max(
                    [_times(rest, f) + m * b for f, b in lows], axis=0)
                back_e = hop_e[cols][None, :]
                # up to its last forward's output delivered (d, and any group's device)
                lead_d = m * f_d + _times(m - trailing, b_d) + hop_d[cols][None, :]
                lead_e = back_e + np.max([m * f + _times(m - trailing, b) for f, b in lows],
                                         axis=0)  # fmt: skip
                for i, later in enumerate(later_states):
                    n = int(later) + gi
                    # the stages before a have at most the devices left
                    fill, drain = before_fill[rows, full - n], before_drain[rows, full - n]
                    # d's first forward, and any group's device (>= y_lo samples)'s
                    start_d, start_e = fill + at_d, fill + at_e
                    # after the device's last backward: the stage's ring, and its
                    # gradient's way back through the stages before a, both leaving
                    # over its uplink
                    ends_d = _after(ring, s, self.lat, (at_d + drain)[:, None], chan_d[:, None])
                    ends_e = _after(ring, s, self.lat, (at_e + drain)[:, None], chan_e[:, None])
                    fits = ((np.maximum(work + ends_d, sent) <= (limit - start_d)[:, None])
                            & (work_lo + ends_e <= (limit - start_e)[:, None]))  # fmt: skip
                    trip_need = f_e + np.maximum(tail_d + ends_d, tail_e + ends_e)
                    live = fits & (after[None, :, i] <= limit - trip_need - start_e[:, None])
                    x_next = later_tails[None, :, i]
                    if r:  # the next stage's last forward and what follows it
                        live &= ((lead_d + x_next <= (limit - start_d)[:, None])
                                 & (lead_e + x_next <= (limit - start_e)[:, None]))  # fmt: skip
                    if len(used) > 1:  # the split's devices must take all B samples
                        returned = at_e[:, None] + f_e + after[None, :, i]
                        live = self._balanced(
                            live, split, rows, cols, limit, fill, drain, returned,
                            x_next if r else None, rest, trailing, ring)  # fmt: skip
                    if not live.any():
                        continue
                    trip = np.maximum(warm * f_e, f_e + after[None, :, i] + back_e) + b_e
                    got = np.where(live, trip, inf).min(axis=1) + at_e
                    nxt[rows, n] = np.minimum(nxt[rows, n], got)
                    # X: from the last activation's delivery on, a device's last forward,
                    # then its trailing backwards, its ring and its gradient's way back,
                    # or its output's way through the later stages
                    x_own = f_e + np.maximum(_times(trailing, b_e) + ends_e,
                                             back_e + x_next if r else 0.0)  # fmt: skip
                    x_got = np.where(live, x_own, inf).min(axis=1)
                    nxt_tails[rows, n] = np.minimum(nxt_tails[rows, n], x_got)
            value, tails = nxt, nxt_tails
            if not np.isfinite(value).any():
                return False
        return bool(np.isfinite(value[0, 1:]).any())

    def _balanced(self, live: np.ndarray, split: Split, rows: slice, cols: np.ndarray,
                  limit: float, fill: np.ndarray, drain: np.ndarray, returned: np.ndarray,
                  x_next: np.ndarray | None, rest: int, trailing: int, ring: np.ndarray
                  ) -> np.ndarray:  # fmt: skip
        """``live`` (block pairs (a, b), a in ``rows``, b in ``cols``) where the devices
        of a split of several groups can take the micro-batch's B samples: a device of
        group j holds at most cap_j samples, the most y >= y_lo at which every term of a
        device with y samples of its own fits T = ``limit`` (work + ring, drain, uplink,
        round trip from ``returned`` = h(a, y_lo) + f_e + U' after the prefix's fill,
        and for a stage before the last its last forward into the next one's X'); each
        term rises with y, so cap_j - y_lo + 1 is the count of y that fit. One device
        holds the split's fewest, y_lo, so a plan needs y_lo + sum_j g_j cap_j - min_j
        cap_j >= B (the y_lo device is best taken from the group of least cap), and
        every used group's cap_j >= y_lo. O(groups x B x live pairs)."""
        g, s, y_lo, _ = split
        row, at = np.nonzero(live)
        a_s, bs = row + rows.start, cols[at]
        m, lat, batch = self.m_count, self.lat, self.batch
        start = fill[row]
        back = drain[row]
        ring_at = ring[row, at]
        base = start + returned[row, at]
        x_at = None if x_next is None else x_next[0, at]
        caps = []
        for j in np.flatnonzero(g):
            count = np.zeros(row.size, dtype=np.int64)
            for y in range(y_lo, batch - (s - 1) * y_lo + 1):
                f = self.f_from[j][y - 1][a_s, bs]
                b = self.b_from[j][y - 1][a_s, bs]
                hop, chan = self.hops[y], self.chans[y]
                hop_a, chan_a = hop[a_s], chan[a_s]  # gathered once per y
                own = start + hop_a  # the device's first forward starts
                ends = _after(ring_at, s, lat, hop_a + back, chan_a)
                need = np.maximum.reduce([
                    own + m * (f + b) + ends,
                    own + f + m * (chan_a + chan[bs]) + ring_at - 2.0 * (s - 1) * lat + lat,
                    base + hop[bs] + _times(rest, f) + m * b + ends,
                ])  # fmt: skip
                if x_at is not None:
                    need = np.maximum(need, own + m * f + _times(m - trailing, b) + hop[bs] + x_at)
                fits = need <= limit
                if not fits.any():
                    break
                count += fits
            caps.append((int(g[j]), y_lo - 1 + count))
        total = sum(n * cap for n, cap in caps)
        least = np.min([cap for _, cap in caps], axis=0)
        ok = (least >= y_lo) & (y_lo + total - least >= batch)
        out = np.zeros_like(live)
        out[row[ok], at[ok]] = True
        return out


def chain_groups(tables: Tables, batch: int) -> list[list[int]]:
    """The class groups :class:`ChainBound` keeps apart: those of
    :func:`planner.solvers.exact.stage_bounds.bound_groups` under :data:`CHAIN_STATES`."""
    return bound_groups(tables, batch, CHAIN_STATES)


def _after(ring: np.ndarray, s: int, lat: float, way: np.ndarray, chan: np.ndarray
           ) -> np.ndarray:  # fmt: skip
    """From a device's last backward (of micro-batch M - 1) to the end of the round, per
    block pair (a, b) (arguments broadcast): the stage's ``ring`` (``s`` devices), its
    last gradient's ``way`` back (h(a, y) + D), and both of those through its own uplink
    (switched) or the medium: its ring chunks' channel time, ring - 2 (s - 1) lat, and
    the gradient's, ``chan`` v y bytes(a) (0 point to point, where the ring's pair is
    not the gradient's, and at a = 0), the later of the two delivered a latency later.
    O(1) per pair."""
    alone = np.maximum(ring, way)
    if s == 1:  # no ring: the gradient alone (or nothing, at a = 0)
        return alone
    return np.maximum(alone, ring - 2.0 * (s - 1) * lat + lat + chan)


def _times(count: int, figure: np.ndarray) -> np.ndarray | float:
    """``count`` actions of ``figure`` ms each; 0 for none (0 x inf, a pair a >= b, is
    no term, not NaN)."""
    return count * figure if count else 0.0


def _schedule_counts(tables: Tables, batch: int, num_stages: int) -> list[tuple[int, int]]:
    """Per stage of a ``num_stages`` schedule: the forwards it runs before its first
    backward, and the backwards it runs after its last forward."""
    out = []
    for acts in stage_orders(tables.problem, batch, num_stages):
        kinds = [kind for kind, _ in acts]
        first_b = kinds.index("B") if "B" in kinds else len(kinds)
        last_f = len(kinds) - 1 - kinds[::-1].index("F") if "F" in kinds else -1
        out.append((first_b, kinds[last_f + 1 :].count("B")))
    return out


def chain_bounds(
    tables: Tables,
    known: dict[int, np.ndarray],
    max_stages: int,
    ceiling: float,
    deadline: Deadline,
    rel_tol: float = 1e-3,
) -> set[int]:
    """Raise ``known`` (per micro-batch size B, entry P: a valid lower bound on every
    plan of (B, P); entry 0 unused) in place, in two passes within ``deadline``; return
    the sizes tested at the ``ceiling`` (their tables built in time).

    First every size in ``known``'s order whose tables fit :data:`CHAIN_BYTES`, each
    within an equal share of the time left to the sizes not yet tested, on each of the
    ``deadline``'s clocks (:meth:`~planner.solvers.time_limit.Deadline.portion`; its
    tables included: issue 29, the limit covers everything): one :meth:`ChainBound.feasible`
    at the ``ceiling``, and an entry the relaxation cannot meet there rises to it (what
    prunes). Then bisection steps, each on the size whose least entry still open (its
    interval above ``rel_tol``) is the lowest, the global bound being the least over
    programs: at the midpoint T of that entry and the least T met so far, the size's
    entries still below T rise to it when none of their stage counts meets T
    (:meth:`ChainBound.meets_any`). Why: with a share each for its test and bisection,
    a size's bisection took the time a later size needed for its test (densenet121-like
    x 4 mixed, 10 CPU s: 0.920 of the incumbent, 0.984 this way). The tables of a size
    with open entries are kept while all kept fit CHAIN_BYTES together; one beyond is
    rebuilt for its steps (one such at a time). When the deadline passes every entry
    stays where it was raised (each a valid bound). O(sizes + steps) feasibility passes,
    each O(P X S L^2) (:class:`ChainBound`)."""
    tested: dict[int, list] = {}  # B: [its tables or None, stage counts met, least T met]
    at_ceiling: set[int] = set()
    kept = 0
    for done, (batch, row) in enumerate(known.items()):
        left = deadline.left_s()
        if left <= 0:
            return at_ceiling
        size = table_bytes(tables.n_blocks, batch, len(chain_groups(tables, batch)))
        if size > CHAIN_BYTES:
            continue
        share = deadline.portion(1 / (len(known) - done))  # on each clock
        cb = None  # a size not kept is freed before the next one is built
        try:
            cb = ChainBound(tables, batch, max_stages, share)
            met = cb.feasible(ceiling, share)
        except TimeoutError:
            continue
        at_ceiling.add(batch)
        row[1:][~met] = np.maximum(row[1:][~met], ceiling)
        if met.any():
            keep = kept + size <= CHAIN_BYTES
            kept += size if keep else 0
            tested[batch] = [cb if keep else None, met, ceiling]
    rebuilt: tuple[int, ChainBound] | None = None  # the one size rebuilt for its steps
    while True:
        least = {}
        for batch, (_, met, top) in tested.items():
            low = float(known[batch][1:][met].min())
            if top - low > rel_tol * top:
                least[batch] = low
        if not least:
            return at_ceiling
        batch = min(least, key=least.__getitem__)
        cb, met, top = tested[batch]
        row = known[batch]
        mid = 0.5 * (least[batch] + top)
        below = met & (row[1:] < mid)  # the entries other bounds leave below
        try:
            if cb is None:
                if rebuilt is None or rebuilt[0] != batch:
                    rebuilt = None  # freed before the next size's tables are built
                    rebuilt = (batch, ChainBound(tables, batch, max_stages, deadline))
                cb = rebuilt[1]
            if cb.meets_any(mid, below, deadline):
                tested[batch][2] = mid
            else:
                row[1:][below] = mid
        except TimeoutError:
            return at_ceiling
