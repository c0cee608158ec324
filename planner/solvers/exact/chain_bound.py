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
are merged into one group priced at the least time over classes per block (a relaxation:
a device's stage time is at least the sum over its blocks of that least), so the state
counts devices only. Memory is ignored (a relaxation).

Stage terms (cost model: :func:`planner.cost.makespan.round_makespan`; each device runs
its stage's actions in the schedule's order, :func:`planner.solvers.exact.tables.stage_orders`;
a transfer of ``x`` bytes over a channel lasts at least ``x v + lat``, v the fastest
ms per byte and lat the least latency of any pair; a channel carries at most one ms of
channel time per ms, :func:`planner.cost.channels.fair_shares`). Stage q = blocks [a, b)
with s devices, r = P - 1 - q stages after it; n_r the forwards a device of stage q runs
before its first backward (the schedule's warm-up; the DP takes the least and the largest
over P of the stages with r stages after them, each where the term stays a bound). A
split (s, y_lo): the stage's fewest samples on a device are y_lo (1 .. B / s; B for
s = 1), so another holds y_d >= max(y_lo, ceil((B - y_lo) / (s - 1))); every figure of
a device is a sum over the stage's blocks, least over classes and over the y it may
hold, plus the runtime's work per action (:meth:`planner.cost.model.CostModel.device_times`).
h(c, y) = lat + v y bytes(c): y samples of cut c's boundary through one device's
downlink or uplink (switched) or the medium, one sample point to point (a device's
pairs run in parallel); 0 at c = 0.

- d, the device with y_d samples (f_d, b_d its forward and backward, w_d its f + b):

      work + ring:  S_d + M w_d + ring_s(a, b)
      drain:        S_d + M w_d + h(a, y_d) + D(a, N - n)
      round trip:   S_e + f_e + U' + h(b, y_d) + (M - n_r) f_d + M b_d + ring_s(a, b)
      uplink:       S_d + f_d + M (h(a, y_d) + h(b, y_d) - 2 lat) + ring_s - 2 (s - 1) lat
                    + lat

  S_d = E(a, N - n) + h(a, y_d): d's first forward starts once the earliest forward of
  micro-batch 0 on the stage before ended (E, below, with the N - n devices the stages
  before a may have) and d's samples came over its downlink; S_e likewise with y_lo (the
  stage's earliest first forward). ring_s: after the stage's last backward, 2 (s - 1)
  steps of a chunk W[a, b) / s at the fastest pair plus the least latency (the
  point-to-point formula of :func:`planner.cost.formulas.ring_allreduce_ms`; sharing only
  slows it). Drain: d's last backward's gradient leaves over its uplink and goes back
  through the stages before (D). Round trip: d's first backward starts after the
  gradient of its micro-batch came back: the earliest first forward on stage q ends at
  S_e + f_e, U' later the earliest first backward on stage q + 1 has ended, then d's
  samples' gradients come over its downlink; after it d still runs M - n_r forwards and
  M backwards, then the ring (with n_r forwards before it, S_d + M w_d is the work term).
  Uplink: from the end of d's first forward on, its uplink (switched) or the medium
  carries M y_d samples of each of the stage's boundaries (activations on, gradients
  back) and its ring chunks, at most one ms of channel time per ms, the last one
  delivered a latency later (point to point: its ring chunks only, all to one pair);
- the DP's value for stage q's start: U(a) = h(a, y_lo) + R, the least time from the
  end of the earliest first forward on stage q - 1 to the end of the earliest first
  backward on stage q: R = max(n_r f_e, f_e + U' + h(b, y_lo)) + b_e for the device e
  that ends it (y_e >= y_lo: it waits for its n_r forwards and for its gradient), U'
  the next stage's value (0, and no hop, for the last stage);
- the stages before a (:meth:`ChainBound._prefixes`, no term checked: a relaxation), over
  prefixes of at most k devices:

      E(b, k) = min over a < b, splits of E(a, k - s) + h(a, y_lo) + f_e[a, b]
      D(b, k) = min over a < b, splits of D(a, k - s) + h(a, y_lo) + b_e[a, b]

  (E: the earliest first forward of the prefix's last stage ends; D: from a gradient's
  arrival there to the end of stage 0's backward), E(0, .) = D(0, .) = 0.

Why it is a bound: every plan's stages are integer cuts with these figures at least,
each term is a path of the cost model's event schedule made only of actions a device
runs one after the other and transfers that last at least what is counted, so a plan's
iteration time is at least its largest term; the DP relaxes memory and merges classes.

Feasibility of T (state: start block a and devices n used by the stages from q on,
one layer per r = 0 .. P - 1, from the last stage back):

    U_0(a, s) = min over stages [a, L) and splits of s devices whose terms are <= T
                of h(a, y_lo) + R
    U_r(a, n) = min over b > a, splits with s < n, U_{r-1}(b, n - s) finite and every
                term of stage [a, b) <= T (U' = U_{r-1}(b, n - s)) of h(a, y_lo) + R

Every term and R rise with U', so the least U' per state is the only one worth keeping.
T is met with P = r + 1 stages when U_r(0, n) is finite for some n <= N.

Complexity: per T, O(P N S L^2) (numpy over block pairs, only the b a later stage can
start at; S splits, about B ln B); the tables O((B + S) L^2) memory and O(N S L^2)
time. Bisection: log2(1 / tol) passes per micro-batch size and tolerance, every P in
each pass (:func:`chain_bounds`)."""

from __future__ import annotations

import numpy as np
from edgepipe.planner.solvers.exact.tables import Tables, stage_orders
from edgepipe.planner.solvers.time_limit import Deadline

#: the most bytes the tables of the micro-batch sizes :func:`chain_bounds` keeps at once
#: may take ((L + 1)^2 floats per y and figure); the sizes beyond it keep their bounds
CHAIN_BYTES = 2**27


def table_bytes(n_blocks: int, batch: int, n_devices: int) -> int:
    """The bytes of :class:`ChainBound`'s tables: three figures per y <= ``batch``, a
    ring per device count, an uplink figure per split, and the work of the DP's
    layers."""
    splits = 1 + sum(batch // s for s in range(2, min(batch, n_devices) + 1))
    return 8 * (n_blocks + 1) ** 2 * (3 * batch + min(batch, n_devices) + splits + 8)


class ChainBound:
    """The DP's tables for one micro-batch size and its feasibility test
    (:meth:`feasible`); the module docstring has the terms and the recurrence."""

    def __init__(self, tables: Tables, batch: int, max_stages: int) -> None:
        self.batch, self.max_stages = batch, max_stages
        self.n_blocks = n_blocks = tables.n_blocks
        self.m_count = m = tables.problem.config.global_batch // batch
        self.n_devices = tables.n_devices
        self.smax = min(batch, tables.n_devices)
        cols = slice(1, batch + 1)
        # per block and y = 1 .. B: least forward / backward ms over classes
        fwd = np.min([tf[:, cols] for tf in tables.tf], axis=0)
        bwd = np.min([tb[:, cols] for tb in tables.tb], axis=0)
        pre_f = np.vstack([np.zeros(batch), np.cumsum(fwd, axis=0)])  # (L + 1, B)
        pre_b = np.vstack([np.zeros(batch), np.cumsum(bwd, axis=0)])
        pair = np.triu(np.ones((n_blocks + 1, n_blocks + 1), dtype=bool), k=1)  # a < b
        inf = np.inf

        def from_y(pre: np.ndarray) -> list[np.ndarray]:
            """Entry y - 1: (L + 1, L + 1), least over y' >= y of the blocks [a, b)'s sum
            (inf where a >= b)."""
            out = [pre[None, :, -1] - pre[:, None, -1]]
            for y in range(batch - 1, 0, -1):
                out.append(np.minimum(out[-1], pre[None, :, y - 1] - pre[:, None, y - 1]))
            return [np.where(pair, t, inf) for t in out[::-1]]

        # a used device adds the runtime's work per action (CostModel.device_times)
        wf, wb = min(tables.wf), min(tables.wb)
        f_from = [t + wf for t in from_y(pre_f)]
        b_from = [t + wb for t in from_y(pre_b)]
        w_from = [t + wf + wb for t in from_y(pre_f + pre_b)]
        v, lat = tables.v_lo, tables.lat_lo
        aggregate = tables.topology != "point_to_point"
        bnd = np.concatenate([[0.0], np.asarray(tables.boundary, dtype=float)[:-1], [0.0]])

        def hop(y: int) -> np.ndarray:
            """Per cut c (0 .. L): lat + v y' bytes(c), y' = y over a device's own
            downlink or the medium, 1 point to point; 0 at c = 0 and L (no cut)."""
            got = lat + v * (y if aggregate else 1) * bnd
            got[0] = got[-1] = 0.0
            return got

        self.hops = {y: hop(y) for y in range(1, batch + 1)}

        def chan(y: int) -> np.ndarray:
            """Per cut c: v y bytes(c) on a device's uplink (switched) or the medium, 0
            point to point (a device's pairs run in parallel); 0 at c = 0 and L."""
            return (self.hops[y] - np.where(bnd > 0, lat, 0.0)) if aggregate else np.zeros_like(bnd)
        grad = np.concatenate([[0.0], np.cumsum(np.asarray(tables.grad, dtype=float))])
        weights = np.where(pair, grad[None, :] - grad[:, None], 0.0)
        # per split (s devices, the fewest samples y_lo on one of them, so the most
        # y_d >= ceil((B - y_lo) / (s - 1)) on another): (s, y_lo, y_d, M w_d, f_d, b_d,
        # f_e, b_e, ring), e's figures at y >= y_lo
        self.splits: list[tuple] = []
        for s in range(1, self.smax + 1):
            ring = 2.0 * (s - 1) * (weights * v / s + lat)
            for y_lo in range(batch if s == 1 else 1, batch // s + 1):
                y_d = batch if s == 1 else max(y_lo, -(-(batch - y_lo) // (s - 1)))
                # d's uplink: from its first forward's end on, M y_d samples of both
                # boundaries and its ring chunks, then a latency
                sent = (f_from[y_d - 1] + m * (chan(y_d)[:, None] + chan(y_d)[None, :])
                        + ring - 2.0 * (s - 1) * lat + lat)  # fmt: skip
                self.splits.append((s, y_lo, y_d, m * w_from[y_d - 1], f_from[y_d - 1],
                                    b_from[y_d - 1], f_from[y_lo - 1], b_from[y_lo - 1], ring,
                                    sent))  # fmt: skip
        self.fill, self.drain = self._prefixes()
        orders = {p: _forwards_first(tables, batch, p) for p in range(1, max_stages + 1)}
        # per r: least and largest n_r over P (stage q = P - 1 - r)
        self.n_lo = [min(orders[p][p - 1 - r] for p in orders if p > r) for r in range(max_stages)]
        self.n_hi = [max(orders[p][p - 1 - r] for p in orders if p > r) for r in range(max_stages)]

    def _prefixes(self) -> tuple[np.ndarray, np.ndarray]:
        """(L + 1, N + 1) each, per block a and devices k: the least over prefixes [0, a)
        of at most k devices (any stages, terms unchecked: a relaxation) of the end of
        the earliest forward of micro-batch 0 on their last stage (E), and of the time
        from a gradient's arrival at their last stage to the end of stage 0's backward
        (D), every stage at its split's fewest samples:

            E(b, k) = min over a < b, splits of E(a, k - s) + h(a, y_lo) + f_e[a, b]
            D(b, k) = min over a < b, splits of D(a, k - s) + h(a, y_lo) + b_e[a, b]

        (the earliest device of a stage holds >= y_lo samples and receives them over
        its downlink; a gradient leaves a device over its uplink), E(0, 0) = D(0, 0) =
        0. O(N x splits x L^2)."""
        n_blocks, n_dev = self.n_blocks, self.n_devices
        out = []
        for which in (6, 7):  # f_e, b_e of each split
            got = np.full((n_blocks + 1, n_dev + 1), np.inf)
            got[0, 0] = 0.0
            for k in range(1, n_dev + 1):
                for split in self.splits:
                    s, y_lo = split[0], split[1]
                    if s <= k:
                        step = (got[:, k - s] + self.hops[y_lo])[:, None] + split[which]
                        got[:, k] = np.minimum(got[:, k], step.min(axis=0))
            out.append(np.minimum.accumulate(got, axis=1))  # at most k devices
        return out[0], out[1]

    def feasible(self, limit: float, deadline: Deadline | None = None) -> np.ndarray:
        """Per P = 1 .. ``max_stages`` (entry P - 1): can P stages meet T = ``limit``
        in the relaxation? One DP layer per stage, from the last back.

        Raises:
            TimeoutError: ``deadline`` passed (checked before each stage size of each
                layer)."""
        n_blocks, n_dev, m = self.n_blocks, self.n_devices, self.m_count
        inf = np.inf
        ok = np.zeros(self.max_stages, dtype=bool)
        # value[a, n]: U_r(a, n); the last stage ends at L, others at the next's start
        value = np.full((n_blocks + 1, n_dev + 1), inf)
        last = np.where(np.arange(n_blocks + 1) == n_blocks, 0.0, inf)
        for r in range(self.max_stages):
            if deadline is not None and deadline.passed():
                raise TimeoutError
            nxt = np.full_like(value, inf)
            for s, y_e, y_d, *figures in self.splits:
                if deadline is not None and deadline.passed():
                    raise TimeoutError
                sizes = list(range(s + 1, n_dev + 1)) if r else [s]
                # U_{r-1}(b, n - s) per b and n; the last stage ends at L
                after = value[:, [n - s for n in sizes]] if r else last[:, None]
                cols = np.flatnonzero(np.isfinite(after).any(axis=1))
                if not cols.size:
                    continue
                after = after[cols]
                work, f_d, b_d, f_e, b_e, ring, sent = (t[:, cols] for t in figures)
                hop_d, hop_e = self.hops[y_d], self.hops[y_e]
                # the most U' can be in d's round-trip term, but for stage q's first forward
                later = (m - self.n_hi[r]) * f_d if m > self.n_hi[r] else 0.0
                room_trip = limit - ring - f_e - hop_d[cols][None, :] - later - m * b_d
                back_e = hop_e[cols][None, :]
                for i, n in enumerate(sizes):
                    # the stages before a have at most N - n devices
                    fill, drain = self.fill[:, n_dev - n], self.drain[:, n_dev - n]
                    start_d = fill + hop_d  # d's first forward, per a
                    fits = (
                        (np.maximum(work + ring, sent) <= (limit - start_d)[:, None])
                        & (work <= (limit - start_d - hop_d - drain)[:, None]))  # fmt: skip
                    live = fits & (after[None, :, i] <= room_trip - (fill + hop_e)[:, None])
                    if not live.any():
                        continue
                    trip = np.maximum(self.n_lo[r] * f_e, f_e + after[None, :, i] + back_e) + b_e
                    got = np.where(live, trip, inf).min(axis=1) + hop_e
                    nxt[:, n] = np.minimum(nxt[:, n], got)
            value = nxt
            ok[r] = np.isfinite(value[0, 1:]).any()
        return ok


def _forwards_first(tables: Tables, batch: int, num_stages: int) -> list[int]:
    """Per stage of a ``num_stages`` schedule, the forwards it runs before its first
    backward."""
    return [
        next((i for i, (kind, _) in enumerate(acts) if kind == "B"), len(acts))
        for acts in stage_orders(tables.problem, batch, num_stages)
    ]


def chain_bounds(
    tables: Tables,
    known: dict[int, np.ndarray],
    max_stages: int,
    ceiling: float,
    deadline: Deadline,
    tols: tuple[float, ...] = (1e-2, 1e-3),
) -> None:
    """Raise ``known`` (per micro-batch size B, entry P: a valid lower bound on every
    plan of (B, P); entry 0 unused) in place. Per size, in ``known``'s order, while the
    tables of the sizes so far fit :data:`CHAIN_BYTES`: an entry the relaxation cannot
    meet at ``ceiling`` rises to it (what prunes). Then, one round per tolerance in
    ``tols`` over every size, the least feasible T over a size's other entries is
    bisected to that tolerance (every one of them is at least it), so every size is
    bisected coarsely before any finely. When ``deadline`` passes every entry stays
    where the bisection had raised it (each a valid bound). One
    :meth:`ChainBound.feasible` per step."""
    searches: list[tuple[ChainBound, np.ndarray, np.ndarray]] = []
    tops: list[float] = []
    room = CHAIN_BYTES
    try:
        for batch, row in known.items():
            room -= table_bytes(tables.n_blocks, batch, tables.n_devices)
            if room < 0 or deadline.passed():
                break
            cb = ChainBound(tables, batch, max_stages)
            met = cb.feasible(ceiling, deadline)
            row[1:][~met] = np.maximum(row[1:][~met], ceiling)
            if met.any():
                searches.append((cb, row, met))
                tops.append(ceiling)
        for tol in tols:
            for i, (cb, row, met) in enumerate(searches):
                while tops[i] - (lo := float(row[1:][met].min())) > tol * tops[i]:
                    mid = 0.5 * (lo + tops[i])
                    if cb.feasible(mid, deadline)[met].any():
                        tops[i] = mid
                    else:
                        row[1:][met] = np.maximum(row[1:][met], mid)
    except TimeoutError:
        pass
