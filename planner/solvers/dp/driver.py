"""Asteroid's planning DP (Algorithm 2, reference/asteroid.md §4.2), keyed by device class,
with exact composition, several device orders and a time limit.

Inputs: a :class:`~planner.inputs.problem.Problem` (L blocks, N devices in K classes of
interchangeable devices, :mod:`planner.solvers.classes`; global batch G; micro-batch candidates)
and a wall-clock limit.

Device classes. Devices of one class have the same times, memory and network figures, so
the DP never names devices: a stage's group is a *composition* g = (g_1..g_K), g_k
devices of class k, and a DP state is the multiset r = (r_1..r_K) of devices still
available. Head evaluations (Algorithm 1 allocation, stage times, all-reduce, memory)
are computed once per composition, so 64 identical devices give 64 group sizes, not
2,080 device ranges; Algorithm 1 itself runs class by class where it can (complexity).
Devices are taken out of a class in cluster order when a plan is written down, with
Algorithm 1's device-by-device split of that one stage (the same samples per class as
the tables', in its own device order).

State graph (per micro-batch size B). States are count vectors r; a *move* r -> r - g
makes the group g the head stage; a *skip* r -> r - e_k leaves one device idle. Two
graphs:

* complete (when it has at most ``COMPLETE_MOVES`` moves): every r <= counts and every
  composition g <= r is a move. This is every assignment of devices to stages, in any
  order, idle devices included - no device order is imposed.
* ordered (otherwise): the union, over the device orders of :func:`device_orders`
  (memory descending, Asteroid's; speed ascending; speed descending), of Asteroid's
  contiguous groups: with the devices of an order laid out class by class, the states
  are its suffixes, a move takes the first n - n' devices of a suffix of n, and a skip
  drops the first device of a suffix (so any device may stay idle between groups).
  Memory descending gives the deep-warm-up early stages the large memories; speed
  ascending puts the fastest devices last, where the stage holding the heaviest blocks
  often sits (with memory order only, the DP's worst gap to the exact optimum on the
  solver benchmark was 53%: gpt2-small on the 8-device Ethernet testbed, whose last
  stage could be an Orin only in a plan that used nothing else). Taking the union makes
  the DP at least as good as the best single order, in one run.

Both graphs drop two kinds of dominated moves: groups of more than B devices (some
device would get no sample; the same plan is a smaller group plus skips) and a group of
s devices of one class whose times never fall with the batch size when a smaller group
s' < s of that class has the same largest share ceil(B/s') = ceil(B/s) (the same stage
times and memory, a cheaper all-reduce, fewer devices used). So a class contributes
O(sqrt B) homogeneous group sizes. The ordered graph also keeps a group of several
classes (one that straddles a class boundary of an order) only at those sizes, where
the even share ceil(B/s) falls (:meth:`_Tables.falls`). This is a heuristic cut, not a
dominance (a mixed group's split is Algorithm 1's, not even): such groups are most of
the compositions on many classes (3,472 of 3,560 at B = 32 on 512 devices of 8 types,
each used by one state per order) and most of the head evaluations; measured on 35
ordered-graph instances of 2-8 classes (docs/decisions.md, session 12) the plans were
the same on 32, better on two (-0.32%, -1.27%) and worse on one (+0.70%), in 0.6-0.95x
the time (512 x 8: 0.6x).

Value (objective: :func:`planner.cost.model.pipeline_closed_form_ms`, whose pieces - stage
figures, all-reduce, the closed-form boundary :func:`~planner.cost.model.boundary_occupancy_ms`
and :func:`~planner.cost.model.link_period_ms`, memory - all come from :mod:`planner.cost.model`):
for the suffix plan putting the last l blocks into stages on devices drawn from r, not
one number but a front of entries (D, X; S, Y, N, FREE, TAIL). The round time is
``D + X``, D = max over steps i of ``C_i + max((M - 1) pi_i + tau_i + w_i, W_i)``
(traversal tau: a stage's E_f + E_b, a link's 2 (occupancy + latency); steady-state
period pi: a
stage's E_f + E_b, a link's :func:`~planner.cost.model.link_period_ms`: its occupancy point to
point, plus the next boundary's occupancy on a switch (a stage's ports carry both its
boundaries), twice it plus every later boundary's medium time on a shared medium; w_i
the warm-up bubble and W_i the warm-up window of a stage), X = max_s (T_a^s - PB_s). S
is the suffix's summed traversal, O what the suffix adds to the period of the link before it
(:func:`~planner.cost.model.link_downstream_ms`), Y the largest per-device samples of its
head group (a switch's busiest port carries max(Y_a, Y_b) samples of a boundary, a
point-to-point piece at most min(Y_a, Y_b), a shared medium all B), N its stage
count. Prepending a head (c0 = E_f +
E_b, E_f0, E_b0, T_a0, samples Y0, warm-up K = K(N + 1)) and the link to the entry's head
(occupancy o from Y0 and Y, latency lam, tau1 = 2 (o + lam), period pi1) gives exactly

    D' = max(M c0 + max(0, tau1 + S - (min(K, M) - 1) E_f0),   (head; its bubble)
             ceil(M / min(K, M)) (c0 + tau1 + S),              (head; its window)
             c0 + tau1 + (M - 1) pi1(o, O),                    (the link)
             c0 + tau1 + D)                                    (the suffix, shifted)
    X' = max(T_a0, X - E_b0 - (o + lam))   S' = c0 + tau1 + S   O' = downstream(o, O)
    Y' = Y0   N' = N + 1

non-decreasing in D, X, S and O. The bubble: the head's first backward waits for the first
micro-batch's round trip downstream (tau1 + S) while the head runs only K forwards; with
few micro-batches this is what the older closed form (Asteroid's, half-duplex links,
no bubble: ``PlanCost.closed_form_ms``) missed, misranking plans by up to 25%
(docs/planners.md). The window: 1F1B starts the head's forward of micro-batch j + K only
after its backward of j, a round trip c0 + tau1 + S after that forward began, so its M
micro-batches take ceil(M / K) round trips at least (without it the closed form priced
a plan of pipedream-resnet18 on orin-pair-2 at 298 ms that the schedule runs in 353, and
the DP missed the optimum by 2.64%). Fronts hold ``FRONT`` entries (:func:`_pareto`):
the least D + X', the least S, the least X' (Pareto points in (D, X', S)), then the least
D among the entries whose head group has fewer samples per device (Y) than the first
pick's, when no pick so far has (it prices its link lower), else the next least D + X'.
X' = max(X, H) with H a lower bound on the backward traversal of the stages before the
cell's suffix (:meth:`_BatchSearch._hidden`): the suffix's X reaches the root as X - PB
<= X - H, and the root's X is at least its first stage's T_a >= 0, so X below H never
shows and entries equal in X' are equal at the root. Comparing X itself ranked a suffix
of wide stages (large all-reduces that the stages before it hide) below 1-device ones
and dropped it from fronts of 4: on 100 blocks x 64 identical devices the DP returned
1777 ms where a 32 x 2-device pipeline runs in 1762 (with X': 1583).
Y, N, FREE, TAIL are carried, not compared, so the recurrence is a heuristic where a
dropped entry would have priced its link (Y) or fit a replica (FREE, TAIL) better; the
re-scoring by the exact makespan decides.

Ring replicas (:mod:`planner.replan.replicas`, ``replication_interval`` > 0): a stage run by one
device sends its replica, (1 + k_opt) W bytes (:meth:`CostModel.replica_bytes`), to the
next stage's holder (its used device of largest usable memory; the DP takes, among
those, the one with most samples: the least memory left), and the last stage's to the
first stage's. So each entry carries FREE (usable memory minus Eq. 3 memory at its true
K of its head's holder) and TAIL (the replica its last stage sends to stage 0, 0 when
that stage has several devices); a one-device head is composed onto an entry only if
FREE >= its replica, and a complete plan (l = L) only if the head's own FREE >= TAIL.
One-stage plans keep their replica on an idle device (no memory of the plan's own).

State: Q(p, l, r), p = stages of the suffix; its head's warm-up K = warmup_depth(P-p of
P) depends on p only (Asteroid: 2p-1), so memory is checked locally. Levels collapse:
p matters only through K(p), and a head's tables change with K only where some block
range's unconstrained split fits at a depth d with K(p) <= d < K(P) (Eq. 3 solved for
K). From the least p0 beyond every such d, all levels read the same tables, so they
merge into one level holding every stage count >= p0, filled in one pass over the
states in ascending size (a move may then land in the same level). With memory to spare
p0 = 1 and the P levels become one. Levels stay exact when ``max_stages`` caps P and
when P x moves x (L + 1)^2 <= ``EXACT_LEVELS_WORK`` (each exact level contributes its own
answers to the re-scoring, which matters where the closed form misranks plans).
Base: Q(1, l, r) = Pareto-min over moves g of r of the head [L-l, L) on g alone
    (D = M c0, X = T_a0, S = c0, N = 1), and over skips r' of r of Q(1, l, r').
Transition (p >= 2): Q(p, l, r) = Pareto-min over
    moves r -> r' = r - g, p-1 <= l' < l, entries (D, X) of Q(p-1, l', r'):
        compose(head [L-l, L-l') on g with K(p), link at block L-l' to the entry's head
        group), and skips r -> r': Q(p, l, r').
The link of a head to its suffix is priced from the classes of both groups (slowest
pair, largest latency: Eq. 8), so each entry remembers its head composition.
Answer: per B the ``RERANK`` distinct lowest D + X over p of Q(p, L, all devices)
(``RERANK_LEVEL`` per exact level), reconstructed and deduplicated; each B's best is
re-scored at once by the exact schedule makespan of the cost model
(:meth:`CostModel.evaluate`; it prunes the micro-batch sizes still to come), the others
after all B in order of D + X, at most ``RESCORE`` of them, none above the fastest
figure by ``RESCORE_MARGIN``, within a quarter of the search's time (``RESCORE_SHARE``;
an exact evaluation of a 64-device plan takes tenths of a second), and not one whose
lower bound (:meth:`CostModel.round_lower_bound_ms`) exceeds both the tie window of the
fastest figure and its size's best figure so far (it could change neither); plans the cost
model finds overflowing are dropped; among plans within ``TIE_TOLERANCE`` of the
fastest the one using fewest devices wins, then fewest stages, then the smallest B (a
plan that leaves devices free is worth more than one fewer stage: seen, 16-way data
parallel chosen over a 4-device plan 0.04% slower).

Pruning (bound U, per micro-batch size: ``RESCORE_MARGIN`` above the fastest exact
figure of the sizes already searched, and of the warm start's plan (``incumbent``, which
re-planning gives: its fast-path plan) when there is one; for the first search without a
warm start, which has no figure, a guess,
``FIRST_GUESS`` x its relaxed bound max(Q(L, N), Z); whenever the margin of the figure
it found exceeds the guess, the size is searched again after the other sizes, under the
bound then (or skipped by it), and at once without a bound when it found none: under a
time limit the other sizes' plans come first, 512 x 8 at 30 s: 937 ms, not the first
size's 1,081). No answer whose DP value
exceeds U is ever scored, so the search drops what cannot finish below it. The bounds
come from a relaxed plan space (:meth:`_Tables.relaxed`) solved exactly by small DPs
over (blocks, devices used): a stage on g devices has one with at least s = ceil(B / g)
samples, so its c is at least its blocks' least time on any class at any batch >= s
(E_f, E_b alike), it fits only if Eq. 3 holds for s samples on the largest memory at its
warm-up K(p) (a stage before a suffix: K(2)), its all-reduce is at least the ring's over
g devices on the fastest pair, and a boundary's occupancy at least its bytes x (s on a
switch, ceil(B / N) point to point, B on a shared medium) / the fastest pair's rate.
Along a chain D' >= max(M c0, c0 + tau1 + (M - 1) o, c0 + tau1 + D, (M - k + 1) E_f0 +
M E_b0 + tau1 + S) (the last: the head's bubble with k = min(K, M) in flight), and the
root's D + X >= D_s + T_a^s + (the E_f and one-way links before stage s) for every
stage s (X >= T_a^s - PB_s). The tables: F[j, n], the least summed c + tau of stages
holding blocks [0, j) on at most n devices plus the first stage's T_a; E[j, n], the
least max over them of (what comes before) + M c; G[p, l, n], the least D of a suffix
of l blocks in p stages (p >= pc merged: ``RELAX_LEVELS``, ``RELAX_WORK``); Q[p, l, n],
the least max over its stages of the D_s + T_a^s term (each a min of maxima taken term
by term, which only lowers it); Z, a bound on the root's D + X that prices each plan's
traversal, bubbles and all-reduces together (:meth:`_Tables._weighted`); PF[j, n], the
least summed E_f + one-way link of stages holding blocks [0, j) on at most n devices:
unrolling D' >= c0 + tau1 + D and X' >= X - E_b0 - (o + lam), the root's D + X is at
least PF + the D + X of any suffix (entry) it is built on. Rules:
micro-batch sizes are searched in order of max(Q(L, N), Z) and a size whose bound
exceeds U is skipped: every size's Z first (:func:`weighted_bound`, a tenth of its
tables' time; in order of :meth:`_Tables.lower_bound` while the time limit lasts), then
the tables in order of Z until no size left can have a lesser max(Q, Z) than the least
found (the first search: that size, or on the ordered graph the smallest size whose
max(Q, Z) is within ``FIRST_NEAR`` of it, as a smaller size has fewer groups to search
and its figure then bounds the larger sizes' searches; on the complete graph searches
are cheap and the least bound's figure prunes best), and after it only those of sizes
whose Z is within U (one
whose Z exceeds U is skipped whenever it comes, U only falls) and, on two device classes,
whose Zc is (:meth:`_Tables.class_bound`: Z with the DP keyed by the devices left per
class, so that the fast class's devices are spent once; it only skips, so the sizes
searched and their order are those of max(Q, Z)), and on three or more classes, before
its tables are built and again when its turn comes under a bound fallen since, whose Zp
is (:func:`priced_weighted_bound`,
:mod:`planner.solvers.dp.prices`: Z's sum with a price per device class, a Lagrangian relaxation of
Zc's class counts, so that stages compete for the fast classes; it only skips too), and,
where max(Q, Z) is within ``STAGED_NEAR`` of U, whose Zs is
(:meth:`_Tables.staged_bound`: Z with each stage's warm-up bubble at its own depth and
part of the first stage's all-reduce counted whole; skips only, as Zc) and whose Zw is
(:func:`reweighted_bound`, :mod:`planner.solvers.dp.block_weights`: Z's block weights, one
distribution for the D terms and one for the X terms, raised by subgradient ascent
until above U; skips only, and before the size's relaxed tables are built). Per
search, Fg[r, l] (:meth:`_BatchSearch._prefix`) bounds what the stages before a cell
add to D over the graph's own paths from the root to r (the groups' classes and
counts, where F lets n devices of any class run every block): with F' = max(F[L-l,
n], Fg[r, l]), a (state r, l) cell, with n = N - |r| devices before it, holds nothing
when E[L-l, n], F' + G[l, |r|], Q[l, |r|] (least over p) or PF[L-l, n] + Q[l, |r|]
exceeds U, and a state whose cells all do is not searched; an entry with D + max(F',
X + PF[L-l, n]) > U is dropped *after* its front is selected (:func:`_pareto` picks among
all candidates, so a slot such an entry wins stays empty instead of going to another
candidate: dropped before, a freed slot changed which entries a front keeps, so a
tighter bound lost plans, docs/decisions.md); a pair (l, l') of a move
whose max(M c0, c0 + the least D of its front at l') + max(F', T_a0 + PF) > U is never
built (D' is at least the first term, X' at least T_a0), so a move without any other
pair is not composed, l' runs over the pairs left, and a head of
l - l' blocks is composed only within the *head band* of the widest head among them
(gathered when at most ``BAND_USE`` of the slice l' = lo..hi); the head tables of a
composition that few states use (the ordered graph's groups that straddle two classes:
one state per order) are evaluated (Algorithm 1 and its figures) only on the pairs
that pass that test with c0's lower bound of :meth:`_Tables.head_bound`, the others
reading inf (:meth:`_BatchSearch._heads`; the same candidates, so the same plans).
Under a guessed bound (the first search) PF is not used and a candidate with D + F > U
is dropped before the selection, as in earlier sessions: with PF, a guess below every
plan left no answer at all (not even the ones above the guess that F lets through) and
the repeat ran unbounded; and dropping before the selection there happens to find the
best known plan of pipedream-resnet18 on the 8-device Ethernet testbed (225.86 ms,
236.49 otherwise: the fronts of 4 are lossy, and neither way dominates). Nothing
dropped could have been scored, but a front freed of a hopeless entry (by a pair or
cell rule, or by F under a guessed bound) gives its slot to another, so the pruned
search is not
bit-identical to the unpruned one
(tests/unit/test_dp.py compares it with the unpruned DP's recorded plans, and checks every
table against the closed form of every plan of small instances).

Rows in ranges: a head needs l' < l, so a level's rows l = p..L are composed in
``ROW_CHUNKS`` ranges of equal height (from ``ROW_CHUNK_MIN`` rows), each over its own
l' < l: about 2/3 of the rows x l' rectangle (the triangle l' < l is half), same results.

Exactness: the DP value equals the cost model's closed form
(:func:`planner.cost.model.pipeline_closed_form_ms`) of the reconstructed plan when every
device of every group gets samples, on every topology except point-to-point groups of
several devices (there the DP's piece bound min(Y_a, Y_b) is an upper bound of the
cost model's, which reads the pieces); Algorithm 1 may give a device 0 samples, then the
DP value is an upper bound too (the cost model prices the devices that got samples;
tests/unit/test_dp.py checks both on non-uniform networks of each topology). On the complete
graph the DP is optimal over every device assignment with Algorithm 1 splits, up to the
front cap, the carried values and the closed form's ranking (the best are re-scored
exactly).

Bound: levels p run in order, each over the states in ascending size; the time limit is
checked before each state. When it expires the DP returns the best plan of the levels
completed (status ``timed_out``); the first level (single-stage plans, O(moves) heads;
without a guessed bound, and also after a later level of a guessed search that has no
answer) always completes, so a plan is returned whenever one fits memory. The sizes' Z
and relaxed tables are built before the first search only while the limit lasts, and
once it has passed with a plan found no further micro-batch size is begun (neither its
relaxed tables, nor its graph, nor its first level): the overshoot is bounded by one
size's relaxed tables and skip bounds (Zw at most ``REWEIGHT_WORK``), one level's state
(or the first size's first level) and the final re-scoring, which stops at the limit
too.

Long chains: :func:`plan_dp` on more than ``MULTILEVEL_ABOVE`` blocks runs this DP
twice, on ~100 merged blocks and then on the cuts within one merge width of the good
coarse plans' cuts (:mod:`planner.solvers.dp.multilevel`; merging is exact for every plan on the
merged cuts, so only the cut positions are restricted); ``multilevel=False`` runs it on
every block.

Complexity per B, with S states, E moves, C distinct compositions and P = min(L, N,
max_stages) levels (p0 of them after collapsing): Z, O(L^2 N sqrt(B)) numpy work, on two
classes after the first search Zc, O(B L^2 (c_1 + 1)(c_2 + 1) + L^2 P2) (P2 the pairs
of a state and a group it holds, at most (c_1 + 1)^2 (c_2 + 1)^2 / 4), where max(Q, Z)
is near the bound Zs, O(J L^2 N sqrt(B)) (J the stage levels whose warm-up is below M),
and Zw, O(L^2 N sqrt(B)) per ascent step (at most ``REWEIGHT_WORK`` in all), and unless
Z, Zc, Zs or Zw rules the size out, the relaxed bounds, and before its search on
three or more classes Zp, O(R K B log(K B)) for its stage costs and O(R K B + L^2) per
ascent step (at most :data:`planner.solvers.dp.prices.ITERATIONS`; R = L (L + 1) / 2 ranges),
O(pc L^2 N sqrt(B)) (pc <=
``RELAX_LEVELS``; an O(N L) weak form beyond ``RELAX_MAX``); Fg, O(E L^2); C head
tables, each Algorithm 1 over the O(L^2) block ranges (those a move may use within the bound:
pruning): a closed form for one-class groups whose times never fall with the batch,
else class by class, O(K) per range and move
(:func:`~planner.solvers.allocation.allocate_classes`, from one (K, L^2, B + 1) table of the
classes' times per B), where every class's time strictly grows with the samples, and
device by device, O(g), on the other ranges; P x E compositions of
O(L W F) numpy work each, W <= L the head band (L with no bound; about 2 L^2 / 3 over
the row ranges), 7 carried values per entry, one Pareto reduction per (level, state,
row range); then at most (number of B) + ``RESCORE`` exact evaluations (each
O(A log A) events for A transfers and computations of the plan, planner.cost.model). The complete
graph
has S = prod_k (c_k + 1) states and E = prod_k (c_k + 1)(c_k + 2) / 2 moves at most;
the ordered graph S <= 3 (N + 1) and E <= 3 (N + 1) min(B, N). Memory: the traceback,
O(P S L F) small integers, the values of two levels' fronts, O(S L F) floats each, and
the Algorithm 1 splits and head tables, at most ``BASE_CACHE_BYTES`` +
``HEAD_CACHE_BYTES`` (:class:`_Cache`; without the cap the ordered graph's groups that
straddle two classes, one state's each, held 4.65 GiB on 512 devices of 8 types).
"""

from __future__ import annotations

import itertools
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from edgepipe.planner.cost.model import (
    CostModel,
    PlanCost,
    boundary_occupancy_ms,
    link_downstream_ms,
    link_period_ms,
    pipeline_closed_form_ms,
    ring_allreduce_ms,
    samples_that_fit,
    stage_memory_bytes,
    warmup_that_fits,
)
from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.problem import Problem
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.plan import check_partition
from edgepipe.planner.solvers.allocation import allocate, allocate_classes
from edgepipe.planner.solvers.classes import DeviceClass, class_network, device_classes
from edgepipe.planner.solvers.dp.allocator import retain_freed_memory
from edgepipe.planner.solvers.dp.block_weights import block_weighted_bound, chain, stage_costs
from edgepipe.planner.solvers.dp.prices import priced_bound

#: Pareto front entries kept per DP state
FRONT = 4

#: root answers re-scored by the exact schedule makespan: the best of a collapsed level
#: (every stage count), and per exact level (one stage count) the best RERANK_LEVEL, so
#: that a stage count whose plans the closed form ranks low is still re-scored
RERANK = 8
RERANK_LEVEL = 3

#: after each micro-batch size's best answer, at most this many more answers (of all
#: sizes, in order of DP value) are re-scored by the exact makespan, none whose DP value
#: is above the fastest figure found by more than RESCORE_MARGIN, and only while the
#: re-scoring has taken less than RESCORE_SHARE of the search's time (at least
#: RESCORE_MIN_S seconds) and the time limit has not passed. The DP value under-predicts
#: the exact figure by up to ~20% but over-predicts it by at most 4.4% on every plan
#: re-scored on the solver_vs_dp suite and the planner_scaling cases (docs/decisions.md),
#: so on those measured plans an answer 6% above the fastest figure did not win or tie
#: it (0.5%); a measurement, not a proof (on tiny brute-force instances some feasible
#: non-answers are over-predicted far more, review 8 F6); the margin is
#: also the search's bound U (pruning), hence its time
RESCORE = 40
RESCORE_MARGIN = 0.06
RESCORE_SHARE = 0.25
RESCORE_MIN_S = 0.25
#: relative slack of a comparison between two figures of one plan summed in different
#: orders (a bound and the figure it bounds may differ in the last digits)
ROUNDING_SLACK = 1e-9

#: plans within this relative margin of the fastest count as tied; among them the one
#: using fewest devices, then fewest stages, then smallest micro-batch wins
TIE_TOLERANCE = 0.005

#: the complete state graph is used when it has at most this many moves
COMPLETE_MOVES = 1500

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

#: the relaxed lower bound (:meth:`_Tables.relaxed`) tracks the suffix's stage count p
#: (whose warm-up K(p) its memory check and bubble read) while pc x L^2 N sqrt(B) / 2
#: stays within this; beyond, p >= pc share K(pc)'s memory and K(P)'s bubble (3e7 until
#: session 13: on 100 x 64 identical its 4 levels cost 7% of the planning instructions
#: and pruned nothing the 2 or 3 levels of 1e6 do not; the same plans on all 121
#: solver_vs_dp rows, whose tables stay within it, and the 34 ordered-graph instances)
RELAX_WORK = 1e6
RELAX_LEVELS = 4
#: above this work the relaxed bound takes its weak O(N L) form (:meth:`_Tables.relaxed`)
RELAX_MAX = 2e8
#: Zc (:meth:`_Tables.class_bound`) is computed while its DP's (state, group) pairs x
#: L^2 / 2 stay within this (100 blocks, 8 + 8 devices: 1,944 pairs, 1e7)
CLASS_BOUND_WORK = 3e7
#: Zs (:meth:`_Tables.staged_bound`) is computed for a size only when its max(Q, Z) is
#: within this factor below the bound U (it lifted Z by 1-6% where measured), with this
#: weight on the first stage's all-reduce (docs/decisions.md, session 9)
STAGED_NEAR = 1.1
STAGED_FIRST = 0.25
#: Zw (:func:`reweighted_bound`) is computed, like Zs, where max(Q, Z) is within
#: ``STAGED_NEAR`` of the bound, with at most this much DP work (about 0.5 s here: a step
#: on 100 blocks x 64 devices at B = 16 takes 5 ms), and not where that allows fewer than
#: ``REWEIGHT_STEPS`` steps of its ascent
REWEIGHT_WORK = 2e8
REWEIGHT_STEPS = 10

#: head tables of a composition that at most this many states use (the ordered graph's
#: groups that straddle two classes: one state per device order) are evaluated only on
#: the block ranges those states may use within the bound (:meth:`_BatchSearch._heads`)
LAZY_USERS = 3

#: bytes of Algorithm 1 splits and of head tables kept (:class:`_Cache`; least recently
#: used evicted beyond)
BASE_CACHE_BYTES = 2**28
HEAD_CACHE_BYTES = 2**29

#: the first micro-batch size is searched under this multiple of its relaxed bound
#: (:func:`best_plan`), and again after the other sizes when its figure's margin exceeds it
#: (figure / bound was 1.05-1.37 on the planner_scaling cases, so U / bound up to 1.57:
#: at 1.3 most first searches ran twice)
FIRST_GUESS = 1.7
#: on the ordered graph the first search is the smallest size whose relaxed bound lies
#: within this fraction of the least (the figure of a smaller, cheaper search bounds the
#: larger ones: 512 x 8 searched 4 before 16, 42 -> 32 s; 100 x 64 2 before 4, -7%;
#: 100 x 16 mixed 2 before 4, -10%; same plans; docs/decisions.md, session 13)
FIRST_NEAR = 0.15

#: chains of more blocks than this are planned coarse to fine by default
#: (:mod:`planner.solvers.dp.multilevel`, docs/decisions.md)
MULTILEVEL_ABOVE = 200

#: default wall-clock limit of one DP run, seconds
DEFAULT_TIME_LIMIT = 60.0

INF = np.inf


@dataclass(frozen=True)
class DPResult:
    """The DP's plan, its cost-model figures and search statistics.

    ``status``: ``complete`` (every level searched) or ``timed_out`` (the best plan of
    the levels finished before the time limit)."""

    partition: Partition
    cost: PlanCost
    dp_value_ms: float
    solve_time_s: float
    candidates: dict[int, float]  # micro-batch size -> best predicted iteration ms
    status: str
    graph: str  # complete | ordered | none (no search ran: a warm start none could beat)
    #: every plan the cost model scored and found fitting memory: (figures, plan, DP value)
    scored: tuple[tuple[PlanCost, Partition, float], ...] = ()
    #: planned coarse to fine (:mod:`planner.solvers.dp.multilevel`), not on every block
    coarse_to_fine: bool = False


class _Timeout(Exception):
    """The time limit expired inside a level."""


def device_orders(problem: Problem, classes: list[DeviceClass]) -> list[list[int]]:
    """Class orders of the ordered graph: memory descending (then speed descending),
    speed ascending, speed descending; speed = 1 / (the whole model's forward + backward
    time at the largest micro-batch candidate); ties by first appearance. Duplicates
    removed."""
    cm_batch = max(problem.config.micro_batch_sizes())
    timing = problem.timings
    n_blocks = problem.model.num_blocks

    def model_ms(c: DeviceClass) -> float:
        t = timing[c.type]
        per_block = [
            float(np.interp(cm_batch, t.batch_sizes, f) + np.interp(cm_batch, t.batch_sizes, b))
            for f, b in zip(t.forward_ms, t.backward_ms, strict=True)
        ]
        return sum(per_block[:n_blocks]) * c.slowdown

    ks = range(len(classes))
    ms = [model_ms(c) for c in classes]
    orders = [
        sorted(ks, key=lambda k: (-classes[k].budget, ms[k], k)),
        sorted(ks, key=lambda k: (-ms[k], k)),
        sorted(ks, key=lambda k: (ms[k], k)),
    ]
    unique: list[list[int]] = []
    for order in orders:
        if order not in unique:
            unique.append(order)
    return unique


@dataclass
class _Graph:
    """States (count vectors, ascending size), edges (state, composition or -1 for a
    skip, next state) and each state's edge indices."""

    states: list[tuple[int, ...]]
    edges: list[tuple[int, int, int]]
    out: list[list[int]]
    kind: str


@dataclass(frozen=True)
class _Relaxed:
    """The relaxed lower bounds of :meth:`_Tables.relaxed`: F, E, PF (prefixes) indexed
    [blocks, devices], G, Q (suffixes) [p - 1, blocks, devices]."""

    f: np.ndarray
    e: np.ndarray
    g: np.ndarray
    q: np.ndarray
    z: float
    pf: np.ndarray

    @property
    def q_root(self) -> float:
        """Q(L, N): the least over the stage counts."""
        return float(self.q[:, -1, -1].min())


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
        self.budget = np.array([c.budget for c in classes])
        self.bw, self.lat = class_network(cm, classes)
        #: the fastest pair's rate and the least latency (the relaxed bounds' links)
        pairs = np.isfinite(self.bw)
        self.bw_max = float(self.bw[pairs].max()) if pairs.any() else INF
        self.lat_min = float(self.lat[pairs].min()) if pairs.any() else 0.0
        self.topology = problem.cluster.network.kind
        #: per class, whether every block's forward and backward times never fall as the
        #: batch grows (then even splits are Algorithm 1's and dominate, docstring)
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
        #: Z per (B, M, K(1)): :meth:`weighted_bound` and :meth:`relaxed` give the same
        self._z: dict[tuple[int, int, int], float] = {}

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

    def _unconstrained(
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
            self._curve[batch] = (curves, (np.diff(curves, axis=2) > 0).all(axis=2))
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
        base_y, base_ok, depth = self._unconstrained(cid, batch, rows)
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
        only those are read (O(classes) instead of O(devices) per row)."""
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
        for part, cols in ((two, ends), (~two, np.arange(len(slot)))):
            k, at, y_at = slot[cols][None, :], np.flatnonzero(part), y[part][:, cols]
            f_at, e_at = first[at][:, None], end[at][:, None]
            ef[at] = (self.fwd[k, e_at, y_at] - self.fwd[k, f_at, y_at]).max(1, initial=-INF)
            eb[at] = (self.bwd[k, e_at, y_at] - self.bwd[k, f_at, y_at]).max(1, initial=-INF)
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
        whatever their figures (:meth:`_BatchSearch._moves`)."""
        key = (cid, warmup, batch)
        size = self.n_blk + 1
        n_rows = len(self.rows_first)
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
        base_y, _, depth = self._unconstrained(cid, batch, todo)
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
        """Forget head tables of warm-ups other than ``keep`` (one level at a time)."""
        for key in [k for k in self._tables if k[1] not in (-1, keep)]:
            del self._tables[key]

    def lower_bound(self, batch: int, max_stages: int) -> float:
        """A lower bound on the exact iteration time of every plan at micro-batch
        ``batch``: with s = ceil(B / N), every stage's c = E_f + E_b is at least its
        blocks' time at >= s samples on the fastest class, so sum_p c_p >= T_min, the
        sum over blocks of the least time of any class at any batch >= s. The schedule
        runs one micro-batch forward and back through every step (>= T_min) and each
        step M times (>= M max_p c_p >= M T_min / P). O(K L max_batch)."""
        t_min = float(self.prefix_bound(batch)[-1])
        m = self.problem.config.global_batch // batch
        return max(t_min, m * t_min / max_stages)

    def prefix_bound(self, batch: int, devices: int | None = None) -> np.ndarray:
        """(L + 1,) entry j: a lower bound on the summed c = E_f + E_b of any stages that
        together hold blocks [0, j) at micro-batch ``batch`` on at most ``devices``
        devices (default all): the prefix sum of each block's least time on any class at
        any batch >= ceil(B / devices) (some device of a stage holds at least that share,
        and its time bounds the stage's E_f + E_b). O(K L max_batch), cached per share."""
        return self._share_prefix(-(-batch // (devices or sum(self.counts))))

    def relaxed(self, batch: int, m: int, warmups: list[int], in_flight: list[int]) -> _Relaxed:
        """Lower bounds from a relaxed plan space (module docstring, pruning), on at most n
        devices of the N (``warmups``: K(1), .., K(pc), the heads' warm-ups by the
        number of stages from the end, the last one standing for every p >= pc):

        * F[j, n]: the least summed c + tau of stages holding blocks [0, j) with a suffix
          after them, plus the first stage's all-reduce T_a (D' >= c0 + tau1 + D, and
          the root's X >= its head's T_a);
        * E[j, n]: the least max over those stages of (what the stages before it add)
          + M c, plus that T_a (the root's D holds each stage's M c shifted);
        * G[p, l, n]: the least D of a suffix of the last l blocks in p stages (pc: p >=
          pc), by the recurrence D' >= max(M c0, c0 + tau1 + (M - 1) o, c0 + tau1 + D);
        * Q[p, l, n]: the least max over its stages s of D_s + T_a^s (the root's D + X
          is at least that: X >= T_a^s - PB_s and D >= PB_s + D_s);
        * PF[j, n]: the least summed E_f + one-way link (occupancy + latency) of stages
          holding blocks [0, j) with a suffix after them (the root's D + X is at least
          PF + the suffix's D + X: D' >= c0 + tau1 + D, X' >= X - E_b0 - one way);
        * Z: a bound on the root's D + X that prices every plan's stages together
          (:meth:`_weighted`; Q's min of maxima lets the suffixes that give its D, S and
          all-reduce terms their least values be different plans).

        Relaxation: a stage on g devices has one with at least s = ceil(B / g) samples,
        so its c is at least the summed least time of its blocks on any class at any
        batch >= s, it fits memory only if Eq. 3 holds for s samples on the largest
        memory at its warm-up (a prefix stage: K(2)), and its T_a is at least the ring's
        over g devices on the fastest pair; a boundary's occupancy is at least its bytes
        per sample x (s on a switch, the sender's busiest port; ceil(B / N) point to
        point; B on a shared medium) / the fastest pair's bandwidth, its latency the
        least pair's. Only the least g of each share matters (fewer devices leave more
        to the rest). Exact DPs over (blocks, devices) of that relaxation (min of a max
        taken term by term, which only lowers it): O(pc L^2 N sqrt(B)) numpy work."""
        big_l, n_dev = self.n_blk, sum(self.counts)
        shares = sorted({-(-batch // g) for g in range(1, min(batch, n_dev) + 1)})
        if len(warmups) * (big_l + 1) ** 2 * (n_dev + 1) * len(shares) / 2 > RELAX_MAX:
            return self._relaxed_cheap(batch, m)
        need, c_tab, ef, eb, ta, occ, tau, lat_min = self._share_figures(batch, warmups)
        depth = len(warmups)
        # shift[share, n] = n - need[share], or the inf pad column when negative
        shift = np.arange(n_dev + 1)[None, :] - need[:, None]
        shift = np.where(shift >= 0, shift, n_dev + 1)
        width = n_dev + 2
        f_tab = np.full((big_l + 1, width), INF)
        e_tab = np.full((big_l + 1, width), INF)
        pf_tab = np.full((big_l + 1, width), INF)
        f_tab[0, : n_dev + 1] = e_tab[0, : n_dev + 1] = pf_tab[0, : n_dev + 1] = 0.0
        mid = c_tab[min(1, depth - 1)]
        ef_mid = np.where(np.isfinite(mid), ef, INF)  # E_f of the stages that fit
        ok = np.where(shift <= n_dev, 0.0, INF)  # (share, n): enough devices
        for j in range(1, big_l + 1):
            c0 = mid[:, 0, j][:, None]  # (share, 1): the first stage [0, j)
            t0 = ta[:, 0, j][:, None]
            f_first = (c0 + tau[:, j][:, None] + t0 + ok).min(axis=0)
            e_first = (m * c0 + t0 + ok).min(axis=0)
            pf_first = (ef_mid[:, 0, j][:, None] + tau[:, j][:, None] / 2 + ok).min(axis=0)
            f_tab[j, : n_dev + 1], e_tab[j, : n_dev + 1] = f_first, e_first
            pf_tab[j, : n_dev + 1] = pf_first
            if j > 1:
                f_sub = f_tab[1:j][:, shift]  # (i, share, n)
                e_sub = e_tab[1:j][:, shift]
                c = mid[:, 1:j, j].T[:, :, None]  # (i, share, 1)
                step = c + tau[:, j][None, :, None]
                f_tab[j, : n_dev + 1] = np.minimum(f_first, (f_sub + step).min(axis=(0, 1)))
                e_tab[j, : n_dev + 1] = np.minimum(
                    e_first, np.maximum(e_sub, f_sub + m * c).min(axis=(0, 1))
                )
                step = ef_mid[:, 1:j, j].T[:, :, None] + tau[:, j][None, :, None] / 2
                pf_sub = pf_tab[1:j][:, shift] + step
                pf_tab[j, : n_dev + 1] = np.minimum(pf_first, pf_sub.min(axis=(0, 1)))
        g_tab, q_tab, s_tab = (np.full((depth + 1, big_l + 1, width), INF) for _ in range(3))
        for suffix in range(1, big_l + 1):
            head = big_l - suffix  # the suffix's first block
            c = c_tab[0, :, head, big_l][:, None]
            s_tab[1, suffix, : n_dev + 1] = (c + ok).min(axis=0)
            g_tab[1, suffix, : n_dev + 1] = (m * c + ok).min(axis=0)
            q_tab[1, suffix, : n_dev + 1] = (m * c + ta[:, head, big_l][:, None] + ok).min(axis=0)
            if suffix == 1:
                continue
            cuts = big_l - np.arange(1, suffix)  # first block of the sub-suffix, l' = 1..l-1
            t = tau[:, cuts].T[:, :, None]  # (l', share, 1)
            o = occ[:, cuts].T[:, :, None]
            t_a = ta[:, head, cuts].T[:, :, None]
            f0 = ef[:, head, cuts].T[:, :, None]
            b0 = eb[:, head, cuts].T[:, :, None]
            for p in range(2, depth + 1):
                c = c_tab[p - 1][:, head, cuts].T[:, :, None]
                g_sub, q_sub, s_sub = (v[p - 1, 1:suffix] for v in (g_tab, q_tab, s_tab))
                if p == depth:  # p >= pc: the sub-suffix has p - 1 or more stages
                    g_sub, q_sub, s_sub = (
                        np.minimum(w, v[p, 1:suffix])
                        for w, v in ((g_sub, g_tab), (q_sub, q_tab), (s_sub, s_tab))
                    )
                s_sub = s_sub[:, shift]  # (l', share, n)
                s_new = c + t + s_sub
                # the head's bubble: M c0 + tau1 + S - (k - 1) E_f0 with k <= M in flight
                # (inf where the head does not fit: c inf)
                bubble = (m - in_flight[p - 1] + 1) * f0 + m * b0 + t
                bubble = bubble + np.where(np.isfinite(c), 0.0, INF) + s_sub
                d = np.maximum(
                    np.maximum(m * c, c + t + (m - 1) * o),
                    np.maximum(c + t + g_sub[:, shift], bubble),
                )
                s_tab[p, suffix, : n_dev + 1] = s_new.min(axis=(0, 1))
                g_tab[p, suffix, : n_dev + 1] = d.min(axis=(0, 1))
                q = np.maximum(d + t_a, (f0 + o + lat_min) + q_sub[:, shift])
                q_tab[p, suffix, : n_dev + 1] = q.min(axis=(0, 1))
        key = (batch, m, warmups[0])
        if key not in self._z:  # Z, unless :meth:`weighted_bound` gave it already
            self._z[key] = self._weighted(m, need, c_tab[0], ef, eb, ta, tau / 2)
        return _Relaxed(f_tab[:, :-1], e_tab[:, :-1], g_tab[1:, :, :-1], q_tab[1:, :, :-1],
                        self._z[key], pf_tab[:, :-1])  # fmt: skip

    def _share_figures(self, batch: int, warmups: list[int]) -> tuple:
        """The relaxed stage and link figures per share s (:meth:`relaxed`): the least
        devices of each share, c [warm-up, share, first, end] where it fits memory (inf
        elsewhere), E_f, E_b and T_a [share, first, end], the boundaries' occupancy and
        traversal [share, cut] (0 at the ends) and the least latency."""
        big_l, n_dev = self.n_blk, sum(self.counts)
        cm = self.cm
        shares = sorted({-(-batch // g) for g in range(1, min(batch, n_dev) + 1)})
        need = np.array([-(-batch // s) for s in shares])  # least devices of each share
        blocks = np.arange(big_l + 1)
        first, end = blocks[:, None], blocks[None, :]
        static = cm.state_factor * (cm.param_prefix[end] - cm.param_prefix[first])
        saved = cm.saved_prefix[end] - cm.saved_prefix[first]
        grad = np.where(first < end, cm.param_prefix[end] - cm.param_prefix[first], 0.0)
        budget = float(self.budget.max())
        bw_max, lat_min = self.bw_max, self.lat_min
        per_sample = np.concatenate([[0.0], cm.boundary[: big_l - 1], [0.0]])  # by cut
        n_s, depth = len(shares), len(warmups)
        # [warm-up, share, first, end]: stage c where it fits memory (inf elsewhere)
        c_tab = np.full((depth, n_s, big_l + 1, big_l + 1), INF)
        ef = np.zeros((n_s, big_l + 1, big_l + 1))  # least E_f and E_b alone
        eb = np.zeros((n_s, big_l + 1, big_l + 1))
        ta = np.zeros((n_s, big_l + 1, big_l + 1))
        occ = np.zeros((n_s, big_l + 1))  # [share, cut]
        for i, s in enumerate(shares):
            cum = self._share_prefix(s)
            c = np.where(first < end, cum[end] - cum[first], INF)
            cum = self._share_prefix(s, "f")
            ef[i] = np.where(first < end, cum[end] - cum[first], INF)
            cum = self._share_prefix(s, "b")
            eb[i] = np.where(first < end, cum[end] - cum[first], INF)
            for k, warm in enumerate(warmups):
                fits = samples_that_fit(budget, static, warm, saved, batch) >= s
                c_tab[k, i] = np.where(fits, c, INF)
            ta[i] = ring_allreduce_ms(grad, need[i], bw_max, lat_min, self.cm.shared_medium)
            occ[i] = per_sample * self.carried(batch, s) / bw_max
        tau = 2 * (occ + lat_min)
        tau[:, [0, big_l]] = 0.0
        return need, c_tab, ef, eb, ta, occ, tau, lat_min

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

    def weighted_bound(self, batch: int, m: int, warmups: list[int]) -> float:
        """Z alone (:meth:`_weighted`), as :meth:`relaxed` gives it (0 beyond
        ``RELAX_MAX``), without its other tables: a few DPs less."""
        big_l, n_dev = self.n_blk, sum(self.counts)
        shares = len({-(-batch // g) for g in range(1, min(batch, n_dev) + 1)})
        if len(warmups) * (big_l + 1) ** 2 * (n_dev + 1) * shares / 2 > RELAX_MAX:
            return 0.0
        key = (batch, m, warmups[0])
        if key not in self._z:
            need, c_tab, ef, eb, ta, _, tau, _ = self._share_figures(batch, warmups[:1])
            self._z[key] = self._weighted(m, need, c_tab[0], ef, eb, ta, tau / 2)
        return self._z[key]

    def _weighted(
        self, m: int, need: np.ndarray, c: np.ndarray, ef: np.ndarray, eb: np.ndarray,
        ta: np.ndarray, one_way: np.ndarray,
    ) -> float:  # fmt: skip
        """Z, a lower bound on the root's D + X of every plan on at most N devices, from
        the relaxed figures per share (:meth:`relaxed`; ``c`` inf where the stage cannot
        fit even at the least warm-up K(1), ``one_way`` the link after a stage by its
        cut).

        Along the chain D >= C_s + D_s for every stage s (C_s: the summed c + tau before
        it), and D_s >= (M - 1) c_s + tau_s + max(0, R_s - (k - 1) E_f^s) >= c_s + R_s +
        (M - 1) E_b^s (its bubble, k = min(K, M) <= M; R_s the traversal after it); the
        last stage's D_s = M c_s. So D >= S + (M - 1) b'_s for every s, S the whole
        traversal, b'_s = E_b^s (E_f + E_b for the last stage); and X >= T_a^s - PB_s for
        every s (module docstring). Averaged over the stages with the weights of their
        block counts (block j votes for its stage; the uniform weights 1 / L of each
        block; max >= any average):

            D + X >= sum_s [c_s + tau_s + (M - 1) mu_s b'_s + mu_s T_a^s
                            - (E_b^s + o_s) mu(> s)]

        mu_s: the stage's blocks / L, mu(> s): the blocks after it / L, o_s the link
        after it one way. Every figure's coefficient is >= 0 (E_b's is 1 - mu(> s) + ...),
        so each may take its relaxed least value, and the sum is additive over stages:
        an exact DP over (first block, devices), O(L^2 N sqrt(B)). Unlike Q it cannot
        give the all-reduces and the traversal to different plans: on 100 blocks x 64
        identical devices at B = 32 (M = 2) it gives 1,984 ms where Q gives 1,734 (the
        best plan the DP finds: 2,258), above the bound U = 1,814 of that search."""
        big_l, n_dev = self.n_blk, sum(self.counts)
        cut = np.arange(big_l + 1)
        mu = (cut[None, :] - cut[:, None]) / big_l  # [first, end): its blocks' weight
        after = (big_l - cut) / big_l  # [end]
        cost = stage_costs(mu, mu, after, m, np.isfinite(c), ef, eb, ta, one_way)
        return float(chain(cost, need, n_dev)[0][0, n_dev])

    def staged_bound(self, batch: int, m: int, warmups: list[int], lam: float) -> float:
        """Zs: Z (:meth:`_weighted`) with each stage's warm-up bubble at its own depth and
        part of the first stage's all-reduce counted whole (0 beyond ``RELAX_MAX``).

        A stage with n stages after it has k_n = min(K, M) micro-batches in flight, K =
        ``warmup_depth`` of the stage n + 1 from the end (a function of n alone). The
        closed form (:func:`planner.cost.model.pipeline_closed_form_ms`) gives D >= C_s +
        (M - 1) c_s + tau_s + max(0, R_s - (k_n - 1) E_f^s) >= S + (M - 1) E_b^s + (M -
        k_n) E_f^s (S the whole traversal), and for the last stage D >= C_s + M c_s = S +
        (M - 1) (E_f + E_b): Z's bound, which takes k_n = M for every stage but the last,
        plus (M - k_n) E_f^s. And X >= lam (T_a of the first stage, before which PB = 0)
        + (1 - lam) (Z's block-weighted average of T_a^s - PB_s), for lam in [0, 1]. The
        block-weighted average of the D terms plus that X bound is additive over stages
        with coefficients >= 0, so each figure takes its relaxed least value (Z's); a DP
        over (first block, devices, stages after it up to the first n with k_n = M):

            Zs_0[a, n] = min_g cost_0[a, L] (the last stage),
            Zs_j[a, n] = min_{e < L, g} Zs_{j-1}[e, n - g] + cost_j[a, e]   (j < J),
            Zs_J[a, n] = min_{e < L, g} min(Zs_{J-1}, Zs_J)[e, n - g] + cost_J[a, e],

        cost_j Z's stage cost with E_f's coefficient 1 + (M - k_j) mu (mu: the stage's
        blocks / L) and X's terms times 1 - lam, plus lam T_a where a = 0; answer the
        least Zs_j[0, N]. Every plan's D + X is at least its value, so a size whose Zs
        exceeds the bound U has no answer that can be re-scored. O(J L^2 N sqrt(B))."""
        big_l, n_dev = self.n_blk, sum(self.counts)
        shares = len({-(-batch // g) for g in range(1, min(batch, n_dev) + 1)})
        if len(warmups) * (big_l + 1) ** 2 * (n_dev + 1) * shares / 2 > RELAX_MAX:
            return 0.0
        need, c_tab, ef, eb, ta, _, tau, _ = self._share_figures(batch, warmups[:1])
        config = self.problem.config
        max_p = min(big_l, n_dev, config.max_stages or n_dev)
        in_flight = [1]  # the last stage: D >= C + M c, as with one in flight
        for n in range(1, max_p):
            k = min(config.warmup_depth(max_p - 1 - n, max_p, m), m)
            if k >= m:
                break
            in_flight.append(k)
        in_flight.append(m)
        cut = np.arange(big_l + 1)
        mu = (cut[None, :] - cut[:, None]) / big_l  # [first, end): its blocks' weight
        after = (big_l - cut) / big_l  # [end]
        one_way = tau[:, None, :] / 2
        with np.errstate(invalid="ignore"):
            x_terms = (1 - lam) * (mu * ta - (eb + one_way) * after)
            rest = eb * (1 + (m - 1) * mu) + 2 * one_way + x_terms
            costs = [np.where(np.isfinite(c_tab[0]), ef * (1 + (m - k) * mu) + rest, INF)
                     for k in in_flight]  # fmt: skip
        first = lam * ta  # added to the stage that starts at block 0
        shift = np.arange(n_dev + 1)[None, :] - need[:, None]
        shift = np.where(shift >= 0, shift, n_dev + 1)
        top = len(in_flight) - 1
        z = np.full((top + 1, big_l + 1, n_dev + 2), INF)
        for a in range(big_l - 1, -1, -1):
            extra = first[:, a] if a == 0 else np.zeros_like(first[:, a])  # (share, end)
            last = (costs[0][:, a, big_l] + extra[:, big_l])[:, None]  # (share, 1)
            z[0, a, : n_dev + 1] = (last + np.where(shift <= n_dev, 0.0, INF)).min(axis=0)
            if a + 1 == big_l:
                continue
            for j in range(1, top + 1):
                sub = z[j - 1, a + 1 : big_l]
                if j == top:
                    sub = np.minimum(sub, z[j, a + 1 : big_l])
                step = costs[j][:, a, a + 1 : big_l] + extra[:, a + 1 : big_l]
                z[j, a, : n_dev + 1] = (sub[:, shift] + step.T[:, :, None]).min(axis=(0, 1))
        return float(z[:, 0, n_dev].min())

    def class_bound(self, batch: int, m: int, warmups: list[int]) -> float:
        """Zc: Z (:meth:`_weighted`) with the devices counted per class, for two classes
        (0 otherwise, or beyond ``CLASS_BOUND_WORK``). Z lets every stage take each block's
        least time on any class, so on a mixed cluster it prices every stage as if it ran
        on the fastest class, all N devices of it; Zc keys its DP by how many devices of
        each class remain, so the fast class's devices are spent once.

        A stage's weighted figure alpha E_f + beta E_b (Z's coefficients, >= 0) on a group
        of g_k devices of class k (its used devices: every device holds a sample) is at
        least v whenever the devices cannot place the B samples with each below v: a
        class-k device with y samples has alpha E_f + beta E_b >= w_k(y), its blocks'
        least forward and backward times on class k at any batch >= y (inf where y
        samples do not fit its memory at the least warm-up K(1)), non-decreasing in y. So
        for any s_0, s_1 >= 1 with g_0 (s_0 - 1) + g_1 (s_1 - 1) <= B - 1 some class-0
        device holds >= s_0 samples or some class-1 device >= s_1, and the figure is at
        least min(w_0(s_0), w_1(s_1)); the bound is the largest of these over s_0 (s_1
        the largest its s_0 allows), or w_k(ceil(B / g_k)) for a one-class group. The
        link and all-reduce terms are Z's, at the group's size g_0 + g_1. DP over
        (first block, devices left per class):

            Zc[a, n] = min over a < e <= L, g <= n, 1 <= |g| <= B of
                       Zc[e, n - g] + cost_g[a, e],   Zc[L, n] = 0,

        answer Zc[0, counts]. Every plan's D + X is at least its value (Z's argument,
        term by term), so a micro-batch size whose Zc exceeds the bound U has no answer
        that can be re-scored. O(B L^2 prod(c_k + 1)) for the stage costs and O(L^2 P)
        for the DP, P the (state, group) pairs, sum_n prod(n_k + 1)."""
        big_l = self.n_blk
        # (state, group) pairs g <= n, g != 0: prod over classes of (c + 1)(c + 2) / 2,
        # less the states (before the |g| <= B filter)
        most = math.prod((c + 1) * (c + 2) // 2 for c in self.counts)
        most -= math.prod(c + 1 for c in self.counts)
        if len(self.classes) != 2 or most * (big_l + 1) ** 2 / 2 > CLASS_BOUND_WORK:
            return 0.0
        states = list(itertools.product(*(range(c + 1) for c in self.counts)))
        groups = [g for g in states if 1 <= sum(g) <= batch]
        index = {s: i for i, s in enumerate(states)}
        # (state, group) pairs with g <= n, by state: Zc[a, n] is the least over its pairs
        pairs = [(i, j) for i, n in enumerate(states) for j, g in enumerate(groups)
                 if all(a >= b for a, b in zip(n, g, strict=True))]  # fmt: skip
        w, lr = self.class_terms(batch, m, warmups[0])
        first, end = self.rows_first, self.rows_end
        cost = np.full((len(groups), big_l + 1, big_l + 1), INF)
        for j, (g0, g1) in enumerate(groups):
            if g1 == 0:
                v = w[0, -(-batch // g0)]
            elif g0 == 0:
                v = w[1, -(-batch // g1)]
            else:
                s0 = np.arange(1, -(-batch // g0) + 1)
                s1 = (batch - 1 - g0 * (s0 - 1)) // g1 + 1
                v = np.minimum(w[0, s0], w[1, s1]).max(axis=0)
            cost[j, first, end] = v + lr[g0 + g1]
        target = np.array([i for i, _ in pairs])
        source = np.array([index[tuple(a - b for a, b in zip(states[i], groups[j], strict=True))]
                           for i, j in pairs])  # fmt: skip
        group = np.array([j for _, j in pairs])
        starts = np.flatnonzero(np.r_[True, target[1:] != target[:-1]])
        z = np.full((big_l + 1, len(states)), INF)
        z[big_l] = 0.0
        for a in range(big_l - 1, -1, -1):
            best = (z[a + 1 :, source] + cost[group, a, a + 1 :].T).min(axis=0)  # (pairs,)
            z[a, target[starts]] = np.minimum.reduceat(best, starts)
        return float(z[0, index[self.counts]])

    def class_terms(self, batch: int, m: int, warmup: int) -> tuple[np.ndarray, np.ndarray]:
        """The per-class stage terms of Zc and Zp (:meth:`class_bound`, :meth:`priced_costs`),
        with Z's coefficients (:meth:`_weighted`; M = ``m``):

        * w[k, y, range]: a lower bound on alpha E_f + beta E_b of a class-k device with y
          samples on the range, its blocks' least forward and backward times on class k
          at any batch >= y (inf where y samples do not fit its memory at ``warmup``,
          the least warm-up K(1)); non-decreasing in y;
        * lr[n, range]: the link after the range and its share of the all-reduce, for a
          group of n devices (Z's: the one-way occupancy at share ceil(B / n) plus the
          least latency, times (2 - after); mu x the ring over n devices on the fastest
          pair), n = 1..min(B, N); inf at n = 0.

        O(K B L^2 + min(B, N) L^2)."""
        big_l, n_dev = self.n_blk, sum(self.counts)
        tau = self._share_figures(batch, [warmup])[6]
        first, end = self.rows_first, self.rows_end
        mu = (end - first) / big_l
        after = (big_l - end) / big_l
        alpha = 1 + (m - 1) * mu * (end == big_l)
        beta = 1 - after + (m - 1) * mu
        w = np.empty((len(self.classes), batch + 1, len(first)))
        y = np.arange(batch + 1)
        for k in range(len(self.classes)):
            least = []
            for table in (self.fwd[k], self.bwd[k]):
                per = np.diff(table[:, : batch + 1], axis=0)  # (L, B + 1) (blocks, batch)
                above = np.minimum.accumulate(per[:, ::-1], axis=1)[:, ::-1]  # batch >= y
                cum = np.concatenate([np.zeros((1, batch + 1)), above.cumsum(axis=0)])
                least.append(cum[end] - cum[first])  # (ranges, B + 1)
            cap = samples_that_fit(self.budget[k], self.static, warmup, self.saved, batch)
            value = alpha[:, None] * least[0] + beta[:, None] * least[1]
            w[k] = np.where(y[None, :] <= cap[:, None], value, INF).T
        bw_max, lat_min = self.bw_max, self.lat_min
        most = min(batch, n_dev)
        shares = sorted({-(-batch // g) for g in range(1, most + 1)})
        one_way = tau / 2
        lr = np.full((most + 1, len(first)), INF)
        for n in range(1, most + 1):
            link = one_way[shares.index(-(-batch // n)), end] * (2 - after)
            reduce = ring_allreduce_ms(self.grad, n, bw_max, lat_min, self.cm.shared_medium)
            lr[n] = link + mu * reduce
        return w, lr

    def priced_costs(self, batch: int, m: int, warmup: int) -> np.ndarray:
        """(ranges, K, B) the stage costs of Zp (:func:`planner.solvers.dp.prices.priced_bound`):
        entry [range, k, y - 1] is the least, over the levels v >= w[k, y] of the range
        (its w values, :meth:`class_terms`), of v + lr's least over the group sizes
        n >= ceil(B / h(v)), h(v) the most samples one device of any class holds at
        level v (w <= v). A stage on the range whose devices' largest w is v* and whose
        class-k devices hold at most y samples at that level (#{y' : w[k, y'] <= v*} =
        y, so v* >= w[k, y]) costs at least that in Z's sum: its n devices with samples
        place B, so n >= ceil(B / h(v*)). inf where w[k, y] is. O(R K B log(K B)), R =
        L (L + 1) / 2 ranges."""
        w, lr = self.class_terms(batch, m, warmup)
        n_cls, n_rng = len(self.classes), len(self.rows_first)
        most = lr.shape[0] - 1
        # least link and all-reduce over every size n' >= n (and inf beyond min(B, N))
        lr_from = np.minimum.accumulate(lr[::-1], axis=0)[::-1]
        lr_from = np.concatenate([lr_from, np.full((batch + 1 - most, n_rng), INF)])
        levels = w[:, 1:, :].transpose(2, 0, 1).reshape(n_rng, n_cls * batch)
        order = np.argsort(levels, axis=1, kind="stable")
        v = np.take_along_axis(levels, order, 1)
        # the most samples one device of any class holds at or below each level (ties
        # count fully at the last of their run, which the suffix minimum below reaches)
        holds = np.zeros(v.shape, dtype=np.int64)
        for k in range(n_cls):
            holds = np.maximum(holds, np.cumsum(order // batch == k, axis=1))
        fewest = -(-batch // holds)  # the fewest devices that place B samples below v
        at_level = np.where(np.isfinite(v), v + lr_from[fewest, np.arange(n_rng)[:, None]], INF)
        from_level = np.minimum.accumulate(at_level[:, ::-1], axis=1)[:, ::-1]
        place = np.empty_like(order)
        np.put_along_axis(place, order, np.arange(n_cls * batch)[None, :], 1)
        costs = np.take_along_axis(from_level, place, 1).reshape(n_rng, n_cls, batch)
        return np.where(np.isfinite(w[:, 1:, :].transpose(2, 0, 1)), costs, INF)

    def _relaxed_cheap(self, batch: int, m: int) -> _Relaxed:
        """The relaxed bounds' weak form, O(N L) (beyond ``RELAX_MAX``): F[j, n] the
        blocks' least times at share ceil(B / n) (:meth:`prefix_bound`), E[j, n] M times
        the largest of at most min(n, j) stages summing to it, G = Q = 0."""
        big_l, n_dev = self.n_blk, sum(self.counts)
        f_tab = np.full((big_l + 1, n_dev + 1), INF)
        f_tab[0] = 0.0
        for n in range(1, n_dev + 1):
            f_tab[:, n] = self.prefix_bound(batch, n)
        stages = np.maximum(np.minimum(np.arange(big_l + 1)[:, None], np.arange(n_dev + 1)), 1)
        zeros = np.zeros((1, big_l + 1, n_dev + 1))
        return _Relaxed(f_tab, m * f_tab / stages, zeros, zeros, 0.0, np.zeros_like(f_tab))

    def _share_prefix(self, share: int, part: str = "fb") -> np.ndarray:
        """(L + 1,) prefix sums of each block's least c = E_f + E_b (``part`` "fb"), E_f
        ("f") or E_b ("b") on any class at any batch >= ``share`` (cached)."""
        key = (share, part)
        if key not in self._prefix:
            table = {"fb": self.fb, "f": self.fwd, "b": self.bwd}[part]
            per_block = np.diff(table, axis=1)[:, :, share:].min(axis=(0, 2))
            self._prefix[key] = np.concatenate([[0.0], np.cumsum(per_block)])
        return self._prefix[key]

    # -- the state graph -----------------------------------------------------------------
    def useful(self, g: tuple[int, ...], batch: int) -> bool:
        """Whether group g is not dominated (module docstring): at most B devices, and a
        one-class group of a monotone class has the least size of its largest share."""
        size = sum(g)
        if not 1 <= size <= batch:
            return False
        if np.count_nonzero(g) == 1:
            k = next(i for i, v in enumerate(g) if v)
            if self.monotone[k]:
                share = -(-batch // size)
                return size == -(-batch // share)
        return True

    def falls(self, g: tuple[int, ...], batch: int) -> bool:
        """Whether the ordered graph keeps group g (module docstring): a one-class group
        always (:meth:`useful` has dropped its dominated sizes), a group of several
        classes only at a size where the even share falls, |g| = ceil(B / ceil(B / |g|))
        (the sizes a one-class group of a monotone class keeps)."""
        if np.count_nonzero(g) == 1:
            return True
        size = sum(g)
        return size == -(-batch // -(-batch // size))

    def graph(self, batch: int, orders: list[list[int]]) -> _Graph:
        """The complete graph if it has at most ``COMPLETE_MOVES`` moves, else the
        ordered one (module docstring)."""
        return self._complete(batch) if self.complete else self._ordered(batch, orders)

    @property
    def complete(self) -> bool:
        """Whether the complete graph has at most ``COMPLETE_MOVES`` moves (at any B)."""
        return math.prod((c + 1) * (c + 2) // 2 for c in self.counts) <= COMPLETE_MOVES

    def _complete(self, batch: int) -> _Graph:
        states = sorted(itertools.product(*(range(c + 1) for c in self.counts)), key=sum)
        index = {s: i for i, s in enumerate(states)}
        edges: list[tuple[int, int, int]] = []
        out: list[list[int]] = [[] for _ in states]
        for i, r in enumerate(states):
            for g in itertools.product(*(range(v + 1) for v in r)):
                if self.useful(g, batch):
                    sub = tuple(a - b for a, b in zip(r, g, strict=True))
                    out[i].append(len(edges))
                    edges.append((i, self.comp(g), index[sub]))
        return _Graph(states, edges, out, "complete")

    def _ordered(self, batch: int, orders: list[list[int]]) -> _Graph:
        n_cls = len(self.counts)
        suffixes: list[list[tuple[int, ...]]] = []
        for order in orders:
            seq = [k for k in order for _ in range(self.counts[k])]
            vecs = []
            for n in range(len(seq) + 1):
                v = [0] * n_cls
                for k in seq[len(seq) - n :]:
                    v[k] += 1
                vecs.append(tuple(v))
            suffixes.append(vecs)
        states = sorted({v for vecs in suffixes for v in vecs}, key=lambda v: (sum(v), v))
        index = {s: i for i, s in enumerate(states)}
        seen: set[tuple[int, int, int]] = set()
        for vecs in suffixes:
            for n in range(1, len(vecs)):
                r = vecs[n]
                seen.add((index[r], -1, index[vecs[n - 1]]))
                for n_sub in range(max(0, n - batch), n):
                    g = tuple(a - b for a, b in zip(r, vecs[n_sub], strict=True))
                    if self.useful(g, batch) and self.falls(g, batch):
                        seen.add((index[r], self.comp(g), index[vecs[n_sub]]))
        edges = sorted(seen)
        out: list[list[int]] = [[] for _ in states]
        for e, (i, _, _) in enumerate(edges):
            out[i].append(e)
        return _Graph(states, edges, out, "ordered")


def _relax_levels(tables: _Tables, batch: int) -> tuple[int, list[int], list[int]]:
    """M, the warm-ups K(1..pc) of the relaxed bounds' suffix levels and the in-flight
    micro-batches min(K, M) their bubble term may assume per level (the last level
    stands for every p >= pc: K(P)). pc: up to where K stops growing, within
    ``RELAX_WORK`` and ``RELAX_LEVELS`` (at least 2)."""
    config = tables.problem.config
    n_dev = sum(tables.counts)
    m = config.global_batch // batch
    max_p = min(tables.n_blk, n_dev, config.max_stages or n_dev)

    def warmup(p: int) -> int:
        return config.warmup_depth(max_p - min(p, max_p), max_p, m)

    shares = len({-(-batch // g) for g in range(1, min(batch, n_dev) + 1)})
    work = (tables.n_blk + 1) ** 2 * (n_dev + 1) * shares / 2
    grows = [p for p in range(2, max_p + 1) if warmup(p) > warmup(p - 1)]
    pc = max(2, min(max(grows, default=1), int(RELAX_WORK // work), RELAX_LEVELS))
    warmups = [warmup(p) for p in range(1, pc + 1)]
    in_flight = [min(k, m) for k in warmups]
    in_flight[-1] = min(warmup(max_p), m)
    return m, warmups, in_flight


def relaxed_bounds(tables: _Tables, batch: int) -> _Relaxed:
    """The relaxed lower bounds (:meth:`_Tables.relaxed`) at micro-batch ``batch``, over
    the levels of :func:`_relax_levels`."""
    m, warmups, in_flight = _relax_levels(tables, batch)
    return tables.relaxed(batch, m, warmups, in_flight)


def weighted_bound(tables: _Tables, batch: int) -> float:
    """Z of :func:`relaxed_bounds` alone (:meth:`_Tables.weighted_bound`)."""
    m, warmups, _ = _relax_levels(tables, batch)
    return tables.weighted_bound(batch, m, warmups)


def staged_weighted_bound(tables: _Tables, batch: int) -> float:
    """Zs of :meth:`_Tables.staged_bound` at micro-batch ``batch``, ``STAGED_FIRST`` of
    the first stage's all-reduce counted whole."""
    m, warmups, _ = _relax_levels(tables, batch)
    return tables.staged_bound(batch, m, warmups, STAGED_FIRST)


def reweighted_bound(tables: _Tables, batch: int, target: float) -> float:
    """Zw (:func:`planner.solvers.dp.block_weights.block_weighted_bound`: Z with its block weights
    raised by subgradient ascent) at micro-batch ``batch``; its ascent stops once above
    ``target``. 0 beyond ``RELAX_MAX`` (Z's cap) or where ``REWEIGHT_WORK`` allows fewer
    than ``REWEIGHT_STEPS`` steps."""
    m, warmups, _ = _relax_levels(tables, batch)
    big_l, n_dev = tables.n_blk, sum(tables.counts)
    shares = len({-(-batch // g) for g in range(1, min(batch, n_dev) + 1)})
    per_step = (big_l + 1) ** 2 * (n_dev + 1) * shares / 2
    if per_step > RELAX_MAX or per_step * REWEIGHT_STEPS > REWEIGHT_WORK:
        return 0.0
    need, c_tab, ef, eb, ta, _, tau, _ = tables._share_figures(batch, warmups[:1])
    return block_weighted_bound(need, np.isfinite(c_tab[0]), ef, eb, ta, tau / 2, m, n_dev,
                                target, int(REWEIGHT_WORK // per_step))  # fmt: skip


def class_weighted_bound(tables: _Tables, batch: int) -> float:
    """Zc of :meth:`_Tables.class_bound` at micro-batch ``batch`` (0 where not computed)."""
    m, warmups, _ = _relax_levels(tables, batch)
    return tables.class_bound(batch, m, warmups)


def priced_weighted_bound(tables: _Tables, batch: int, target: float) -> float:
    """Zp (:func:`planner.solvers.dp.prices.priced_bound`) at micro-batch ``batch``, on three or
    more
    device classes (0 otherwise: one class has no competition Z does not see, and two
    classes have Zc, the exact DP over the class counts that Zp relaxes); its ascent
    stops once above ``target``."""
    if len(tables.classes) < 3:
        return 0.0
    m, warmups, _ = _relax_levels(tables, batch)
    costs = tables.priced_costs(batch, m, warmups[0])
    return priced_bound(costs, tables.rows_first, tables.rows_end, tables.counts, target)


def _pareto(
    d: np.ndarray, x: np.ndarray, carry: np.ndarray, y: np.ndarray, keep: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per row, indices of ``keep`` candidates of the front, and whether each slot holds
    one (rows with fewer candidates alive are padded); ``x`` is the compared X' = max(X,
    H) of the module docstring. Picks in turn: least D + X; least
    S; least X; least D among the candidates whose Y is below the first pick's, when
    none of the picks so far has such a Y (else, or if there is none, least D + X);
    then least D + X again. S and X get a slot of their own because a later head adds
    the suffix's traversal S to its warm-up bubble and hides X behind its own backward
    time (recurrence in the module docstring): a suffix that ranks low by D + X can win
    after composition. The fourth slot keeps a suffix whose head group takes fewer
    samples per device (Y) in the front: it prices the link before it lower (a switch's
    busiest port carries max(Y_a, Y_b) samples), which D + X, S and X do not see. Such a
    group has more devices, so a larger all-reduce T_a in X, which the stages before it
    often hide (X' = max(T_a0, X - E_b0 - ...)), hence D as its key. Seen:
    pipedream-resnet18 on the 6-device Ethernet testbed, 8.96% above the best known plan
    while that plan's two-Nano suffix (Y = 2 against the Xavier NX's 4, the least D of
    its cell, 13th by D + X) had no slot.

    Selection by repeated argmin: take the alive candidate of least key (ties: least D),
    then drop every candidate it dominates in (D, X, S) (itself included). No alive
    candidate dominates a pick by the keys D + X, S or X (it would have a lower or
    equal key), so those picks are Pareto points in (D, X, S); the fourth is the least
    D of its subset. O(keep x rows x candidates).
    """
    total = d + x
    alive = np.isfinite(total) & np.isfinite(carry)
    rows = np.arange(len(d))
    chosen = np.zeros((len(d), keep), dtype=np.int64)
    valid = np.zeros((len(d), keep), dtype=bool)
    y_first = np.full((len(d), 1), -INF)
    y_kept = np.zeros((len(d), 1), dtype=bool)  # a pick has fewer samples than the first
    for j in range(keep):
        key = {1: carry, 2: x}.get(j, total) if keep > 3 else total
        if j == 3:
            fewer = alive & (y < y_first) & ~y_kept
            key = np.where(fewer.any(axis=1, keepdims=True), np.where(fewer, d, INF), total)
        masked = np.where(alive, key, INF)
        least = masked.min(axis=1, keepdims=True)
        # a row with no alive candidate (least inf) picks a dead one: found is false
        pick = np.argmin(np.where(masked == least, d, INF), axis=1)
        found = alive[rows, pick]
        chosen[:, j], valid[:, j] = np.where(found, pick, 0), found  # empty: column 0
        if not found.any():
            break
        if j == 0:
            y_first = y[rows, pick][:, None]
        y_kept |= (y[rows, pick][:, None] < y_first) & found[:, None]
        # keep what the pick does not dominate in (D, X, S): alive candidates are finite
        # in all three, and a row without a pick compares with inf (keeps every one)
        d_pick = np.where(found, d[rows, pick], INF)[:, None]
        alive &= (d < d_pick) | (x < x[rows, pick][:, None]) | (carry < carry[rows, pick][:, None])
        alive[rows, pick] = False
    return chosen, valid


def _front(
    d: np.ndarray, x: np.ndarray, carry: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_pareto`'s ``FRONT`` picks, run on the columns where some row has a finite D
    when they are fewer than half (a column of inf D holds no candidate: the picks and
    their order are the same; an empty slot reads column 0, as there)."""
    live = np.flatnonzero(np.isfinite(d).any(axis=0))
    if 2 * len(live) >= d.shape[1]:
        return _pareto(d, x, carry, y, FRONT)
    if not len(live):
        return np.zeros((len(d), FRONT), dtype=np.int64), np.zeros((len(d), FRONT), dtype=bool)
    chosen, ok = _pareto(d[:, live], x[:, live], carry[:, live], y[:, live], FRONT)
    return np.where(ok, live[chosen], 0), ok


def _fields(packed: np.ndarray) -> np.ndarray:
    """``packed`` with its last axis (an entry's fields) first, a view to unpack."""
    return packed.transpose(packed.ndim - 1, *range(packed.ndim - 1))


@dataclass
class _Level:
    """Fronts of one level over every state: values D, X, the carried S (summed
    traversal), Y (largest per-device samples of the entry's head group), N (its
    stage count, which a collapsed level does not fix), FREE (the memory left on its
    head's ring-replica holder) and TAIL (the ring replica its last stage sends to the
    plan's first stage), the head
    composition H of each entry and its parent (edge, l', slot, and whether the parent
    lies in this level: a skip, or a move inside a collapsed level). ``warm`` is the
    heads' warm-up; a ``collapsed`` level holds every stage count from its first on."""

    warm: int
    collapsed: bool
    #: (states, L + 1, FRONT, 7): D, X, S, O, Y, FREE, TAIL of each entry, and (.., 2):
    #: H, N; packed so that the search gathers an entry's values in one read
    vals: np.ndarray
    ints: np.ndarray
    edge: np.ndarray
    l_sub: np.ndarray
    k_sub: np.ndarray
    same: np.ndarray

    def __post_init__(self) -> None:
        self.d, self.x, self.s, self.o, self.y, self.free, self.tail = _fields(self.vals)
        self.h, self.n = _fields(self.ints)

    @classmethod
    def empty(cls, n_states: int, n_blk: int, warm: int, collapsed: bool) -> _Level:
        shape = (n_states, n_blk + 1, FRONT)
        vals = np.full((*shape, 7), INF)
        vals[..., 5] = -INF  # FREE
        ints = np.zeros((*shape, 2), dtype=np.int32)
        ints[..., 0] = -1  # H
        return cls(
            warm,
            collapsed,
            vals,
            ints,
            np.full(shape, -1, dtype=np.int32),
            np.zeros(shape, dtype=np.int32),
            np.zeros(shape, dtype=np.int8),
            np.zeros(shape, dtype=bool),
        )

    def trim(self) -> None:
        """Keep only the traceback (the values of a finished level are no longer read)."""
        self.vals, self.ints = np.empty((0, 0, 0, 7)), np.empty((0, 0, 0, 2), dtype=np.int32)
        self.__post_init__()


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
        deadline: float,
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
        self.answers: list[tuple[float, int, int, int, int, int, int]] = []
        self._pending: list[tuple[float, int, int, int, int, int, int]] = []
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
        #: round trips in the warm-up window of the head of an (n+1)-stage suffix (module
        #: docstring): ceil(M / min(K, M))
        self.rounds_of = -(-self.m // np.minimum(self.k_of[1:], self.m))
        #: under a bound that is a figure: prune by PF too (:meth:`_before`), and drop the
        #: candidates beyond the bound after their front's selection (:meth:`_rows`);
        #: under a guessed one, D + F > U goes before it (``early``; module docstring)
        self.by_pf = not guessed
        self.early = INF if self.by_pf else bound
        #: per (state, l): lower bounds on what the blocks before the suffix add to its D
        #: (F) and to its D + X (PF), inf where the cell holds nothing (:meth:`_before`)
        #: Fg (:meth:`_prefix`): it does not depend on the bound, so once per search
        self.prefix = self._prefix()
        self.before, self.pf = self._before()
        self.hidden = self._hidden()
        self._layout: tuple[int, int, bool, list[int]] = (0, 1, False, [])
        #: the base heads of the state being filled, every row from the first (_level)
        self._base_rows: tuple[int, tuple[np.ndarray, ...] | None] = (0, None)

    def _before(self) -> tuple[np.ndarray, np.ndarray]:
        """Two (states, L + 1) tables: for a suffix of l blocks on devices drawn from
        state r, lower bounds on what the blocks before it add to the DP value of a
        complete plan, or inf where no such plan can stay within the bound (module
        docstring, pruning). The blocks before it run on the n = N - |r| devices outside
        r and add at least max(F[L - l, n], Fg[r, l]) to the suffix's D (:meth:`_prefix`),
        and PF[L - l, n] to its D + X (:meth:`_Tables.relaxed`); the cell holds nothing
        when the root's D + X must exceed the bound: E[L - l, n], that first bound + G[l,
        |r|], Q[l, |r|] or PF[L - l, n] + Q[l, |r|] (least over the stage counts p) above
        it."""
        t, relaxed = self.t, self.relaxed
        big_l, n_dev = t.n_blk, sum(t.counts)
        rows = np.arange(big_l + 1)
        g_least, q_least = relaxed.g.min(axis=0), relaxed.q.min(axis=0)
        out = np.full((len(self.sizes), big_l + 1), INF)
        out_pf = np.full((len(self.sizes), big_l + 1), INF)
        for size in np.unique(self.sizes):
            at = self.sizes == size
            n_pre = n_dev - int(size)
            here = np.maximum(relaxed.f[big_l - rows, n_pre][None, :], self.prefix[at])
            forward = relaxed.pf[big_l - rows, n_pre] if self.by_pf else np.zeros(big_l + 1)
            least = np.maximum(
                np.maximum(relaxed.e[big_l - rows, n_pre], q_least[rows, size])[None, :],
                here + g_least[rows, size][None, :],
            )
            if self.by_pf:
                least = np.maximum(least, (forward + q_least[rows, size])[None, :])
            out[at] = np.where(least <= self.bound, here, INF)
            out_pf[at] = np.where(least <= self.bound, forward[None, :], INF)
        return out, out_pf

    def _prefix(self) -> np.ndarray:
        """Fg (states, L + 1): for a suffix of l blocks on devices drawn from state r, a
        lower bound on the summed c + tau of the stages before it, over this graph's own
        paths from the root to r (F relaxes which devices those stages have; Fg keeps
        each path's groups, so the classes and counts outside r). A move r -> r' with
        group g heading [L-l, L-l') adds at least c_lb + tau_lb: c_lb the head's
        :meth:`_Tables.head_bound`, inf where the range cannot fit even the fewest
        samples its busiest device holds, ceil(B / |g|), on the group's largest memory at
        the least warm-up any level uses, K(1); tau_lb = 2 (its cut's bytes per sample
        x the fewest samples the link carries (ceil(B / |g|) on a switch, ceil(B / N)
        point to point, B on a shared medium) / the fastest pair's rate + the least
        latency). D' >= c0 + tau1 + D along the chain, so the root's D is at least Fg[r,
        l] + the entry's D. Recurrence from Fg[root, L] = 0, states in descending size:
        Fg[r', l'] = min over edges r -> r' of Fg[r, l'] (a skip) or min over l > l' of
        Fg[r, l] + c_lb + tau_lb. O(E L^2) numpy work, E the moves."""
        t, graph = self.t, self.g
        big_l = t.n_blk
        warm = self.warmup(1)
        per_sample = np.where(np.arange(big_l + 1) > 0, self.per_sample, 0.0)  # by l'
        cost: dict[tuple[tuple[int, ...], int], np.ndarray] = {}
        out = np.full((len(graph.states), big_l + 1), INF)
        out[self.root, big_l] = 0.0
        for s in range(self.root, -1, -1):
            if not np.isfinite(out[s]).any():
                continue
            for e in graph.out[s]:
                _, cid, sub = graph.edges[e]
                if cid < 0:
                    np.minimum(out[sub], out[s], out=out[sub])
                    continue
                g = t.comps[cid]
                present = tuple(int(k) for k in np.flatnonzero(g))
                share = -(-self.batch // sum(g))
                if (present, share) not in cost:
                    fits = samples_that_fit(float(t.budget[list(present)].max()), t.dense_static,
                                            warm, t.dense_saved, self.batch) >= share  # fmt: skip
                    carried = t.carried(self.batch, share)
                    tau = 2 * (per_sample * carried / t.bw_max + t.lat_min)
                    cost[present, share] = np.where(
                        fits, t.head_bound(cid, self.batch) + tau[None, :], INF
                    )
                step = (out[s][:, None] + cost[present, share]).min(axis=0)
                np.minimum(out[sub], step, out=out[sub])
        return out

    def _hidden(self) -> np.ndarray:
        """(states, L + 1): for a suffix of l blocks on devices drawn from state r, a lower
        bound on the backward traversal PB of the stages before it (the blocks [0, L - l)
        on the n = N - |r| devices outside r, each stage with one device of at least
        ceil(B / n) samples: their least backward times at such a share,
        :meth:`_Tables._share_prefix`; 0 when n = 0). An entry's X enters the root's X
        as X - PB <= X - hidden, and the root's X is at least its first stage's
        T_a >= 0, so X below ``hidden`` never shows: fronts compare max(X, hidden)."""
        t = self.t
        big_l, n_dev = t.n_blk, sum(t.counts)
        out = np.zeros((len(self.sizes), big_l + 1))
        for size in np.unique(self.sizes):
            n_pre = n_dev - int(size)
            if n_pre > 0:
                cum = t._share_prefix(-(-self.batch // n_pre), "b")
                out[self.sizes == size] = cum[big_l - np.arange(big_l + 1)]
        return out

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
            if time.perf_counter() > self.deadline:
                raise _Timeout
            depth = self.t._unconstrained(cid, self.batch)[2]
            binding = depth[np.isfinite(depth) & (depth < k_max)]
            if binding.size:
                worst = max(worst, float(binding.max()))
        return 1 + max((p for p in range(1, self.max_p + 1) if self.warmup(p) <= worst), default=0)

    def run(self) -> list[tuple[float, int, int]]:
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
                if p == 1 and time.perf_counter() > self.deadline:
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
            if not only_root and time.perf_counter() > self.deadline:
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
        edge, head, l_sub, k_sub, same = self._decode(meta, chosen, l_here, level)
        level.h[at] = np.where(ok, head, -1)
        level.edge[at] = np.where(ok, edge, -1)
        level.l_sub[at] = l_sub
        level.k_sub[at] = k_sub
        level.same[at] = same
        if s == self.root and r1 == big_l + 1:
            # the complete plans within the bound (a D above it: nothing to score)
            total = np.where(d[-1] <= self.bound, d[-1] + x[-1], INF)
            # one candidate per value: skips reach the same plan along several paths
            _, first = np.unique(total, return_index=True)
            best = first[np.isfinite(total[first])][:RERANK][None, :]
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
        elif lazy:
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
        t, graph, m = self.t, self.g, self.m
        big_l = t.n_blk
        cids = [graph.edges[e][1] for e in moves]
        state = graph.edges[moves[0]][0]  # the moves' state
        before, forward = self.before[state, r0:r1], self.pf[state, r0:r1]
        if front is None:
            heads = self._heads(cids, warm, state, None, [], r0)
            c0 = np.array([h[0][r0:r1, 0] for h in heads]).T  # (l, T)
            x = np.array([h[2][r0:r1, 0] for h in heads]).T
            d = np.where(m * c0 + before[:, None] <= self.early, m * c0, INF)
            y, hold_b, hold_y, used = (
                np.array([h[i][r0:r1, 0] for h in heads]).T for i in range(3, 7)
            )
            at = (slice(r0, r1), 0)
            with np.errstate(invalid="ignore"):
                free = hold_b - stage_memory_bytes(
                    t.dense_static[at][:, None], self.k_of[1], hold_y, t.dense_saved[at][:, None]
                )
            tail = np.where(used == 1, t.dense_replica[at][:, None], 0.0)
            return d, x, c0, np.zeros_like(c0), y, np.ones(c0.shape, np.int64), free, tail
        subs = [graph.edges[e][2] for e in moves]
        finite = np.isfinite(front.d[subs])  # (T, l', F)
        lps = np.flatnonzero(finite.any(axis=(0, 2)))
        lo, hi = max(int(lps[0]), p - 1), min(int(lps[-1]), r1 - 2)
        if hi < lo:
            return None
        width_band = hi - lo + 1
        heads = self._heads(cids, warm, state, front, subs, r0)
        if np.isfinite(self.bound):
            # what cannot stay within the bound is not built: D' >= max(M c0, c0 + D)
            # (tau1 >= 0), so a pair (l, l') whose head's M c0 or c0 plus the least D of
            # its front, plus what the blocks before it add, exceeds the bound holds
            # nothing; moves without any other pair go, l' narrows to the pairs left,
            # and the head band is their longest head l - l' (heads read inf on the
            # pairs :meth:`_heads` left out, which hold nothing)
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
            moves, cids, heads, subs = ([v[i] for i in live] for v in (moves, cids, heads, subs))
            pairs = alive[live].any(axis=0)  # (l, l')
            lps = lo + np.flatnonzero(pairs.any(axis=0))
            reach = np.arange(r0, r1)[:, None] - np.arange(lo, hi + 1)[None, :]
            width_band = int(np.where(pairs, reach, 0).max())
            lo, hi = int(lps[0]), int(lps[-1])
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
        with np.errstate(invalid="ignore"):
            occ = boundary_occupancy_ms(per_sample, y0, sub_y, self.batch, bw, t.topology)
            one_way = occ + lat  # (l, T, l', f)
            tau1 = 2 * one_way
            rest = tau1 + sub_s
            ef0 = c0 - eb0
            bubble = np.maximum(0.0, rest - (self.k_of[sub_n + 1] - 1) * ef0)
            s_new = c0 + rest
            d_new = np.maximum(
                np.maximum(
                    np.maximum(m * c0 + bubble, self.rounds_of[sub_n] * s_new),
                    c0 + tau1 + (m - 1) * link_period_ms(occ, sub_o, t.topology),
                ),
                c0 + tau1 + sub_d,
            )
            x_new = np.maximum(ta0, sub_x - eb0 - one_way)
            o_new = link_downstream_ms(occ, sub_o, t.topology)
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


def choose(
    found: list[tuple[PlanCost, Partition, float]],
) -> tuple[PlanCost, Partition, float]:
    """The tie rule: among the plans within ``TIE_TOLERANCE`` of the fastest exact
    iteration time, the one using fewest devices, then fewest stages, then the smallest
    micro-batch, then the fastest."""
    fastest = min(cost.iteration_ms for cost, _, _ in found)
    return min(
        (c for c in found if c[0].iteration_ms <= fastest * (1 + TIE_TOLERANCE)),
        key=lambda c: (
            len(c[1].used_devices()),
            c[1].num_stages,
            c[1].micro_batch_size,
            c[0].iteration_ms,
        ),
    )


def check_incumbent(problem: Problem, incumbent: Partition) -> None:
    """Raise unless ``incumbent`` is a plan of ``problem`` at one of its micro-batch
    candidates (:class:`~planner.errors.PlanMismatchError`, :class:`InputError`)."""
    check_partition(problem, incumbent)
    sizes = problem.config.micro_batch_sizes()
    if incumbent.micro_batch_size not in sizes:
        raise InputError(
            "incumbent",
            str(incumbent.micro_batch_size),
            f"the warm start's micro-batch size is not one of the config's "
            f"candidates {list(sizes)}; give a plan of the DP's space",
        )


def plan_dp(
    problem: Problem,
    progress: Callable[[int, int], None] | None = None,
    time_limit: float = DEFAULT_TIME_LIMIT,
    *,
    by_class: bool = True,
    incumbent: Partition | None = None,
    multilevel: bool = True,
) -> DPResult:
    """Best partition found by the DP over every micro-batch candidate.

    Args:
        problem: the inputs.
        progress: optional ``callback(done, total)`` after each level of each micro-batch
            candidate.
        time_limit: wall-clock seconds; when they run out the best plan so far is
            returned with status ``timed_out``.
        by_class: key states by device class (default); ``False`` makes every device a
            class of its own (the device-by-device DP, for tests and benchmarks).
        incumbent: a warm start, a known plan of ``problem`` at one of its micro-batch
            candidates (re-planning passes its fast-path plan): scored first, so that
            every search, the first included, runs under the bound of its exact figure
            instead of a guess, and kept as a candidate, so the answer is never slower
            than it beyond the tie tolerance (:func:`choose` may prefer a plan within
            ``TIE_TOLERANCE`` on fewer devices); it is returned, with its closed form as
            the DP value, when the search finds nothing better.
        multilevel: on a chain of more than
            :data:`MULTILEVEL_ABOVE` blocks, plan coarse to fine
            (:func:`planner.solvers.dp.multilevel.plan_multilevel`: the DP on merged blocks, then on
            the cuts near the coarse plans' cuts); ``False`` runs the DP on every block.

    Raises:
        InfeasibleError: no candidate fits memory (message names the binding figure).
        PlanMismatchError: the incumbent is not a plan of ``problem``.
        InputError: the incumbent's micro-batch size is not a candidate.
    """
    if multilevel and problem.model.num_blocks > MULTILEVEL_ABOVE:
        # imported here: the multilevel planner runs best_plan itself
        from edgepipe.planner.solvers.dp.multilevel import plan_multilevel

        result = plan_multilevel(problem, progress, time_limit, by_class=by_class,
                                 incumbent=incumbent)  # fmt: skip
    else:
        result = best_plan(problem, progress, time_limit, by_class=by_class,
                           incumbent=incumbent)  # fmt: skip
    if result is None:
        # imported here: the diagnosis runs the DP itself (on clusters with more memory)
        from edgepipe.planner.solvers.diagnosis import diagnose_infeasible

        raise diagnose_infeasible(problem)
    return result


def best_plan(
    problem: Problem,
    progress: Callable[[int, int], None] | None = None,
    time_limit: float = DEFAULT_TIME_LIMIT,
    *,
    by_class: bool = True,
    incumbent: Partition | None = None,
) -> DPResult | None:
    """:func:`plan_dp` without the diagnosis: ``None`` when nothing fits."""
    # the searches' arrays stay on mapped pages (planner.solvers.dp.allocator)
    retain_freed_memory()
    start = time.perf_counter()
    deadline = start + time_limit
    sizes = problem.config.micro_batch_sizes()
    cm = CostModel(problem, max(sizes))
    classes = device_classes(problem)
    if not by_class:
        classes = [
            DeviceClass(c.type, c.budget, c.slowdown, (i,)) for c in classes for i in c.members
        ]
    tables = _Tables(problem, cm, classes)
    orders = device_orders(problem, classes)
    n_dev = len(problem.cluster.devices)
    per_batch_levels = min(problem.model.num_blocks, n_dev, problem.config.max_stages or n_dev)
    total = per_batch_levels * len(sizes)
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(min(done, total), total)

    found: list[tuple[PlanCost, Partition, float]] = []
    per_batch: dict[int, float] = {}
    seen: set[Partition] = set()
    waiting: list[tuple[float, int, Partition]] = []

    def score(value: float, batch: int, partition: Partition, cost: PlanCost | None = None) -> bool:
        """Score one plan by the cost model (``cost``: its figures, when evaluated
        already); whether it fits memory (the search checks stage memory and ring
        replicas with a conservative holder; this is the figure)."""
        cost = cost if cost is not None else cm.evaluate(partition)
        if not cost.memory_ok:
            return False
        per_batch[batch] = min(per_batch.get(batch, INF), cost.iteration_ms)
        found.append((cost, partition, value))
        return True

    if incumbent is not None:
        # the warm start: its exact figure bounds every search from the first on (module
        # docstring, "Pruning"), and it competes in the final choice
        check_incumbent(problem, incumbent)
        seen.add(incumbent)
        cost = cm.evaluate(incumbent)
        score(
            pipeline_closed_form_ms(cm, incumbent, cost),
            incumbent.micro_batch_size,
            incumbent,
            cost,
        )
    status, kind = "complete", "none"  # the graph searched; none when no search ran
    bounds = {b: tables.lower_bound(b, per_batch_levels) for b in sizes}
    # micro-batch sizes: first the one of least lower bound on the exact figure (a small
    # size, whose search is cheap: a first plan early, also under a time limit), then in
    # order of the relaxed bound on their DP values, so that the likeliest figures come
    # early and prune the later searches (or skip them)
    relaxed: dict[int, _Relaxed] = {}
    weighted: dict[int, float] = {}  # Z alone, of the sizes whose tables are not built
    by_class: dict[int, float] = {}  # Zc of the sizes after the first (skips only)
    staged: dict[int, float] = {}  # Zs of the sizes after the first near U (skips only)
    reweighted: dict[int, float] = {}  # Zw where Zs is computed (skips only)
    priced: dict[int, tuple[float, float]] = {}  # Zp and the bound its ascent rose toward
    deferred: list[int] = []  # the first size, searched again after the others

    def priced_above(b: int, bound: float) -> bool:
        """Whether Zp exceeds ``bound``; Zp is raised toward ``bound`` unless a value
        raised toward it, or one above it, is known (any Zp is a bound on every plan)."""
        if b not in priced or priced[b][0] <= bound != priced[b][1]:
            priced[b] = (priced_weighted_bound(tables, b, bound), bound)
        return priced[b][0] > bound

    def root(b: int) -> float:
        """max(Q(L, N), Z), or Z (a lower bound on it) where the tables are not built."""
        return max(relaxed[b].q_root, relaxed[b].z) if b in relaxed else weighted[b]

    def micro_batches() -> Iterator[int]:
        # every size's Z first (a tenth of its tables' time), in order of the cheap bound
        # and while the time limit lasts; then the tables in order of Z until no size
        # left can have a lesser max(Q, Z) (>= Z) than the least found, and the search
        # of that least relaxed bound: its figure is likeliest to be low and prune the
        # others (the cheap bound ties on every size whose share ceil(B / N) is 1); on
        # the ordered graph the smallest size near it (FIRST_NEAR), a cheaper search
        for b in sorted(sizes, key=lambda b: (bounds[b], b)):
            weighted[b] = weighted_bound(tables, b)
            if time.perf_counter() >= deadline:
                break
        for b in sorted(weighted, key=lambda b: (weighted[b], b)):
            if relaxed and (weighted[b], b) > min((root(a), a) for a in relaxed):
                break
            relaxed[b] = relaxed_bounds(tables, b)
            if time.perf_counter() >= deadline:
                break
        least = min(root(b) for b in relaxed)
        near = 0.0 if tables.complete else FIRST_NEAR
        first = min(b for b in relaxed if root(b) <= least * (1 + near))
        yield first
        if found and time.perf_counter() >= deadline:
            return  # out of time with a plan: no other size's tables are built
        # a size whose Z exceeds the bound now is skipped whenever it comes (the bound
        # only falls), so its tables are not built and its place does not matter
        weighted.update({b: weighted_bound(tables, b) for b in sizes if b not in weighted})
        fastest = min((c.iteration_ms for c, _, _ in found), default=INF)
        for b in sizes:
            # Zc (devices counted per class) is no bound on the order, which stays that
            # of max(Q, Z): it only skips, so the sizes searched and their order are the
            # same as without it
            if b not in relaxed and weighted[b] <= fastest * (1 + RESCORE_MARGIN):
                by_class[b] = class_weighted_bound(tables, b)
                if weighted[b] * STAGED_NEAR > fastest * (1 + RESCORE_MARGIN):
                    staged[b] = staged_weighted_bound(tables, b)
                if max(by_class[b], staged.get(b, 0.0)) > fastest * (1 + RESCORE_MARGIN):
                    continue
                if b in staged:  # near the bound: Zw, as Zs
                    reweighted[b] = reweighted_bound(tables, b, fastest * (1 + RESCORE_MARGIN))
                if reweighted.get(b, 0.0) > fastest * (1 + RESCORE_MARGIN):
                    continue
                # Zp too (skips only): a size it skips now is skipped at its turn (U only
                # falls), so its tables are not built
                if not priced_above(b, fastest * (1 + RESCORE_MARGIN)):
                    relaxed[b] = relaxed_bounds(tables, b)
        yield from sorted((b for b in sizes if b != first), key=lambda b: (root(b), b))
        yield from deferred  # the first size, when its guess proved low (below)

    for i, batch in enumerate(micro_batches()):
        if found and time.perf_counter() >= deadline:
            status = "timed_out"  # a plan exists: the sizes left are not searched
            break
        fastest = min((c.iteration_ms for c, _, _ in found), default=INF)
        if bounds[batch] > fastest * (1 + TIE_TOLERANCE):
            continue  # no plan at this micro-batch size can win or tie
        # no answer whose DP value exceeds the fastest figure by RESCORE_MARGIN is ever
        # re-scored, so the search drops what cannot finish below that
        if max(root(batch), by_class.get(batch, 0.0)) > fastest * (1 + RESCORE_MARGIN):
            continue  # no answer at this micro-batch size could be re-scored
        # Zs (warm-up bubbles at their depth, the first stage's all-reduce) only skips, as
        # Zc: the sizes searched keep their order; computed where max(Q, Z) is near U
        if batch not in staged and root(batch) * STAGED_NEAR > fastest * (1 + RESCORE_MARGIN):
            staged[batch] = staged_weighted_bound(tables, batch)
        if staged.get(batch, 0.0) > fastest * (1 + RESCORE_MARGIN):
            continue
        # Zw (block weights by ascent) only skips too, computed where Zs is
        if batch in staged and batch not in reweighted:
            reweighted[batch] = reweighted_bound(tables, batch, fastest * (1 + RESCORE_MARGIN))
        if reweighted.get(batch, 0.0) > fastest * (1 + RESCORE_MARGIN):
            continue
        # Zp (stages priced per device class, three or more classes) is computed for a
        # size that would be searched now, against the bound it would be searched under
        # (unless known above it since its tables were considered); like Zc it only skips
        bound = fastest * (1 + RESCORE_MARGIN)
        if np.isfinite(bound) and priced_above(batch, bound):
            continue
        tables.clear()
        graph = tables.graph(batch, orders)
        kind = graph.kind
        # the first size searched has no figure to prune by: it searches under a guess,
        # FIRST_GUESS x its relaxed bound, and again (after the other sizes, or at once
        # without a bound when it found nothing) when its figure's margin is above it
        guessed = not np.isfinite(bound)
        if guessed:
            bound = root(batch) * FIRST_GUESS
        while True:
            search = _BatchSearch(tables, graph, batch, deadline, tick, bound, relaxed[batch],
                                  guessed)  # fmt: skip
            try:
                answers = search.run()
            except _Timeout:
                status = "timed_out"
                answers = getattr(search, "answers", [])
            done = min((i + 1) * per_batch_levels, total)
            if progress is not None:
                progress(done, total)
            # the best answer of each micro-batch size is scored at once (its figure
            # prunes the sizes still to come) unless its DP value is already
            # RESCORE_MARGIN above the fastest figure; the others wait for the final
            # re-scoring
            evaluated_here = False
            for answer in answers:
                partition = search.reconstruct(answer)
                if partition in seen:
                    continue
                seen.add(partition)
                fastest = min((c.iteration_ms for c, _, _ in found), default=INF)
                if evaluated_here or answer[0] > fastest * (1 + RESCORE_MARGIN):
                    waiting.append((answer[0], batch, partition))
                    continue
                evaluated_here = score(answer[0], batch, partition)
            fastest = min((c.iteration_ms for c, _, _ in found), default=INF)
            if not guessed or status == "timed_out" or fastest * (1 + RESCORE_MARGIN) <= bound:
                break
            if np.isfinite(fastest):
                # the guess lay below the figure's margin: the size is searched again after
                # the others, under the bound then (or skipped by it), so that a time
                # limit finds the other sizes' plans first
                deferred.append(batch)
                break
            bound, guessed = INF, False  # nothing found: again at once, without a bound
    # re-score the waiting answers in order of their DP value while they can still win:
    # at most RESCORE of them, none whose value exceeds the fastest figure found by
    # RESCORE_MARGIN (the DP value over-predicts by less: RESCORE_MARGIN's comment)
    waiting.sort(key=lambda w: w[0])
    searched = time.perf_counter() - start
    budget_end = min(deadline, time.perf_counter() + max(RESCORE_MIN_S, RESCORE_SHARE * searched))
    for k, (value, batch, partition) in enumerate(waiting):
        fastest = min((c.iteration_ms for c, _, _ in found), default=INF)
        over = k >= RESCORE or time.perf_counter() > budget_end
        if found and (over or value > fastest * (1 + RESCORE_MARGIN)):
            break
        # a plan whose figure is provably above the tie window and above its size's
        # best figure so far (CostModel.round_lower_bound_ms, ~10x cheaper) changes
        # neither the fastest, nor the plans within the tie tolerance (the fastest only
        # falls), nor the per-size figures: it is not scored. The bound and the figure
        # add the same terms in other orders (a last-digit difference was seen: review 9
        # F1), hence the relative slack ROUNDING_SLACK
        least = max(fastest * (1 + TIE_TOLERANCE), per_batch.get(batch, INF))
        if np.isfinite(least) and cm.round_lower_bound_ms(partition) > least * (1 + ROUNDING_SLACK):
            continue
        score(value, batch, partition)
    if not found:
        return None
    cost, partition, value = choose(found)
    return DPResult(partition, cost, value, time.perf_counter() - start, per_batch, status, kind,
                    tuple(found))  # fmt: skip
