"""The exact planner's program for one (micro-batch size B, stage count P): the variables
and constraints of :mod:`planner.milp`'s formulation, built as a small backend-neutral
linear model (:class:`Model`) that :mod:`planner.milp_backends` lowers to each solver.

Formulation for fixed (B, P), L blocks, classes k, samples y in 1..B:

Variables
    c[l, p] in {0, 1}, p = 1..P-1: block l is in stage >= p (c[l, 0] = 1, c[l, P] = 0);
        block l is in stage p iff x[l, p] := c[l, p] - c[l, p + 1] = 1.
    n[p, k, y] in {0..min(count_k, B // y)}: devices of class k in stage p taking y samples;
        q[p, k, y] in {0, 1} with q <= n <= ub q (q = some such device exists);
        u[p, k] in {0, 1} = OR_y q[p, k, y]; d2[p, k] in {0, 1}: at least two devices of
        class k in stage p (only where the network needs it).
    h[p, g] in {0, 1}, g = 1..min(N, B): stage p's group has g devices (one-hot).
    Ef[p], Eb[p], Ta[p] >= 0: forward, backward and all-reduce time of stage p;
        Lk[p] >= 0: link time p -> p+1 (one direction); LATin[p], LATx[p]: the largest
        latency inside stage p's group and between stages p and p+1; ein[p, j],
        ex[p, j] in {0, 1}: some pair inside the group / across the link has
        1/bandwidth >= v_j (v_0 < v_1 < ... the distinct 1/bandwidth values).
    e[s, i] >= 0: end of the i-th action of chain step s in the schedule; T: round time.

Constraints
    contiguity: c[l, p] <= c[l + 1, p], c[l, p + 1] <= c[l, p], sum_l x[l, p] >= 1;
    samples:    sum_{k, y} y n[p, k, y] = B per stage; sum_{p, y} n[p, k, y] <= count_k;
                sum_g h[p, g] = 1, sum_g g h[p, g] = sum_{k, y} n[p, k, y];
    compute:    q[p, k, y] => Ef[p] >= sum_l t_f(l, k, y) x[l, p]  (same for Eb; Eq. 8);
    memory:     q[p, k, y] => sum_l ((2 + k_opt) W_l + K_p y A_l) x[l, p] <= budget_k;
    link:       Lk[p] >= LATx[p] + B v_0 a_p and ex[p, j] => Lk[p] >= LATx[p] + B v_j a_p,
                a_p = sum_c a_{c-1} (c[c, p + 1] - c[c - 1, p + 1]) the boundary bytes per
                sample of the cut, LATx[p] >= lat(k1, k2) (u[p, k1] + u[p + 1, k2] - 1),
                ex[p, j] >= u[p, k1] + u[p + 1, k2] - 1 for class pairs with 1/bw >= v_j;
    all-reduce: h[p, g] (and ein[p, j]) => Ta[p] >= r_g v_j sum_l W_l x[l, p]
                + 2 (g - 1) LATin[p] with r_g = 2(g-1)/g (2(g-1) on a shared medium),
                LATin and ein as LATx and ex over pairs inside the group (§3.3);
    schedule:   for every action a of step s (1F1B with the cost model's warm-ups, or
                GPipe), e[s, a] >= e[s, prev(a)] + dur(a) and e[s, a] >= e[dep(a)] + dur(a),
                dur = Ef / Eb on stage steps and Lk on link steps; T >= e[s, last] + Ta[p];
    redundant:  T >= M (Ef^c + Eb^c) + sum_{i<c} (Ef^i + Eb^i) for every step c (implied
                by the paths above; stated so that propagation bounds T at once);
    balance:    where a class's block times never fall with the batch size, its devices
                in one stage take y or y + 1 samples (even splits are never worse);
    cutoff:     T <= incumbent (1 + 1e-4).

Objective: minimise T. With the durations fixed the least T satisfying the schedule
constraints is the longest path through the schedule's actions, i.e. exactly
:func:`planner.cost.schedule_makespan`; every other constraint is an exact linear (or
indicator) form of a cost-model formula, or drops only plans that another plan matches
or beats (balance), so the optimum of the program is the least chain recurrence
(``PlanCost.chain_ms``) over the space. The cost model's reported figure
(``PlanCost.iteration_ms``) prices boundaries as parallel re-sliced pieces on the
network's channels (docs/cost-model.md), which the program does not: every solution is
re-scored by :class:`CostModel`, incumbents are compared by that figure, and the cutoff,
bounds and gap are in the program's units.
Uniform networks need no LAT/ein/ex variables (a single bandwidth and latency value).

Size per program: O(P L) block binaries, O(P K B) sample variables, O(P min(N, B))
group-size binaries, O(S M) action variables (S = 2P - 1 steps, M micro-batches) and
O(P K B L + S M + P min(N, B) L) non-zeros. The number of programs is
O(#candidates x min(L, N)); each is NP-hard in general (it contains bin packing), so the
time limit bounds the whole search; the plan records whether optimality was proven.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from planner.classes import DeviceClass, representative_pair
from planner.cost import CostModel, chain_schedule
from planner.partition import Partition, StageAssignment
from planner.problem import Problem

#: variable kinds: binary, integer, time in ms
BIN, INT, TIME = "bin", "int", "time"


# --------------------------------------------------------------------------------------
# a small linear-model representation, lowered to each backend
# --------------------------------------------------------------------------------------
Lin = dict[int, float]


@dataclass
class Row:
    """``sum terms (sense) rhs``; ``unit`` says how CP-SAT scales it (``ms``: times,
    ``bytes``: memory, rounded conservatively, ``count``: exact integers); the row only
    holds when every binary in ``enforce`` is 1."""

    terms: Lin
    sense: str
    rhs: float
    unit: str
    enforce: tuple[int, ...] = ()


@dataclass
class Model:
    """Variables (bounds and kind: binary, integer, or time in ms) and rows; minimise
    the variable ``objective``."""

    lb: list[float] = field(default_factory=list)
    ub: list[float] = field(default_factory=list)
    kind: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    objective: int = -1

    def var(self, kind: str, lb: float, ub: float) -> int:
        self.lb.append(lb)
        self.ub.append(ub)
        self.kind.append(kind)
        return len(self.kind) - 1

    def add(
        self, terms: Lin, sense: str, rhs: float, unit: str, enforce: tuple[int, ...] = ()
    ) -> None:
        terms = {v: c for v, c in terms.items() if c != 0.0}
        self.rows.append(Row(terms, sense, rhs, unit, enforce))

    def minimum(self, terms: Lin) -> float:
        """Least value of ``terms`` over the variables' bounds."""
        return sum(c * (self.lb[v] if c > 0 else self.ub[v]) for v, c in terms.items())

    def maximum(self, terms: Lin) -> float:
        """Largest value of ``terms`` over the variables' bounds."""
        return sum(c * (self.ub[v] if c > 0 else self.lb[v]) for v, c in terms.items())


def axpy(out: Lin, coef: float, terms: Lin) -> Lin:
    for v, c in terms.items():
        out[v] = out.get(v, 0.0) + coef * c
    return out


# --------------------------------------------------------------------------------------
# the formulation for one (B, P)
# --------------------------------------------------------------------------------------
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


class Tables:
    """Per-class block tables shared by every (B, P) program of one problem."""

    def __init__(self, problem: Problem, cm: CostModel, classes: list[DeviceClass]) -> None:
        self.problem, self.cm, self.classes = problem, cm, classes
        self.n_blocks = problem.model.num_blocks
        # per class: (L, max_batch + 1) forward / backward ms of each block at each batch
        self.tf = [np.diff(cm.fwd[c.type], axis=0) * c.slowdown for c in classes]
        self.tb = [np.diff(cm.bwd[c.type], axis=0) * c.slowdown for c in classes]
        self.static = cm.state_factor * np.diff(cm.param_prefix)
        self.saved = np.diff(cm.saved_prefix)
        self.grad = np.diff(cm.param_prefix)
        self.boundary = cm.boundary
        n_cls = len(classes)
        inv = np.full((n_cls, n_cls), np.nan)
        lat = np.full((n_cls, n_cls), np.nan)
        for a, ca in enumerate(classes):
            for b, cb in enumerate(classes):
                pair = representative_pair(ca, cb)
                if pair is not None:
                    inv[a, b] = 1.0 / cm.bw[pair]
                    lat[a, b] = cm.lat[pair]
        self.inv_bw, self.lat = inv, lat
        #: distinct 1/bandwidth values of device pairs, ascending (v_0 < v_1 < ...)
        self.inv_values = sorted(set(inv[~np.isnan(inv)].tolist()))
        known = lat[~np.isnan(lat)]
        self.lat_lo = float(known.min()) if known.size else 0.0
        self.lat_hi = float(known.max()) if known.size else 0.0
        self.uniform = len(self.inv_values) <= 1 and self.lat_lo == self.lat_hi
        #: per class, whether every block's times are non-decreasing in the batch size.
        #: Then splitting a class's samples in a stage evenly (counts differing by at
        #: most 1) is never worse: moving one sample from a device with y samples to one
        #: of the same class with y' <= y - 2 leaves both at or below the first device's
        #: old time and memory, and changes no other figure.
        self.monotone = [
            bool((np.diff(tf, axis=1) >= 0).all() and (np.diff(tb, axis=1) >= 0).all())
            for tf, tb in zip(self.tf, self.tb, strict=True)
        ]
        self.n_devices = sum(c.count for c in classes)


def schedule_actions(cm: CostModel, batch: int, num_stages: int) -> list[list[tuple[str, int]]]:
    """The action lists of every chain step for (B, P), as the cost model builds them:
    the warm-ups come from scoring a placeholder partition of P stages (they depend on P,
    M and the config only), the order from :func:`planner.cost.chain_schedule`."""
    problem = cm.problem
    n_blocks = problem.model.num_blocks
    devices = problem.cluster.devices
    stages = tuple(
        StageAssignment(p, p + 1 if p + 1 < num_stages else n_blocks, (devices[p].id,), (batch,))
        for p in range(num_stages)
    )
    placeholder = Partition(batch, problem.config.global_batch // batch, stages)
    return chain_schedule(cm.evaluate(placeholder).chain)


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
        self.group_max = min(tables.n_devices, batch)

    def build(self, cutoff_ms: float, horizon_ms: float) -> Formulation:
        self.blocks()
        self.devices()
        ef, eb = self.compute()
        ta = self.allreduce(horizon_ms)
        links = self.links(horizon_ms)
        self.schedule(ef, eb, ta, links, cutoff_ms, horizon_ms)
        return Formulation(
            self.md, self.batch, self.num_stages, self.cum, self.n, self.q, self.u, self.h,
            self.d2,
        )  # fmt: skip

    # -- blocks -------------------------------------------------------------------------
    def c_term(self, l_: int, p: int) -> tuple[Lin, float]:
        """c[l, p] as (terms, constant): 1 for p = 0, 0 for p = P, else a variable."""
        if p == 0:
            return {}, 1.0
        if p == self.num_stages:
            return {}, 0.0
        return {self.cum[l_, p]: 1.0}, 0.0

    def x_lin(self, weights: np.ndarray, p: int) -> tuple[Lin, float]:
        """sum_l weights[l] x[l, p] as (terms, constant)."""
        terms: Lin = {}
        const = 0.0
        for l_, w in enumerate(weights.tolist()):
            if w == 0.0:
                continue
            for sign, stage in ((1.0, p), (-1.0, p + 1)):
                part, c0 = self.c_term(l_, stage)
                axpy(terms, sign * w, part)
                const += sign * w * c0
        return terms, const

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
    def devices(self) -> None:
        md, t, batch = self.md, self.t, self.batch
        config = t.problem.config
        use_per_class: list[Lin] = [{} for _ in t.classes]
        for p in range(self.num_stages):
            warm = config.warmup_depth(p, self.num_stages, self.m_count)
            allowed = np.arange(p, t.n_blocks - self.num_stages + p + 1)  # blocks p can hold
            samples_row: Lin = {}
            for k, cls in enumerate(t.classes):
                # y with which even the lightest block stage p may hold overflows are out
                ys = [
                    y
                    for y in range(1, batch + 1)
                    if (t.static[allowed] + warm * y * t.saved[allowed]).min() <= cls.budget
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
                    terms, const = self.x_lin(t.static + warm * y * t.saved, p)
                    if md.maximum(terms) + const > cls.budget:
                        md.add(terms, "<=", cls.budget - const, "bytes", (q,))
                md.add(u_row, "<=", 0.0, "count")  # u <= sum_y q
                if cls.count >= 2 and len(ys) > 2 and t.monotone[k]:
                    # balanced classes: the samples of one class in one stage differ by
                    # at most 1 (all used y in [lo, lo + 1]); see Tables.monotone
                    lo = md.var(INT, 1, batch)
                    for y in ys:
                        md.add({lo: 1.0}, "<=", float(y), "count", (self.q[p, k, y],))
                        md.add({lo: 1.0}, ">=", float(y - 1), "count", (self.q[p, k, y],))
                if cls.count >= 2 and class_row and not t.uniform:
                    d2 = self.d2[p, k] = md.var(BIN, 0, 1)
                    md.add(axpy(class_row, -(cls.count - 1.0), {d2: 1.0}), "<=", 1.0, "count")
            md.add(samples_row, "==", float(batch), "count")
            sizes = range(1, self.group_max + 1)
            for g in sizes:
                self.h[p, g] = md.var(BIN, 0, 1)
            md.add({self.h[p, g]: 1.0 for g in sizes}, "==", 1.0, "count")
            count_row = {v: 1.0 for (sp, _, _), v in self.n.items() if sp == p}
            md.add(
                axpy(count_row, -1.0, {self.h[p, g]: float(g) for g in sizes}), "==", 0.0, "count"
            )
        for k, cls in enumerate(t.classes):
            if use_per_class[k]:
                md.add(use_per_class[k], "<=", float(cls.count), "count")

    # -- step durations ------------------------------------------------------------------
    def compute(self) -> tuple[list[int], list[int]]:
        """E_f and E_b of every stage: its slowest device's time (Eq. 8)."""
        md, t, batch = self.md, self.t, self.batch
        d_max = max(
            float(max(tf[:, 1 : batch + 1].sum(0).max(), tb[:, 1 : batch + 1].sum(0).max()))
            for tf, tb in zip(t.tf, t.tb, strict=True)
        )
        ef = [md.var(TIME, 0.0, d_max) for _ in range(self.num_stages)]
        eb = [md.var(TIME, 0.0, d_max) for _ in range(self.num_stages)]
        for (p, k, y), q in self.q.items():
            for dur, table in ((ef[p], t.tf[k]), (eb[p], t.tb[k])):
                terms, const = self.x_lin(table[:, y], p)
                md.add(axpy({dur: 1.0}, -1.0, terms), ">=", const, "ms", (q,))
        return ef, eb

    def pair_used(self, p_a: int, k_a: int, p_b: int, k_b: int) -> tuple[Lin, float] | None:
        """(terms, constant) >= 1 exactly when devices of classes k_a in stage p_a and k_b
        in stage p_b (distinct devices) are both present; None if no such pair counts."""
        if p_a == p_b and k_a == k_b:
            return ({self.d2[p_a, k_a]: 1.0}, 0.0) if (p_a, k_a) in self.d2 else None
        if p_a == p_b and k_a > k_b:
            return None  # pairs inside a group are unordered
        return {self.u[p_a, k_a]: 1.0, self.u[p_b, k_b]: 1.0}, -1.0

    def network(self, p_a: int, p_b: int) -> tuple[Lin, float, dict[int, int]]:
        """The largest latency between groups p_a and p_b (p_a = p_b: inside one group)
        as (terms, constant), and the indicators ``flags[j]`` = some pair has 1/bandwidth
        >= v_j, j >= 1. On a uniform network: a constant and no flags."""
        md, t = self.md, self.t
        if t.uniform:
            return {}, t.lat_lo, {}
        lat_var = md.var(TIME, t.lat_lo, t.lat_hi)
        flags = {j: md.var(BIN, 0, 1) for j in range(1, len(t.inv_values))}
        n_cls = len(t.classes)
        for ka in range(n_cls):
            for kb in range(n_cls):
                used = None if np.isnan(t.inv_bw[ka, kb]) else self.pair_used(p_a, ka, p_b, kb)
                if used is None:
                    continue
                terms, const = used
                if t.lat[ka, kb] > t.lat_lo:
                    row = axpy({lat_var: 1.0}, -t.lat[ka, kb], terms)
                    md.add(row, ">=", t.lat[ka, kb] * const, "ms")
                for j, flag in flags.items():
                    if t.inv_bw[ka, kb] >= t.inv_values[j]:
                        md.add(axpy({flag: 1.0}, -1.0, terms), ">=", const, "count")
        return {lat_var: 1.0}, 0.0, flags

    def allreduce(self, horizon_ms: float) -> list[int]:
        """T_a of every stage: ring all-reduce over its g devices (§3.3)."""
        md, t = self.md, self.t
        shared = t.problem.cluster.network.shared_medium
        ta = [md.var(TIME, 0.0, horizon_ms) for _ in range(self.num_stages)]
        if self.group_max < 2:
            return ta
        for p in range(self.num_stages):
            lat_terms, lat_const, flags = self.network(p, p)
            w_terms, w_const = self.x_lin(t.grad, p)
            for g in range(2, self.group_max + 1):
                ratio = 2.0 * (g - 1) if shared else 2.0 * (g - 1) / g
                for j, v in enumerate(t.inv_values):
                    row = axpy({ta[p]: 1.0}, -ratio * v, w_terms)
                    axpy(row, -2.0 * (g - 1), lat_terms)
                    rhs = ratio * v * w_const + 2.0 * (g - 1) * lat_const
                    enforce = (self.h[p, g],) if j == 0 else (self.h[p, g], flags[j])
                    md.add(row, ">=", rhs, "ms", enforce)
        return ta

    def links(self, horizon_ms: float) -> list[int]:
        """Link time p -> p+1: latency + B x boundary bytes of the cut / bandwidth."""
        md, t = self.md, self.t
        links = []
        for p in range(self.num_stages - 1):
            lat_terms, lat_const, flags = self.network(p, p + 1)
            link = md.var(TIME, 0.0, horizon_ms)
            links.append(link)
            cut: Lin = {}  # boundary bytes per sample of the cut before stage p + 1
            for c in range(1, t.n_blocks):
                a = float(t.boundary[c - 1])
                axpy(cut, a, self.c_term(c, p + 1)[0])
                axpy(cut, -a, self.c_term(c - 1, p + 1)[0])
            for j, v in enumerate(t.inv_values):
                row = axpy(axpy({link: 1.0}, -self.batch * v, cut), -1.0, lat_terms)
                md.add(row, ">=", lat_const, "ms", () if j == 0 else (flags[j],))
        return links

    # -- the schedule's longest path -----------------------------------------------------
    def schedule(
        self,
        ef: list[int],
        eb: list[int],
        ta: list[int],
        links: list[int],
        cutoff_ms: float,
        horizon_ms: float,
    ) -> None:
        """T and the longest-path rows through the schedule's actions."""
        md = self.md
        actions = schedule_actions(self.t.cm, self.batch, self.num_stages)
        last = len(actions) - 1
        ends = [{a: md.var(TIME, 0.0, horizon_ms) for a in acts} for acts in actions]
        round_time = md.var(TIME, 0.0, min(cutoff_ms, horizon_ms))
        # per step, the forward and backward duration variables
        step_dur = [
            (links[s // 2],) * 2 if s % 2 else (ef[s // 2], eb[s // 2]) for s in range(last + 1)
        ]
        for s, acts in enumerate(actions):
            prev = None
            for kind, mb in acts:
                dur = step_dur[s][kind == "B"]
                me = ends[s][kind, mb]
                if kind == "F":
                    dep = ends[s - 1]["F", mb] if s > 0 else None
                else:
                    dep = ends[s + 1]["B", mb] if s < last else ends[s]["F", mb]
                for before in (prev, dep):
                    if before is not None:
                        md.add({me: 1.0, before: -1.0, dur: -1.0}, ">=", 0.0, "ms")
                if prev is None and dep is None:
                    md.add({me: 1.0, dur: -1.0}, ">=", 0.0, "ms")
                prev = me
            if s % 2 == 0:  # a stage's round ends with its all-reduce
                md.add({round_time: 1.0, prev: -1.0, ta[s // 2]: -1.0}, ">=", 0.0, "ms")
        # redundant rows that the paths above imply, stated directly so that a solver's
        # bound on T follows the durations at once (Asteroid's D term): step c's first
        # forward starts after the forwards of the steps before it, c then runs its M
        # forwards and M backwards, and its last backward still travels back to step 0
        for c in range(last + 1):
            row: Lin = {
                round_time: 1.0,
                step_dur[c][0]: -float(self.m_count),
                step_dur[c][1]: -float(self.m_count),
            }
            for i in range(c):
                axpy(row, -1.0, {step_dur[i][0]: 1.0, step_dur[i][1]: 1.0})
            md.add(row, ">=", 0.0, "ms")
        md.objective = round_time


def solution_hint(form: Formulation, tables: Tables, partition: Partition) -> dict[int, float]:
    """Values of the block and device variables for ``partition`` (a MIP start / hint;
    the solvers complete the time variables)."""
    problem = tables.problem
    cls_of = {i: k for k, c in enumerate(tables.classes) for i in c.members}
    values: dict[int, float] = {}
    for p, stage in enumerate(partition.stages):
        for l_ in range(stage.first, stage.end):
            for p2 in range(1, form.num_stages):
                values[form.cum[l_, p2]] = 1.0 if p >= p2 else 0.0
    for (p, k, y), var in form.n.items():
        stage = partition.stages[p]
        count = sum(
            1
            for d, s in zip(stage.devices, stage.samples, strict=True)
            if cls_of[problem.cluster.index(d)] == k and s == y
        )
        values[var] = float(count)
        values[form.q[p, k, y]] = 1.0 if count else 0.0
    for (p, k), var in form.u.items():
        values[var] = float(
            any(cls_of[problem.cluster.index(d)] == k for d in partition.stages[p].devices)
        )
    for (p, k), var in form.d2.items():
        count = sum(cls_of[problem.cluster.index(d)] == k for d in partition.stages[p].devices)
        values[var] = 1.0 if count >= 2 else 0.0
    for (p, g), var in form.h.items():
        values[var] = 1.0 if len(partition.stages[p].devices) == g else 0.0
    return values


def extract(form: Formulation, tables: Tables, values: list[float]) -> Partition:
    """The partition encoded by a solution: block ranges from c, devices from n (the
    members of a class taken in cluster order)."""
    big_l, big_p = tables.n_blocks, form.num_stages
    stage_of = [sum(round(values[form.cum[l_, p]]) for p in range(1, big_p)) for l_ in range(big_l)]
    free = [list(c.members) for c in tables.classes]
    devices = tables.problem.cluster.devices
    stages = []
    for p in range(big_p):
        blocks = [l_ for l_ in range(big_l) if stage_of[l_] == p]
        taken: list[tuple[int, int]] = []
        for (sp, k, y), var in sorted(
            form.n.items(), key=lambda kv: (kv[0][0], kv[0][1], -kv[0][2])
        ):
            if sp == p:
                for _ in range(round(values[var])):
                    taken.append((free[k].pop(0), y))
        taken.sort()
        stages.append(
            StageAssignment(
                blocks[0],
                blocks[-1] + 1,
                tuple(devices[i].id for i, _ in taken),
                tuple(y for _, y in taken),
            )
        )
    return Partition(form.batch, tables.problem.config.global_batch // form.batch, tuple(stages))
