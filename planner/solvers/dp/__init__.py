"""Asteroid's planning DP (Algorithm 2, reference/asteroid.md §4.2), keyed by device class,
with exact composition, several device orders and a time limit.

Inputs: a :class:`~planner.inputs.problem.Problem` (L blocks, N devices in K classes of
interchangeable devices, :mod:`planner.solvers.classes`; global batch G; micro-batch
candidates B, M = G / B micro-batches) and a wall-clock limit.

State (per B): Q(p, l, r), the front of the best suffix plans putting the last l blocks
into p stages on devices drawn from r, r = (r_1..r_K) the devices still available per
class (the DP never names devices: a stage's group is a composition g = (g_1..g_K)).

Recurrence: a move r -> r - g makes group g the head stage of blocks [L-l, L-l') in front
of an entry of Q(p - 1, l', r - g); a skip r -> r - e_k leaves a device idle. Composing a
head with its link onto an entry gives the longer suffix's value exactly as the cost
model's closed form (:func:`planner.cost.closed_form.pipeline_closed_form_ms`) prices it: D + X,
the round time, with the carried traversal S, link period O, samples Y, stage count N and
ring-replica memory FREE / TAIL. Answer: the root Q(p, L, all devices)'s best entries,
re-scored by the exact schedule makespan, and the tie rule.

Exactness: the DP value equals the closed form of the reconstructed plan when every
device of every group gets samples, on every topology except point-to-point groups of
several devices (there the DP's piece bound min(Y_a, Y_b) is an upper bound of the cost
model's, which reads the pieces); Algorithm 1 may give a device 0 samples, then the DP
value is an upper bound too (tests/unit/test_dp.py checks both on non-uniform networks of
each topology). On the complete graph the DP is optimal over every device assignment with
Algorithm 1 splits, up to the front cap, the carried values and the closed form's ranking
(the best are re-scored exactly).

Complexity per B, with S states, E moves, C distinct compositions and P = min(L, N,
max_stages) levels: the bounds (O(L^2 N sqrt(B)) numpy work each), C head tables of
Algorithm 1 over the O(L^2) block ranges, P x E compositions of O(L W F) numpy work each
(W <= L the head band, F the front size), then at most (number of B) + ``RESCORE`` exact
evaluations; the complete graph has S = prod_k (c_k + 1) states, the ordered graph S <= 3
(N + 1). Each module states its own part.

Where each part lives (Alpa's split: tables built first, a small DP over them):

* :mod:`~planner.solvers.dp.driver`: :func:`plan_dp`, the entry point (multilevel on long
  chains, the diagnosis when nothing fits);
* :mod:`~planner.solvers.dp.multilevel`: coarse-to-fine planning of long chains;
* :mod:`~planner.solvers.dp.sizes`: :func:`best_plan`, the loop over the micro-batch sizes
  (their order, bounds U, re-scoring, tie rule :func:`choose`, time limit; ``DPResult``);
* :mod:`~planner.solvers.dp.tables`: the cost tables (per-class block figures, Algorithm 1's
  splits, the head figures of each composition, cached);
* :mod:`~planner.solvers.dp.graph`: the state graphs (complete, ordered) and device orders;
* :mod:`~planner.solvers.dp.bounds`: the lower bounds from a relaxed plan space (F, E, G, Q,
  PF, Z, Zs, Zc, the drivers of Zp and Zw) and a search's own (Fg over the graph's paths,
  the cell bounds, the hidden backward traversal), with :mod:`~planner.solvers.dp.prices`
  (Zp), :mod:`~planner.solvers.dp.block_weights` (Zw) and their step schedule
  :mod:`~planner.solvers.dp.ascent`;
* :mod:`~planner.solvers.dp.search`: the DP of one size over one graph (levels, pruning,
  answers, reconstruction);
* :mod:`~planner.solvers.dp.recurrence`: composing a head onto an entry (the formula);
* :mod:`~planner.solvers.dp.fronts`: the fronts' selection and storage;
* :mod:`~planner.solvers.dp.allocator`: glibc's thresholds, so the searches' arrays stay
  on mapped pages.

Importers use the modules directly (``from edgepipe.planner.solvers.dp.driver import
plan_dp``); this package exports nothing.
"""
