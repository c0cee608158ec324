"""The feasibility DP behind :func:`planner.solvers.exact.bounds.program_bounds` (its
docstring has the stage terms, the recurrence and the complexity): the class groups the
DP keeps apart (:func:`bound_groups`), the stage compositions over them
(:func:`compositions`) and, per micro-batch size, the tables and the DP itself
(:class:`StageBounds`: is every stage term of some partition into P stages <= T?)."""

from __future__ import annotations

import itertools
import math

import numpy as np
from edgepipe.planner.cost.formulas import samples_that_fit
from edgepipe.planner.solvers.exact.tables import Tables, stage_orders
from edgepipe.planner.solvers.time_limit import Deadline

#: the class-vector DP of :func:`planner.solvers.exact.bounds.program_bounds` keeps at
#: most about this many (state, stage composition) pairs; classes of similar speed merge
#: until it fits
BOUND_STATES = 8192


def bound_groups(tables: Tables, batch: int, most: int = BOUND_STATES) -> list[list[int]]:
    """The classes :func:`planner.solvers.exact.bounds.program_bounds` keeps apart:
    groups of classes (indices into ``tables.classes``), in order of speed (least
    per-sample time over the whole model, y <= ``batch``). The bound's DP state counts
    the devices used per group, so it has prod(count_j + 1) states and a stage one of
    the group compositions (g_j <= count_j, 1 <= sum g_j <= min(B, N)); while their
    product exceeds ``most`` (default :data:`BOUND_STATES`), the two adjacent groups of
    the closest speeds merge (a merged group counts its devices together and prices them
    at its fastest member's times: a relaxation). One group is the device-count DP.
    O(K^2 + most)."""
    classes = tables.classes
    ys = np.arange(1, batch + 1)
    speed = [
        float(((tf[:, 1 : batch + 1] + tb[:, 1 : batch + 1]).sum(axis=0) / ys).min())
        for tf, tb in zip(tables.tf, tables.tb, strict=True)
    ]
    groups = [[k] for k in sorted(range(len(classes)), key=lambda k: speed[k])]
    gmax = min(batch, tables.n_devices)

    def size(parts: list[list[int]]) -> float:
        counts = [sum(classes[k].count for k in part) for part in parts]
        states = math.prod(c + 1 for c in counts)
        if len(parts) == 1 or states > most:
            return states * (gmax if len(parts) == 1 else most)
        return states * len(compositions(counts, gmax))

    while len(groups) > 1 and size(groups) > most:
        i = min(
            range(len(groups) - 1),
            key=lambda i: speed[groups[i + 1][0]] / max(speed[groups[i][-1]], 1e-300),
        )
        groups[i : i + 2] = [groups[i] + groups[i + 1]]
    return groups


def compositions(counts: list[int], most: int) -> list[tuple[int, ...]]:
    """Every (g_1 .. g_J) with 0 <= g_j <= counts[j] and 1 <= sum <= ``most``."""
    return [g for g in itertools.product(*(range(c + 1) for c in counts)) if 1 <= sum(g) <= most]


class StageBounds:
    """The tables and the feasibility DP of
    :func:`planner.solvers.exact.bounds.program_bounds` for one micro-batch size (its
    docstring has the terms, the recurrence and the complexity); built once, then
    :meth:`feasible` answers "is every stage term of some partition into P stages <= T?"
    for several (P, T) at a time. Building stops with ``TimeoutError`` once ``deadline``
    passes (checked before each first block of a stage: O(L) pairs of work apart)."""

    def __init__(
        self, tables: Tables, batch: int, max_stages: int, deadline: Deadline | None = None
    ) -> None:
        problem, cm = tables.problem, tables.cm
        self.n_blocks = n_blocks = tables.n_blocks
        self.max_stages = max_stages
        self.problem, self.batch = problem, batch
        m_count = problem.config.global_batch // batch
        gmax = min(batch, tables.n_devices)
        cols = slice(1, batch + 1)
        ys = np.arange(1, batch + 1, dtype=float)
        zero = np.zeros((1, batch))
        groups = bound_groups(tables, batch)
        counts = [sum(tables.classes[k].count for k in grp) for grp in groups]
        comps = np.array(compositions(counts, gmax), dtype=np.int64).reshape(-1, len(groups))
        present = comps > 0
        size = comps.sum(axis=1)  # g of each composition
        radix = np.cumprod([1, *(c + 1 for c in counts[:-1])])
        self.n_states = n_states = math.prod(c + 1 for c in counts)
        digits = (np.arange(n_states)[:, None] // radix[None, :]) % (np.array(counts) + 1)
        offset = (comps @ radix)[None, :]
        # state s - g (the state before a stage of composition g) and s + g (after)
        self.back_ok = (digits[:, None, :] >= comps[None, :, :]).all(axis=2)
        self.back = np.where(self.back_ok, np.arange(n_states)[:, None] - offset, 0)
        ahead_ok = (digits[:, None, :] + comps[None, :, :] <= np.array(counts)).all(axis=2)
        ahead = np.where(ahead_ok, np.arange(n_states)[:, None] + offset, 0)
        k_div, r_mod = np.divmod(batch, size)
        ybar = (r_mod * (k_div + 1.0) ** 2 + (size - r_mod) * k_div**2.0) / batch

        def prefix(tables_k: list[np.ndarray]) -> list[np.ndarray]:
            return [np.vstack([zero, np.cumsum(t[:, cols], axis=0)]) for t in tables_k]

        def mean(s: np.ndarray, least: np.ndarray) -> np.ndarray:
            """mean(s, l) of the docstring per composition, from per-group s and l."""
            with np.errstate(divide="ignore", invalid="ignore"):
                rate = np.where(present, comps / np.where(s > 0, s, 0.0)[None, :], 0.0)
                frac = batch / rate.sum(axis=1)
            fastest = np.where(present, s[None, :], np.inf).min(axis=1)
            return np.maximum(np.maximum(frac, ybar * fastest),
                              np.where(present, least[None, :], np.inf).min(axis=1))  # fmt: skip

        fwd_prefix, bwd_prefix = prefix(tables.tf), prefix(tables.tb)
        least_f = np.min([tf[:, cols].min(axis=1) for tf in tables.tf], axis=0)
        self.pre_f = np.concatenate([[0.0], np.cumsum(least_f)])
        bnd = np.asarray(tables.boundary, dtype=float)
        self.cut_hop = tables.lat_lo + tables.v_lo * bnd
        self.hop_min = float(self.cut_hop[:-1].min(initial=np.inf)) if n_blocks > 1 else 0.0
        grad_prefix = np.concatenate([[0.0], np.cumsum(tables.grad)])
        budgets = [max(tables.classes[k].budget for k in grp) for grp in groups]
        warmup = m_count if problem.config.schedule == "gpipe" else 1
        ring_steps = 2.0 * (size - 1.0)
        # per first block a: the stage ends b (> a) that fit memory, and per (b,
        # composition) the stage's work, fill contribution, ring and sent terms and its
        # mean forward and backward, shape (len(ends), G)
        self.stages: dict[int, tuple[np.ndarray, ...]] = {}
        rho = np.inf
        for a in range(n_blocks):
            if deadline is not None and deadline.passed():
                raise TimeoutError
            rows = []
            for b in range(a + 1, n_blocks + 1):
                fit = np.array([
                    samples_that_fit(budget, cm.static_bytes(a, b), warmup,
                                     cm.saved_bytes(a, b), batch)
                    for budget in budgets
                ])  # fmt: skip
                room = np.where(present, comps * fit[None, :], 0).sum(axis=1)
                usable = (room >= batch) & ~(present & (fit[None, :] < 1)).any(axis=1)
                if not usable.any():
                    continue
                span_f = np.array([w[b] - w[a] for w in fwd_prefix])  # (K, B) per class
                span_b = np.array([w[b] - w[a] for w in bwd_prefix])
                figures = []
                for span in (span_f, span_b, span_f + span_b):
                    per_sample = (span / ys).min(axis=1)
                    least = span.min(axis=1)
                    figures.append((np.array([per_sample[grp].min() for grp in groups]),
                                    np.array([least[grp].min() for grp in groups])))  # fmt: skip
                (s_f, l_f), (s_b, l_b), (s_t, l_t) = figures
                for num, den in ((s_f, s_b), (l_f, l_b)):
                    with np.errstate(divide="ignore", invalid="ignore"):
                        ratio = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.inf)
                    rho = min(rho, float(ratio.min()))
                w = np.where(usable, m_count * mean(s_t, l_t), np.inf)
                mean_f, mean_b = mean(s_f, l_f), mean(s_b, l_b)
                chunk = (grad_prefix[b] - grad_prefix[a]) / size
                ring = ring_steps * (chunk * tables.v_lo + tables.lat_lo)
                crossing = float(bnd[b - 1] if b < n_blocks else 0.0) + (bnd[a - 1] if a else 0.0)
                if tables.topology == "switched":
                    sent = (m_count * batch * crossing / size + ring_steps * chunk) * tables.v_lo
                elif tables.topology == "shared_medium":
                    sent = (m_count * batch * crossing + ring_steps * chunk * size) * tables.v_lo
                else:
                    sent = np.zeros(len(comps))
                mean_f = np.where(usable, mean_f, np.inf)
                rows.append((b, w, mean_f + mean_b, ring, sent, mean_f, mean_b))
            if rows:
                self.stages[a] = tuple(np.array(x) for x in zip(*rows, strict=True))
        self.alpha = rho / (1.0 + rho) if math.isfinite(rho) else 1.0
        # suffix[r, b, s]: the least fill of r stages over blocks [b, L) with the devices
        # state s leaves (a min-sum DP backwards), what the round-trip branch adds
        suffix = np.full((max_stages + 1, n_blocks + 1, n_states), np.inf)
        suffix[0, n_blocks] = 0.0
        for r in range(1, max_stages + 1):
            if deadline is not None and deadline.passed():
                raise TimeoutError
            for a, (ends, _, fill, *_) in self.stages.items():
                later = suffix[r - 1][ends.astype(int)]  # (E, S)
                cand = np.where(ahead_ok[None], later[:, ahead] + fill[:, None, :], np.inf)
                suffix[r, a] = cand.min(axis=(0, 2))
        self.suffix = suffix
        self._pairs: dict[int, np.ndarray] = {}

    def pairs(self, num_stages: int) -> np.ndarray:
        """Per stage q of a P-stage schedule the (forwards, backwards) a device runs up
        to and including F(m) and from B(m) on, for every micro-batch m, Pareto-maximal
        ones only, padded with (0, 0): shape (P, most, 2)."""
        if num_stages not in self._pairs:
            per_stage = []
            for acts in stage_orders(self.problem, self.batch, num_stages):
                kinds = np.array([k == "F" for k, _ in acts])
                f_before = np.cumsum(kinds)  # forwards up to and including position i
                b_before = np.cumsum(~kinds)
                pos = {a: i for i, a in enumerate(acts)}
                found = set()
                for kind, m in acts:
                    if kind != "F" or ("B", m) not in pos:
                        continue
                    i, j = pos["F", m], pos["B", m]
                    f_from = int(f_before[-1] - (f_before[j - 1] if j else 0))
                    b_from = int(b_before[-1] - (b_before[j - 1] if j else 0))
                    found.add((int(f_before[i]) + f_from, int(b_before[i]) + b_from))
                top = [x for x in found if not any(y != x and y[0] >= x[0] and y[1] >= x[1]
                                                   for y in found)]  # fmt: skip
                per_stage.append(top or [(0, 0)])
            most = max(len(x) for x in per_stage)
            arr = np.zeros((num_stages, most, 2))
            for q, top in enumerate(per_stage):
                arr[q, : len(top)] = top
            self._pairs[num_stages] = arr
        return self._pairs[num_stages]

    def feasible(self, targets: list[int], limit: np.ndarray, deadline: Deadline) -> np.ndarray:
        """Per target P (with its T in ``limit``): does a partition into P stages have
        every stage term <= T? One DP pass over the layers p = 1 .. max(targets).

        Raises:
            TimeoutError: ``deadline`` passed."""
        n_blocks, alpha = self.n_blocks, self.alpha
        ok = np.zeros(len(targets), dtype=bool)
        want = np.array(targets)
        t_col = limit[:, None, None]
        start = np.where(np.arange(self.n_states) == 0, 0.0, np.inf)
        prev = {0: np.repeat(start[None, :], len(targets), axis=0)}
        schedules = {t: self.pairs(t) for t in set(targets)}
        most = max(x.shape[1] for x in schedules.values())
        for p in range(1, max(targets) + 1):
            if deadline.passed():
                raise TimeoutError
            q = p - 1
            # per target row: its stage q's schedule pairs, remaining stages, cuts
            pairs = np.zeros((len(targets), most, 2))
            for i, t in enumerate(targets):
                if q < t:
                    pairs[i, : schedules[t].shape[1]] = schedules[t][q]
            left = np.clip(want - p, 0, None)
            cuts = np.maximum(want - 1, 0)
            cur: dict[int, np.ndarray] = {}
            for a, c_prev in prev.items():
                if a not in self.stages:
                    continue
                ends, w, fill, ring, sent, mean_f, mean_b = self.stages[a]
                ends_i = ends.astype(int)
                hops = (q - 1) * self.hop_min + float(self.cut_hop[a - 1]) if q else 0.0
                branch = np.maximum(hops + w + ring, hops + sent)  # (E, G)
                # C_prev + 2 hops + w <= T; max(pre_f, alpha C_prev) + branch <= T
                cap = t_col - 2 * hops - w
                if alpha > 0:
                    cap = np.minimum(cap, (t_col - branch) / alpha)
                cap = np.where(self.pre_f[a] + branch <= t_col, cap, -np.inf)  # (T, E, G)
                # round trip: C_prev + suffix + max_m (alpha_m f + beta_m b) + hops <= T
                exact = int(a > 0) + (ends_i < n_blocks).astype(int)  # cuts priced exactly
                after = np.where(ends_i < n_blocks, self.cut_hop[np.clip(ends_i - 1, 0, None)], 0.0)
                before = float(self.cut_hop[a - 1]) if a else 0.0
                trip_hops = 2.0 * (
                    (cuts[:, None] - exact[None, :]) * self.hop_min + before + after[None, :]
                )  # (T, E)
                with np.errstate(invalid="ignore"):  # 0 x inf: a composition that cannot fit
                    runs = pairs[:, :, 0, None, None] * mean_f + pairs[:, :, 1, None, None] * mean_b
                chain = runs.max(axis=1)  # (T, E, G)
                trip = self.suffix[left[:, None], ends_i[None, :]]  # (T, E, S)
                cap_trip = (t_col[:, :, :, None] - trip[:, :, :, None]
                            - (chain + trip_hops[:, :, None])[:, :, None, :])  # fmt: skip
                gathered = np.where(self.back_ok, c_prev[:, self.back], np.inf)  # (T, S, G)
                limit_all = np.minimum(cap[:, :, None, :], cap_trip)  # (T, E, S, G)
                grown = gathered[:, None] + fill[None, :, None, :]
                grown = np.where(gathered[:, None] <= limit_all, grown, np.inf)
                best = grown.min(axis=3)  # (T, E, S)
                for e, b in enumerate(ends_i):
                    cur[b] = best[:, e] if b not in cur else np.minimum(cur[b], best[:, e])
            if n_blocks in cur:
                ok |= (want == p) & np.isfinite(cur[n_blocks]).any(axis=1)
            prev = {b: v for b, v in cur.items() if b < n_blocks}
            if not prev:
                break
        return ok

