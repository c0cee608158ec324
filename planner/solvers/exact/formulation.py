"""The exact planner's program for one (micro-batch size B, stage count P): its variables
and constraints (:class:`Builder`, one method per constraint family below), built as a
backend-neutral linear model (:class:`planner.solvers.exact.linear_model.Model`) that
:mod:`planner.solvers.exact.backends` lowers to each solver, and the cut that excludes
one plan (:func:`no_good`).

What the program computes: for every plan of its space a value T(plan) <= the cost
model's iteration time (``PlanCost.iteration_ms``, :func:`planner.cost.makespan.round_makespan`:
every device runs the schedule on its own samples, every re-sliced piece and ring chunk
is a transfer sharing its channels max-min fairly, one ordered connection per pair),
equal on the exact class below. The rows are a *relaxation* of the cost model: a
solver's lower bound on the program is a lower bound on the cost model's figure, and
:mod:`planner.solvers.exact.search` compares, cuts off and reports in the cost model's
figure only. Every coefficient comes from :mod:`planner.cost.model` (its per-block
figures and its closed-form pieces ``transfer_ms``, ``ring_allreduce_ms``,
``stage_memory_bytes``, ``replica_bytes`` evaluated at unit arguments: they are linear,
:mod:`planner.solvers.exact.tables`), the stages' action order from
:func:`planner.schedule.build`; nothing is re-derived here.

Formulation for fixed (B, P), L blocks, classes k, samples y in 1..B, boundaries b
(between stages b and b + 1), v(k1, k2) / lat(k1, k2) the ms per byte / latency of a
pair, v_lo / lat_lo the least over all pairs:

Variables
    c[l, p] in {0, 1}, p = 1..P-1: block l is in stage >= p (c[l, 0] = 1, c[l, P] = 0);
        block l is in stage p iff x[l, p] := c[l, p] - c[l, p + 1] = 1.
    n[p, k, y] in {0..min(count_k, B // y)}: devices of class k in stage p taking y samples;
        q[p, k, y] in {0, 1} with q <= n <= ub q (q = some such device exists);
        u[p, k] in {0, 1} = OR_y q[p, k, y]; d2[p, k] in {0, 1}: at least two devices of
        class k in stage p (only where the network needs it).
    h[p, g] in {0, 1}, g = 1..min(N, B): stage p's group has g devices (one-hot).
    r[p, k, y] in {0, 1} (replication on, P >= 2): stage p holds its ring predecessor's
        replica on a class-k device with y samples.
    Ef[p], Eb[p]: stage p's slowest device's times; ef[p], eb[p]: lower bounds on its
        fastest device's; Ta[p]: a lower bound on its ring after its slowest device ends.
    O[b]: channel time of one micro-batch's pieces (their most loaded channel); D[b]:
        from their posting until all are delivered; S[b], R[b] (switched): the most
        loaded port of stage b / b + 1.
    lo[p, a], hi[p, a]: lower bounds on when stage p's fastest / slowest device ends
        compute action a; F[b, m], G[b, m]: when all pieces of micro-batch m's activations
        / gradients over b are through; T: the round.

Constraints and how they stand to the cost model
    EXACT  contiguity, samples, group size (one-hot h) and class counts;
    EXACT  compute (Eq. 8): q[p, k, y] => Ef[p] >= sum_l t_f(l, k, y) x[l, p] (Eb alike);
           ef[p] >= the same where h[p, 1] (one device), else >= sum_l min_{k, y}
           t_f(l, k, y) x[l, p] (RELAXED: the fastest class at its best sample count);
    EXACT  memory (Eq. 3): q[p, k, y] => sum_l ((2 + k_opt) W_l + K_p y A_l) x[l, p] <=
           budget_k; with ring replication (:mod:`planner.replan.replicas`) on and P >= 2, one
           holder per stage whose predecessor has one device (sum r = h[pred, 1]), of a
           class of the largest budget used in the stage (r + u[p, k'] <= 1 for larger
           k'), and r[p, k, y] => the same row plus sum_l (1 + k_opt) W_l x[l, pred];
           :func:`planner.solvers.exact.solutions.extract` lists the holder first, which
           is the device the placement rule picks (largest budget, first listed);
    compute order (two tracks, each a device's own chain): per stage its F/B in the
           schedule's order, lo with durations ef/eb, hi with Ef/Eb, hi >= lo; every
           device's F_p(m) waits for a piece (>= lo[p-1, F m] + one sample over the
           fastest pair + lat_lo); a stage of one device (h[p, 1]) for all its pieces:
           >= lo[p-1, F m] + D[p-1] and >= F[p-1, m] + lat_lo (B_p(m) alike with G[p]);
           T >= hi[p, last] + Ta[p]. EXACT for single-device stages, RELAXED otherwise
           (which device waits for which pieces is not modelled);
    EXACT  full duplex: a boundary's activations and gradients are two streams, each a
           sequence over m: F[b, m] >= lo[b, F m] + O[b], F[b, m] >= F[b, m-1] + O[b] (one
           connection per pair: a pair's piece m follows its piece m-1; G alike, posted by
           stage b + 1's backwards);
    transfer loads (lower bounds on a transfer alone; D >= O + lat_lo):
        point-to-point: O = the largest piece. EXACT when a side has one device (its
            pieces are the other side's y samples: q ^ h[side, 1] ^ u => O >= y v(k1, k2)
            cut, D >= that + lat(k1, k2)); otherwise RELAXED to one sample's piece;
        switched: q[b, k, y] => S >= y v_min(k) cut (a port carries its device's y
            samples at no less than its fastest pair's rate), R alike, O = max(S, R).
            EXACT on uniform bandwidth and where the other side is one device (then
            v(k1, k2)); RELAXED otherwise;
        shared medium: O = the sum of all pieces: EXACT on uniform bandwidth (B v cut)
            and where each side is one device; RELAXED to B x the least rate otherwise;
    RELAXED  channels two streams share (work conservation: from any transfer's posting
           on, a channel still needs that transfer's and every later one's channel time):
           shared medium: per stage, its posts (fixed by its compute order, none before
           lo) chained on the medium, T >= the chain's end; T >= the first forward's end
           + 2 M sum_b O[b] + the rings' channel time (everything on one channel: the
           sum as a bound). Switched, uniform bandwidth: a middle stage's uplinks carry
           its activations out and gradients back (chained likewise), its downlinks both
           streams in (T >= first forward upstream + M (R[p-1] + S[p])). The cost model
           shares these channels fairly; the rows keep each stream's order and the
           channel's total, not the sharing;
    all-reduce (§3.3, the cost model's :meth:`CostModel.ring`: 2(g-1) steps of W_p / g
           chunks, a member posting step k+1 when it has step k): from the slowest
           member's last backward, 2(g-1) chunks and latencies in a row, h[p, g] => Ta >=
           r_g v_lo W + l_g lat_lo ((r_g, l_g) = :func:`ring_coefficients`, point-to-point
           formula); for g = 2 the pair's own v and lat (EXACT); RELAXED for g >= 3 on a
           non-uniform group and wherever the ring meets pipeline traffic;
    redundant (implied): T >= M (Ef_c + Eb_c) + the fastest way to stage c and back per
           stage, and per boundary its M transfers plus the way around;
    balance (drops only plans another plan matches): where a class's block times never
           fall with the batch size, its devices in one stage take y or y + 1 samples,
           unless a ring replica lands in the stage;
    cutoff: T <= incumbent x (1 + 1e-4) (valid: T <= the cost model's figure).

The exact class (program value = cost model's figure, checked by ``tests/unit/test_milp.py``
on non-uniform networks): single-device stages, three or more on point-to-point links
or a switch (a middle stage's port carrying both streams included where the fair
sharing leaves the chained bound tight), two on a shared medium; one data-parallel pair.
Elsewhere the program may price a plan below the cost model;
:mod:`planner.solvers.exact.search` then re-scores it, excludes it (:func:`no_good`) and
solves again, so a program counts as solved only when its optimum is a plan the cost
model prices at the program's value.

Objective: minimise T. Uniform networks need no LATin/ein/d2 variables.

Size per program: O(P L) block binaries, O(P K B) sample and holder variables,
O(P min(N, B)) group-size binaries, O(P M) action and transfer variables (M
micro-batches) and O(P K^2 B L + P M + P min(N, B) L |V|) non-zeros. The number of
programs is O(#candidates x min(L, N)); each is NP-hard in general (it contains bin
packing), so the time limit bounds the whole search; the plan records whether
optimality was proven.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from edgepipe.planner.cost.formulas import stage_memory_bytes
from edgepipe.planner.solvers.exact.linear_model import BIN, INT, TIME, Lin, Model, axpy
from edgepipe.planner.solvers.exact.tables import Tables, ring_coefficients, stage_orders


@dataclass
class Formulation:
    """A built program and the variables needed to read a plan from it or hint one."""

    model: Model
    batch: int
    num_stages: int
    cum: dict[tuple[int, int], int]  # (l, p) -> c[l, p] for p = 1..P-1
    n: dict[tuple[int, int, int], int]  # (p, k, y) -> n[p, k, y]
    q: dict[tuple[int, int, int], int]
    u: dict[tuple[int, int], int]
    h: dict[tuple[int, int], int]
    d2: dict[tuple[int, int], int]
    r: dict[tuple[int, int, int], int]  # (p, k, y) -> stage p's replica holder is (k, y)


class Builder:
    """Builds the program of one (B, P); the method per constraint family follows the
    module docstring."""

    def __init__(self, tables: Tables, batch: int, num_stages: int) -> None:
        self.t, self.batch, self.num_stages = tables, batch, num_stages
        self.md = Model()
        self.m_count = tables.problem.config.global_batch // batch
        self.cum: dict[tuple[int, int], int] = {}
        self.n: dict[tuple[int, int, int], int] = {}
        self.q: dict[tuple[int, int, int], int] = {}
        self.u: dict[tuple[int, int], int] = {}
        self.d2: dict[tuple[int, int], int] = {}
        self.h: dict[tuple[int, int], int] = {}
        self.r: dict[tuple[int, int, int], int] = {}
        self.group_max = min(tables.n_devices, batch)

    def build(
        self,
        cutoff_ms: float,
        horizon_ms: float,
        exclude: tuple[dict[int, float], ...] = (),
        stop: Callable[[], bool] = lambda: False,
    ) -> Formulation:
        """The program with objective cutoff ``cutoff_ms``; ``exclude`` lists assignments
        (values of the decision variables,
        :func:`planner.solvers.exact.solutions.decision`) the program must avoid.

        Raises:
            TimeoutError: ``stop()`` said so between two constraint families (a long
                chain's build takes seconds).
        """

        def check() -> None:
            if stop():
                raise TimeoutError

        self.blocks()
        self.devices()
        check()
        self.replicas()
        check()
        durations = self.compute()
        check()
        ta, work = self.allreduce(horizon_ms)
        links = []
        for b in range(self.num_stages - 1):
            check()
            links.append(self.boundary_load(b, horizon_ms))
        check()
        self.schedule(durations, ta, work, links, cutoff_ms, horizon_ms)
        form = Formulation(
            self.md, self.batch, self.num_stages, self.cum, self.n, self.q, self.u, self.h,
            self.d2, self.r,
        )  # fmt: skip
        for values in exclude:
            no_good(form, values)
        return form

    # -- blocks -------------------------------------------------------------------------
    def c_term(self, l_: int, p: int) -> tuple[Lin, float]:
        """c[l, p] as (terms, constant): 1 for p = 0, 0 for p = P, else a variable."""
        if p == 0:
            return {}, 1.0
        if p == self.num_stages:
            return {}, 0.0
        return {self.cum[l_, p]: 1.0}, 0.0

    def x_lin(self, weights: np.ndarray, p: int) -> tuple[Lin, float]:
        """sum_l weights[l] x[l, p] as (terms, constant): x[l, p] = c[l, p] - c[l, p + 1]
        with :meth:`c_term`'s constants written out (the same terms, one pass: this is
        most of a long chain's build)."""
        terms: Lin = {}
        const = 0.0
        last, cum = self.num_stages, self.cum
        for l_, w in enumerate(weights.tolist()):
            if w == 0.0:
                continue
            if p == 0:
                const += w
            elif p < last:
                terms[cum[l_, p]] = w
            if p + 1 < last:
                terms[cum[l_, p + 1]] = -w
        return terms, const

    def cut_bytes(self, b: int) -> Lin:
        """Boundary bytes per sample of the cut between stages b and b + 1:
        sum_c a_{c-1} (c[c, b+1] - c[c-1, b+1]) (the difference is 1 exactly at the first
        block of stage b + 1)."""
        cut: Lin = {}
        for c in range(1, self.t.n_blocks):
            a = float(self.t.boundary[c - 1])
            axpy(cut, a, self.c_term(c, b + 1)[0])
            axpy(cut, -a, self.c_term(c - 1, b + 1)[0])
        return cut

    def blocks(self) -> None:
        md, big_l, big_p = self.md, self.t.n_blocks, self.num_stages
        for p in range(1, big_p):
            for l_ in range(big_l):
                lo = 1 if big_l - 1 - l_ < big_p - p else 0  # too few blocks left for p..P-1
                hi = 0 if l_ < p else 1  # stages 0..p-1 need p blocks before
                self.cum[l_, p] = md.var(BIN, lo, hi)
        for p in range(1, big_p):
            for l_ in range(big_l - 1):
                md.add({self.cum[l_, p]: 1.0, self.cum[l_ + 1, p]: -1.0}, "<=", 0.0, "count")
            if p + 1 < big_p:
                for l_ in range(big_l):
                    md.add({self.cum[l_, p + 1]: 1.0, self.cum[l_, p]: -1.0}, "<=", 0.0, "count")
        for p in range(big_p):
            terms, const = self.x_lin(np.ones(big_l), p)
            md.add(terms, ">=", 1.0 - const, "count")

    # -- devices and samples -------------------------------------------------------------
    def memory(self, p: int, y: int) -> np.ndarray:
        """Per block, its bytes on a device of stage p taking y samples (Eq. 3,
        :func:`planner.cost.formulas.stage_memory_bytes` per block: it is additive over blocks)."""
        config = self.t.problem.config
        warm = config.warmup_depth(p, self.num_stages, self.m_count)
        return np.asarray(stage_memory_bytes(self.t.static, warm, y, self.t.saved))

    def devices(self) -> None:
        md, t, batch = self.md, self.t, self.batch
        use_per_class: list[Lin] = [{} for _ in t.classes]
        sizes = range(1, self.group_max + 1)
        for p in range(self.num_stages):
            for g in sizes:
                self.h[p, g] = md.var(BIN, 0, 1)
            md.add({self.h[p, g]: 1.0 for g in sizes}, "==", 1.0, "count")
        for p in range(self.num_stages):
            # balance below holds where no ring replica lands in stage p: its predecessor
            # has two or more devices (always, with replication off or one stage)
            balanced: tuple[int, ...] = ()
            if t.replicated and self.num_stages >= 2:
                not_single = md.var(BIN, 0, 1)
                pred = (p - 1) % self.num_stages
                md.add({not_single: 1.0, self.h[pred, 1]: 1.0}, "==", 1.0, "count")
                balanced = (not_single,)
            allowed = np.arange(p, t.n_blocks - self.num_stages + p + 1)  # blocks p can hold
            samples_row: Lin = {}
            for k, cls in enumerate(t.classes):
                # y with which even the lightest block stage p may hold overflows are out
                ys = [
                    y for y in range(1, batch + 1) if self.memory(p, y)[allowed].min() <= cls.budget
                ]
                self.u[p, k] = md.var(BIN, 0, 1 if ys else 0)
                u_row: Lin = {self.u[p, k]: 1.0}
                class_row: Lin = {}
                for y in ys:
                    top = min(cls.count, batch // y)
                    n = self.n[p, k, y] = md.var(INT, 0, top)
                    q = self.q[p, k, y] = md.var(BIN, 0, 1)
                    md.add({n: 1.0, q: -float(top)}, "<=", 0.0, "count")
                    md.add({q: 1.0, n: -1.0}, "<=", 0.0, "count")
                    md.add({q: 1.0, self.u[p, k]: -1.0}, "<=", 0.0, "count")
                    u_row[q] = -1.0
                    samples_row[n] = float(y)
                    class_row[n] = 1.0
                    use_per_class[k][n] = 1.0
                    # memory of a device of class k with y samples (Eq. 3)
                    terms, const = self.x_lin(self.memory(p, y), p)
                    if md.maximum(terms) + const > cls.budget:
                        md.add(terms, "<=", cls.budget - const, "bytes", (q,))
                md.add(u_row, "<=", 0.0, "count")  # u <= sum_y q
                if cls.count >= 2 and len(ys) > 2 and t.monotone[k]:
                    # balanced classes: the samples of one class in one stage differ by
                    # at most 1 (all used y in [lo, lo + 1]); see Tables.monotone. Not
                    # where a ring replica lands: its holder pays more memory, so moving
                    # a sample onto it can overflow it
                    lo = md.var(INT, 1, batch)
                    for y in ys:
                        when = (self.q[p, k, y], *balanced)
                        md.add({lo: 1.0}, "<=", float(y), "count", when)
                        md.add({lo: 1.0}, ">=", float(y - 1), "count", when)
                if cls.count >= 2 and class_row and not t.uniform:
                    d2 = self.d2[p, k] = md.var(BIN, 0, 1)
                    md.add(axpy(class_row, -(cls.count - 1.0), {d2: 1.0}), "<=", 1.0, "count")
            md.add(samples_row, "==", float(batch), "count")
            count_row = {v: 1.0 for (sp, _, _), v in self.n.items() if sp == p}
            md.add(
                axpy(count_row, -1.0, {self.h[p, g]: float(g) for g in sizes}), "==", 0.0, "count"
            )
        for k, cls in enumerate(t.classes):
            if use_per_class[k]:
                md.add(use_per_class[k], "<=", float(cls.count), "count")

    def replicas(self) -> None:
        """Ring replicas (:mod:`planner.replan.replicas`): with replication on and P >= 2, a
        stage q run by one device is replicated onto the device of stage q + 1 (mod P)
        with the largest usable memory, which also holds q's weights and optimizer state
        (:meth:`planner.cost.model.CostModel.replica_bytes`). r[p, k, y] = 1: stage p's holder
        is a class-k device with y samples; exactly one holder when the predecessor has
        one device (h[pred, 1]), none otherwise; no class of larger budget is used in
        stage p; the holder's memory row adds the predecessor's replica. Among devices
        of equal budget the rule takes the first listed, so
        :func:`planner.solvers.exact.solutions.extract` lists the holder first."""
        md, t, big_p = self.md, self.t, self.num_stages
        if not t.replicated or big_p < 2:
            return
        for p in range(big_p):
            pred = (p - 1) % big_p
            holders: Lin = {}
            repl_terms, repl_const = self.x_lin(t.replica, pred)
            for (sp, k, y), q in self.q.items():
                if sp != p:
                    continue
                r = self.r[p, k, y] = md.var(BIN, 0, 1)
                holders[r] = 1.0
                md.add({r: 1.0, q: -1.0}, "<=", 0.0, "count")
                budget = t.classes[k].budget
                for k2, other in enumerate(t.classes):
                    if other.budget > budget:
                        md.add({r: 1.0, self.u[p, k2]: 1.0}, "<=", 1.0, "count")
                terms, const = self.x_lin(self.memory(p, y), p)
                axpy(terms, 1.0, repl_terms)
                const += repl_const
                if md.maximum(terms) + const > budget:
                    md.add(terms, "<=", budget - const, "bytes", (r,))
            md.add(axpy(holders, -1.0, {self.h[pred, 1]: 1.0}), "==", 0.0, "count")

    # -- durations -----------------------------------------------------------------------
    def compute(self) -> tuple[list[int], list[int], list[int], list[int]]:
        """Per stage E_f, E_b (its slowest device, Eq. 8: what that device's own chain of
        actions takes) and lower bounds e_f, e_b on its fastest device's times: the
        fastest class at its best sample count block by block, and E_f exactly when the
        stage has one device."""
        md, t, batch = self.md, self.t, self.batch
        d_max = max(
            float(max(tf[:, 1 : batch + 1].sum(0).max() + wf, tb[:, 1 : batch + 1].sum(0).max()
                      + wb))
            for tf, tb, wf, wb in zip(t.tf, t.tb, t.wf, t.wb, strict=True)
        )
        out = []
        # a used device also pays the runtime's work per micro-batch (CostModel.device_times)
        for tables, work in ((t.tf, t.wf), (t.tb, t.wb)):
            slow = [md.var(TIME, 0.0, d_max) for _ in range(self.num_stages)]
            fast = [md.var(TIME, 0.0, d_max) for _ in range(self.num_stages)]
            least = np.min([table[:, 1 : batch + 1].min(axis=1) for table in tables], axis=0)
            for p in range(self.num_stages):
                terms, const = self.x_lin(least, p)
                md.add(axpy({fast[p]: 1.0}, -1.0, terms), ">=", const + min(work), "ms")
            for (p, k, y), q in self.q.items():
                terms, const = self.x_lin(tables[k][:, y], p)
                const += work[k]
                md.add(axpy({slow[p]: 1.0}, -1.0, terms), ">=", const, "ms", (q,))
                md.add(axpy({fast[p]: 1.0}, -1.0, terms), ">=", const, "ms", (q, self.h[p, 1]))
            out += [slow, fast]
        ef, ef_lo, eb, eb_lo = out
        return ef, eb, ef_lo, eb_lo

    def pair_used(self, p_a: int, k_a: int, p_b: int, k_b: int) -> tuple[Lin, float] | None:
        """(terms, constant) >= 1 exactly when devices of classes k_a in stage p_a and k_b
        in stage p_b (distinct devices) are both present; None if no such pair counts."""
        if p_a == p_b and k_a == k_b:
            return ({self.d2[p_a, k_a]: 1.0}, 0.0) if (p_a, k_a) in self.d2 else None
        if p_a == p_b and k_a > k_b:
            return None  # pairs inside a group are unordered
        return {self.u[p_a, k_a]: 1.0, self.u[p_b, k_b]: 1.0}, -1.0

    def allreduce(self, horizon_ms: float) -> tuple[list[int], list[int]]:
        """Per stage a lower bound on its ring all-reduce after its slowest device's last
        backward, and on a shared medium the ring's channel time. The ring (the cost
        model's :meth:`CostModel.ring`) is 2(g-1) steps, a member posting step k+1 when
        it has step k, each chunk W_p / g at its pair's rate: from the slowest member's
        post on, 2(g-1) chunks and latencies in a row, each at least the fastest pair's
        (:func:`ring_coefficients` of the point-to-point formula at v_lo, lat_lo; for g = 2
        the one pair's figures, exact). On the medium all 2(g-1) g chunks pass: the
        shared formula's channel time at v_lo."""
        md, t = self.md, self.t
        ta = [md.var(TIME, 0.0, horizon_ms) for _ in range(self.num_stages)]
        work = [md.var(TIME, 0.0, horizon_ms) for _ in range(self.num_stages)]
        if self.group_max < 2:
            return ta, work
        n_cls = len(t.classes)
        for p in range(self.num_stages):
            w_terms, w_const = self.x_lin(t.grad, p)
            for g in range(2, self.group_max + 1):
                per_byte, per_lat = ring_coefficients(g, False)
                # (enforcing literals, ms per byte, latency) of each bound on the ring
                pairs: list[tuple[tuple[int, ...], float, float]] = [
                    ((self.h[p, g],), t.v_lo, t.lat_lo)
                ]
                if g == 2:
                    for ka in range(n_cls):
                        for kb in range(n_cls):
                            used = self.pair_used(p, ka, p, kb)
                            if used is None or np.isnan(t.inv_bw[ka, kb]):
                                continue
                            # both ends present: the literals of pair_used's terms
                            lits = (self.h[p, g], *used[0])
                            pairs.append((lits, float(t.inv_bw[ka, kb]), float(t.lat[ka, kb])))
                for enforce, v, lat in pairs:
                    row = axpy({ta[p]: 1.0}, -per_byte * v, w_terms)
                    md.add(row, ">=", per_byte * v * w_const + per_lat * lat, "ms", enforce)
                    if t.topology == "shared_medium":
                        shared_byte = ring_coefficients(g, True)[0]
                        row = axpy({work[p]: 1.0}, -shared_byte * v, w_terms)
                        md.add(row, ">=", shared_byte * v * w_const, "ms", enforce)
        return ta, work

    def boundary_load(self, b: int, horizon_ms: float) -> tuple[int, int, int, int, Lin]:
        """Stage boundary b -> b+1 (one direction; the other carries the same pieces
        reversed): ``(O, D, S, R, one)``: O the channel time of one micro-batch's pieces
        (their most loaded channel, :func:`planner.cost.channels.channel_loads`), D the time from
        their posting until every piece is delivered (>= O + the least latency, >= a
        piece's ms + its latency), S and R on a switched network the most loaded port of
        stage b and of stage b + 1 (O = max), ``one`` the terms of one sample's piece
        over the fastest pair plus the least latency (what any receiver waits at least).
        Lower bounds of the cost model's figures, exact where the module docstring says;
        piece ms = samples x bytes x ms per byte (``Tables.inv_bw``)."""
        md, t = self.md, self.t
        cut = self.cut_bytes(b)
        occ = md.var(TIME, 0.0, horizon_ms)
        delay = md.var(TIME, 0.0, horizon_ms)
        send = md.var(TIME, 0.0, horizon_ms)
        recv = md.var(TIME, 0.0, horizon_ms)
        single = (self.h[b, 1], self.h[b + 1, 1])
        used = [
            (k1, k2)
            for k1 in range(len(t.classes))
            for k2 in range(len(t.classes))
            if not np.isnan(t.inv_bw[k1, k2])
        ]

        def at_least(var: int, coef: float, enforce: tuple[int, ...], plus: float = 0.0) -> None:
            """var >= coef x cut bytes + plus, where every literal of ``enforce`` is 1."""
            if coef > 0 or plus > 0:
                md.add(axpy({var: 1.0}, -coef, cut), ">=", plus, "ms", enforce)

        md.add({delay: 1.0, occ: -1.0}, ">=", t.lat_lo, "ms")
        if t.topology == "shared_medium":
            # the medium carries every piece: B x bytes x (ms per byte of each piece)
            at_least(occ, self.batch * t.v_lo, ())
            for k, v_min in enumerate(t.v_min):  # one device on a side: its rate bounds all
                for p, one in ((b, single[0]), (b + 1, single[1])):
                    if v_min > t.v_lo:
                        at_least(occ, self.batch * v_min, (one, self.u[p, k]))
            for k1, k2 in used:  # one device on both sides: one piece
                pair = (self.u[b, k1], self.u[b + 1, k2])
                at_least(occ, self.batch * float(t.inv_bw[k1, k2]), (*single, *pair))
                at_least(delay, self.batch * float(t.inv_bw[k1, k2]), (*single, *pair),
                         float(t.lat[k1, k2]))  # fmt: skip
            return occ, delay, occ, occ, axpy({}, t.v_lo, cut)
        for (p, k, y), q in self.q.items():
            if p not in (b, b + 1):
                continue
            side = send if p == b else recv
            if t.topology == "switched":  # a port carries its device's y samples
                at_least(side, y * t.v_min[k], (q,))
            for k1, k2 in used:
                if (k1 if p == b else k2) != k:
                    continue
                v = float(t.inv_bw[k1, k2])
                # the other side is one device of the other class: this device's pieces
                # are its y samples to or from it, one piece
                other = (self.h[b + 1, 1], self.u[b + 1, k2]) if p == b else (
                    self.h[b, 1], self.u[b, k1])  # fmt: skip
                at_least(delay, y * v, (q, *other), float(t.lat[k1, k2]))
                if t.topology == "switched" and v <= t.v_min[k]:
                    continue
                at_least(side, y * v, (q, *other))
        if t.topology == "point_to_point":
            at_least(occ, t.v_lo, ())  # some piece carries a sample
        for side in (send, recv):
            md.add({occ: 1.0, side: -1.0}, ">=", 0.0, "ms")
        return occ, delay, send, recv, axpy({}, t.v_lo, cut)

    # -- the schedule's longest path -----------------------------------------------------
    def schedule(
        self,
        durations: tuple[list[int], list[int], list[int], list[int]],
        ta: list[int],
        work: list[int],
        links: list[tuple[int, int, int, int, Lin]],
        cutoff_ms: float,
        horizon_ms: float,
    ) -> None:
        """T and the longest-path rows through the stages' actions (two tracks: ``lo``,
        a lower bound on when a stage's fastest device ends an action, and ``hi``, on when
        its slowest does) and the boundaries' transfer streams (module docstring)."""
        md, t, m_count, big_p = self.md, self.t, self.m_count, self.num_stages
        ef, eb, ef_lo, eb_lo = durations
        orders = stage_orders(t.problem, self.batch, big_p)
        last = big_p - 1
        lo = [{a: md.var(TIME, 0.0, horizon_ms) for a in acts} for acts in orders]
        hi = [{a: md.var(TIME, 0.0, horizon_ms) for a in acts} for acts in orders]
        round_time = md.var(TIME, 0.0, min(cutoff_ms, horizon_ms))
        # per boundary and direction, when all pieces of the m-th transfer are through
        fwd = [[md.var(TIME, 0.0, horizon_ms) for _ in range(m_count)] for _ in links]
        bwd = [[md.var(TIME, 0.0, horizon_ms) for _ in range(m_count)] for _ in links]
        for b, (occ, *_) in enumerate(links):
            for stream, post, kind in ((fwd[b], lo[b], "F"), (bwd[b], lo[b + 1], "B")):
                for m in range(m_count):
                    md.add({stream[m]: 1.0, post[kind, m]: -1.0, occ: -1.0}, ">=", 0.0, "ms")
                    if m:
                        md.add({stream[m]: 1.0, stream[m - 1]: -1.0, occ: -1.0}, ">=", 0.0, "ms")
        for p, acts in enumerate(orders):
            for track, f_dur, b_dur in ((lo[p], ef_lo[p], eb_lo[p]), (hi[p], ef[p], eb[p])):
                prev = None
                for kind, m in acts:
                    dur = f_dur if kind == "F" else b_dur
                    me = track[kind, m]
                    md.add({me: 1.0, dur: -1.0}, ">=", 0.0, "ms")
                    if prev is not None:
                        md.add({me: 1.0, prev: -1.0, dur: -1.0}, ">=", 0.0, "ms")
                    prev = me
                    if kind == "F" and p > 0:
                        sender, b, stream = lo[p - 1], p - 1, fwd[p - 1]
                    elif kind == "B" and p < last:
                        sender, b, stream = lo[p + 1], p, bwd[p]
                    else:
                        continue
                    _, delay, _, _, one = links[b]
                    # any device waits for some piece; a single device for all of them
                    row = axpy({me: 1.0, sender[kind, m]: -1.0, dur: -1.0}, -1.0, one)
                    md.add(row, ">=", t.lat_lo, "ms")
                    alone = (self.h[p, 1],)
                    md.add({me: 1.0, sender[kind, m]: -1.0, delay: -1.0, dur: -1.0}, ">=", 0.0,
                           "ms", alone)  # fmt: skip
                    md.add({me: 1.0, stream[m]: -1.0, dur: -1.0}, ">=", t.lat_lo, "ms", alone)
                if track is hi[p]:  # T >= hi[p, last] + Ta[p]
                    md.add({round_time: 1.0, track[acts[-1]]: -1.0, ta[p]: -1.0}, ">=", 0.0, "ms")
            for a in acts:
                md.add({hi[p][a]: 1.0, lo[p][a]: -1.0}, ">=", 0.0, "ms")
        self.shared_channels(orders, lo, links, work, round_time, horizon_ms)
        self.redundant(durations, links, round_time)
        md.objective = round_time

    def shared_channels(
        self,
        orders: list[list[tuple[str, int]]],
        lo: list[dict[tuple[str, int], int]],
        links: list[tuple[int, int, int, int, Lin]],
        work: list[int],
        round_time: int,
        horizon_ms: float,
    ) -> None:
        """Channels that two streams share, by work conservation: a channel serves at
        most one ms of channel time per ms, so from any transfer's posting on, it still
        needs the channel time of that transfer and of every later one on it.

        Shared medium: the transfers stage p posts (in its compute order, none before
        the ``lo`` track's time) all hold the medium: J_i >= post_i + load_i, J_i >=
        J_{i-1} + load_i, T >= J_last; and T >= the first forward's end + everything on
        the medium (2 M loads per boundary and the rings' channel time). Switched,
        uniform bandwidth: a middle stage's uplinks carry its activations out and its
        gradients back (loads S and R of its two boundaries, largest on the same device:
        the one with most samples), the same chain over them; its downlinks carry both
        streams in: T >= the first forward's end upstream + M (R + S) of its two
        boundaries."""
        md, t, m_count = self.md, self.t, self.m_count
        last = self.num_stages - 1
        chains: list[list[tuple[int, int]]] = []  # per chain: (post end, load) in order
        if t.topology == "shared_medium":
            for p, acts in enumerate(orders):
                chain = []
                for kind, m in acts:
                    if kind == "F" and p < last:
                        chain.append((lo[p][kind, m], links[p][0]))
                    if kind == "B" and p > 0:
                        chain.append((lo[p][kind, m], links[p - 1][0]))
                chains.append(chain)
            if links:
                row: Lin = {round_time: 1.0, lo[0]["F", 0]: -1.0}
                for occ, *_ in links:
                    axpy(row, -2.0 * m_count, {occ: 1.0})
                for w in work:
                    axpy(row, -1.0, {w: 1.0})
                md.add(row, ">=", 0.0, "ms")
        elif t.topology == "switched" and t.uniform_bw:
            for p in range(1, last):
                chain = []
                for kind, m in orders[p]:
                    load = links[p][2] if kind == "F" else links[p - 1][3]
                    chain.append((lo[p][kind, m], load))
                chains.append(chain)
                down = {round_time: 1.0, lo[p - 1]["F", 0]: -1.0}
                axpy(down, -float(m_count), {links[p - 1][3]: 1.0, links[p][2]: 1.0})
                md.add(down, ">=", 0.0, "ms")
        for chain in chains:
            prev = None
            for post, load in chain:
                j = md.var(TIME, 0.0, horizon_ms)
                md.add({j: 1.0, post: -1.0, load: -1.0}, ">=", 0.0, "ms")
                if prev is not None:
                    md.add({j: 1.0, prev: -1.0, load: -1.0}, ">=", 0.0, "ms")
                prev = j
            if prev is not None:
                md.add({round_time: 1.0, prev: -1.0}, ">=", 0.0, "ms")

    def redundant(
        self,
        durations: tuple[list[int], list[int], list[int], list[int]],
        links: list[tuple[int, int, int, int, Lin]],
        round_time: int,
    ) -> None:
        """Rows the paths above imply, stated directly so that a solver's bound on T
        follows the durations at once (Asteroid's D term): stage c's slowest device runs
        M forwards and M backwards after the first micro-batch reached it, and its last
        gradient travels back to stage 0; boundary c's M transfers of one direction
        follow each other, then the last micro-batch finishes its way."""
        md, m_count, t = self.md, float(self.m_count), self.t
        ef, eb, ef_lo, eb_lo = durations
        big_p = self.num_stages

        def way(stages: range) -> tuple[Lin, float]:
            """Forward and backward of the fastest devices of ``stages`` and one sample's
            way over each of their outgoing boundaries, both directions."""
            terms: Lin = {}
            for i in stages:
                axpy(terms, 1.0, {ef_lo[i]: 1.0, eb_lo[i]: 1.0})
                axpy(terms, 2.0, links[i][4])
            return terms, 2.0 * t.lat_lo * len(stages)

        for c in range(big_p):
            terms, const = way(range(c))
            row = axpy({round_time: 1.0, ef[c]: -m_count, eb[c]: -m_count}, -1.0, terms)
            md.add(row, ">=", const, "ms")
        for c in range(big_p - 1):
            terms, const = way(range(c))  # to stage c and back from it, around c
            axpy(terms, 1.0, {ef_lo[c]: 1.0, eb_lo[c]: 1.0, ef_lo[c + 1]: 1.0, eb_lo[c + 1]: 1.0})
            axpy(terms, 1.0, links[c][4])  # the other direction's one sample
            axpy(terms, m_count, {links[c][0]: 1.0})  # M transfers of one direction
            row = axpy({round_time: 1.0}, -1.0, terms)
            md.add(row, ">=", const + 2.0 * t.lat_lo, "ms")


def no_good(form: Formulation, values: dict[int, float]) -> None:
    """Exclude one assignment of the decision variables
    (:func:`planner.solvers.exact.solutions.decision`): at least one of them differs. A
    binary b differs through b (if 0) or 1 - b (if 1); an integer n at 0 through its q
    (q = 1 iff n >= 1); an integer n at v >= 1 through new binaries lo (n <= v - 1) and
    hi (n >= v + 1)."""
    md = form.model
    q_of = {form.n[key]: form.q[key] for key in form.n}
    row: Lin = {}
    rhs = 1.0
    for var, value in values.items():
        if md.kind[var] == BIN:
            axpy(row, -1.0 if value else 1.0, {var: 1.0})
            rhs -= value
        elif value == 0.0:
            axpy(row, 1.0, {q_of[var]: 1.0})
        else:
            lo, hi = md.var(BIN, 0, 1), md.var(BIN, 0, 1)
            md.add({var: 1.0}, "<=", value - 1.0, "count", (lo,))
            md.add({var: 1.0}, ">=", value + 1.0, "count", (hi,))
            axpy(row, 1.0, {lo: 1.0, hi: 1.0})
    md.add(row, ">=", rhs, "count")
