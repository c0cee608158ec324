"""The DP for one micro-batch size over one state graph (as Alpa's
``stage_construction.py`` runs over the tables ``stage_profiling.py`` built): levels of
fronts, the pruning by the bound, the root's answers and their plans.

Inputs: the cost tables (:class:`planner.solvers.dp.tables._Tables`), a state graph
(:mod:`planner.solvers.dp.graph`), B, a deadline, the bound U and the size's relaxed
bounds (:mod:`planner.solvers.dp.bounds`).

State: Q(p, l, r), the front (:mod:`planner.solvers.dp.fronts`) of the suffix plans
putting the last l blocks into p stages on devices drawn from r; its head's warm-up K =
warmup_depth(P-p of P) depends on p only (Asteroid: 2p-1), so memory is checked locally.
Levels collapse: p matters only through K(p), and a head's tables change with K only
where some block range's unconstrained split fits at a depth d with K(p) <= d < K(P)
(Eq. 3 solved for K). From the least p0 beyond every such d, all levels read the same
tables, so they merge into one level holding every stage count >= p0, filled in one pass
over the states in ascending size (a move may then land in the same level). With memory
to spare p0 = 1 and the P levels become one. Levels stay exact when ``max_stages`` caps P
and when P x moves x (L + 1)^2 <= ``EXACT_LEVELS_WORK`` (each exact level contributes its
own answers to the re-scoring, which matters where the closed form misranks plans).

Recurrence (:func:`planner.solvers.dp.recurrence.compose` prices each composition):

    Base: Q(1, l, r) = Pareto-min over moves g of r of the head [L-l, L) on g alone
        (D = M c0, X = T_a0, S = c0, N = 1), and over skips r' of r of Q(1, l, r').
    Transition (p >= 2): Q(p, l, r) = Pareto-min over
        moves r -> r' = r - g, p-1 <= l' < l, entries (D, X) of Q(p-1, l', r'):
            compose(head [L-l, L-l') on g with K(p), link at block L-l' to the entry's
            head group), and skips r -> r': Q(p, l, r').

The link of a head to its suffix is priced from the classes of both groups (slowest pair,
largest latency: Eq. 8), so each entry remembers its head composition. Answer: the
``RERANK`` distinct lowest D + X over p of Q(p, L, all devices) (``RERANK_LEVEL`` per exact
level), reconstructed with devices taken from each class in cluster order and Algorithm
1's device-by-device split of that one stage (the same samples per class as the tables').

Ring replicas (:mod:`planner.replan.replicas`, ``replication_interval`` > 0): a stage run by
one device sends its replica, (1 + k_opt) W bytes (:meth:`CostModel.replica_bytes`), to
the next stage's holder (its used device of largest usable memory; the DP takes, among
those, the one with most samples: the least memory left), and the last stage's to the
first stage's. So each entry carries FREE (usable memory minus Eq. 3 memory at its true K
of its head's holder) and TAIL (the replica its last stage sends to stage 0, 0 when that
stage has several devices); a one-device head is composed onto an entry only if FREE >=
its replica, and a complete plan (l = L) only if the head's own FREE >= TAIL. One-stage
plans keep their replica on an idle device (no memory of the plan's own).

Pruning by U (no answer whose DP value exceeds U is ever scored). Fg[r, l]
(:func:`~planner.solvers.dp.bounds.graph_prefix_bound`) bounds what the stages before a
cell add to D over the graph's own paths from the root to r (the groups' classes and
counts, where the relaxed F lets n devices of any class run every block): with F' =
max(F[L-l, n], Fg[r, l]), a (state r, l) cell, with n = N - |r| devices before it, holds
nothing when E[L-l, n], F' + G[l, |r|], Q[l, |r|] (least over p) or PF[L-l, n] + Q[l, |r|]
exceeds U, and a state whose cells all do is not searched; an entry with D + max(F', X +
PF[L-l, n]) > U is dropped *after* its front is selected
(:func:`~planner.solvers.dp.fronts._pareto` picks among all candidates, so a slot such an
entry wins stays empty instead of going to another candidate: dropped before, a freed slot
changed which entries a front keeps, so a tighter bound lost plans, docs/decisions.md); a
pair (l, l') of a move whose max(M c0, c0 + the least D of its front at l') + max(F', T_a0
+ PF) > U is never built (D' is at least the first term, X' at least T_a0), so a move
without any other pair is not composed, l' runs over the pairs left, and a head of l - l'
blocks is composed only within the *head band* of the widest head among them (gathered
when at most ``BAND_USE`` of the slice l' = lo..hi); the head tables of a composition that
few states use (the ordered graph's groups that straddle two classes: one state per order)
are evaluated only on the pairs that pass that test with c0's lower bound of
:meth:`~planner.solvers.dp.tables._Tables.head_bound`, the others reading inf
(:meth:`_BatchSearch._heads`; the same candidates, so the same plans). Under a guessed
bound (the first search) PF is not used and a candidate with D + F > U is dropped before
the selection: with PF, a guess below every plan left no answer at all and the repeat ran
unbounded; and dropping before the selection there happens to find the best known plan of
pipedream-resnet18 on the 8-device Ethernet testbed (225.86 ms, 236.49 otherwise: the
fronts of 4 are lossy, and neither way dominates). Nothing dropped could have been scored,
but a front freed of a hopeless entry gives its slot to another, so the pruned search is
not bit-identical to the unpruned one (tests/unit/test_dp.py compares it with the unpruned
DP's recorded plans).

Rows in ranges: a head needs l' < l, so a level's rows l = p..L are composed in
``ROW_CHUNKS`` ranges of equal height (from ``ROW_CHUNK_MIN`` rows), each over its own
l' < l: about 2/3 of the rows x l' rectangle (the triangle l' < l is half), same results.

Time limit: levels p run in order, each over the states in ascending size; the deadline is
checked before each state (:class:`_Timeout`). The first level (single-stage plans,
O(moves) heads; without a guessed bound, and also after a later level of a guessed search
that has no answer) always completes, so a plan is returned whenever one fits memory.

Complexity, with S states, E moves and P = min(L, N, max_stages) levels (p0 of them after
collapsing): Fg, O(E L^2); P x E compositions of O(L W F) numpy work each, W <= L the
head band (L with no bound; about 2 L^2 / 3 over the row ranges), F = ``FRONT``, 7
carried values per entry, one Pareto reduction per (level, state, row range). Memory: the
traceback, O(P S L F) small integers, and the values of two levels' fronts, O(S L F)
floats each.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from edgepipe.planner.cost.formulas import stage_memory_bytes, warmup_that_fits
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.solvers.dp.bounds import (
    _Relaxed,
    cell_bounds,
    graph_prefix_bound,
    hidden_bound,
    relaxed_bounds,
)
from edgepipe.planner.solvers.dp.fronts import FRONT, _fields, _front, _Level
from edgepipe.planner.solvers.dp.graph import _Graph
from edgepipe.planner.solvers.dp.recurrence import compose
from edgepipe.planner.solvers.dp.tables import _Tables
from edgepipe.planner.solvers.time_limit import Deadline

#: root answers re-scored by the exact schedule makespan: the best of a collapsed level
#: (every stage count), and per exact level (one stage count) the best RERANK_LEVEL, so
#: that a stage count whose plans the closed form ranks low is still re-scored
RERANK = 8
RERANK_LEVEL = 3


#: levels stay exact (one per stage count, each adding its own answers to the re-scored
#: ones) while levels x moves x (L + 1)^2 is at most this; above it they collapse where
#: memory allows (docstring)
EXACT_LEVELS_WORK = 1e6

#: rows of a level are computed in this many ranges once there are ROW_CHUNK_MIN of them
#: (:meth:`_BatchSearch._chunks`; 3 rather than 4, session 14: fewer calls outweigh the
#: larger rectangles, 100 x 64 -2.7% instructions, 100 x 16 mixed -0.3%, 512 x 8 -3% CPU)
ROW_CHUNKS = 3
ROW_CHUNK_MIN = 48

#: the head band is gathered (instead of slicing l' = lo..hi) when it is at most this
#: fraction of the slice: gathering costs more per element than slicing
BAND_USE = 0.75

#: head tables of a composition that at most this many states use (the ordered graph's
#: groups that straddle two classes: one state per device order) are evaluated only on
#: the block ranges those states may use within the bound (:meth:`_BatchSearch._heads`)
LAZY_USERS = 3

INF = np.inf

#: a root answer: (D + X, level index, edge, head, l', slot, same level)
_Answer = tuple[float, ...]


class _Timeout(Exception):
    """The time limit expired inside a level."""


@dataclass(frozen=True)
class _Source:
    """Layout of one block of candidate columns: ``kind`` base | move | skip, its edges,
    whether the parent lies in the same level, its width, and for moves onto a front the
    first l' and the slots per l' (``band``: the j-th l' of row l is l - 1 - j instead of
    first + j)."""

    kind: str
    edges: list[int]
    same: bool
    width: int
    first: int
    slots: int
    band: bool = False


class _BatchSearch:
    """The DP for one micro-batch size over one state graph."""

    def __init__(
        self,
        tables: _Tables,
        graph: _Graph,
        batch: int,
        deadline: Deadline,
        tick: Callable,
        bound: float = INF,
        relaxed: _Relaxed | None = None,
        guessed: bool = False,
    ) -> None:
        self.t, self.g, self.batch, self.deadline, self.tick = tables, graph, batch, deadline, tick
        #: prune by ``bound``; ``guessed``: a guess, not a figure found (:func:`best_plan`)
        self.bound, self.guessed = bound, guessed
        config = tables.problem.config
        self.m = config.global_batch // batch
        n_dev = sum(tables.counts)
        self.max_p = min(tables.n_blk, n_dev, config.max_stages or n_dev)
        self.capped = config.max_stages is not None and config.max_stages < min(tables.n_blk, n_dev)
        self.levels: list[_Level] = []
        #: root answers: (D + X, level index, edge, head, l', slot, same level)
        self.answers: list[_Answer] = []
        self._pending: list[_Answer] = []
        self.root = len(graph.states) - 1
        #: per composition (the last row: none) the id of its set of classes; the link
        #: from a head group to an entry's head group is priced per pair of sets
        #: (:meth:`_links_from`), not per class of every candidate
        self.sets, self.class_set = np.unique(tables.masks(), axis=0, return_inverse=True)
        self.class_set = self.class_set.ravel()
        self._links: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        #: per composition, the number of states whose moves use it (:meth:`_heads`)
        used = {(a, c) for a, c, _ in graph.edges if c >= 0}
        self.users = np.bincount([c for _, c in used], minlength=len(tables.comps))
        self.sizes = np.array([sum(s) for s in graph.states])
        big_l = tables.n_blk
        cut = big_l - np.arange(big_l + 1)  # first block of a suffix of l' blocks
        self.per_sample = tables.cm.boundary[np.clip(cut - 1, 0, big_l - 1)]
        #: in-flight micro-batches of the head of an n-stage suffix (n = 0..P + 1)
        self.k_of = np.array([self.warmup(min(n, self.max_p)) for n in range(self.max_p + 2)])
        self.relaxed = relaxed or relaxed_bounds(tables, batch)
        #: round trips in the warm-up window of the head of an (n+1)-stage suffix
        #: (planner.solvers.dp.recurrence): ceil(M / min(K, M))
        self.rounds_of = -(-self.m // np.minimum(self.k_of[1:], self.m))
        #: under a bound that is a figure: prune by PF too (:meth:`_before`), and drop the
        #: candidates beyond the bound after their front's selection (:meth:`_rows`);
        #: under a guessed one, D + F > U goes before it (``early``; module docstring)
        self.by_pf = not guessed
        self.early = INF if self.by_pf else bound
        #: per (state, l): lower bounds on what the blocks before the suffix add to its D
        #: (F) and to its D + X (PF), inf where the cell holds nothing (:meth:`_before`)
        #: Fg (graph_prefix_bound): it does not depend on the bound, so once per search
        self.prefix = graph_prefix_bound(tables, graph, batch, self.warmup(1), self.per_sample)
        self.before, self.pf = self._before()
        self.hidden = hidden_bound(tables, self.sizes, batch)
        self._layout: tuple[int, int, bool, list[int]] = (0, 1, False, [])
        #: candidate cells composed so far (heads and compositions): the search's work, a
        #: count that the re-scoring's budget is a share of (:mod:`planner.solvers.dp.sizes`)
        self.cells = 0
        #: the base heads of the state being filled, every row from the first (_level)
        self._base_rows: tuple[int, tuple[np.ndarray, ...] | None] = (0, None)

    def _before(self) -> tuple[np.ndarray, np.ndarray]:
        """The cell bounds under the search's bound
        (:func:`planner.solvers.dp.bounds.cell_bounds`)."""
        return cell_bounds(self.t, self.relaxed, self.prefix, self.sizes, self.bound, self.by_pf)

    def warmup(self, p: int) -> int:
        """K of the head of a p-stage suffix: stage P-p of P, the same for every P."""
        return self.t.problem.config.warmup_depth(self.max_p - p, self.max_p, self.m)

    def first_free_level(self) -> int:
        """The least p0 such that heads at every p >= p0 see the same tables: no range
        of any composition fits its unconstrained split at a depth d with
        K(p0) <= d < K(P) (then memory reads the same at all those warm-ups); p0 = 1 at
        once when no range binds even with all B samples on one device. Every
        level stays exact (P + 1) with a stage cap, or when exact levels are cheap
        (``EXACT_LEVELS_WORK``): each level's own answers are re-scored, which matters
        where the closed form ranks plans differently from the exact makespan."""
        if self.capped:
            return self.max_p + 1
        moves = sum(1 for _, c, _ in self.g.edges if c >= 0)
        if self.max_p * moves * (self.t.n_blk + 1) ** 2 <= EXACT_LEVELS_WORK:
            return self.max_p + 1
        k_max = self.warmup(self.max_p)
        # a device's deepest warm-up only falls with its samples, so when every range fits
        # K(P) with all B samples on any class (or not even its static state), no
        # composition's does otherwise: p0 = 1 without Algorithm 1 on each of them
        t = self.t
        full = warmup_that_fits(t.budget[:, None], t.static[None, :], self.batch, t.saved[None, :])
        if ((full >= k_max) | (full == -INF)).all():
            return 1
        worst = -INF
        for cid in sorted({c for _, c, _ in self.g.edges if c >= 0}):
            if self.deadline.passed():
                raise _Timeout
            depth = self.t.unconstrained(cid, self.batch)[2]
            binding = depth[np.isfinite(depth) & (depth < k_max)]
            if binding.size:
                worst = max(worst, float(binding.max()))
        return 1 + max((p for p in range(1, self.max_p + 1) if self.warmup(p) <= worst), default=0)

    def run(self) -> list[_Answer]:
        """Exact levels p = 1 .. p0 - 1, then one collapsed level for every p >= p0, until
        done or the deadline; the root's best (value, stages, slot) answers. When the
        deadline passes in the first level, or in a later one of a search under a
        guessed bound that has no answer yet, the root's single-stage plans are
        finished (without a guessed bound), so some plan is returned whenever one fits
        memory."""
        try:
            p0 = self.first_free_level()
        except _Timeout:
            p0 = self.max_p + 1
        for p in range(1, min(p0, self.max_p) + 1):
            collapsed = p == p0
            try:
                if p == 1 and self.deadline.passed():
                    raise _Timeout
                level = self._level(p, collapsed)
            except _Timeout:
                if p > 1 and (self.answers or not self.guessed):
                    raise
                if self.guessed:  # a guessed bound may exclude every plan: none here
                    self.bound = self.early = INF
                    self.before, self.pf = self._before()
                self.levels.append(self._level(1, False, only_root=True))
                self._collect(1)
                raise
            self.t.drop_warmups(level.warm)
            if self.levels:
                self.levels[-1].trim()
            self.levels.append(level)
            self._collect(p)
            self.tick()
        return self.answers

    def _collect(self, p: int) -> None:
        """Add level ``p``'s best root answers (``RERANK_LEVEL`` of an exact level,
        ``RERANK`` of a collapsed one) to the answers to re-score."""
        keep = RERANK if self.levels[-1].collapsed else RERANK_LEVEL
        self.answers = sorted(self.answers + self._pending[:keep], key=lambda a: a[0])
        self._pending = []

    def _chunks(self, p: int) -> list[tuple[int, int]]:
        """Row ranges [r0, r1) of l = p..L computed together. A head [L-l, L-l') needs
        l' < l, so rows l see l - lo suffix rows: taken in ``ROW_CHUNKS`` ranges of
        equal height, the candidate arrays hold about (1 + 1/chunks) / 2 of the
        rectangle rows x (L + 1 - lo) instead of all of it (the triangle l' < l is half)."""
        big_l = self.t.n_blk
        n_l = big_l + 1 - p
        count = ROW_CHUNKS if n_l >= ROW_CHUNK_MIN else 1
        cuts = [p + (n_l * i) // count for i in range(count + 1)]
        return [(a, b) for a, b in itertools.pairwise(cuts) if b > a]

    def _level(self, p: int, collapsed: bool, only_root: bool = False) -> _Level:
        """Fronts of level p for every state (or the root's moves alone): from base heads
        (p = 1), moves onto the previous level, moves onto this level (collapsed) and
        skips, per range of rows (:meth:`_chunks`). At the root, whose front nothing
        builds on, the ``RERANK`` candidates of least D + X for all L blocks become
        answers whether Pareto-optimal or not (the exact makespan may rank a dominated
        one first)."""
        t, graph = self.t, self.g
        big_l = t.n_blk
        warm = self.warmup(p)
        level = _Level.empty(len(graph.states), big_l, warm, collapsed)
        prev = self.levels[-1] if self.levels else None
        states = [self.root] if only_root else range(len(graph.states))
        chunks = self._chunks(p)
        self._pending = []
        for s in states:
            if self.sizes[s] < p or not np.isfinite(self.before[s, p:]).any():
                continue  # too few devices, or no plan through this state within the bound
            if not only_root and self.deadline.passed():
                raise _Timeout
            moves = [e for e in graph.out[s] if graph.edges[e][1] >= 0]
            skips = [] if only_root else [e for e in graph.out[s] if graph.edges[e][1] < 0]
            # sources: (moves, front they compose onto or None for base heads, same level)
            sources: list[tuple[list[int], _Level | None, bool]] = []
            if p == 1:
                sources.append((moves, None, False))
                if moves:  # base heads do not depend on l' < l: every row at once
                    first, end = chunks[0][0], chunks[-1][1]
                    self._base_rows = (first, self._moves(moves, p, warm, None, first, end))
            else:
                assert prev is not None
                sources.append((self._live(moves, prev), prev, False))
            if collapsed and not only_root:
                sources.append((self._live(moves, level), level, True))
            for r0, r1 in chunks:
                self._rows(level, s, p, warm, sources, skips, r0, r1)
        return level

    def _rows(
        self,
        level: _Level,
        s: int,
        p: int,
        warm: int,
        sources: list[tuple[list[int], _Level | None, bool]],
        skips: list[int],
        r0: int,
        r1: int,
    ) -> None:
        """Fronts of state ``s`` at rows l = r0..r1-1 of ``level`` (see :meth:`_level`)."""
        graph, big_l = self.g, self.t.n_blk
        rows = np.arange(r1 - r0)[:, None]
        l_here = np.arange(r0, r1)[:, None]
        parts: list[tuple[np.ndarray, ...]] = []
        meta: list[_Source] = []
        for mv, front, same in sources:
            if mv and front is None:  # base heads, computed for every row (_level)
                first, whole = self._base_rows
                assert whole is not None  # set by _level before its rows
                parts.append(tuple(v[r0 - first : r1 - first] for v in whole))
                meta.append(_Source("base", mv, same, len(mv), 0, 1, False))
            elif mv:
                part = self._moves(mv, p, warm, front, r0, r1)
                if part is None:
                    continue
                parts.append(part)
                lo, f, band, kept = self._layout
                meta.append(_Source("base" if front is None else "move", kept, same,
                                    part[0].shape[1], lo, f, band))  # fmt: skip
        for e in skips:
            sub = graph.edges[e][2]
            d, x, carry_s, carry_o, y, free, tail = _fields(level.vals[sub, r0:r1])
            parts.append((d, x, carry_s, carry_o, y, level.n[sub, r0:r1], free, tail))
            meta.append(_Source("skip", [e], True, FRONT, 0, FRONT))
        if not parts:
            return
        d, x, carry_s, carry_o, cand_y, cand_n, cand_free, cand_tail = (
            np.concatenate([q[i] for q in parts], axis=1) for i in range(8)
        )
        x_seen = np.maximum(x, self.hidden[s, r0:r1][:, None])
        chosen, ok = _front(d, np.where(np.isfinite(d), x_seen, INF), carry_s, cand_y)
        # an entry whose D plus what the blocks before it add (F), or whose D + X plus
        # their least forward traversal (PF), exceeds the bound reaches no root answer
        # within it; it takes part in the selection (a slot it wins is not handed to
        # another candidate) and is then dropped (under a guessed bound: ``early``)
        d_kept, x_kept = d[rows, chosen], x[rows, chosen]
        if self.by_pf:
            before, forward = self.before[s, r0:r1][:, None], self.pf[s, r0:r1][:, None]
            with np.errstate(invalid="ignore"):
                ok &= ~(d_kept + np.maximum(before, x_kept + forward) > self.bound)
        at = (s, slice(r0, r1))
        level.d[at] = np.where(ok, d_kept, INF)
        level.x[at] = np.where(ok, x_kept, INF)
        level.s[at] = np.where(ok, carry_s[rows, chosen], INF)
        level.o[at] = np.where(ok, carry_o[rows, chosen], INF)
        level.y[at] = np.where(ok, cand_y[rows, chosen], INF)
        level.n[at] = np.where(ok, cand_n[rows, chosen], 0)
        level.free[at] = np.where(ok, cand_free[rows, chosen], -INF)
        level.tail[at] = np.where(ok, cand_tail[rows, chosen], INF)
        edge, head, l_sub, k_sub, same_level = self._decode(meta, chosen, l_here, level)
        level.h[at] = np.where(ok, head, -1)
        level.edge[at] = np.where(ok, edge, -1)
        level.l_sub[at] = l_sub
        level.k_sub[at] = k_sub
        level.same[at] = same_level
        if s == self.root and r1 == big_l + 1:
            # the complete plans within the bound (a D above it: nothing to score)
            total = np.where(d[-1] <= self.bound, d[-1] + x[-1], INF)
            # one candidate per value: skips reach the same plan along several paths
            _, first_of = np.unique(total, return_index=True)
            best = first_of[np.isfinite(total[first_of])][:RERANK][None, :]
            top = self._decode(meta, best, np.array([[big_l]]), level)
            self._pending = [
                (float(total[j]), len(self.levels), *(int(v[0, i]) for v in top))
                for i, j in enumerate(best[0])
            ]

    def _decode(
        self, meta: list[_Source], chosen: np.ndarray, l_here: np.ndarray, level: _Level
    ) -> tuple[np.ndarray, ...]:
        """Parent (edge, head composition, l', slot, same level) of candidate indices
        ``chosen`` (rows l_here), from the sources' layouts in concatenation order."""
        graph = self.g
        edge = np.full(chosen.shape, -1, dtype=np.int64)
        head = np.full(chosen.shape, -1, dtype=np.int64)
        l_sub = np.zeros(chosen.shape, dtype=np.int64)
        k_sub = np.zeros(chosen.shape, dtype=np.int64)
        same = np.zeros(chosen.shape, dtype=bool)
        offset = 0
        for src in meta:
            mv, width = src.edges, src.width
            per_move = width // len(mv)
            here = (chosen >= offset) & (chosen < offset + width)
            j = np.minimum(np.maximum(chosen - offset, 0), width - 1)  # (np.clip: slower)
            if src.kind == "base":
                e_arr = np.array(mv)[j]
                l_j, k_j = np.zeros_like(j), np.zeros_like(j)
            elif src.kind == "move":
                which, rest = np.divmod(j, per_move)
                e_arr = np.array(mv)[which]
                l_off, k_j = np.divmod(rest, src.slots)
                l_j = l_here - 1 - l_off if src.band else l_off + src.first
            else:
                e_arr = np.full(j.shape, mv[0])
                l_j, k_j = np.broadcast_to(l_here, j.shape), j
            edge = np.where(here, e_arr, edge)
            l_sub = np.where(here, l_j, l_sub)
            k_sub = np.where(here, k_j, k_sub)
            same = np.where(here, src.same, same)
            if src.kind == "skip":
                h_j = level.h[graph.edges[mv[0]][2], l_here, j]
            else:
                h_j = np.array([graph.edges[e][1] for e in mv])[j // per_move]
            head = np.where(here, h_j, head)
            offset += width
        return edge, head, l_sub, k_sub, same

    def _links_from(self, own: int) -> tuple[np.ndarray, np.ndarray]:
        """Per set of classes, the slowest bandwidth and largest latency between a
        device of set ``own`` and one of that set (Eq. 8's slowest pair; inf and 0 to
        the empty set), cached per ``own``: O(sets x K)."""
        if own not in self._links:
            t, mine = self.t, self.sets[own]
            bw_row = np.where(mine[:, None], t.bw, INF).min(axis=0)  # (K,)
            lat_row = np.where(mine[:, None], t.lat, 0.0).max(axis=0)
            self._links[own] = (
                np.where(self.sets, bw_row[None, :], INF).min(axis=1),
                np.where(self.sets, lat_row[None, :], 0.0).max(axis=1),
            )
        return self._links[own]

    def _live(self, moves: list[int], front: _Level) -> list[int]:
        """Moves whose next state has some finite entry in ``front`` (others add nothing)."""
        return [e for e in moves if np.isfinite(front.d[self.g.edges[e][2]]).any()]

    def _heads(
        self,
        cids: list[int],
        warm: int,
        state: int,
        front: _Level | None,
        subs: list[int],
        r0: int,
    ) -> list[np.ndarray]:
        """Head tables of the compositions ``cids`` of ``state``'s moves (onto ``front``
        at the states ``subs``, or base heads when None) for its rows l >= r0: a
        composition that at most ``LAZY_USERS`` states use is evaluated only where a
        move may stay within the bound (module docstring, pruning): the ranges whose
        c0 lower bound c_lb (:meth:`_Tables.head_bound`) gives M c_lb + F <= U on base
        heads [L-l, L), max(M c_lb, c_lb + the least D of the front at l') + F <= U on
        pairs (l, l') (every range with no bound); every other composition on
        all ranges. The fronts moved onto are final here (smaller states, or the level
        before), so the pairs of all of ``state``'s remaining row ranges are taken at
        once: Algorithm 1's vectorised rounds cost about as much for a few ranges as
        for many."""
        t, m = self.t, self.m
        lazy = [c for c in cids if self.users[c] <= LAZY_USERS]
        rows: dict[int, np.ndarray] = {}
        if lazy and front is None:
            rows = {c: t.range_at[r0:, 0] for c in lazy}
            if np.isfinite(self.bound):  # a base head's D is M c0
                before = self.before[state, r0:]
                for c in lazy:
                    least = t.head_bound(c, self.batch)[r0:, 0]
                    rows[c] = rows[c][m * least + before <= self.bound]
        elif lazy and front is not None:
            ranges = t.range_at[r0:]  # (l, l'), -1 where l' >= l
            if np.isfinite(self.bound):
                before = self.before[state, r0:, None]
                for c in lazy:
                    d_least = front.d[subs[cids.index(c)]].min(axis=1)[None, :]
                    least = t.head_bound(c, self.batch)[r0:]
                    maybe = np.maximum(m * least, least + d_least) + before <= self.bound
                    rows[c] = ranges[maybe]
            else:
                rows = {c: ranges[ranges >= 0] for c in lazy}
        return [t.head(c, warm, self.batch, rows.get(c)) for c in cids]

    def _moves(
        self, moves: list[int], p: int, warm: int, front: _Level | None, r0: int, r1: int
    ) -> tuple[np.ndarray, ...] | None:
        """(D, X) candidates of rows l = r0..r1-1 from ``moves``, their carried S and O and
        their head's Y (None when no head fits those rows),
        ring replicas checked and candidates beyond the bound dropped (module
        docstring). Heads alone (``front`` None) are laid out per row as (move,); moves
        composed onto ``front`` as (move, l', slot < f), the layout (first l', slots per
        l', band, the moves kept) going to ``self._layout``, where the moves are those with
        some pair (l, l') that can stay within the bound, f bounds the finite entries of
        the fronts moved onto and l' runs over lo..hi (the finite l' of those fronts
        with such a pair) or, when the head band is narrower (a finite bound), over
        l - 1 - j for j below the band's width."""
        if front is None:
            return self._base_moves(moves, warm, r0, r1)
        t, graph, m = self.t, self.g, self.m
        big_l = t.n_blk
        cids = [graph.edges[e][1] for e in moves]
        state = graph.edges[moves[0]][0]  # the moves' state
        before = self.before[state, r0:r1]
        subs = [graph.edges[e][2] for e in moves]
        finite = np.isfinite(front.d[subs])  # (T, l', F)
        lps = np.flatnonzero(finite.any(axis=(0, 2)))
        lo, hi = max(int(lps[0]), p - 1), min(int(lps[-1]), r1 - 2)
        if hi < lo:
            return None
        width_band = hi - lo + 1
        heads = self._heads(cids, warm, state, front, subs, r0)
        if np.isfinite(self.bound):
            kept = self._pairs(moves, cids, heads, subs, front, state, lo, hi, r0, r1)
            if kept is None:
                return None
            moves, cids, heads, subs, lo, hi, width_band = kept
        finite = np.isfinite(front.d[subs, lo : hi + 1])
        f = int(np.flatnonzero(finite.any(axis=(0, 1)))[-1]) + 1
        width = hi - lo + 1
        band = width_band <= BAND_USE * width
        rows = np.arange(r0, r1)[:, None]
        if band:
            lp = rows - 1 - np.arange(max(width_band, 1))[None, :]  # (l, j)
            off_band = (lp < lo) | (lp > hi)
            lp = np.minimum(np.maximum(lp, 0), big_l)

            def take(a: np.ndarray) -> np.ndarray:
                return a[..., rows, lp]
        else:
            lp = np.arange(lo, hi + 1)[None, :]

            def take(a: np.ndarray) -> np.ndarray:
                return a[..., r0:r1, lo : hi + 1]

        # candidates are laid out (l, T, l', f): a row's candidates are contiguous, in
        # the order (move, l', slot) that _decode reads
        # (7, l, T, l', 1), from (T, 7, l, l')
        figures = np.array([take(h) for h in heads]).transpose(1, 2, 0, 3)[..., None]
        c0, eb0, ta0, y0, hold_b, hold_y, used = figures
        if band:
            c0 = np.where(off_band[:, None, :, None], INF, c0)
            at = (np.array(subs)[None, :, None], lp[:, None, :], slice(0, f))  # (l, T, j, f)
            sub_d, sub_x, sub_s, sub_o, sub_y, sub_free, sub_tail = _fields(front.vals[at])
            sub_h, sub_n = _fields(front.ints[at])
            per_sample = self.per_sample[lp][:, None, :, None]
        else:
            window = (subs, slice(lo, hi + 1), slice(0, f))  # (1, T, l', f) below
            sub_d, sub_x, sub_s, sub_o, sub_y, sub_free, sub_tail = _fields(
                front.vals[window][None]
            )
            sub_h, sub_n = _fields(front.ints[window][None])
            per_sample = self.per_sample[None, None, lo : hi + 1, None]
        # link from the head group to each entry's head group (slowest pair, largest
        # latency), priced by the cost model's closed-form boundary
        links = [self._links_from(int(k)) for k in self.class_set[cids]]
        to_set = self.class_set[sub_h]  # h = -1: the empty set (inf, 0)
        move = np.arange(len(cids))[None, :, None, None]
        bw = np.array([b for b, _ in links])[move, to_set]  # (l, T, l', f)
        lat = np.array([a for _, a in links])[move, to_set]
        d_new, x_new, s_new, o_new = compose(
            c0, eb0, ta0, y0, sub_d, sub_x, sub_s, sub_o, sub_y, sub_n, per_sample, bw, lat,
            m=m, batch=self.batch, topology=t.topology, k_of=self.k_of,
            rounds_of=self.rounds_of,
        )  # fmt: skip
        self.cells += d_new.size
        # ring replicas (planner.replan.replicas): a one-device head's replica goes to the
        # entry's head holder; a complete plan's (row l = L) first stage holds the
        # replica of its last
        replica = take(t.dense_replica)[:, None, :, None]
        fits = ~((used == 1) & (sub_free < replica))
        # the carried N, and FREE: the head holder's memory left at its true warm-up
        n_new = sub_n + 1
        with np.errstate(invalid="ignore"):
            free = hold_b - stage_memory_bytes(
                take(t.dense_static)[:, None, :, None], self.k_of[n_new], hold_y,
                take(t.dense_saved)[:, None, :, None],
            )  # fmt: skip
        if r1 == big_l + 1:  # the complete plans' row, l = L
            fits[-1] &= free[-1] >= sub_tail[-1]
        keep = np.isfinite(sub_d) & np.isfinite(c0) & fits
        keep &= d_new + before[:, None, None, None] <= self.early
        d_new = np.where(keep, d_new, INF)
        n_l = r1 - r0
        self._layout = (lo, f, band, moves)
        return tuple(
            (v if v.shape == d_new.shape else np.broadcast_to(v, d_new.shape)).reshape(n_l, -1)
            for v in (d_new, x_new, s_new, o_new, y0, n_new, free, sub_tail)
        )

    def _base_moves(self, moves: list[int], warm: int, r0: int, r1: int) -> tuple[np.ndarray, ...]:
        """:meth:`_moves` of heads alone (p = 1, laid out per row as (move,)): D = M c0,
        X = T_a0, S = c0, N = 1, FREE at the one-stage warm-up, TAIL the replica of a
        one-device head."""
        t, graph, m = self.t, self.g, self.m
        cids = [graph.edges[e][1] for e in moves]
        state = graph.edges[moves[0]][0]  # the moves' state
        before = self.before[state, r0:r1]
        heads = self._heads(cids, warm, state, None, [], r0)
        c0 = np.array([h[0][r0:r1, 0] for h in heads]).T  # (l, T)
        x = np.array([h[2][r0:r1, 0] for h in heads]).T
        d = np.where(m * c0 + before[:, None] <= self.early, m * c0, INF)
        self.cells += d.size
        y, hold_b, hold_y, used = (np.array([h[i][r0:r1, 0] for h in heads]).T for i in range(3, 7))
        at = (slice(r0, r1), 0)
        with np.errstate(invalid="ignore"):
            free = hold_b - stage_memory_bytes(
                t.dense_static[at][:, None], self.k_of[1], hold_y, t.dense_saved[at][:, None]
            )
        tail = np.where(used == 1, t.dense_replica[at][:, None], 0.0)
        return d, x, c0, np.zeros_like(c0), y, np.ones(c0.shape, np.int64), free, tail

    def _pairs(
        self,
        moves: list[int],
        cids: list[int],
        heads: list[np.ndarray],
        subs: list[int],
        front: _Level,
        state: int,
        lo: int,
        hi: int,
        r0: int,
        r1: int,
    ) -> tuple[list[int], list[int], list[np.ndarray], list[int], int, int, int] | None:
        """What cannot stay within the bound is not built (module docstring): D' >=
        max(M c0, c0 + D) (tau1 >= 0), so a pair (l, l') whose head's M c0 or c0 plus the
        least D of its front, plus what the blocks before it add, exceeds the bound holds
        nothing; moves without any other pair go, l' narrows to the pairs left, and the
        head band is their longest head l - l' (heads read inf on the pairs
        :meth:`_heads` left out, which hold nothing). The moves, compositions, heads and
        next states kept, l' = lo..hi and the band's width; None when no pair is left."""
        m = self.m
        before, forward = self.before[state, r0:r1], self.pf[state, r0:r1]
        d_least = front.d[subs, lo : hi + 1].min(axis=2)[:, None, :]
        c_win = np.array([h[0, r0:r1, lo : hi + 1] for h in heads])  # (T, l, l')
        added = before[None, :, None]
        if self.by_pf:  # X' >= T_a0
            ta_win = np.array([h[2, r0:r1, lo : hi + 1] for h in heads])
            added = np.maximum(added, ta_win + forward[None, :, None])
        alive = np.maximum(m * c_win, c_win + d_least) + added <= self.bound
        live = np.flatnonzero(alive.any(axis=(1, 2)))
        if not len(live):
            return None
        moves, cids = [moves[i] for i in live], [cids[i] for i in live]
        heads, subs = [heads[i] for i in live], [subs[i] for i in live]
        pairs = alive[live].any(axis=0)  # (l, l')
        lps = lo + np.flatnonzero(pairs.any(axis=0))
        reach = np.arange(r0, r1)[:, None] - np.arange(lo, hi + 1)[None, :]
        width_band = int(np.where(pairs, reach, 0).max())
        return moves, cids, heads, subs, int(lps[0]), int(lps[-1]), width_band

    def reconstruct(self, answer: tuple) -> Partition:
        """The plan of a root answer, devices taken from each class in cluster order."""
        t, graph = self.t, self.g
        big_l = t.n_blk
        devices = t.problem.cluster.devices
        free = [list(c.members) for c in t.classes]
        stages: list[StageAssignment] = []
        _, i, e, _, l_sub, k_sub, same = answer
        s, l_cur = self.root, big_l
        while True:
            level = self.levels[i]
            _, cid, sub = graph.edges[e]
            if cid >= 0:
                first, end = big_l - l_cur, big_l - l_sub
                row = np.flatnonzero((t.rows_first == first) & (t.rows_end == end))
                y, _ = t.allocation(cid, row, level.warm, self.batch, by_slot=True)
                taken = []
                for cls, count in zip(t.slots(t.comps[cid]), y[0], strict=True):
                    member = free[int(cls)].pop(0)
                    if count > 0:
                        taken.append((member, int(count)))
                taken.sort()
                stages.append(
                    StageAssignment(
                        first,
                        end,
                        tuple(devices[j].id for j, _ in taken),
                        tuple(c for _, c in taken),
                    )
                )
                if not same:
                    i -= 1
            s, l_cur, k = sub, l_sub, k_sub
            if l_cur == 0:
                break
            level = self.levels[i]
            e = int(level.edge[s, l_cur, k])
            l_sub, k_sub = int(level.l_sub[s, l_cur, k]), int(level.k_sub[s, l_cur, k])
            same = bool(level.same[s, l_cur, k])
        return Partition(self.batch, self.m, tuple(stages))
