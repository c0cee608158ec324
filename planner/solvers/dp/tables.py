"""The DP's cost tables (as Alpa's ``stage_profiling.py`` builds the tables its
``stage_construction.py`` reads): per device class, the blocks' time, memory and network
figures; per *composition* g = (g_1..g_K) (g_k devices of class k, :mod:`planner.solvers.dp.graph`),
Algorithm 1's split of every block range (reference/asteroid.md §4.1) and the head figures
the search composes (Eq. 8's E_f, E_b; §3.3's all-reduce T_a; Eq. 3's memory).

Inputs: a :class:`~planner.inputs.problem.Problem`, its
:class:`~planner.cost.model.CostModel` and its device classes
(:func:`planner.solvers.classes.device_classes`: devices of one class have the same times,
memory and network figures, so the tables never name devices).

State: the per-class arrays (built once), and three caches: Algorithm 1's unconstrained
splits per (composition, B), the head tables per (composition, warm-up, B), and the
per-share block prefix sums the bounds read. Head evaluations are computed once per
composition, so 64 identical devices give 64 group sizes, not 2,080 device ranges.

Algorithm 1 (:mod:`planner.solvers.allocation`): a one-class group whose times never fall
with the batch takes the even split in closed form (:meth:`_Tables._even`); where every
class's time strictly grows with the samples, class by class, O(K) per range and move
(:func:`~planner.solvers.allocation.allocate_classes`, from one (K, L^2, B + 1) table of
the classes' times per B); device by device, O(g), on the other ranges. A range whose
unconstrained split does not fit the warm-up is split again under per-device caps.

Complexity: each head table is O(L^2) ranges of Algorithm 1 and figures, filled lazily
(only the ranges a search may use within its bound); memory at most ``BASE_CACHE_BYTES``
+ ``HEAD_CACHE_BYTES`` (:class:`_Cache`; without the cap the ordered graph's groups that
straddle two classes, one state's each, held 4.65 GiB on 512 devices of 8 types).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from edgepipe.planner.cost.formulas import ring_allreduce_ms, samples_that_fit, warmup_that_fits
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.inputs.problem import Problem
from edgepipe.planner.solvers.allocation import allocate, allocate_classes
from edgepipe.planner.solvers.classes import DeviceClass, class_network

#: bytes of Algorithm 1 splits and of head tables kept (:class:`_Cache`; least recently
#: used evicted beyond)
BASE_CACHE_BYTES = 2**28
HEAD_CACHE_BYTES = 2**29

INF = np.inf

#: the warm-up key of a head table that no warm-up binds (:meth:`_Tables.head`); the
#: base figures are kept under -1
UNBOUND = -2


class _Cache(OrderedDict):
    """Tuples of arrays kept while their bytes stay within ``limit``: setting an entry
    evicts the least recently read or set ones beyond it, never the one just set (a
    caller reads it back). Head tables of compositions used once (the ordered graph's
    groups that straddle two classes: one state each) would otherwise pile up, about
    1.3 MB each at 100 blocks, until the micro-batch size is done (4.65 GiB on 512
    devices of 8 types). An evicted entry is recomputed when read again."""

    def __init__(self, limit: float) -> None:
        super().__init__()
        self.limit, self.bytes = limit, 0

    def __getitem__(self, key: object) -> tuple[np.ndarray, ...]:
        self.move_to_end(key)
        return super().__getitem__(key)

    def __setitem__(self, key: object, value: tuple[np.ndarray, ...]) -> None:
        if key in self:
            del self[key]
        super().__setitem__(key, value)
        self.bytes += sum(a.nbytes for a in value)
        while self.bytes > self.limit and len(self) > 1:
            del self[next(iter(self))]

    def __delitem__(self, key: object) -> None:
        self.bytes -= sum(a.nbytes for a in super().__getitem__(key))
        super().__delitem__(key)

    def clear(self) -> None:
        super().clear()
        self.bytes = 0


class _Tables:
    """Per-class block tables and the head evaluations of compositions (cached)."""

    def __init__(self, problem: Problem, cm: CostModel, classes: list[DeviceClass]) -> None:
        self.problem, self.cm, self.classes = problem, cm, classes
        self.n_blk = problem.model.num_blocks
        self.counts = tuple(c.count for c in classes)
        self.fwd = np.stack([cm.fwd[c.type] * c.slowdown for c in classes])
        self.bwd = np.stack([cm.bwd[c.type] * c.slowdown for c in classes])
        self.fb = self.fwd + self.bwd
        #: per class the runtime's forward / backward ms per micro-batch on a used device
        #: (CostModel.device_times; docs/lab.md "Runtime work per action"); the
        #: bounds leave it out, so they stay lower bounds
        self.work_f = np.array([cm.work[c.type][0] * c.slowdown for c in classes])
        self.work_b = np.array([cm.work[c.type][1] * c.slowdown for c in classes])
        self.budget = np.array([c.budget for c in classes])
        self.bw, self.lat = class_network(cm, classes)
        #: the fastest pair's rate and the least latency (the relaxed bounds' links)
        pairs = np.isfinite(self.bw)
        self.bw_max = float(self.bw[pairs].max()) if pairs.any() else INF
        self.lat_min = float(self.lat[pairs].min()) if pairs.any() else 0.0
        self.topology = problem.cluster.network.kind
        #: per class, whether every block's forward and backward times never fall as the
        #: batch grows (then even splits are Algorithm 1's and dominate: planner.solvers.dp.graph)
        self.monotone = [
            bool((np.diff(np.diff(f, axis=0), axis=1) >= 0).all())
            and bool((np.diff(np.diff(b, axis=0), axis=1) >= 0).all())
            for f, b in zip(self.fwd, self.bwd, strict=True)
        ]
        first, end = np.triu_indices(self.n_blk + 1, k=1)
        self.rows_first, self.rows_end = first, end
        self.static = cm.state_factor * (cm.param_prefix[end] - cm.param_prefix[first])
        self.saved = cm.saved_prefix[end] - cm.saved_prefix[first]
        self.grad = cm.param_prefix[end] - cm.param_prefix[first]
        size, big_l = self.n_blk + 1, self.n_blk
        #: dense [l, l'] tables of the range [L-l, L-l'): static bytes, saved bytes per
        #: sample, and the bytes of its ring replica (planner.replan.replicas; 0 when ring
        #: replication is off)
        self.dense_static, self.dense_saved, self.dense_replica = (
            np.zeros((size, size)) for _ in range(3)
        )
        at = (big_l - first, big_l - end)
        self.dense_static[at], self.dense_saved[at] = self.static, self.saved
        #: [l, l'] the index of the block range [L-l, L-l') among the ranges (-1 where
        #: l' >= l)
        self.range_at = np.full((size, size), -1, dtype=np.int64)
        self.range_at[at] = np.arange(len(first))
        if problem.config.replicated:
            self.dense_replica[at] = [
                cm.replica_bytes(int(a), int(b)) for a, b in zip(first, end, strict=True)
            ]
        self.comps: list[tuple[int, ...]] = []
        self.comp_id: dict[tuple[int, ...], int] = {}
        self._base: _Cache = _Cache(BASE_CACHE_BYTES)
        self._tables: _Cache = _Cache(HEAD_CACHE_BYTES)
        self._prefix: dict[tuple[int, str], np.ndarray] = {}
        self._curve: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._least: dict[tuple[tuple[int, ...], int], np.ndarray] = {}
        #: per (composition, B) the least deepest warm-up over all ranges (:meth:`head`)
        self._deepest: dict[tuple[int, int], float] = {}
        #: Z per (B, M, K(1)), kept by :mod:`planner.solvers.dp.bounds` (its ``z_bound`` and
        #: ``relaxed_tables`` give the same)
        self.z_cache: dict[tuple[int, int, int], float] = {}

    def comp(self, g: tuple[int, ...]) -> int:
        if g not in self.comp_id:
            self.comp_id[g] = len(self.comps)
            self.comps.append(g)
        return self.comp_id[g]

    def masks(self) -> np.ndarray:
        """(compositions + 1, K) classes present in each composition; last row empty."""
        out = np.zeros((len(self.comps) + 1, len(self.classes)), dtype=bool)
        for i, g in enumerate(self.comps):
            out[i] = np.array(g) > 0
        return out

    def clear(self) -> None:
        self._base.clear()
        self._tables.clear()
        self._curve.clear()
        self._deepest.clear()

    def slots(self, g: tuple[int, ...]) -> np.ndarray:
        """Class of each device slot of composition g (class order)."""
        return np.repeat(np.arange(len(g)), g)

    # -- Algorithm 1 ---------------------------------------------------------------------
    def _even(self, k: int, size: int, batch: int) -> np.ndarray:
        """Samples of ``size`` devices of one class splitting ``batch`` evenly (the first
        ``batch mod size`` take one more): Algorithm 1's split for identical devices
        whose times never fall with the batch (its offloading never moves a sample)."""
        y = np.full(size, batch // size, dtype=np.int64)
        y[: batch % size] += 1
        return y

    def unconstrained(
        self, cid: int, batch: int, rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, ...]:
        """Algorithm 1 for composition ``cid`` on the block ranges ``rows`` (default
        all), memory ignored: samples, feasibility and the deepest warm-up each range
        fits (Eq. 3 for K), as arrays over every range of which only the ranges asked
        for so far are filled (Algorithm 1 splits each range independently of the
        others, so a range's split does not depend on which were asked for with it)."""
        key = (cid, batch)
        g = self.comps[cid]
        slot = self.slots(g)
        n_rows = len(self.rows_first)
        if key not in self._base:
            if self._even_split(cid):  # the closed form, every range at once
                y = np.tile(self._even(int(slot[0]), len(slot), batch), (n_rows, 1))
            else:
                y = np.empty((n_rows, len(slot)), dtype=np.int64)
            # nothing caps a split: all B are placed; depths filled with the splits
            done = np.zeros(n_rows, dtype=bool)
            self._base[key] = (y, np.ones(n_rows, dtype=bool), np.full(n_rows, INF), done)
        entry = self._base[key]
        y, _, depth, done = entry
        todo = np.flatnonzero(~done) if rows is None else rows[~done[rows]]
        if len(todo):
            if not self._even_split(cid):
                # Algorithm 1 class by class on the ranges where every class's time
                # strictly grows with the samples, device by device on the others
                present = np.flatnonzero(g)
                curves, strict = self._curves(batch)
                by_class = strict[present][:, todo].all(axis=0)
                y[todo[by_class]] = allocate_classes(
                    curves, present, np.array(g)[present], todo[by_class], batch
                )
                rest = todo[~by_class]
                if len(rest):
                    y[rest], _ = allocate(
                        self.fb[slot], self.rows_first[rest], self.rows_end[rest], batch,
                        np.full((len(rest), len(slot)), batch),
                    )  # fmt: skip
            at = warmup_that_fits(
                self.budget[slot][None, :], self.static[todo, None], y[todo],
                self.saved[todo, None],
            )  # fmt: skip
            depth[todo] = np.where(y[todo] > 0, at, INF).min(axis=1)
            done[todo] = True
            self._base[key] = entry  # set again: filling may have evicted it
        return entry[:3]

    def _even_split(self, cid: int) -> bool:
        """Whether composition ``cid`` is one class whose times never fall with the batch
        (:meth:`_even` is then its Algorithm 1 split)."""
        g = self.comps[cid]
        return np.count_nonzero(g) == 1 and self.monotone[int(np.flatnonzero(g)[0])]

    def _curves(self, batch: int) -> tuple[np.ndarray, np.ndarray]:
        """(K, ranges, B + 1) forward+backward time of one device of each class on each
        block range at y = 0..B samples, and (K, ranges) whether it strictly grows with
        y (:func:`~planner.solvers.allocation.allocate_classes`' precondition); one table for
        every composition of the micro-batch size (cached until :meth:`clear`)."""
        if batch not in self._curve:
            fb = self.fb[:, :, : batch + 1]
            # C order: allocate_classes reads it flat (a view only when contiguous; the
            # fancy index leaves the ranges' axis outermost, so each call copied it)
            curves = np.ascontiguousarray(fb[:, self.rows_end] - fb[:, self.rows_first])
            self._curve[batch] = (curves, np.asarray((np.diff(curves, axis=2) > 0).all(axis=2)))
        return self._curve[batch]

    def allocation(
        self, cid: int, rows: np.ndarray, warmup: int, batch: int, by_slot: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """Algorithm 1 for composition ``cid`` over ``rows`` (indices into the block
        ranges): the memory-unconstrained split where it fits ``warmup``, else the split
        under per-device caps. Returns (samples per slot, feasible). The unconstrained
        split may order a class's devices otherwise than :func:`allocate` (the same
        samples per class: :func:`allocate_classes`); ``by_slot`` gives allocate's own
        order (a plan being written down)."""
        base_y, base_ok, depth = self.unconstrained(cid, batch, rows)
        y, ok = base_y[rows].copy(), base_ok[rows].copy()
        slot = self.slots(self.comps[cid])
        caps = np.full((len(rows), len(slot)), batch)
        redo = np.flatnonzero(depth[rows] < warmup)
        if len(redo):
            caps[redo] = samples_that_fit(
                self.budget[slot][None, :],
                self.static[rows[redo]][:, None],
                warmup,
                self.saved[rows[redo]][:, None],
                batch,
            )
        if by_slot and not self._even_split(cid):
            redo = np.arange(len(rows))
        if len(redo):
            first, end = self.rows_first[rows[redo]], self.rows_end[rows[redo]]
            y[redo], ok[redo] = allocate(self.fb[slot], first, end, batch, caps[redo])
        return y, ok

    def _figures(self, cid: int, rows: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, ...]:
        """E_f, E_b (Eq. 8) and T_a (§3.3) of the ranges ``rows`` on composition ``cid``
        with samples y per slot. E_f and E_b are maxima over the devices; on a row where
        each class's samples fall by at most one along its slots (as the class by class
        split writes them), the class's first and last slot hold every value it has, so
        only those are read (O(classes) instead of O(devices) per row, each slot once)."""
        g = self.comps[cid]
        slot = self.slots(g)
        first, end = self.rows_first[rows], self.rows_end[rows]
        edges = np.cumsum(g)[np.array(g) > 0]
        ends = np.concatenate([edges - np.array(g)[np.array(g) > 0], edges - 1])
        inner = np.ones(len(slot) - 1, dtype=bool)
        inner[edges[:-1] - 1] = False  # the steps between slots of one class
        spread = y[:, ends[: len(edges)]] - y[:, ends[len(edges) :]]
        two = ((np.diff(y, axis=1) <= 0) | ~inner).all(axis=1) & (spread <= 1).all(axis=1)
        ef, eb = np.empty(len(rows)), np.empty(len(rows))
        # a class of one device has one end slot: read once (a maximum, so exact)
        for part, cols in ((two, np.unique(ends)), (~two, np.arange(len(slot)))):
            k, at, y_at = slot[cols][None, :], np.flatnonzero(part), y[part][:, cols]
            f_at, e_at = first[at][:, None], end[at][:, None]
            wf, wb = (np.where(y_at > 0, w[k], 0.0) for w in (self.work_f, self.work_b))
            ef[at] = (self.fwd[k, e_at, y_at] - self.fwd[k, f_at, y_at] + wf).max(1, initial=-INF)
            eb[at] = (self.bwd[k, e_at, y_at] - self.bwd[k, f_at, y_at] + wb).max(1, initial=-INF)
        used = y > 0
        # pairs of used devices, counted per class: a pair of classes (a, b) occurs when
        # both have a used device, (a, a) when a has two
        per_class = used.astype(np.int64) @ (slot[:, None] == np.arange(len(self.counts)))
        present = per_class >= 1
        pair = present[:, :, None] & present[:, None, :]
        pair &= ~np.eye(len(self.counts), dtype=bool)[None] | (per_class >= 2)[:, :, None]
        bw_min = np.where(pair, self.bw[None], INF).min(axis=(1, 2))
        lat_max = np.where(pair, self.lat[None], 0.0).max(axis=(1, 2))
        ta = ring_allreduce_ms(self.grad[rows], used.sum(1), bw_min, lat_max, self.cm.shared_medium)
        return ef, eb, ta

    def head(self, cid: int, warmup: int, batch: int, rows: np.ndarray | None = None) -> np.ndarray:
        """One (7, L+1, L+1) array indexed [figure, l, l'] for the head holding blocks
        [L-l, L-l') on composition ``cid`` with ``warmup`` micro-batches in flight: the
        figures c = E_f + E_b, E_b, T_a, the largest per-device samples Y, the
        ring-replica holder's usable memory and samples, and the number of devices with
        samples (inf where infeasible or l' >= l); stacked, so that the search gathers
        a window of all seven in one read. Only the block ranges ``rows`` (indices into
        the ranges; default all) and those asked for before are filled, the others read
        inf: a caller reads only what it asked for, or cells whose candidates it drops
        whatever their figures (:meth:`planner.solvers.dp.search._BatchSearch._moves`).

        A whole table (``rows`` None) whose every range fits its unconstrained split at
        ``warmup`` (Algorithm 1's deepest warm-up ``depth`` >= ``warmup`` on all ranges)
        is the same array at every such warm-up: no range is split again under caps, so
        every figure is the unconstrained split's. It is kept once per (composition, B)
        under the warm-up ``UNBOUND`` and returned for each of them (the exact levels of
        a small chain read one table instead of one per level: session 21,
        docs/decisions.md). Tables asked for in part keep one per warm-up: which of
        their cells are filled depends on what was asked at that warm-up."""
        n_rows = len(self.rows_first)
        key = (cid, warmup, batch)
        if rows is None and key not in self._tables:
            if (cid, batch) not in self._deepest:  # every range: the split is complete
                self._deepest[cid, batch] = float(self.unconstrained(cid, batch)[2].min())
            if self._deepest[cid, batch] >= warmup:
                key = (cid, UNBOUND, batch)
        size = self.n_blk + 1
        if key not in self._tables:
            self._tables[key] = (np.full((7, size, size), INF), np.zeros(n_rows, dtype=bool),
                                 np.zeros(1, dtype=np.int64))  # fmt: skip
        entry = self._tables[key]
        out, done, filled = entry  # filled: how many ranges are done
        if filled[0] == n_rows:
            return out
        todo = np.flatnonzero(~done) if rows is None else rows[~done[rows]]
        if not len(todo):
            return out
        base_key = (cid, -1, batch)
        if base_key not in self._tables:
            empty = (np.empty(n_rows) for _ in range(3))
            self._tables[base_key] = (*empty, np.zeros(n_rows, dtype=bool))
        base = self._tables[base_key]
        base_y, _, depth = self.unconstrained(cid, batch, todo)
        fresh = todo[~base[3][todo]]
        if len(fresh):
            for v, values in zip(base[:3], self._figures(cid, fresh, base_y[fresh]), strict=True):
                v[fresh] = values
            base[3][fresh] = True
            self._tables[base_key] = base  # set again: filling may have evicted it
        ef, eb, ta = (v[todo] for v in base[:3])
        y, ok = self.allocation(cid, todo, warmup, batch)
        redo = np.flatnonzero(depth[todo] < warmup)
        if len(redo):
            ef[redo], eb[redo], ta[redo] = self._figures(cid, todo[redo], y[redo])
        at = (self.n_blk - self.rows_first[todo], self.n_blk - self.rows_end[todo])
        # the ring-replica holder (planner.replan.replicas: the used device of largest usable
        # memory; among those the one with most samples, the least free memory)
        budget = np.where(y > 0, self.budget[self.slots(self.comps[cid])][None, :], -INF)
        hold_budget = budget.max(axis=1)
        hold_y = np.where(budget == hold_budget[:, None], y, -1).max(axis=1)
        used = (y > 0).sum(axis=1)
        for i, values in enumerate((ef + eb, eb, ta, y.max(axis=1), hold_budget, hold_y, used)):
            out[i][at] = np.where(ok, values, INF)
        done[todo] = True
        filled[0] = np.count_nonzero(done)
        self._tables[key] = entry  # set again: filling may have evicted it
        return out

    def head_bound(self, cid: int, batch: int) -> np.ndarray:
        """(L+1, L+1) [l, l']: a lower bound on c = E_f + E_b of the head [L-l, L-l') on
        composition ``cid`` (inf where l' >= l), without Algorithm 1: some device of the
        g has at least s = ceil(B / g) samples (all B are placed), and c >= E_f + E_b of
        that one device >= its class's summed least time of the blocks at any batch >= s
        (the least over the composition's classes). O(K L^2), cached per (classes,
        share)."""
        g = self.comps[cid]
        present = tuple(int(k) for k in np.flatnonzero(g))
        share = -(-batch // sum(g))
        key = (present, share)
        if key not in self._least:
            per_block = np.diff(self.fb[list(present)], axis=1)[:, :, share:].min(axis=2)
            cum = np.concatenate([np.zeros((len(present), 1)), per_block.cumsum(axis=1)], 1)
            big_l = self.n_blk
            blocks = big_l - np.arange(big_l + 1)  # l -> the first block L - l
            least = (cum[:, blocks[None, :]] - cum[:, blocks[:, None]]).min(axis=0)
            self._least[key] = np.where(self.range_at >= 0, least, INF)
        return self._least[key]

    def drop_warmups(self, keep: int) -> None:
        """Forget head tables of warm-ups other than ``keep`` (one level at a time); the
        base figures and the tables of no binding warm-up (``UNBOUND``, :meth:`head`)
        stay, as every level may read them."""
        for key in [k for k in self._tables if k[1] not in (-1, UNBOUND, keep)]:
            del self._tables[key]

    def carried(self, batch: int, share: int) -> int:
        """The fewest samples per micro-batch a boundary's busiest channel carries when
        the sending stage's group has ``share`` = ceil(B / g) samples per device: that
        share on a switch (the sender's busiest port), ceil(B / N) point to point (the
        least piece), all B on a shared medium."""
        if self.topology == "switched":
            return share
        if self.topology == "shared_medium":
            return batch
        return -(-batch // sum(self.counts))

    def share_prefix(self, share: int, part: str = "fb") -> np.ndarray:
        """(L + 1,) prefix sums of each block's least c = E_f + E_b (``part`` "fb"), E_f
        ("f") or E_b ("b") on any class at any batch >= ``share`` (cached)."""
        key = (share, part)
        if key not in self._prefix:
            table = {"fb": self.fb, "f": self.fwd, "b": self.bwd}[part]
            per_block = np.diff(table, axis=1)[:, :, share:].min(axis=(0, 2))
            self._prefix[key] = np.concatenate([[0.0], np.cumsum(per_block)])
        return self._prefix[key]
