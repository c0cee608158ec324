"""Asteroid's planning DP (Algorithm 2, reference/asteroid.md §4.2) with exact composition.

Inputs: a :class:`~planner.problem.Problem` (L blocks, N devices, global batch G, micro-
batch candidates). Devices are ordered by usable memory (descending), then effective
speed (descending), then id, so early stages - which keep the most micro-batches in
flight - get the largest memories; every stage group is a contiguous run of that order.

For each micro-batch size B (M = G / B micro-batches):

State: Q(p, l, n) for the suffix plan putting the last l blocks into p stages on the last n
devices D[N-n..N-1]; the suffix's head (first stage) starts at device N-n and layer L-l.
Because the head of a p-stage suffix always has 2(p-1) steps after it, its in-flight depth
K = warmup_depth(P-p of P) depends on p only (Asteroid: 2p-1), so memory is checked
locally.

Value: not one number but a small Pareto front of pairs (D, X). By the closed form of
:mod:`planner.cost`, a step chain's round latency is ``D + X`` with
``D = max_c (M c_c + C_c)`` and ``X = max_s (T_a^s - PB_s)``. Prepending a head compute
step (c0 = E_f + E_b, E_b0, T_a0) and the link after it (c1 = 2 E_link) to a suffix
(D, X) gives exactly

    D' = max(M c0, c0 + M c1, c0 + c1 + D)        X' = max(T_a0, X - E_b0 - E_link)

both non-decreasing in D and X, so keeping the (D, X)-Pareto-optimal suffixes makes the
recurrence exact with respect to the cost model (a single best latency per state, as in
the re-implementations, is not: a suffix with lower D + X can lose after composition).
Fronts are capped at ``FRONT`` entries (lowest D + X kept), the one approximation left
besides the two below.

Base: Q(1, l, n) = the head [L-l, L) on devices [N-n, N) alone: D = M c0, X = T_a0.
Transition (p >= 2):
    Q(p, l, n) = Pareto-min over p-1 <= l' < l, p-1 <= n' < n and entries (D, X) of
                 Q(p-1, l', n') of compose(head [L-l, L-l') on [N-n, N-n'), link at L-l')
Answer: the ``RERANK`` lowest D + X over p, n <= N of Q(p, L, n) per B, re-scored by the
exact schedule makespan of the cost model; the best over all B wins, where plans within
``TIE_TOLERANCE`` of the fastest are tied and the simplest of them is taken (fewest stages,
then devices, then smallest B). Devices before N-n
stay idle, and
the head allocation (Algorithm 1, :mod:`planner.allocation`) may also leave a device of a
group with 0 samples.

Where exactness holds: the DP value equals the cost model's figure for the reconstructed
plan when all pair bandwidths and latencies are equal (uniform network): the DP prices a
link by the device *ranges* of the two groups, the cost model by the devices that got
samples; on non-uniform networks the DP value is an upper bound and the returned plan is
re-scored by the cost model. Within its search space (contiguous memory-ordered groups,
Algorithm 1 allocations) the DP is then optimal up to the front cap; the exact solver of
:mod:`planner.milp` searches the larger space.

Complexity per B: O(N^2) head tables, each an Algorithm 1 run over all O(L^2) layer
ranges; O(P N^2 L^2 F) compositions (F = front size) done as numpy array operations, one
Pareto reduction per (p, n) of O(L x N L F log(N L F)).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from planner.allocation import allocate
from planner.cost import (
    CostModel,
    PlanCost,
    ring_allreduce_ms,
    samples_that_fit,
    transfer_ms,
    warmup_that_fits,
)
from planner.errors import InfeasibleError
from planner.partition import Partition, StageAssignment
from planner.problem import Problem

#: Pareto front entries kept per DP state
FRONT = 4

#: answers per micro-batch size re-scored by the exact schedule makespan
RERANK = 8

#: plans within this relative margin of the fastest count as tied; among them the one
#: with fewest stages, then fewest devices, then smallest micro-batch wins
TIE_TOLERANCE = 0.005

INF = np.inf


@dataclass(frozen=True)
class DPResult:
    """The DP's plan, its cost-model figures and search statistics."""

    partition: Partition
    cost: PlanCost
    dp_value_ms: float
    solve_time_s: float
    candidates: dict[int, float]  # micro-batch size -> best predicted iteration ms


def device_order(problem: Problem) -> list[int]:
    """Cluster indices sorted by usable memory desc, effective speed desc, id."""
    cl = problem.cluster
    return sorted(
        range(len(cl.devices)),
        key=lambda i: (
            -cl.budget_bytes(i),
            -cl.type_of(i).effective_gflops / cl.devices[i].slowdown,
            cl.devices[i].id,
        ),
    )


class _Search:
    """State of the DP for one micro-batch size (tables are cached across calls)."""

    def __init__(self, problem: Problem, cm: CostModel, order: list[int]) -> None:
        self.problem, self.cm, self.order = problem, cm, order
        self.n_dev = len(order)
        self.n_blk = problem.model.num_blocks
        types = [cm.device_type[i] for i in order]
        slow = cm.slowdown[order]
        self.fwd = np.stack([cm.fwd[t] * s for t, s in zip(types, slow, strict=True)])
        self.bwd = np.stack([cm.bwd[t] * s for t, s in zip(types, slow, strict=True)])
        self.fb = self.fwd + self.bwd
        self.budget = cm.budget[order]
        bw = cm.bw[np.ix_(order, order)]
        lat = cm.lat[np.ix_(order, order)]
        self.bw, self.lat = bw, lat
        n = self.n_dev
        # range-to-range link figures: group [a, b) to group [b, c)
        self.link_bw = np.full((n + 1, n + 1, n + 1), INF)
        self.link_lat = np.zeros((n + 1, n + 1, n + 1))
        for a in range(n):
            for b in range(a + 1, n):
                rows_bw = bw[a:b].min(axis=0)
                rows_lat = lat[a:b].max(axis=0)
                self.link_bw[a, b, b + 1 :] = np.minimum.accumulate(rows_bw[b:])
                self.link_lat[a, b, b + 1 :] = np.maximum.accumulate(rows_lat[b:])
        first, end = np.triu_indices(self.n_blk + 1, k=1)
        self.rows_first, self.rows_end = first, end
        self.static = cm.state_factor * (cm.param_prefix[end] - cm.param_prefix[first])
        self.saved = cm.saved_prefix[end] - cm.saved_prefix[first]
        self.grad = cm.param_prefix[end] - cm.param_prefix[first]
        self._base: dict[tuple[int, int, int], tuple[np.ndarray, ...]] = {}
        self._tables: dict[tuple[int, int, int, int], tuple[np.ndarray, ...]] = {}

    def clear(self) -> None:
        """Drop the head tables (they are per micro-batch size)."""
        self._base.clear()
        self._tables.clear()

    # -- heads ---------------------------------------------------------------------------
    def _unconstrained(self, a: int, b: int, batch: int) -> tuple[np.ndarray, ...]:
        """Algorithm 1 on devices [a, b) for every layer range, ignoring memory, cached:
        samples, feasibility, and the deepest warm-up each row fits (Eq. 3 solved for K)."""
        key = (a, b, batch)
        if key not in self._base:
            n_rows = len(self.rows_first)
            y, ok = allocate(
                self.fb[a:b], self.rows_first, self.rows_end, batch, np.full((n_rows, b - a), batch)
            )
            depth = warmup_that_fits(
                self.budget[a:b][None, :], self.static[:, None], y, self.saved[:, None]
            )
            depth = np.where(y > 0, depth, INF).min(axis=1)
            self._base[key] = (y, ok, depth)
        return self._base[key]

    def allocation(
        self, a: int, b: int, rows: np.ndarray, warmup: int, batch: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Algorithm 1 for devices [a, b) over ``rows`` (indices into the layer ranges):
        the memory-unconstrained split where it fits ``warmup``, else the split under
        per-device caps. Returns (samples, feasible)."""
        base_y, base_ok, depth = self._unconstrained(a, b, batch)
        y, ok = base_y[rows].copy(), base_ok[rows].copy()
        redo = np.flatnonzero(depth[rows] < warmup)
        if len(redo):
            sub = rows[redo]
            caps = samples_that_fit(
                self.budget[a:b][None, :],
                self.static[sub][:, None],
                warmup,
                self.saved[sub][:, None],
                batch,
            )
            first, end = self.rows_first[rows[redo]], self.rows_end[rows[redo]]
            y[redo], ok[redo] = allocate(self.fb[a:b], first, end, batch, caps)
        return y, ok

    def _figures(self, a: int, b: int, rows: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, ...]:
        """E_f, E_b (Eq. 8) and T_a (§3.3) of the heads ``rows`` on [a, b) with samples y."""
        first, end = self.rows_first[rows], self.rows_end[rows]
        d = np.arange(b - a)[None, :]
        ef = (self.fwd[a:b][d, end[:, None], y] - self.fwd[a:b][d, first[:, None], y]).max(1)
        eb = (self.bwd[a:b][d, end[:, None], y] - self.bwd[a:b][d, first[:, None], y]).max(1)
        used = y > 0
        pair = used[:, :, None] & used[:, None, :] & ~np.eye(b - a, dtype=bool)[None]
        bw_min = np.where(pair, self.bw[a:b, a:b][None], INF).min(axis=(1, 2))
        lat_max = np.where(pair, self.lat[a:b, a:b][None], 0.0).max(axis=(1, 2))
        ta = ring_allreduce_ms(self.grad[rows], used.sum(1), bw_min, lat_max, self.cm.shared_medium)
        return ef, eb, ta

    def head_table(self, a: int, b: int, warmup: int, batch: int) -> tuple[np.ndarray, ...]:
        """Dense (L+1, L+1) arrays over [first, end): c = E_f + E_b, E_b, T_a (inf if
        infeasible) for the head on devices [a, b) with ``warmup`` micro-batches in flight.
        Rows whose unconstrained split fits reuse its figures (computed once per [a, b))."""
        key = (a, b, warmup, batch)
        if key in self._tables:
            return self._tables[key]
        base_key = (a, b, -1, batch)
        all_rows = np.arange(len(self.rows_first))
        if base_key not in self._tables:
            base_y, _, _ = self._unconstrained(a, b, batch)
            self._tables[base_key] = self._figures(a, b, all_rows, base_y)
        ef, eb, ta = (v.copy() for v in self._tables[base_key])
        y, ok = self.allocation(a, b, all_rows, warmup, batch)
        redo = np.flatnonzero(self._unconstrained(a, b, batch)[2] < warmup)
        if len(redo):
            ef[redo], eb[redo], ta[redo] = self._figures(a, b, redo, y[redo])
        size = self.n_blk + 1
        out = []
        for values in (ef + eb, eb, ta):
            dense = np.full((size, size), INF)
            dense[self.rows_first, self.rows_end] = np.where(ok, values, INF)
            out.append(dense)
        self._tables[key] = tuple(out)
        return self._tables[key]


def _pareto(d: np.ndarray, x: np.ndarray, keep: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, indices of the ``keep`` (D, X)-Pareto-optimal candidates with the lowest
    D + X, and whether each slot holds one (rows with fewer Pareto points are padded).

    Selection by repeated argmin: take the alive candidate of least D + X, then drop every
    candidate it dominates (itself included). The pick is never dominated by an alive
    candidate (that one would have a lower or equal sum), so the picks are exactly the
    Pareto points in order of D + X. O(keep x rows x candidates).
    """
    total = d + x
    alive = np.isfinite(total)
    rows = np.arange(len(d))
    chosen = np.zeros((len(d), keep), dtype=np.int64)
    valid = np.zeros((len(d), keep), dtype=bool)
    for j in range(keep):
        pick = np.argmin(np.where(alive, total, INF), axis=1)
        found = alive[rows, pick]
        chosen[:, j], valid[:, j] = pick, found
        if not found.any():
            break
        dominated = (d >= d[rows, pick][:, None]) & (x >= x[rows, pick][:, None])
        alive &= ~(dominated & found[:, None])
        alive[rows, pick] = False
    return chosen, valid


def _compose(
    search: _Search,
    sub: dict[str, np.ndarray],
    n_sub: int,
    a: int,
    warmup: int,
    batch: int,
    m: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Candidates for Q(p, l, n) built on the suffixes Q(p-1, l', n_sub), all l and l'.

    The head runs blocks [L-l, L-l') on devices [a, N-n_sub); its link carries the cut's
    activations to the suffix's head group. Returns (D', X') of shape (L+1, (L+1) x
    FRONT), indexed [l, l' x FRONT + k]; D' is inf where l' >= l or the parts are
    infeasible. Recurrence in the module docstring.
    """
    big_l, big_n = search.n_blk, search.n_dev
    b = big_n - n_sub
    c, eb, ta = search.head_table(a, b, warmup, batch)
    ls = np.arange(big_l + 1)
    rows, cols = (big_l - ls)[:, None], (big_l - ls)[None, :]
    c0, eb0, ta0 = c[rows, cols][:, :, None], eb[rows, cols][:, :, None], ta[rows, cols][:, :, None]
    sub_d, sub_x = sub["D"][:, n_sub, :][None], sub["X"][:, n_sub, :][None]
    head_end = np.clip(big_n - sub["PN"][:, n_sub, :], 0, big_n)
    cut = big_l - ls  # first block of the suffix, per l'
    act = batch * search.cm.boundary[np.clip(cut - 1, 0, big_l - 1)]
    link = transfer_ms(
        act[:, None], search.link_bw[a, b][head_end], search.link_lat[a, b][head_end]
    )[None]
    d_new = np.maximum(np.maximum(m * c0, c0 + 2 * m * link), c0 + 2 * link + sub_d)
    with np.errstate(invalid="ignore"):
        x_new = np.maximum(ta0, sub_x - eb0 - link)
    valid = (ls[None, :] < ls[:, None])[:, :, None] & np.isfinite(sub_d)
    d_new = np.where(valid, d_new, INF)
    return d_new.reshape(big_l + 1, -1), x_new.reshape(big_l + 1, -1)


def _solve_batch(search: _Search, batch: int) -> list[tuple[float, tuple]]:
    """Run the DP for micro-batch size ``batch``; return its ``RERANK`` best answers by
    the closed form as (latency, traceback) pairs, best first (ties: fewer stages, then
    fewer devices)."""
    config = search.problem.config
    big_l, big_n = search.n_blk, search.n_dev
    m = config.global_batch // batch
    max_p = min(big_l, big_n, config.max_stages or big_n)
    shape = (big_l + 1, big_n + 1, FRONT)

    def warmup(p: int) -> int:
        """K of the head of a p-stage suffix: stage P-p of P, the same for every P."""
        return config.warmup_depth(max_p - p, max_p, m)

    def empty_front() -> dict[str, np.ndarray]:
        # D, X; parent l', n' (the suffix's head group ends at device N - n'), slot k
        front = {k: np.full(shape, INF) for k in ("D", "X")}
        front.update({k: np.full(shape, -1, dtype=np.int64) for k in ("PL", "PN", "PK")})
        return front

    fronts: list[dict[str, np.ndarray]] = [{}]
    f1 = empty_front()
    for n in range(1, big_n + 1):
        c, _, ta = search.head_table(big_n - n, big_n, warmup(1), batch)
        f1["D"][1:, n, 0] = m * c[big_l - np.arange(1, big_l + 1), big_l]
        f1["X"][1:, n, 0] = ta[big_l - np.arange(1, big_l + 1), big_l]
        f1["PN"][:, n, 0] = 0
    fronts.append(f1)

    for p in range(2, max_p + 1):
        fp = empty_front()
        for n in range(p, big_n + 1):
            subs = list(range(p - 1, n))
            parts = [
                _compose(search, fronts[p - 1], n_sub, big_n - n, warmup(p), batch, m)
                for n_sub in subs
            ]
            d_all = np.concatenate([d for d, _ in parts], axis=1)
            x_all = np.concatenate([x for _, x in parts], axis=1)
            chosen, ok = _pareto(d_all, np.where(np.isfinite(d_all), x_all, INF), FRONT)
            per_sub = (big_l + 1) * FRONT
            which_sub = chosen // per_sub
            rest = chosen % per_sub
            l_sub, k_sub = rest // FRONT, rest % FRONT
            rows = np.arange(big_l + 1)[:, None]
            n_sub_arr = np.array(subs)[which_sub]
            fp["D"][:, n, :] = np.where(ok, d_all[rows, chosen], INF)
            fp["X"][:, n, :] = np.where(ok, x_all[rows, chosen], INF)
            fp["PL"][:, n, :] = np.where(ok, l_sub, -1)
            fp["PN"][:, n, :] = np.where(ok, n_sub_arr, -1)
            fp["PK"][:, n, :] = np.where(ok, k_sub, -1)
        fronts.append(fp)

    answers = []
    for p in range(1, max_p + 1):
        total = fronts[p]["D"][big_l] + fronts[p]["X"][big_l]  # (n, k)
        for n in range(1, big_n + 1):
            for k in range(FRONT):
                if np.isfinite(total[n, k]):
                    answers.append((float(total[n, k]), p, n, k))
    answers.sort()
    return [(value, (fronts, (p, n, k), max_p)) for value, p, n, k in answers[:RERANK]]


def _reconstruct(search: _Search, batch: int, trace: tuple) -> Partition:
    fronts, (p, n, k), max_p = trace
    problem = search.problem
    m = problem.config.global_batch // batch
    big_l, big_n = search.n_blk, search.n_dev
    devices = problem.cluster.devices
    stages: list[StageAssignment] = []
    l_cur = big_l
    while p >= 1:
        f = fronts[p]
        if p == 1:
            l_sub, n_sub, k_sub = 0, 0, 0
        else:
            l_sub = int(f["PL"][l_cur, n, k])
            n_sub = int(f["PN"][l_cur, n, k])
            k_sub = int(f["PK"][l_cur, n, k])
        a, b = big_n - n, big_n - n_sub
        first, end = big_l - l_cur, big_l - l_sub
        row = np.flatnonzero((search.rows_first == first) & (search.rows_end == end))
        warm = problem.config.warmup_depth(max_p - p, max_p, m)
        y, _ = search.allocation(a, b, row, warm, batch)
        ids, samples = [], []
        for j, count in enumerate(y[0]):
            if count > 0:
                ids.append(devices[search.order[a + j]].id)
                samples.append(int(count))
        stages.append(StageAssignment(first, end, tuple(ids), tuple(samples)))
        p, n, k, l_cur = p - 1, n_sub, k_sub, l_sub
    return Partition(batch, m, tuple(stages))


def plan_dp(problem: Problem, progress: Callable[[int, int], None] | None = None) -> DPResult:
    """Best partition found by the DP over every micro-batch candidate.

    Args:
        problem: the inputs.
        progress: optional ``callback(done, total)`` after each micro-batch candidate.

    Raises:
        InfeasibleError: no candidate fits memory (message names the binding figure).
    """
    result = _best_plan(problem, progress)
    if result is None:
        sizes = problem.config.micro_batch_sizes()
        raise diagnose_infeasible(problem, CostModel(problem, max(sizes)))
    return result


def _best_plan(
    problem: Problem, progress: Callable[[int, int], None] | None = None
) -> DPResult | None:
    """:func:`plan_dp` without the diagnosis: ``None`` when nothing fits."""
    start = time.perf_counter()
    sizes = problem.config.micro_batch_sizes()
    cm = CostModel(problem, max(sizes))
    search = _Search(problem, cm, device_order(problem))
    found: list[tuple[PlanCost, Partition, float]] = []
    per_batch: dict[int, float] = {}
    for i, batch in enumerate(sizes):
        search.clear()
        for value, trace in _solve_batch(search, batch):
            partition = _reconstruct(search, batch, trace)
            cost = cm.evaluate(partition)
            per_batch[batch] = min(per_batch.get(batch, INF), cost.iteration_ms)
            found.append((cost, partition, value))
        if progress is not None:
            progress(i + 1, len(sizes))
    if not found:
        return None
    fastest = min(cost.iteration_ms for cost, _, _ in found)
    cost, partition, value = min(
        (c for c in found if c[0].iteration_ms <= fastest * (1 + TIE_TOLERANCE)),
        key=lambda c: (
            c[1].num_stages,
            len(c[1].used_devices()),
            c[1].micro_batch_size,
            c[0].iteration_ms,
        ),
    )
    return DPResult(partition, cost, value, time.perf_counter() - start, per_batch)


def diagnose_infeasible(problem: Problem, cm: CostModel) -> InfeasibleError:
    """Explain why no plan fits memory: the first violated necessary condition.

    Checks, in order: (1) some block's weights + gradients + optimizer state exceed the
    largest device's usable memory; (2) the whole model's static state exceeds all usable
    memory together; (3) otherwise activations of the in-flight micro-batches bind.
    """
    cluster = problem.cluster
    n = len(cluster.devices)
    budgets = [cluster.budget_bytes(i) for i in range(n)]
    largest = max(range(n), key=lambda i: budgets[i])
    gib = 2**30
    for i, block in enumerate(problem.model.blocks):
        need = cm.static_bytes(i, i + 1)
        if need > budgets[largest]:
            short = need - budgets[largest]
            return InfeasibleError(
                f"memory: block {i} ({block.name}) alone needs {need / gib:.2f} GiB for "
                f"weights, gradients and {problem.config.optimizer} state, but the largest "
                f"device ({cluster.devices[largest].id}) has {budgets[largest] / gib:.2f} GiB "
                f"usable: short by {short / gib:.2f} GiB. Use a device with more memory, "
                "a lighter optimizer (sgd), or a smaller model.",
                "memory",
                short,
            )
    total = cm.static_bytes(0, problem.model.num_blocks)
    if total > sum(budgets):
        short = total - sum(budgets)
        return InfeasibleError(
            f"memory: the model's weights, gradients and {problem.config.optimizer} state "
            f"need {total / gib:.2f} GiB but all devices together have "
            f"{sum(budgets) / gib:.2f} GiB usable: short by {short / gib:.2f} GiB. Add "
            "devices, use a lighter optimizer (sgd), or a smaller model.",
            "memory",
            short,
        )
    smallest = min(problem.config.micro_batch_sizes())
    scale, plan = _memory_scale_to_fit(problem, smallest)
    if plan is None:
        return InfeasibleError(
            "memory: no stage layout fits even with 1000x the devices' memory at "
            f"micro-batch {smallest}; check the profile's byte figures",
            "memory",
            None,
        )
    device, over = max(
        (
            (d, mem - cluster.budget_bytes(cluster.index(d)))
            for stage, sc in zip(plan.partition.stages, plan.cost.stages, strict=True)
            for d, mem in zip(stage.devices, sc.memory_bytes, strict=True)
        ),
        key=lambda t: t[1],
    )
    return InfeasibleError(
        "memory: no stage layout fits; the activations of in-flight micro-batches bind. "
        f"With micro-batch {smallest} the best plan needs {scale:.2f}x the usable memory: "
        f"device {device} is short by {_human_bytes(over)} "
        f"({plan.partition.num_stages} stages). Try smaller micro_batch_candidates, "
        "warmup 'classic' (fewer micro-batches in flight), or more devices.",
        "memory",
        over,
    )


def _human_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def _memory_scale_to_fit(problem: Problem, batch: int) -> tuple[float, DPResult | None]:
    """Smallest factor (to 2%) by which every device's memory must grow for the DP to find
    a plan at micro-batch ``batch``, and that plan (scored on the scaled cluster)."""

    def attempt(factor: float) -> DPResult | None:
        cl = problem.cluster
        devices = tuple(
            replace(d, memory_bytes=cl.memory_bytes(i) * factor) for i, d in enumerate(cl.devices)
        )
        scaled = replace(
            problem,
            cluster=replace(cl, devices=devices),
            config=replace(problem.config, micro_batch_candidates=(batch,)),
        )
        return _best_plan(scaled)

    low, high, found = 1.0, 2.0, attempt(2.0)
    while found is None and high < 1000:
        low, high = high, high * 4
        found = attempt(high)
    if found is None:
        return high, None
    while high / low > 1.02:
        mid = (low * high) ** 0.5
        plan = attempt(mid)
        if plan is None:
            low = mid
        else:
            high, found = mid, plan
    return high, found
