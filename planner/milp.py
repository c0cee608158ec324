"""The exact planner: a mixed-integer program over a larger space than the DP's.

Search space (larger than :mod:`planner.dp`'s): any device may serve any stage in any
order (no fixed device order, no contiguous device runs), stages take contiguous block
ranges, every device of a stage takes an integer number of samples >= 1 of each
micro-batch (devices may stay idle), the micro-batch size comes from the candidates, and
every device must fit its stage's weights, gradients, optimizer state and K_p in-flight
micro-batches of activations (Eq. 3, K_p from :meth:`TrainingConfig.warmup_depth`).
Every figure is the one of :mod:`planner.cost`; the objective is the exact iteration
time the cost model reports (``PlanCost.iteration_ms``), not a proxy.

Symmetry: devices with the same type, usable memory and slowdown and no per-pair link
override are interchangeable (same times, memory and network figures), so they form a
*class* k with ``count_k`` members and the program counts devices per (stage, class,
samples) instead of naming them. A device with a per-pair link override is a class of
its own, which keeps every network figure a function of the classes involved.

Decomposition: one program per (micro-batch size B, stage count P), P = 1 ..
min(L, N, max_stages); with B and P fixed the micro-batch count M = G/B, the warm-ups
K_p and the schedule's action order are constants. The DP's plan is the first incumbent
and its (B, P) program comes first; every program carries the incumbent's exact
iteration time as an objective cutoff, so one that cannot beat it is infeasible. Two
programs run at a time (one solver thread each); a first pass gives every program a
short slice (the easy ones close, better incumbents appear early), a second pass gives
the open ones the time left, lowest bound first.

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
or beats (balance), so the optimum of the program is the least iteration time over the
space; the plan is re-scored by :class:`CostModel` anyway.
Uniform networks need no LAT/ein/ex variables (a single bandwidth and latency value).

Backends: OR-Tools CP-SAT (``cpsat``: integer program; times scaled to integer units of
about 1e-8 of the incumbent, memory rounded conservatively to bytes, indicators as
enforcement literals, the DP plan as a solution hint, one worker per program) and pulp
with CBC (``cbc``: big-M indicators, the DP plan as MIP start) or HiGHS (``highs``:
big-M, the DP value as the objective cutoff; pulp's HiGHS interface has no MIP start).
CP-SAT's optimum is exact up to that time resolution (relative error below about 1e-5).

Size per program: O(P L) block binaries, O(P K B) sample variables, O(P min(N, B))
group-size binaries, O(S M) action variables (S = 2P - 1 steps, M micro-batches) and
O(P K B L + S M + P min(N, B) L) non-zeros. The number of programs is
O(#candidates x min(L, N)); each is NP-hard in general (it contains bin packing), so the
time limit bounds the whole search; the plan records whether optimality was proven.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from planner.classes import DeviceClass, device_classes, representative_pair
from planner.cost import CostModel, PlanCost
from planner.diagnosis import diagnose_infeasible
from planner.dp import plan_dp
from planner.errors import InfeasibleError, InputError
from planner.partition import Partition, StageAssignment
from planner.problem import Problem
from planner.simulator import one_f_one_b

BACKENDS = ("cpsat", "cbc", "highs")

#: the backend used when none is named (fastest on the benchmark suite, docs/planners.md)
DEFAULT_BACKEND = "cpsat"

#: default wall-clock limit of a whole solve, seconds
DEFAULT_TIME_LIMIT = 60.0

#: CP-SAT time resolution: the incumbent is about this many integer time units
CPSAT_UNITS = 1e8

#: an incumbent must improve by more than this relative amount to replace the last one
IMPROVEMENT = 1e-9

#: programs solved at the same time (one solver thread each)
PARALLEL = 2

#: share of the time limit spread over the first, quick pass over all programs
QUICK_SHARE = 0.25

#: the objective cutoff sits this far (relative) above the incumbent, so that CP-SAT's
#: rounded times cannot cut off the incumbent's own program
CUTOFF_SLACK = 1e-4

_BIN, _INT, _TIME = "bin", "int", "time"


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """Send file descriptor 1 to /dev/null for the block (HiGHS prints a banner to stdout
    from C++ even when told to be quiet). Process-wide: do not print from other threads
    meanwhile."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


# --------------------------------------------------------------------------------------
# a small linear-model representation, lowered to each backend
# --------------------------------------------------------------------------------------
Lin = dict[int, float]


@dataclass
class _Row:
    """``sum terms (sense) rhs``; ``unit`` says how CP-SAT scales it (``ms``: times,
    ``bytes``: memory, rounded conservatively, ``count``: exact integers); the row only
    holds when every binary in ``enforce`` is 1."""

    terms: Lin
    sense: str
    rhs: float
    unit: str
    enforce: tuple[int, ...] = ()


@dataclass
class _Model:
    """Variables (bounds and kind: binary, integer, or time in ms) and rows; minimise
    the variable ``objective``."""

    lb: list[float] = field(default_factory=list)
    ub: list[float] = field(default_factory=list)
    kind: list[str] = field(default_factory=list)
    rows: list[_Row] = field(default_factory=list)
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
        self.rows.append(_Row(terms, sense, rhs, unit, enforce))

    def minimum(self, terms: Lin) -> float:
        """Least value of ``terms`` over the variables' bounds."""
        return sum(c * (self.lb[v] if c > 0 else self.ub[v]) for v, c in terms.items())

    def maximum(self, terms: Lin) -> float:
        """Largest value of ``terms`` over the variables' bounds."""
        return sum(c * (self.ub[v] if c > 0 else self.lb[v]) for v, c in terms.items())


def _axpy(out: Lin, coef: float, terms: Lin) -> Lin:
    for v, c in terms.items():
        out[v] = out.get(v, 0.0) + coef * c
    return out


# --------------------------------------------------------------------------------------
# the formulation for one (B, P)
# --------------------------------------------------------------------------------------
@dataclass
class _Formulation:
    """A built program and the variables needed to read a plan from it or hint one."""

    model: _Model
    batch: int
    num_stages: int
    cum: dict[tuple[int, int], int]  # (l, p) -> c[l, p] for p = 1..P-1
    n: dict[tuple[int, int, int], int]  # (p, k, y) -> n[p, k, y]
    q: dict[tuple[int, int, int], int]
    u: dict[tuple[int, int], int]
    h: dict[tuple[int, int], int]
    d2: dict[tuple[int, int], int]


class _Tables:
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


def _schedule(cm: CostModel, batch: int, num_stages: int) -> list[list[tuple[str, int]]]:
    """The action lists of every chain step for (B, P), as the cost model builds them:
    the warm-ups come from scoring a placeholder partition of P stages (they depend on P,
    M and the config only), the order from :func:`planner.simulator.one_f_one_b`."""
    problem = cm.problem
    n_blocks = problem.model.num_blocks
    devices = problem.cluster.devices
    stages = tuple(
        StageAssignment(p, p + 1 if p + 1 < num_stages else n_blocks, (devices[p].id,), (batch,))
        for p in range(num_stages)
    )
    placeholder = Partition(batch, problem.config.global_batch // batch, stages)
    return one_f_one_b(cm.evaluate(placeholder).chain)


class _Builder:
    """Builds the program of one (B, P); the method per constraint family follows the
    module docstring."""

    def __init__(self, tables: _Tables, batch: int, num_stages: int) -> None:
        self.t, self.batch, self.num_stages = tables, batch, num_stages
        self.md = _Model()
        self.m_count = tables.problem.config.global_batch // batch
        self.cum: dict[tuple[int, int], int] = {}
        self.n: dict[tuple[int, int, int], int] = {}
        self.q: dict[tuple[int, int, int], int] = {}
        self.u: dict[tuple[int, int], int] = {}
        self.d2: dict[tuple[int, int], int] = {}
        self.h: dict[tuple[int, int], int] = {}
        self.group_max = min(tables.n_devices, batch)

    def build(self, cutoff_ms: float, horizon_ms: float) -> _Formulation:
        self.blocks()
        self.devices()
        ef, eb = self.compute()
        ta = self.allreduce(horizon_ms)
        links = self.links(horizon_ms)
        self.schedule(ef, eb, ta, links, cutoff_ms, horizon_ms)
        return _Formulation(
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
                _axpy(terms, sign * w, part)
                const += sign * w * c0
        return terms, const

    def blocks(self) -> None:
        md, big_l, big_p = self.md, self.t.n_blocks, self.num_stages
        for p in range(1, big_p):
            for l_ in range(big_l):
                lo = 1 if big_l - 1 - l_ < big_p - p else 0  # too few blocks left for p..P-1
                hi = 0 if l_ < p else 1  # stages 0..p-1 need p blocks before
                self.cum[l_, p] = md.var(_BIN, lo, hi)
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
                self.u[p, k] = md.var(_BIN, 0, 1 if ys else 0)
                u_row: Lin = {self.u[p, k]: 1.0}
                class_row: Lin = {}
                for y in ys:
                    top = min(cls.count, batch // y)
                    n = self.n[p, k, y] = md.var(_INT, 0, top)
                    q = self.q[p, k, y] = md.var(_BIN, 0, 1)
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
                    # at most 1 (all used y in [lo, lo + 1]); see _Tables.monotone
                    lo = md.var(_INT, 1, batch)
                    for y in ys:
                        md.add({lo: 1.0}, "<=", float(y), "count", (self.q[p, k, y],))
                        md.add({lo: 1.0}, ">=", float(y - 1), "count", (self.q[p, k, y],))
                if cls.count >= 2 and class_row and not t.uniform:
                    d2 = self.d2[p, k] = md.var(_BIN, 0, 1)
                    md.add(_axpy(class_row, -(cls.count - 1.0), {d2: 1.0}), "<=", 1.0, "count")
            md.add(samples_row, "==", float(batch), "count")
            sizes = range(1, self.group_max + 1)
            for g in sizes:
                self.h[p, g] = md.var(_BIN, 0, 1)
            md.add({self.h[p, g]: 1.0 for g in sizes}, "==", 1.0, "count")
            count_row = {v: 1.0 for (sp, _, _), v in self.n.items() if sp == p}
            md.add(
                _axpy(count_row, -1.0, {self.h[p, g]: float(g) for g in sizes}), "==", 0.0, "count"
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
        ef = [md.var(_TIME, 0.0, d_max) for _ in range(self.num_stages)]
        eb = [md.var(_TIME, 0.0, d_max) for _ in range(self.num_stages)]
        for (p, k, y), q in self.q.items():
            for dur, table in ((ef[p], t.tf[k]), (eb[p], t.tb[k])):
                terms, const = self.x_lin(table[:, y], p)
                md.add(_axpy({dur: 1.0}, -1.0, terms), ">=", const, "ms", (q,))
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
        lat_var = md.var(_TIME, t.lat_lo, t.lat_hi)
        flags = {j: md.var(_BIN, 0, 1) for j in range(1, len(t.inv_values))}
        n_cls = len(t.classes)
        for ka in range(n_cls):
            for kb in range(n_cls):
                used = None if np.isnan(t.inv_bw[ka, kb]) else self.pair_used(p_a, ka, p_b, kb)
                if used is None:
                    continue
                terms, const = used
                if t.lat[ka, kb] > t.lat_lo:
                    row = _axpy({lat_var: 1.0}, -t.lat[ka, kb], terms)
                    md.add(row, ">=", t.lat[ka, kb] * const, "ms")
                for j, flag in flags.items():
                    if t.inv_bw[ka, kb] >= t.inv_values[j]:
                        md.add(_axpy({flag: 1.0}, -1.0, terms), ">=", const, "count")
        return {lat_var: 1.0}, 0.0, flags

    def allreduce(self, horizon_ms: float) -> list[int]:
        """T_a of every stage: ring all-reduce over its g devices (§3.3)."""
        md, t = self.md, self.t
        shared = t.problem.cluster.network.shared_medium
        ta = [md.var(_TIME, 0.0, horizon_ms) for _ in range(self.num_stages)]
        if self.group_max < 2:
            return ta
        for p in range(self.num_stages):
            lat_terms, lat_const, flags = self.network(p, p)
            w_terms, w_const = self.x_lin(t.grad, p)
            for g in range(2, self.group_max + 1):
                ratio = 2.0 * (g - 1) if shared else 2.0 * (g - 1) / g
                for j, v in enumerate(t.inv_values):
                    row = _axpy({ta[p]: 1.0}, -ratio * v, w_terms)
                    _axpy(row, -2.0 * (g - 1), lat_terms)
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
            link = md.var(_TIME, 0.0, horizon_ms)
            links.append(link)
            cut: Lin = {}  # boundary bytes per sample of the cut before stage p + 1
            for c in range(1, t.n_blocks):
                a = float(t.boundary[c - 1])
                _axpy(cut, a, self.c_term(c, p + 1)[0])
                _axpy(cut, -a, self.c_term(c - 1, p + 1)[0])
            for j, v in enumerate(t.inv_values):
                row = _axpy(_axpy({link: 1.0}, -self.batch * v, cut), -1.0, lat_terms)
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
        actions = _schedule(self.t.cm, self.batch, self.num_stages)
        last = len(actions) - 1
        ends = [{a: md.var(_TIME, 0.0, horizon_ms) for a in acts} for acts in actions]
        round_time = md.var(_TIME, 0.0, min(cutoff_ms, horizon_ms))
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
                _axpy(row, -1.0, {step_dur[i][0]: 1.0, step_dur[i][1]: 1.0})
            md.add(row, ">=", 0.0, "ms")
        md.objective = round_time


def _hint(form: _Formulation, tables: _Tables, partition: Partition) -> dict[int, float]:
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


def _extract(form: _Formulation, tables: _Tables, values: list[float]) -> Partition:
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


# --------------------------------------------------------------------------------------
# backends
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Outcome:
    """One program's result: ``status`` optimal | feasible (limit hit, solution) |
    infeasible (nothing at or under the cutoff) | unknown (limit hit, no solution);
    ``bound_ms`` a lower bound on the program's optimum (None if the solver has none)."""

    status: str
    values: list[float] | None
    bound_ms: float | None


def _solve_cpsat(
    md: _Model, hint: dict[int, float], time_limit: float, units_per_ms: float
) -> _Outcome:
    """Lower the program to CP-SAT (times in integer units of 1 / ``units_per_ms`` ms,
    memory rounded conservatively, indicator rows as enforcement literals) and solve it
    with 2 workers, ``hint`` as the solution hint."""
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    scale = units_per_ms
    cp_vars = []
    for lb, ub, kind in zip(md.lb, md.ub, md.kind, strict=True):
        if kind in (_BIN, _INT):
            cp_vars.append(model.NewIntVar(int(lb), int(ub), ""))
        else:
            cp_vars.append(model.NewIntVar(math.floor(lb * scale), math.ceil(ub * scale), ""))
    for row in md.rows:
        coefs: list[int] = []
        if row.unit == "ms":
            for v, c in row.terms.items():
                coefs.append(int(c) if md.kind[v] == _TIME else round(c * scale))
            rhs = round(row.rhs * scale)
        elif row.unit == "bytes":  # only <= rows: round up the load, down the budget
            coefs = [math.ceil(c) for c in row.terms.values()]
            rhs = math.floor(row.rhs)
        else:
            coefs = [round(c) for c in row.terms.values()]
            rhs = round(row.rhs)
        expr = sum(c * cp_vars[v] for v, c in zip(row.terms, coefs, strict=True))
        if row.sense == ">=":
            ct = model.Add(expr >= rhs)
        elif row.sense == "<=":
            ct = model.Add(expr <= rhs)
        else:
            ct = model.Add(expr == rhs)
        if row.enforce:
            ct.OnlyEnforceIf([cp_vars[v] for v in row.enforce])
    model.Minimize(cp_vars[md.objective])
    for v, value in hint.items():
        model.AddHint(cp_vars[v], round(value))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(time_limit, 0.01)
    solver.parameters.num_workers = 1  # PARALLEL programs run side by side
    solver.parameters.log_search_progress = False
    status = solver.Solve(model)
    bound = solver.BestObjectiveBound() / scale
    if status == cp_model.OPTIMAL:
        values = [float(solver.Value(v)) for v in cp_vars]
        return _Outcome("optimal", values, solver.ObjectiveValue() / scale)
    if status == cp_model.FEASIBLE:
        return _Outcome("feasible", [float(solver.Value(v)) for v in cp_vars], bound)
    if status == cp_model.INFEASIBLE:
        return _Outcome("infeasible", None, None)
    return _Outcome("unknown", None, bound if math.isfinite(bound) else None)


def _solve_pulp(md: _Model, hint: dict[int, float], time_limit: float, backend: str) -> _Outcome:
    """Lower the program to pulp (indicator rows as big-M rows from the variables'
    bounds, memory in MiB) and solve it with CBC (MIP start from ``hint``) or HiGHS."""
    import pulp

    prob = pulp.LpProblem("edgepipe", pulp.LpMinimize)
    cats = {_BIN: "Integer", _INT: "Integer", _TIME: "Continuous"}
    lp_vars = [
        prob.add_variable(f"v{i}", lowBound=lb, upBound=ub, cat=cats[kind])
        for i, (lb, ub, kind) in enumerate(zip(md.lb, md.ub, md.kind, strict=True))
    ]
    prob += lp_vars[md.objective]
    for row in md.rows:
        terms, rhs = dict(row.terms), row.rhs
        if row.unit == "bytes":  # MiB keeps the big-M coefficients moderate
            terms = {v: c / 2**20 for v, c in terms.items()}
            rhs /= 2**20
        if row.enforce:
            # slack by `big` unless every literal is 1; a row that always holds is dropped
            literals = {v: 1.0 for v in row.enforce}
            if row.sense == ">=":
                big = rhs - md.minimum(terms)
                terms, rhs = _axpy(terms, -big, literals), rhs - big * len(literals)
            else:
                big = md.maximum(terms) - rhs
                terms, rhs = _axpy(terms, big, literals), rhs + big * len(literals)
            if big <= 0:
                continue
        expr = pulp.lpSum(c * lp_vars[v] for v, c in terms.items())
        prob += {">=": expr >= rhs, "<=": expr <= rhs, "==": expr == rhs}[row.sense]
    deadline = time.perf_counter() + max(time_limit, 0.01)
    if backend == "cbc":
        for v, value in hint.items():
            lp_vars[v].setInitialValue(round(value))
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "cbc.log"
            with warnings.catch_warnings():
                # pulp 3 deprecates PULP_CBC_CMD, its only way to the bundled CBC binary
                warnings.simplefilter("ignore", DeprecationWarning)
                solver = pulp.PULP_CBC_CMD(
                    msg=False,
                    timeLimit=max(time_limit, 0.01),
                    warmStart=bool(hint),
                    logPath=str(log),
                    threads=1,
                )
            prob.solve(solver)
            verdict, bound = _cbc_result(log.read_text() if log.exists() else "")
        if prob.status == pulp.LpStatusInfeasible or verdict == "infeasible":
            return _Outcome("infeasible", None, None)
        stopped = verdict != "optimal"
    else:
        import highspy

        for presolve in ("choose", "off"):
            solver = pulp.HiGHS(
                msg=False,
                timeLimit=max(deadline - time.perf_counter(), 0.01),
                threads=1,
                mip_rel_gap=0.0,
                presolve=presolve,
            )
            prob.solve(solver)
            status = prob.solverModel.getModelStatus()
            # HiGHS 1.16's presolve can end in a solve error ("MIP solver claims
            # optimality, but with ... infeasibilities"): solve again without presolve
            if status != highspy.HighsModelStatus.kSolveError:
                break
        if status == highspy.HighsModelStatus.kInfeasible:
            return _Outcome("infeasible", None, None)
        stopped = status != highspy.HighsModelStatus.kOptimal
        dual = float(prob.solverModel.getInfo().mip_dual_bound)
        bound = dual if math.isfinite(dual) else None
    solved = prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    values = [float(v.varValue) for v in lp_vars] if solved else None
    if values is not None and not stopped:
        return _Outcome("optimal", values, values[md.objective])
    return _Outcome("feasible" if values is not None else "unknown", values, bound)


def _cbc_result(log: str) -> tuple[str, float | None]:
    """CBC's verdict (optimal | infeasible | stopped) and final lower bound from its log."""
    verdict = re.search(r"Result - (.*)", log)
    text = verdict.group(1).lower() if verdict else ""
    found = re.search(r"Lower bound:\s*([-+0-9.eE]+)", log)
    bound = float(found.group(1)) if found else None
    if "infeasible" in text:
        return "infeasible", None
    if "optimal" in text:
        return "optimal", bound
    return "stopped", bound


# --------------------------------------------------------------------------------------
# the planner
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SubProblem:
    """What happened to the program of one (micro-batch size, stage count)."""

    batch: int
    num_stages: int
    status: str  # optimal | feasible | infeasible | unknown | skipped (time was up)
    best_ms: float | None  # exact iteration time of its solution, re-scored
    bound_ms: float | None  # the solver's lower bound on the program's optimum
    solve_time_s: float

    @property
    def closed(self) -> bool:
        """Solved to optimality, or proven unable to beat the incumbent."""
        return self.status in ("optimal", "infeasible")


@dataclass(frozen=True)
class MILPResult:
    """The exact planner's plan, its cost-model figures and its proof status.

    ``status``: ``optimal`` (every program closed), ``feasible`` (time limit hit, but every
    program has a lower bound, so ``bound_ms`` and ``gap`` are valid), ``timed_out``
    (time limit hit before some program had a bound: no global bound). ``gap`` =
    (iteration - bound) / iteration."""

    partition: Partition
    cost: PlanCost
    status: str
    bound_ms: float | None
    gap: float | None
    solve_time_s: float
    backend: str
    time_limit_s: float
    warm_start_ms: float | None
    subproblems: tuple[SubProblem, ...]


class _Search:
    """Runs the (B, P) programs, PARALLEL at a time (each solver call releases the GIL;
    CBC runs as a subprocess), sharing the incumbent: a program is built with the
    incumbent's value at its start as cutoff, and an improving solution, re-scored by
    the cost model, replaces the incumbent at once."""

    def __init__(
        self,
        tables: _Tables,
        backend: str,
        deadline: float,
        best: tuple[float, Partition, PlanCost] | None,
        horizon: float,
    ) -> None:
        self.tables, self.backend, self.deadline, self.horizon = tables, backend, deadline, horizon
        self.best = best
        self.lock = threading.Lock()

    def attempt(self, job: tuple[int, int], cap: float, before: SubProblem | None) -> SubProblem:
        """Solve program ``job`` for at most ``cap`` seconds (and never past the
        deadline); ``before`` is its result from an earlier pass."""
        t0 = time.perf_counter()
        limit = min(cap, self.deadline - t0)
        if limit <= 0:
            return before or SubProblem(*job, "skipped", None, None, 0.0)
        with self.lock:
            best = self.best
        ref = best[0] if best else self.horizon
        form = _Builder(self.tables, *job).build(ref * (1 + CUTOFF_SLACK), self.horizon)
        hint = {}
        if best and (best[1].micro_batch_size, best[1].num_stages) == job:
            hint = _hint(form, self.tables, best[1])
        if self.backend == "cpsat":
            outcome = _solve_cpsat(form.model, hint, limit, CPSAT_UNITS / ref)
        else:
            outcome = _solve_pulp(form.model, hint, limit, self.backend)
        found = before.best_ms if before else None
        if outcome.values is not None:
            partition = _extract(form, self.tables, outcome.values)
            cost = self.tables.cm.evaluate(partition)
            found = cost.iteration_ms
            with self.lock:
                if cost.memory_ok and (
                    self.best is None or found < self.best[0] * (1 - IMPROVEMENT)
                ):
                    self.best = (found, partition, cost)
        spent = time.perf_counter() - t0 + (before.solve_time_s if before else 0.0)
        return SubProblem(*job, outcome.status, found, outcome.bound_ms, spent)

    def run(
        self,
        jobs: list[tuple[int, int]],
        quick: float,
        progress: Callable[[int, int], None] | None,
    ) -> list[SubProblem]:
        """Pass 1 gives every program a short slice ``quick`` (closing the easy ones and
        improving the incumbent early, which strengthens the cutoff of every later
        proof); pass 2 gives the open ones the time left, lowest bound first."""
        results: dict[tuple[int, int], SubProblem] = {}
        order = jobs
        with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
            for cap in (quick, math.inf):
                futures = {pool.submit(self.attempt, j, cap, results.get(j)): j for j in order}
                for future in as_completed(futures):
                    results[futures[future]] = future.result()
                    if progress is not None:
                        progress(sum(r.closed for r in results.values()), len(jobs))
                order = sorted(
                    (j for j in jobs if not results[j].closed),
                    key=lambda j: results[j].bound_ms or 0.0,
                )
        return [results[j] for j in jobs]


def plan_milp(
    problem: Problem,
    backend: str = DEFAULT_BACKEND,
    time_limit: float = DEFAULT_TIME_LIMIT,
    warm_start: Partition | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> MILPResult:
    """Best partition over the exact planner's space (module docstring).

    Args:
        problem: the inputs.
        backend: ``cpsat``, ``cbc`` or ``highs``.
        time_limit: wall-clock seconds for the whole search (all programs together).
        warm_start: an initial plan; default: the DP's plan (if the DP finds one).
        progress: optional ``callback(closed, total)`` after each attempt at a (B, P)
            program: how many of the ``total`` programs are closed (solved or proven
            unable to beat the incumbent). Called with stdout silenced (see
            :func:`quiet_stdout`): report on stderr.

    Raises:
        InputError: unknown backend or a non-positive time limit.
        InfeasibleError: no plan fits memory (proven: every program infeasible; the
            message names the binding figure) or none was found within the time limit
            (constraint ``time_limit``).
    """
    if backend not in BACKENDS:
        raise InputError(
            "--backend", "", f"unknown backend {backend!r}; available: {list(BACKENDS)}"
        )
    if not time_limit > 0:
        raise InputError("--time-limit", "", f"must be positive seconds, got {time_limit!r}")
    start = time.perf_counter()
    deadline = start + time_limit
    sizes = problem.config.micro_batch_sizes()
    cm = CostModel(problem, max(sizes))
    dp_values: dict[int, float] = {}
    if warm_start is None:
        try:
            dp = plan_dp(problem)
            warm_start, dp_values = dp.partition, dp.candidates
        except InfeasibleError:
            warm_start = None
    best: tuple[float, Partition, PlanCost] | None = None
    if warm_start is not None:
        cost = cm.evaluate(warm_start)
        if cost.memory_ok:
            best = (cost.iteration_ms, warm_start, cost)
    warm_ms = best[0] if best else None

    tables = _Tables(problem, cm, device_classes(problem))
    max_p = min(problem.model.num_blocks, len(problem.cluster.devices))
    if problem.config.max_stages:
        max_p = min(max_p, problem.config.max_stages)
    jobs = [(b, p) for b in sizes for p in range(1, max_p + 1)]
    first = (warm_start.micro_batch_size, warm_start.num_stages) if warm_start else None
    jobs.sort(key=lambda j: (j != first, dp_values.get(j[0], math.inf), j[0], j[1]))
    search = _Search(tables, backend, deadline, best, _horizon(tables, sizes))
    with quiet_stdout():
        done = search.run(jobs, min(max(QUICK_SHARE * time_limit / len(jobs), 0.05), 2.0), progress)
    best = search.best
    elapsed = time.perf_counter() - start
    closed = all(s.closed for s in done)
    if best is None:
        if closed:
            raise diagnose_infeasible(problem)
        raise InfeasibleError(
            f"no plan that fits memory was found within the time limit of {time_limit:g} s "
            "(infeasibility is not proven); raise the time limit",
            "time_limit",
        )
    value, partition, cost = best
    if closed:
        status, bound = "optimal", value
    else:
        open_bounds = [s.bound_ms for s in done if not s.closed]
        if any(b is None for b in open_bounds):
            status, bound = "timed_out", None
        else:
            status, bound = "feasible", min([value, *open_bounds])  # type: ignore[list-item]
    gap = None if bound is None else max(0.0, (value - bound) / value)
    return MILPResult(
        partition,
        cost,
        status,
        bound,
        gap,
        elapsed,
        backend,
        time_limit,
        warm_ms,
        tuple(done),
    )


def _horizon(tables: _Tables, sizes: list[int]) -> float:
    """An upper bound on any plan's iteration time (bounds the time variables): every
    action of the longest chain at its largest duration, plus the largest all-reduce."""
    problem = tables.problem
    n_dev = tables.n_devices
    worst = 0.0
    for batch in sizes:
        m_count = problem.config.global_batch // batch
        steps = 2 * min(problem.model.num_blocks, n_dev) - 1
        compute = max(
            float(tf[:, 1 : batch + 1].sum(axis=0).max() + tb[:, 1 : batch + 1].sum(axis=0).max())
            for tf, tb in zip(tables.tf, tables.tb, strict=True)
        )
        slowest = max(tables.inv_values) if tables.inv_values else 0.0
        lat = float(np.nanmax(tables.lat)) if tables.inv_values else 0.0
        link = lat + batch * float(tables.boundary.max()) * slowest
        ring = 2.0 * n_dev * (float(tables.grad.sum()) * slowest + lat)
        worst = max(worst, m_count * steps * (compute + 2 * link) + ring)
    return worst * 1.01 + 1.0
