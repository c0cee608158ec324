"""The DP planner (planner.solvers.dp) against brute force, the exact solver and itself."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from edgepipe.planner import api
from edgepipe.planner.cost.closed_form import (
    boundary_occupancy_ms,
    link_downstream_ms,
    link_period_ms,
    pipeline_closed_form_ms,
)
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.errors import InfeasibleError
from edgepipe.planner.inputs.cluster import Cluster
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import make_problem
from edgepipe.planner.inputs.profile import ModelProfile
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.solvers.classes import device_classes
from edgepipe.planner.solvers.dp import fronts as dp_fronts
from edgepipe.planner.solvers.dp import graph as dp_graph
from edgepipe.planner.solvers.dp import search as dp_search
from edgepipe.planner.solvers.dp import sizes as dp_sizes
from edgepipe.planner.solvers.dp import tables as dp_tables
from edgepipe.planner.solvers.dp.driver import plan_dp
from edgepipe.planner.solvers.dp.sizes import TIE_TOLERANCE
from edgepipe.planner.solvers.time_limit import Deadline

from tests.helpers.dp_cases import NON_UNIFORM, identical, mixed, searched_sizes, tiny
from tests.helpers.oracles import brute_force_best
from tests.helpers.synthetic import random_problem

#: the seed where the DP's choice is off the optimum: it ranks the plans it scored by the
#: steady-state step, while its search bounds and re-scoring skips are on the isolated
#: iteration (docs/planners.md): seed 20's plan is 1.0% above the best steady step and
#: 3.4% above the best iteration (by the oracle)
STEADY_OFF = {20: 0.0101}


@pytest.mark.parametrize("seed", range(24))
def test_dp_finds_the_optimum_of_the_full_space_on_tiny_instances(seed):
    # the oracle enumerates every stage count, cut, device-to-stage assignment in any
    # order (idle devices allowed) and positive sample split, scored by the cost model
    problem = tiny(seed)
    oracle, _ = brute_force_best(problem)
    if not np.isfinite(oracle):
        with pytest.raises(InfeasibleError):
            plan_dp(problem)
        return
    result = plan_dp(problem)
    assert result.cost.memory_ok
    assert result.cost.iteration_ms >= oracle * (1 - 1e-9)
    # the tie rule may prefer a plan on fewer devices within the tie tolerance
    steady, _ = brute_force_best(problem, "steady_ms")
    assert result.cost.steady_ms <= steady * (1 + STEADY_OFF.get(seed, TIE_TOLERANCE))
    assert seed in STEADY_OFF or result.cost.iteration_ms <= oracle * (1 + TIE_TOLERANCE)


@pytest.mark.parametrize(("n_fast", "n_slow", "seed"), [(2, 2, 0), (3, 2, 1), (3, 3, 2), (4, 1, 3)])
def test_class_keyed_dp_equals_the_device_by_device_dp(n_fast, n_slow, seed):
    problem = mixed(n_fast, n_slow, 7, seed)
    grouped = plan_dp(problem)
    by_device = plan_dp(problem, by_class=False)
    assert grouped.cost.iteration_ms == pytest.approx(by_device.cost.iteration_ms, rel=1e-9)


def ethernet_testbed_8() -> Cluster:
    """The demo testbed plus an Orin and a Xavier NX, on gigabit Ethernet: the instance
    where the memory-ordered DP was 53% above the exact optimum (docs/planners.md)."""
    doc = json.loads(api.resolve("jetson-testbed-6", "clusters").read_text())
    doc["devices"] += [
        {"id": "orin-1", "type": "jetson-orin-nano"},
        {"id": "nx-1", "type": "jetson-xavier-nx"},
    ]
    doc["network"] = {"bandwidth_mbps": 940, "latency_ms": 0.2, "shared_medium": False}
    return Cluster.from_dict(doc, "jetson-testbed-8-ethernet")


def test_dp_matches_the_exact_optimum_where_memory_order_lost_53_percent():
    # CP-SAT proved this plan optimal (plan_milp with a 300 s limit: status "optimal" after
    # 37.5 CPU s, 2026-12-07 at 1a5b58b; the proof ran in every suite until then, 37-76 s
    # of its wall): five one-device stages at micro-batch 1, 1887.254 ms by the cost model.
    # The DP once ordered devices by memory and returned a plan 53% slower.
    model = ModelProfile.load(api.resolve("gpt2-small-analytic", "models"))
    problem = make_problem(model, ethernet_testbed_8(), TrainingConfig(32))
    cuts = ((0, 4, "nx-0"), (4, 9, "orin-0"), (9, 12, "nx-1"), (12, 13, "tx2-0"),
            (13, 14, "orin-1"))  # fmt: skip
    optimum = Partition(1, 32, tuple(StageAssignment(a, b, (d,), (1,)) for a, b, d in cuts))
    proven = CostModel(problem, 1).evaluate(optimum).iteration_ms
    assert proven == pytest.approx(1887.254, abs=1e-3)
    dp = plan_dp(problem)
    assert dp.cost.iteration_ms <= proven * (1 + 1e-6)


def test_a_tiny_time_limit_returns_the_best_plan_so_far():
    problem = identical(64, 12, types=2)
    result = plan_dp(problem, time_limit=1e-3)
    assert result.status == "timed_out"
    assert result.cost.memory_ok
    complete = plan_dp(problem)
    assert complete.status == "complete"
    assert complete.cost.iteration_ms <= result.cost.iteration_ms


def test_once_the_time_is_up_with_a_plan_no_other_micro_batch_size_is_searched():
    # the first size's first level always completes (a plan); past the deadline the
    # other sizes' relaxed tables, graphs and first levels are not built (they were, one
    # after another: the limit overshot by their sum)
    problem = identical(64, 12, types=2)
    assert len(problem.config.micro_batch_sizes()) > 1
    result = plan_dp(problem, time_limit=1e-3)
    assert result.status == "timed_out"
    assert len(result.candidates) == 1


def test_identical_devices_have_one_class_and_few_group_sizes():
    # 64 identical devices: B = 16 splits into groups of 1, 2, 3, 4, 6, 8 or 16 devices
    # (other sizes repeat a largest share, ceil(16 / g), with more devices)
    from edgepipe.planner.solvers.dp.graph import device_orders
    from edgepipe.planner.solvers.dp.tables import _Tables

    problem = identical(64, 10)
    classes = device_classes(problem)
    assert [c.count for c in classes] == [64]
    tables = _Tables(problem, CostModel(problem, 16), classes)
    graph = dp_graph.state_graph(tables, 16, device_orders(problem, classes))
    sizes = sorted({sum(tables.comps[c]) for _, c, _ in graph.edges if c >= 0})
    assert sizes == [1, 2, 3, 4, 6, 8, 16]
    assert len(graph.states) == 65


@pytest.mark.parametrize("seed", [1, 2, 4, 7, 9, 11])
def test_dp_plans_fit_memory_when_memory_binds(seed):
    # ring replicas off, so each stage's own memory binds (replicas: tests/unit/test_replan.py)
    problem = random_problem(8, 4, seed=seed, global_batch=16, candidates=(2, 4, 8),
                             memory=(4e7, 2e7))  # fmt: skip
    problem = replace(problem, config=replace(problem.config, replication_interval=0))
    result = plan_dp(problem)
    assert result.cost.memory_ok
    # memory binds: with 1000x the memory the DP finds a faster plan that does not fit
    roomy = random_problem(8, 4, seed=seed, global_batch=16, candidates=(2, 4, 8),
                           memory=(4e10, 2e10))  # fmt: skip
    free = plan_dp(roomy)
    assert free.cost.iteration_ms < result.cost.iteration_ms
    assert not CostModel(problem).evaluate(free.partition).memory_ok


def test_activation_bound_infeasibility_is_explained():
    problem = random_problem(
        8, 4, seed=0, global_batch=16, candidates=(2, 4, 8), memory=(3e7, 1.5e7)
    )
    with pytest.raises(InfeasibleError, match="activations") as info:
        plan_dp(problem)
    assert info.value.constraint == "memory"
    assert "short by" in str(info.value) and info.value.shortfall > 0


def test_dp_is_deterministic():
    problem = random_problem(10, 4, seed=3, global_batch=16, candidates=(2, 4, 8))
    assert plan_dp(problem).partition == plan_dp(problem).partition


def test_the_head_cache_keeps_its_byte_budget_and_the_entry_just_set():
    cache = dp_tables._Cache(16)
    cache["a"], cache["b"] = (np.zeros(1),), (np.zeros(1),)  # 8 bytes each
    cache["a"]  # read: "b" is now the least recently used
    cache["c"] = (np.zeros(1),)
    assert list(cache) == ["a", "c"] and cache.bytes == 16
    cache["big"] = (np.zeros(4),)  # 32 bytes alone: kept, the others evicted
    assert list(cache) == ["big"] and cache.bytes == 32
    del cache["big"]
    assert cache.bytes == 0


@pytest.mark.parametrize("guess", [0.5, 1e9])
def test_the_first_search_under_a_wrong_guess_finds_the_same_plan(monkeypatch, guess):
    # 0.5 x the relaxed lower bound excludes every plan: the first size is searched again
    # without it; 1e9 prunes nothing
    problem = mixed(3, 5, 24, 4)
    kept = plan_dp(problem)
    monkeypatch.setattr(dp_sizes, "FIRST_GUESS", guess)
    again = plan_dp(problem)
    assert again.partition == kept.partition
    assert again.cost.iteration_ms == kept.cost.iteration_ms


def test_a_first_search_whose_guess_proved_low_is_repeated_after_the_other_sizes(
    monkeypatch,
):
    # 100 blocks on 8 + 8 devices (benchmarks/planner_scaling.py), the first size that of
    # least relaxed bound (FIRST_NEAR 0): 4 is searched under its guess (1.7 x its
    # relaxed bound, 5,671 ms) and its figure's margin (5,791) lies above it. It is
    # searched again last, under the bound of the fastest figure then (the least bound of
    # any search), so that a time limit finds the other sizes' plans first
    from benchmarks.planner_scaling import synthetic

    monkeypatch.setattr(dp_sizes, "FIRST_NEAR", 0.0)
    searches: list[tuple[int, float, bool]] = []
    original = dp_search._BatchSearch.__init__

    def spy(self, tables, graph, batch, deadline, tick, bound=np.inf, relaxed=None,
            guessed=False):  # fmt: skip
        searches.append((batch, bound, guessed))
        original(self, tables, graph, batch, deadline, tick, bound, relaxed, guessed)

    monkeypatch.setattr(dp_search._BatchSearch, "__init__", spy)
    result = plan_dp(synthetic(100, 16, 2))
    first = searches[0][0]
    assert searches[0][2] and [b for b, _, _ in searches].count(first) == 2
    assert searches[-1][0] == first and not searches[-1][2]
    assert searches[-1][1] == min(u for _, u, guessed in searches if not guessed)
    assert result.status == "complete"


def relaxed_roots(monkeypatch) -> dict[int, float]:
    """max(Q(L, N), Z) of every micro-batch size whose relaxed tables the DP builds from
    now on."""
    roots: dict[int, float] = {}
    relaxed_bounds = dp_sizes.relaxed_bounds

    def recording(tables, batch):
        out = relaxed_bounds(tables, batch)
        roots[batch] = max(out.q_root, out.z)
        return out

    monkeypatch.setattr(dp_sizes, "relaxed_bounds", recording)
    return roots


@pytest.mark.parametrize("near, first", [(0.0, 4), (0.15, 2)])
def test_the_first_search_on_the_ordered_graph_is_the_smallest_size_near_the_least_bound(
    monkeypatch, near, first
):
    # 100 blocks on 8 + 8 devices (ordered graph): before the first search the relaxed
    # tables of 1, 2, 4 and 8 are built; 4 has the least bound and 2's lies 4.2% above it,
    # within FIRST_NEAR (a smaller size searches fewer groups, and its figure bounds the
    # larger ones); 1's lies 17.6% above
    from benchmarks.planner_scaling import synthetic

    monkeypatch.setattr(dp_sizes, "FIRST_NEAR", near)
    roots = relaxed_roots(monkeypatch)
    searched = searched_sizes(monkeypatch)
    plan_dp(synthetic(100, 16, 2))
    before_first = dict(list(roots.items())[:4])
    assert sorted(before_first) == [1, 2, 4, 8]
    assert min(before_first, key=before_first.get) == 4
    assert before_first[2] / before_first[4] == pytest.approx(1.042, abs=1e-3)
    assert before_first[1] / before_first[4] == pytest.approx(1.176, abs=1e-3)
    assert searched[0] == first


def test_the_first_search_on_the_complete_graph_is_the_size_of_least_bound(monkeypatch):
    # squeezenet on 16 Jetson Nanos (complete graph: searches are cheap, and the least
    # bound's figure prunes best): 4's bound lies 13.6% above 8's, within FIRST_NEAR, and
    # 8 is searched first all the same
    from benchmarks.planner_scaling import nanos

    roots = relaxed_roots(monkeypatch)
    searched = searched_sizes(monkeypatch)
    plan_dp(nanos("pipedream-squeezenet1_0", 16))
    assert list(roots) == [2, 4, 8]  # built before the first search, none after
    assert roots[4] / roots[8] == pytest.approx(1.136, abs=1e-3) and roots[2] > roots[4]
    assert searched[0] == 8


def test_a_time_out_under_a_wrong_guess_still_returns_a_plan(monkeypatch):
    # the guess excludes every plan and the limit passes at once: the root's
    # single-stage plans are finished without the guessed bound
    monkeypatch.setattr(dp_sizes, "FIRST_GUESS", 0.5)
    result = plan_dp(identical(64, 12, types=2), time_limit=1e-3)
    assert result.status == "timed_out"
    assert result.partition.num_stages == 1
    assert result.cost.memory_ok


def test_levels_collapse_without_algorithm_1_when_memory_never_binds(monkeypatch):
    # 20 devices of 2 types with 80 GB each: every composition's every range fits the
    # deepest warm-up, which the fast path sees from all B samples on one device
    monkeypatch.setattr(dp_search, "EXACT_LEVELS_WORK", 0)
    problem = identical(20, 12, types=2)
    cm = CostModel(problem, 16)
    classes = device_classes(problem)
    tables = dp_tables._Tables(problem, cm, classes)
    graph = dp_graph.state_graph(tables, 16, dp_graph.device_orders(problem, classes))
    search = dp_search._BatchSearch(tables, graph, 16, Deadline(np.inf), lambda: None)
    assert search.first_free_level() == 1
    assert len(tables._base) == 0  # no composition's split computed
    k_max = search.warmup(search.max_p)
    for cid in {c for _, c, _ in graph.edges if c >= 0}:
        depth = tables.unconstrained(cid, 16)[2]
        assert ((depth >= k_max) | (depth == -np.inf)).all()


def best_value(tables, graph, batch: int, bound: float) -> float:
    """The least DP value of one micro-batch size's search under ``bound``."""
    search = dp_search._BatchSearch(tables, graph, batch, Deadline(np.inf), lambda: None, bound)
    return min((a[0] for a in search.run()), default=np.inf)


BOUNDED_AT_ITS_OWN_BEST = {
    "12 devices of 2 types, 16 blocks": lambda: identical(12, 16, types=2),
    "mixed 3 fast + 5 slow, 24 blocks": lambda: mixed(3, 5, 24, 4),
    "40 identical, 30 blocks": lambda: identical(40, 30, seed=1),
}


@pytest.mark.parametrize("name", sorted(BOUNDED_AT_ITS_OWN_BEST))
def test_a_search_bounded_at_its_own_best_value_still_finds_it(name):
    # every rule that drops a cell, a pair or a candidate (the relaxed tables, D + F)
    # drops only what cannot finish within the bound: each micro-batch
    # size searched with the bound at the unbounded search's best DP value still
    # returns an answer of that value
    problem = BOUNDED_AT_ITS_OWN_BEST[name]()
    sizes = problem.config.micro_batch_sizes()
    classes = device_classes(problem)
    tables = dp_tables._Tables(problem, CostModel(problem, max(sizes)), classes)
    for batch in sizes:
        graph = dp_graph.state_graph(tables, batch, dp_graph.device_orders(problem, classes))
        free = best_value(tables, graph, batch, np.inf)
        assert np.isfinite(free)
        assert best_value(tables, graph, batch, free * (1 + 1e-9)) <= free * (1 + 1e-9)


@pytest.fixture
def untimed_rescoring(monkeypatch):
    """The re-scoring of waiting answers bounded by count and margin only, not by its
    share of the search's work: two runs compared for equality re-score the same answers
    however much their searches differ (a run whose search composed fewer cells has a
    smaller budget, scores fewer, and its candidates differ)."""
    monkeypatch.setattr(dp_sizes, "RESCORE_MIN_ACTIONS", float("inf"))


@pytest.mark.usefixtures("untimed_rescoring")
def test_caches_that_keep_one_entry_change_no_plan(monkeypatch):
    # 20 devices of 2 types: the ordered graph, whose straddling groups are used once
    problem = identical(20, 12, types=2)
    kept = plan_dp(problem)
    assert kept.graph == "ordered"
    monkeypatch.setattr(dp_tables, "BASE_CACHE_BYTES", 1)
    monkeypatch.setattr(dp_tables, "HEAD_CACHE_BYTES", 1)
    evicting = plan_dp(problem)
    assert evicting.partition == kept.partition
    assert evicting.dp_value_ms == kept.dp_value_ms


def test_the_ordered_graph_keeps_mixed_groups_where_the_even_share_falls(monkeypatch):
    # 4 + 4 devices of 2 types at B = 8, the ordered graph forced: the even share
    # ceil(8 / s) falls at s = 1, 2, 3, 4, 8 (8, 4, 3, 2, 1 samples) and not at 5, 6, 7
    # (2 samples, as at 4). One-class groups keep 1, 2, 3, 4 (useful: both types' times
    # grow with the batch); groups that straddle the classes keep 2, 3, 4 and 8 = 4 + 4
    monkeypatch.setattr(dp_graph, "COMPLETE_MOVES", 0)
    problem = identical(8, 6, types=2)
    sizes = problem.config.micro_batch_sizes()
    classes = device_classes(problem)
    tables = dp_tables._Tables(problem, CostModel(problem, max(sizes)), classes)
    graph = dp_graph.state_graph(tables, 8, dp_graph.device_orders(problem, classes))
    assert graph.kind == "ordered"
    groups = {tables.comps[c] for _, c, _ in graph.edges if c >= 0}
    assert {sum(g) for g in groups if min(g) == 0} == {1, 2, 3, 4}
    assert {sum(g) for g in groups if min(g) > 0} == {2, 3, 4, 8}


def sizes_with_relaxed_tables(monkeypatch) -> list[int]:
    """The micro-batch sizes whose relaxed tables (``relaxed_bounds``) the DP builds from
    now on, in order."""
    built: list[int] = []
    relaxed_bounds = dp_sizes.relaxed_bounds

    def recording(tables, batch):
        built.append(batch)
        return relaxed_bounds(tables, batch)

    monkeypatch.setattr(dp_sizes, "relaxed_bounds", recording)
    return built


@pytest.mark.usefixtures("untimed_rescoring")
def test_sizes_skipped_by_z_alone_change_no_plan(monkeypatch):
    # a size's relaxed tables are built only once its Z (a tenth of their time) could
    # still make it the first search, or keep it within the bound: 6 of 7 sizes here;
    # with a Z of 0 every size's tables are built, as before, and the plans are the same
    problem = random_problem(24, 12, seed=3, global_batch=64, candidates=None,
                             bandwidth_mbps=1000.0)  # fmt: skip
    sizes = problem.config.micro_batch_sizes()
    built = sizes_with_relaxed_tables(monkeypatch)
    lazy = plan_dp(problem)
    assert len(built) < len(sizes)
    built.clear()
    monkeypatch.setattr(dp_sizes, "weighted_bound", lambda tables, batch: 0.0)
    monkeypatch.setattr(dp_sizes, "class_weighted_bound", lambda tables, batch: 0.0)
    every = plan_dp(problem)
    assert sorted(built) == sorted(sizes)
    assert every.partition == lazy.partition
    assert every.dp_value_ms == lazy.dp_value_ms
    assert every.candidates == lazy.candidates


@pytest.mark.usefixtures("untimed_rescoring")
def test_sizes_skipped_by_the_class_bound_change_no_plan(monkeypatch):
    # 20 blocks on 4 fast and 4 slow devices: after the first search, Zc (devices counted
    # per class) exceeds the bound at micro-batch 16, whose Z does not: its tables are not
    # built and it is not searched. With a Zc of 0 it is, and the plans are the same (Zc
    # only skips sizes that could return nothing to re-score; the order stays max(Q, Z)'s).
    # Zs (bounds.staged_bound) and Zw (reweighted_bound) also skip micro-batch 16 here: 0
    # in both runs
    problem = random_problem(20, 8, seed=2, global_batch=32, candidates=None,
                             bandwidth_mbps=1000.0)  # fmt: skip
    monkeypatch.setattr(dp_sizes, "staged_weighted_bound", lambda tables, batch: 0.0)
    monkeypatch.setattr(dp_sizes, "reweighted_bound", lambda tables, batch, target: 0.0)
    built = sizes_with_relaxed_tables(monkeypatch)
    skipped = plan_dp(problem)
    assert 16 not in built
    built.clear()
    monkeypatch.setattr(dp_sizes, "class_weighted_bound", lambda tables, batch: 0.0)
    searched = plan_dp(problem)
    assert 16 in built
    assert searched.partition == skipped.partition
    assert searched.dp_value_ms == skipped.dp_value_ms
    assert searched.candidates == skipped.candidates


@pytest.mark.usefixtures("untimed_rescoring")
def test_sizes_skipped_by_the_staged_bound_change_no_plan(monkeypatch):
    # 200 blocks on 16 identical devices (benchmarks/planner_scaling.py's synthetic
    # model): after the first search, Zs exceeds the bound at micro-batch 16, whose
    # max(Q, Z) does not, and it is not searched. With a Zs of 0 it is, and the plan, its
    # value and the per-size figures are the same (Zs only skips sizes that could return
    # nothing to re-score; the order stays max(Q, Z)'s). Zw (reweighted_bound) skips it
    # too: 0 in both runs
    from benchmarks.planner_scaling import synthetic

    monkeypatch.setattr(dp_sizes, "reweighted_bound", lambda tables, batch, target: 0.0)
    problem = synthetic(200, 16, 1)
    searched = searched_sizes(monkeypatch)
    skipped = plan_dp(problem)
    assert 16 not in searched
    searched.clear()
    monkeypatch.setattr(dp_sizes, "staged_weighted_bound", lambda tables, batch: 0.0)
    every = plan_dp(problem)
    assert 16 in searched
    assert every.partition == skipped.partition
    assert every.dp_value_ms == skipped.dp_value_ms
    assert every.candidates == skipped.candidates


def test_z_alone_is_the_relaxed_tables_z():
    from edgepipe.planner.solvers.dp.bounds import relaxed_bounds, weighted_bound
    from edgepipe.planner.solvers.dp.tables import _Tables

    # each computed on its own tables (the two share Z through a cache)
    for problem in (identical(12, 30, types=2), tiny(3), memory_bound(1)):
        sizes = problem.config.micro_batch_sizes()
        alone, full = (
            _Tables(problem, CostModel(problem, max(sizes)), device_classes(problem))
            for _ in range(2)
        )
        for batch in sizes:
            assert weighted_bound(alone, batch) == relaxed_bounds(full, batch).z


@pytest.mark.usefixtures("untimed_rescoring")
def test_heads_evaluated_only_where_their_one_state_may_use_them_change_no_plan(monkeypatch):
    # 40 devices of 4 types, 30 blocks: the ordered graph, whose groups that straddle two
    # classes are used by one state per device order; their head tables are filled only
    # on the block ranges those states' moves may use within the bound
    problem = identical(40, 30, types=4)
    filled: dict[tuple[int, int, int], int] = {}
    head = dp_tables._Tables.head

    def recording(self, cid, warmup, batch, rows=None):
        out = head(self, cid, warmup, batch, rows)
        # a whole table no warm-up binds is kept once, under UNBOUND (_Tables.head)
        key = (cid, warmup, batch)
        key = key if key in self._tables else (cid, dp_tables.UNBOUND, batch)
        filled[key] = int(self._tables[key][1].sum())
        return out

    monkeypatch.setattr(dp_tables._Tables, "head", recording)
    lazy = plan_dp(problem)
    assert lazy.graph == "ordered"
    ranges = 30 * 31 // 2
    assert sum(n < ranges for n in filled.values()) > len(filled) / 2
    monkeypatch.setattr(dp_search, "LAZY_USERS", 0)  # every table on every range
    full = plan_dp(problem)
    assert lazy.partition == full.partition
    assert lazy.dp_value_ms == full.dp_value_ms
    assert lazy.candidates == full.candidates


@pytest.mark.parametrize("topology", ["point_to_point", "switched", "shared_medium"])
def test_dp_value_equals_cost_model_on_a_uniform_network(topology):
    problem = random_problem(9, 4, seed=5, global_batch=16, candidates=(4,), topology=topology)
    result = plan_dp(problem)
    closed = pipeline_closed_form_ms(CostModel(problem), result.partition)
    assert result.dp_value_ms == pytest.approx(closed, rel=1e-9)


@pytest.mark.parametrize("topology", ["point_to_point", "switched", "shared_medium"])
@pytest.mark.parametrize("seed", range(3))
def test_dp_value_equals_cost_model_on_a_non_uniform_network(seed, topology):
    # per-pair bandwidths and mixed latencies: the DP's objective of every plan it
    # re-scores is the cost model's closed form of that plan (planner.cost.model); 16 samples
    # per micro-batch, so Algorithm 1 gives every device of a group some
    problem = random_problem(7, 4, seed=seed, global_batch=32, candidates=(16,),
                             links=NON_UNIFORM, topology=topology)  # fmt: skip
    cm = CostModel(problem)
    seen = []
    original = dp_sizes.choose

    def recording(found):
        seen.extend(found)
        return original(found)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dp_sizes, "choose", recording)
        # re-score every answer within 100% of the fastest (the default margin leaves
        # some instances with one plan scored)
        patch.setattr(dp_sizes, "RESCORE_MARGIN", 1.0)
        plan_dp(problem)
    assert len(seen) >= 2
    for _, partition, value in seen:
        if all(len(s.devices) == 1 for s in partition.stages) or topology != "point_to_point":
            assert value == pytest.approx(pipeline_closed_form_ms(cm, partition), rel=1e-9)
        else:  # a piece is at most min(largest samples) (an upper bound)
            assert value >= pipeline_closed_form_ms(cm, partition) * (1 - 1e-9)


def test_closed_form_prices_a_switched_boundary_by_its_busiest_port_by_hand():
    # two stages of 2 devices each, 4 samples per micro-batch split 2/2 on both sides:
    # every uplink and downlink carries 2 samples, full duplex
    problem = random_problem(2, 4, seed=0, global_batch=8, candidates=(4,),
                             topology="switched", bandwidth_mbps=8.0)  # fmt: skip
    cm = CostModel(problem)
    a = float(cm.boundary[0])  # bytes per sample at the cut
    bw = 8.0 * 1e6 / 8 / 1e3  # 8 Mbit/s in bytes per ms
    part = Partition(4, 2, (StageAssignment(0, 1, ("d0", "d1"), (2, 2)),
                            StageAssignment(1, 2, ("d2", "d3"), (2, 2))))  # fmt: skip
    cost = cm.evaluate(part)
    s0, s1 = cost.stages
    occ = 2 * a / bw
    one_way = occ + 1.0  # 1 ms latency
    # steps: stage 0, link, stage 1 (M = 2; K_0 = min(3, 2) = 2, K_1 = 1)
    c0, c1 = s0.forward_ms + s0.backward_ms, s1.forward_ms + s1.backward_ms
    bubble = max(0.0, 2 * one_way + c1 - (2 - 1) * s0.forward_ms)
    d = max(2 * c0 + bubble, c0 + 2 * one_way + occ, c0 + 2 * one_way + 2 * c1)
    x = max(s0.allreduce_ms, s1.allreduce_ms - s0.backward_ms - one_way)
    assert pipeline_closed_form_ms(cm, part) == pytest.approx(d + x, rel=1e-12)
    # on a shared medium the boundary carries all 4 samples and both directions
    assert float(boundary_occupancy_ms(a, 2, 2, 4, bw, "shared_medium")) == pytest.approx(
        4 * a / bw
    )
    assert float(link_period_ms(occ, 0.0, "shared_medium")) == pytest.approx(2 * occ)


@pytest.mark.parametrize(
    ("topology", "period", "downstream"),
    # boundary occupancy 2 ms, the boundaries after it 3 ms (see link_period_ms):
    # separate pair channels; a switch port also carries the next boundary's 3 ms; a
    # medium carries both directions (4 ms) and everything after it
    [("point_to_point", 2.0, 0.0), ("switched", 5.0, 2.0), ("shared_medium", 7.0, 7.0)],
)
def test_link_period_counts_what_shares_the_busiest_channel(topology, period, downstream):
    assert float(link_period_ms(2.0, 3.0, topology)) == period
    assert float(link_downstream_ms(2.0, 3.0, topology)) == downstream


def test_ties_prefer_fewer_devices_over_fewer_stages(monkeypatch):
    # a 3-stage plan on 4 devices and a 2-stage plan on 6 are within the tie tolerance of
    # the fastest steady-state step: the one that leaves devices free wins
    seen = []
    original = dp_sizes.choose

    def recording(found):  # the real rule, with the candidates it chose from kept
        seen.extend(found)
        return original(found)

    monkeypatch.setattr(dp_sizes, "choose", recording)
    rng = np.random.default_rng(158)
    problem = random_problem(int(rng.integers(2, 6)), int(rng.integers(3, 7)), seed=158,
                             global_batch=16, candidates=(1, 2, 4, 8, 16),
                             bandwidth_mbps=1e3, shared=False)  # fmt: skip
    result = plan_dp(problem)
    # ties are judged on the steady-state step (docs/planners.md)
    fastest = min(c.steady_ms for c, _, _ in seen)
    tied = [p for c, p, _ in seen if c.steady_ms <= fastest * (1 + TIE_TOLERANCE)]
    fewer_stages = min(tied, key=lambda p: p.num_stages)
    assert len(fewer_stages.used_devices()) > len(result.partition.used_devices())
    assert len(result.partition.used_devices()) == min(len(p.used_devices()) for p in tied)


def test_block_too_big_for_any_device_names_memory_and_shortfall():
    problem = random_problem(3, 2, seed=0, memory=(1e6, 1e6))
    with pytest.raises(InfeasibleError) as info:
        plan_dp(problem)
    assert info.value.constraint == "memory"
    assert "alone needs" in str(info.value) and "short by" in str(info.value)
    assert info.value.shortfall > 0


def replica_tight(seed: int):
    """Tiny problems whose memory leaves little room for ring replicas (replication on,
    the default interval 1)."""
    rng = np.random.default_rng(seed)
    mem = float(rng.choice([3e7, 5e7, 8e7]))
    return random_problem(int(rng.integers(3, 7)), int(rng.integers(2, 5)), seed=seed,
                          global_batch=8, candidates=(2, 4), memory=(mem, mem * 0.6))  # fmt: skip


@pytest.mark.parametrize("seed", [9, 57])
def test_ring_replica_memory_is_part_of_the_search(seed):
    # a DP blind to replicas returned plans 30% (seed 9) and 24% (seed 57) slower: its
    # best plans overflowed once the next stage held the replica, and were dropped
    problem = replica_tight(seed)
    oracle, _ = brute_force_best(problem)
    result = plan_dp(problem)
    assert result.cost.memory_ok
    assert max(b for s in result.cost.stages for b in s.replica_bytes) > 0
    assert result.cost.iteration_ms == pytest.approx(oracle, rel=TIE_TOLERANCE)


def test_replica_memory_no_longer_makes_a_feasible_problem_infeasible():
    # every plan a replica-blind DP found overflowed with its replicas (it raised
    # InfeasibleError); plans that fit exist (the oracle's best: 410.3 ms)
    problem = replica_tight(42)
    oracle, _ = brute_force_best(problem)
    assert np.isfinite(oracle)
    result = plan_dp(problem)
    assert result.cost.memory_ok
    assert result.cost.iteration_ms >= oracle * (1 - 1e-9)


#: iteration ms of the plans the DP found before it dropped candidates beyond the bound
#: (main at 53ebd5a, recorded 2026-12-01): the pruned search must do as well or better
BEFORE_PRUNING = {
    "mixed 3 fast + 5 slow, 24 blocks": (lambda: mixed(3, 5, 24, 4), 875.5114147009609),
    "12 devices of 2 types, 30 blocks": (lambda: identical(12, 30, types=2), 1929.4480778426657),
    "20 identical, 40 blocks": (lambda: identical(20, 40, seed=1), 1309.4668402694933),
}


@pytest.mark.parametrize("name", sorted(BEFORE_PRUNING))
def test_pruning_by_the_bound_loses_no_plan_the_unpruned_dp_found(name):
    build, before = BEFORE_PRUNING[name]
    result = plan_dp(build())
    assert result.status == "complete"
    assert result.cost.iteration_ms <= before * (1 + 1e-9)


def one_way_ms(cm: CostModel, part: Partition, k: int) -> float:
    """Occupancy + latency of the link after stage k (0 after the last), as the closed
    form prices it: the groups' slowest pair and largest latency."""
    if k + 1 >= len(part.stages):
        return 0.0
    a, b = part.stages[k], part.stages[k + 1]
    cluster = cm.problem.cluster
    sub = np.ix_([cluster.index(d) for d in a.devices], [cluster.index(d) for d in b.devices])
    occ = boundary_occupancy_ms(cm.boundary[a.end - 1], max(a.samples), max(b.samples),
                                part.micro_batch_size, cm.bw[sub].min(),
                                cluster.network.kind)  # fmt: skip
    return float(occ + cm.lat[sub].max())


def memory_bound(seed: int):
    """4 blocks on 3 devices whose memory makes the stages' warm-ups bind."""
    return random_problem(4, 3, seed=seed, global_batch=8, candidates=(2, 4),
                          memory=(4e7, 2e7))  # fmt: skip


@pytest.mark.parametrize(
    ("build", "seed"),
    [(tiny, seed) for seed in range(0, 24, 2)]
    + [(memory_bound, seed) for seed in range(3)]
    + [(lambda seed: mixed(2, 2, 4, seed), seed) for seed in range(1, 3)],
)
def test_relaxed_bounds_never_exceed_any_plans_closed_form(build, seed):
    # every memory-feasible plan of the full space (the oracle's enumeration), split at
    # every stage boundary into a prefix and a suffix of p stages: the relaxed tables
    # (planner.solvers.dp.bounds.relaxed_tables) the search prunes by, Zc (devices counted per
    # class, bounds.class_bound; the two-class instances) and Zs (bubbles at their
    # warm-up depth, part of the first all-reduce counted whole, bounds.staged_bound,
    # at first-stage weights 0, 0.25 and 1), stay at or below its closed form
    from edgepipe.planner.solvers.dp.bounds import (
        _relax_levels,
        class_weighted_bound,
        staged_bound,
    )
    from edgepipe.planner.solvers.dp.graph import device_orders
    from edgepipe.planner.solvers.dp.search import _BatchSearch
    from edgepipe.planner.solvers.dp.tables import _Tables

    from tests.helpers.oracles import all_partitions

    problem = build(seed)
    sizes = problem.config.micro_batch_sizes()
    cm = CostModel(problem, max(sizes))
    classes = device_classes(problem)
    tables = _Tables(problem, cm, classes)
    big_l, n_dev = problem.model.num_blocks, len(problem.cluster.devices)
    checked = 0
    for batch in sizes:
        graph = dp_graph.state_graph(tables, batch, device_orders(problem, classes))
        relaxed = _BatchSearch(tables, graph, batch, Deadline(60), lambda: None).relaxed
        levels = relaxed.g.shape[0]
        by_class = class_weighted_bound(tables, batch)
        m, warmups, _ = _relax_levels(tables, batch)
        staged = max(staged_bound(tables, batch, m, warmups, lam) for lam in (0.0, 0.25, 1.0))
        for part in all_partitions(problem, batch):
            cost = cm.evaluate(part)
            if not cost.memory_ok:
                continue
            value = pipeline_closed_form_ms(cm, part) * (1 + 1e-9)
            checked += 1
            assert relaxed.q[:, big_l, n_dev].min() <= value
            assert relaxed.z <= value
            assert by_class <= value
            assert staged <= value
            forward = 0.0  # the stages' E_f and one-way links before stage k
            for k, stage in enumerate(part.stages):
                j = stage.first
                n_pre = sum(len(s.devices) for s in part.stages[:k])
                n_suf = sum(len(s.devices) for s in part.stages[k:])
                p = min(len(part.stages) - k, levels) - 1
                assert relaxed.e[j, n_pre] <= value
                assert relaxed.f[j, n_pre] + relaxed.g[p, big_l - j, n_suf] <= value
                assert relaxed.q[p, big_l - j, n_suf] <= value
                assert relaxed.pf[j, n_pre] <= forward * (1 + 1e-9)
                assert relaxed.pf[j, n_pre] + relaxed.q[p, big_l - j, n_suf] <= value
                forward += cost.stages[k].forward_ms + one_way_ms(cm, part, k)
    assert checked or not np.isfinite(brute_force_best(problem)[0])


def test_prefix_bound_on_the_ordered_graph_reaches_every_state_through_skips(monkeypatch):
    # on the ordered graph a state holds the whole model when the devices before it in
    # its order stay idle (skips from the root): nothing comes before, Fg = 0; and a
    # state whose suffix is shorter has had some stage before it, Fg > 0
    from edgepipe.planner.solvers.dp.graph import device_orders
    from edgepipe.planner.solvers.dp.search import _BatchSearch
    from edgepipe.planner.solvers.dp.tables import _Tables

    monkeypatch.setattr(dp_graph, "COMPLETE_MOVES", 0)
    problem = mixed(3, 3, 5, seed=2)
    classes = device_classes(problem)
    tables = _Tables(problem, CostModel(problem, 8), classes)
    graph = dp_graph.state_graph(tables, 4, device_orders(problem, classes))
    assert graph.kind == "ordered"
    prefix = _BatchSearch(tables, graph, 4, Deadline(60), lambda: None).prefix
    assert (prefix[:, 5] == 0.0).all()
    assert (prefix[:, :5] > 0.0).all()


def slow_switch(seed: int):
    """3 blocks on 4 devices (two of each type) behind a slow switch: links weigh, and a
    group of two carries half a micro-batch per port."""
    return random_problem(3, 4, seed=seed, global_batch=8, candidates=(4,), topology="switched",
                          bandwidth_mbps=20.0)  # fmt: skip


@pytest.mark.parametrize(
    ("build", "seed"),
    [(tiny, seed) for seed in range(1, 24, 2)]
    + [(memory_bound, seed) for seed in range(3)]
    + [(lambda seed: mixed(2, 2, 4, seed), seed) for seed in range(1, 3)]
    + [(slow_switch, seed) for seed in range(2)],
)
def test_prefix_bound_never_exceeds_the_stages_before_any_cut(build, seed):
    # every memory-feasible plan of the full space (the oracle's enumeration), cut before
    # each of its stages: Fg (planner.solvers.dp.bounds.graph_prefix_bound), at the complete
    # graph's
    # state of the devices the stages before the cut leave and the suffix's block count,
    # stays at or below those stages' summed E_f + E_b and round-trip links
    from edgepipe.planner.solvers.dp.graph import device_orders
    from edgepipe.planner.solvers.dp.search import _BatchSearch
    from edgepipe.planner.solvers.dp.tables import _Tables

    from tests.helpers.oracles import all_partitions

    problem = build(seed)
    sizes = problem.config.micro_batch_sizes()
    cm = CostModel(problem, max(sizes))
    classes = device_classes(problem)
    tables = _Tables(problem, cm, classes)
    class_of = {d: k for k, c in enumerate(classes) for d in c.members}
    big_l = problem.model.num_blocks
    checked = 0
    for batch in sizes:
        graph = dp_graph.state_graph(tables, batch, device_orders(problem, classes))
        assert graph.kind == "complete"
        search = _BatchSearch(tables, graph, batch, Deadline(60), lambda: None)
        prefix = search.prefix
        for part in all_partitions(problem, batch):
            cost = cm.evaluate(part)
            if not cost.memory_ok:
                continue
            left = list(tables.counts)
            before = 0.0  # the stages' E_f + E_b and round-trip links before stage k
            for k, stage in enumerate(part.stages):
                state = graph.states.index(tuple(left))
                assert prefix[state, big_l - stage.first] <= before * (1 + 1e-9) + 1e-9
                checked += 1
                before += cost.stages[k].forward_ms + cost.stages[k].backward_ms
                before += 2 * one_way_ms(cm, part, k)
                for d in stage.devices:
                    left[class_of[problem.cluster.index(d)]] -= 1
    assert checked


@pytest.mark.parametrize("seed", range(4))
def test_class_bound_is_the_best_plan_on_one_block(seed):
    # one block on fast and slow devices (two classes, alternating) with a near-free
    # all-reduce: every plan is one stage, D + X = M c + T_a, and Zc (devices counted per
    # class, planner.solvers.dp.bounds.class_bound) prices the best group's min-max split
    # exactly (the least time below which its devices cannot place the B samples), so
    # it equals the brute-force optimum of the closed form, on one-class and mixed
    # groups alike; Z, which lets every device run at the fastest class's times, lies
    # below it where the fast devices run out
    from edgepipe.planner.solvers.dp.bounds import class_weighted_bound, weighted_bound
    from edgepipe.planner.solvers.dp.tables import _Tables

    from tests.helpers.oracles import all_partitions

    below = 0
    for n_dev in (2, 3, 4):
        problem = random_problem(1, n_dev, seed=seed, global_batch=16, candidates=(2, 4, 8, 16),
                                 bandwidth_mbps=1e7, latency_ms=1e-4)  # fmt: skip
        cm = CostModel(problem, 16)
        tables = _Tables(problem, cm, device_classes(problem))
        for batch in (2, 4, 8, 16):
            best = min(
                pipeline_closed_form_ms(cm, part)
                for part in all_partitions(problem, batch)
                if cm.evaluate(part).memory_ok
            )
            by_class = class_weighted_bound(tables, batch)
            assert by_class == pytest.approx(best, rel=1e-9)
            below += weighted_bound(tables, batch) < 0.99 * by_class
    assert below >= 4


@pytest.mark.parametrize("seed", range(4))
def test_stage_figures_equal_the_per_device_maxima_on_splits_of_every_shape(seed):
    # E_f and E_b are maxima over a group's devices; _figures reads only a class's first
    # and last slot where its samples fall by at most one along its slots. Forward and
    # backward times that rise and fall with the samples (so the device with the most
    # samples is not always the slowest), splits of that shape and of any other shape,
    # against the maxima over every device in plain Python
    from edgepipe.planner.solvers.dp.tables import _Tables

    problem = mixed(3, 4, 5, seed)
    tables = _Tables(problem, CostModel(problem, 8), device_classes(problem))
    rng = np.random.default_rng(seed)
    size = tables.fwd.shape
    tables.fwd = np.cumsum(rng.uniform(0.0, 5.0, size), axis=1)  # prefix sums over blocks
    tables.bwd = np.cumsum(rng.uniform(0.0, 5.0, size), axis=1)
    cid = tables.comp((3, 4))
    rows = np.arange(len(tables.rows_first))
    high = rng.integers(1, 8, size=(len(rows), 2))
    ranked = np.concatenate([np.sort(rng.integers(0, 2, (len(rows), c)), 1) for c in (3, 4)], 1)
    two_valued = np.repeat(high, (3, 4), axis=1) - ranked  # each class: v + 1 first, then v
    anything = rng.integers(0, 9, size=(len(rows), 7))
    for y in (
        two_valued,
        anything,
        np.where(rng.random((len(rows), 1)) < 0.5, two_valued, anything),
    ):
        ef, eb, _ = tables._figures(cid, rows, y)
        for r, (a, b) in enumerate(zip(tables.rows_first, tables.rows_end, strict=True)):
            cls = [0, 0, 0, 1, 1, 1, 1]
            assert ef[r] == max(
                tables.fwd[cls[d], b, y[r, d]] - tables.fwd[cls[d], a, y[r, d]] for d in range(7)
            )
            assert eb[r] == max(
                tables.bwd[cls[d], b, y[r, d]] - tables.bwd[cls[d], a, y[r, d]] for d in range(7)
            )


@pytest.mark.parametrize(
    ("build", "seed"),
    [(tiny, seed) for seed in range(1, 24, 2)] + [(memory_bound, seed) for seed in range(3)],
)
def test_no_cell_of_a_plan_within_the_bound_is_emptied(build, seed):
    # review 8 F7: the cell rules (_BatchSearch._before: E, F' + G with F' = max(F, Fg),
    # Q and PF + Q against the bound U) may empty a (state, l) cell only when no plan
    # can pass through it within U. Oracle: every memory-feasible plan of the full
    # space (any device order, idle devices), priced by the cost model's closed form v;
    # under U = v, the cell of each of its suffixes on the DP's path to it (the class
    # counts of the devices the stages before it leave, idle ones included; its block
    # count) stays open, and the forward traversal the search adds before it (PF) is at
    # most the plan's own (stages' E_f and one-way links before the suffix)
    from edgepipe.planner.solvers.dp.graph import device_orders
    from edgepipe.planner.solvers.dp.search import _BatchSearch
    from edgepipe.planner.solvers.dp.tables import _Tables

    from tests.helpers.oracles import all_partitions

    problem = build(seed)
    sizes = problem.config.micro_batch_sizes()
    cm = CostModel(problem, max(sizes))
    classes = device_classes(problem)
    class_of = {problem.cluster.devices[i].id: k for k, c in enumerate(classes) for i in c.members}
    tables = _Tables(problem, cm, classes)
    big_l = problem.model.num_blocks
    checked = 0
    for batch in sizes:
        graph = dp_graph.state_graph(tables, batch, device_orders(problem, classes))
        assert graph.kind == "complete"
        state = {s: i for i, s in enumerate(graph.states)}
        search = _BatchSearch(tables, graph, batch, Deadline(np.inf), lambda: None)
        for part in all_partitions(problem, batch):
            cost = cm.evaluate(part)
            if not cost.memory_ok:
                continue
            search.bound = pipeline_closed_form_ms(cm, part) * (1 + 1e-9)
            before, pf = search._before()
            forward = 0.0
            for k, stage in enumerate(part.stages):
                counts = list(tables.counts)
                for earlier in part.stages[:k]:
                    for d in earlier.devices:
                        counts[class_of[d]] -= 1
                cell = (state[tuple(counts)], big_l - stage.first)
                assert np.isfinite(before[cell]), (part, k)
                assert pf[cell] <= forward * (1 + 1e-9) + 1e-9
                forward += cost.stages[k].forward_ms + one_way_ms(cm, part, k)
                checked += 1
    assert checked or not np.isfinite(brute_force_best(problem)[0])


def test_the_forward_traversal_rule_empties_cells_the_other_rules_keep():
    # review 8 F7, the other direction: under a bound U that is a figure, a cell whose
    # least forward traversal before it plus its suffix's least D + X (PF + Q, relaxed
    # tables) exceeds U holds nothing, also where E, F + G and Q alone stay within U
    # (on this instance, 30 blocks on 40 identical devices at U = the unpruned search's
    # best DP value, 3 such cells at micro-batch 8 and 11 at 16)
    problem = identical(40, 30, seed=1)
    sizes = problem.config.micro_batch_sizes()
    classes = device_classes(problem)
    tables = dp_tables._Tables(problem, CostModel(problem, max(sizes)), classes)
    big_l, n_dev = problem.model.num_blocks, len(problem.cluster.devices)
    only_pf = 0
    for batch in sizes:
        graph = dp_graph.state_graph(tables, batch, dp_graph.device_orders(problem, classes))
        bound = best_value(tables, graph, batch, np.inf)
        search = dp_search._BatchSearch(tables, graph, batch, Deadline(np.inf), lambda: None, bound)
        relaxed = search.relaxed
        q_least, g_least = relaxed.q.min(axis=0), relaxed.g.min(axis=0)
        for s, size in enumerate(search.sizes):
            n_pre = n_dev - int(size)
            for blocks in range(big_l + 1):
                j = big_l - blocks
                others = max(relaxed.e[j, n_pre], q_least[blocks, size],
                             relaxed.f[j, n_pre] + g_least[blocks, size])  # fmt: skip
                if others <= bound < relaxed.pf[j, n_pre] + q_least[blocks, size]:
                    assert search.before[s, blocks] == np.inf
                    only_pf += 1
    assert only_pf > 0


@pytest.mark.parametrize("seed", range(20))
def test_fronts_picked_on_the_live_columns_are_those_of_every_column(seed):
    # most columns of a band's candidates hold no candidate (inf D in every row): the
    # front is picked on the others alone, and the picks (column indices, empty slots at
    # column 0) are those of the selection over every column
    rng = np.random.default_rng(seed)
    rows, cols = 6, 40
    d = rng.integers(1, 9, (rows, cols)).astype(float)
    d[:, rng.random(cols) < 0.8] = np.inf  # dead columns
    d[rng.random((rows, cols)) < 0.2] = np.inf  # dead cells
    d[0] = np.inf  # a row without any candidate
    x, carry, y = (rng.integers(0, 9, (rows, cols)).astype(float) for _ in range(3))
    x = np.where(np.isfinite(d), x, np.inf)
    every = dp_fronts._pareto(d, x, carry, y, dp_fronts.FRONT)
    live = dp_fronts._front(d, x, carry, y)
    assert np.isfinite(d).any(axis=0).sum() * 2 < cols  # the compressed path runs
    assert (live[1] == every[1]).all() and (live[0] == every[0]).all()
