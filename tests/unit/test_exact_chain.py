"""The chain bound (planner.solvers.exact.chain_bound) against brute force: every stage
count's relaxation is met at the least iteration time of the plans of its (micro-batch,
stage count), so the bound is below all of them; it is exact where the round trip and
the hops bind; the bisection prunes and respects its deadline."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.inputs.problem import Problem, make_problem
from edgepipe.planner.solvers.classes import device_classes
from edgepipe.planner.solvers.exact.chain_bound import ChainBound, chain_bounds
from edgepipe.planner.solvers.exact.tables import Tables
from edgepipe.planner.solvers.time_limit import Deadline

from tests.helpers.exact_instances import instances, least_of, least_per_program
from tests.helpers.synthetic import knob_mix_problem, random_problem


def point_to_point():
    """Identical devices on point-to-point links (the hops carry one sample each)."""
    return random_problem(4, 3, seed=11, global_batch=8, candidates=(2, 4),
                          memory=(8e9, 8e9), bandwidth_mbps=20.0, topology="point_to_point")


def three_speeds(seed: int) -> Problem:
    """Three devices of one type at slowdowns 1, 1.7 and 3 (three classes, so a stage of
    several devices spans groups), global batch 8, micro-batches 4 and 8, the network
    topology and warm-up following ``seed``."""
    rng = np.random.default_rng(seed)
    base = random_problem(int(rng.integers(2, 4)), 3, seed=seed, global_batch=8,
                          candidates=(4, 8), memory=(8e9, 8e9),
                          bandwidth_mbps=float(rng.choice([1e2, 1e3, 1e4])),
                          topology=("switched", "shared_medium", "point_to_point")[seed % 3],
                          warmup=("asteroid", "classic")[seed % 2])  # fmt: skip
    slowdowns = (1.0, 1.7, 3.0)
    devices = tuple(dataclasses.replace(d, type="fast", slowdown=s)
                    for d, s in zip(base.cluster.devices, slowdowns, strict=True))  # fmt: skip
    cluster = dataclasses.replace(base.cluster, devices=devices)
    return make_problem(base.model, cluster, base.config, catalog=cluster.device_types)


def two_types(seed: int) -> Problem:
    """Three devices (fast, slow, fast) on a network following ``seed`` (switched,
    shared medium or point to point; 100 Mbit/s to 10 Gbit/s), global batch 8,
    micro-batches 4 and 8."""
    rng = np.random.default_rng(seed)
    return random_problem(int(rng.integers(2, 5)), 3, seed=seed, global_batch=8,
                          candidates=(4, 8), memory=(8e9, 8e9),
                          bandwidth_mbps=float(rng.choice([1e2, 1e3, 1e4])),
                          topology=("switched", "shared_medium", "point_to_point")[seed % 3],
                          warmup=("asteroid", "classic")[seed % 2],
                          schedule="gpipe" if seed % 5 == 0 else "1f1b")  # fmt: skip


def tables_of(problem: Problem) -> Tables:
    return Tables(problem, CostModel(problem), device_classes(problem))


def bisected(cb: ChainBound, stages: int, least: float, steps: int) -> float:
    """The bound of ``stages`` stages bisected ``steps`` times below ``least``: the
    largest figure seen infeasible (0 if none)."""
    lo, hi = 0.0, least * (1 + 1e-9)
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if cb.feasible(mid)[stages - 1] else (mid, hi)
    return lo


@pytest.mark.parametrize("index", range(11))
def test_every_stage_count_meets_the_least_plan_of_its_program(index):
    problem = [*instances(), point_to_point(), three_speeds(0), three_speeds(4),
               two_types(6)][index]  # fmt: skip
    least = least_of(index) if index < 7 else least_per_program(problem)
    tables = tables_of(problem)
    max_p = min(problem.model.num_blocks, len(problem.cluster.devices))
    for batch in problem.config.micro_batch_sizes():
        cb = ChainBound(tables, batch, max_p)
        for p in range(1, max_p + 1):
            if (batch, p) in least:  # (no plan has more stages than devices of samples)
                assert cb.feasible(least[batch, p] * (1 + 1e-9))[p - 1], (batch, p)


@pytest.mark.parametrize(("index", "batch", "stages"), [(2, 2, 2), (0, 4, 4), (0, 4, 2),
                                                       (1, 4, 3), (1, 2, 3), (2, 4, 3),
                                                       (4, 2, 2)])  # fmt: skip
def test_the_bound_is_the_least_plan_where_its_terms_are_tight(index, batch, stages):
    # bisected, the bound is the brute force's least plan: two single-device stages at
    # two samples (the round trip binds), four single-device stages at four samples on a
    # switch (hops of the cut's own bytes), a fast and a slow type kept apart (two and
    # three stages; 0.84 and 0.72 of it with the classes merged to the fast one's times);
    # and where the whole round binds, through paths the stage-by-stage terms missed
    # (with them alone 0.955, 0.924 and 0.962 of it): (1, 2, 3) the middle stage's round
    # trip through the stage after it, then its last gradient's way back through the
    # stage before it; (2, 4, 3) a stage's earlier stages are a prefix of as many stages
    # as the plan has there, not the cheapest prefix of any count; (4, 2, 2) the drain
    # passes the first stage's ring, which starts after that stage's last backward
    problem = instances()[index]
    least = least_of(index)[batch, stages]
    cb = ChainBound(tables_of(problem), batch, stages)
    assert bisected(cb, stages, least, 25) == pytest.approx(least, rel=1e-6)


def test_a_program_that_cannot_meet_the_ceiling_rises_to_it_and_the_others_are_bisected():
    problem = instances()[6]
    least = least_of(6)
    known = {4: np.zeros(4)}
    chain_bounds(tables_of(problem), known, 3, 1e-3, Deadline(60.0))
    assert known[4][1:].tolist() == [1e-3] * 3
    ceiling = 1.2 * least[4, 1]
    known = {2: np.zeros(4), 4: np.zeros(4)}
    chain_bounds(tables_of(problem), known, 3, ceiling, Deadline(60.0), rel_tol=1e-6)
    for b in (2, 4):
        assert all(known[b][p] <= least[b, p] * (1 + 1e-6) for p in (1, 2, 3))
        assert min(known[b][1:]) > 0.8 * min(least[b, p] for p in (1, 2, 3))


def test_a_passed_deadline_leaves_the_known_bounds():
    problem = instances()[6]
    tables = tables_of(problem)
    known = {4: np.array([0.0, 5.0, 4.0, 3.0])}
    chain_bounds(tables, known, 3, 1e9, Deadline(1e-9))
    assert known[4].tolist() == [0.0, 5.0, 4.0, 3.0]
    with pytest.raises(TimeoutError):
        ChainBound(tables, 4, 3).feasible(1e9, Deadline(1e-9))


def test_building_the_tables_stops_at_a_passed_deadline():
    # the tables and prefixes are most of a long chain's time (issue 29: nasnetalarge
    # spent 74 s of a 20 s limit building them): their construction checks the deadline
    with pytest.raises(TimeoutError):
        ChainBound(tables_of(instances()[6]), 4, 3, Deadline(1e-9))


def test_earlier_stages_fill_at_their_own_samples():
    # three stages of instance 5 at micro-batch 4: the stages before a stage go forward
    # (and its gradient back) at their own splits' samples and hops, not every block at
    # its least time over y; that fill lifts the bound from 0.635 to 0.678 of the least
    # plan (brute force)
    problem = instances()[5]
    least = least_of(5)[4, 3]
    cb = ChainBound(tables_of(problem), 4, 3)
    assert 0.677 * least < bisected(cb, 3, least, 16) <= least


def test_a_device_uplink_carries_its_samples_of_both_boundaries():
    # instance 6 (identical devices, 20 Mbit/s switch), micro-batch 1, three stages: the
    # middle stage's device sends M samples of both its boundaries on its uplink after
    # its first forward; that lifts the bound from 0.51 to 0.798 of the least plan
    problem = instances()[6]
    least = least_of(6)[1, 3]
    cb = ChainBound(tables_of(problem), 1, 3)
    assert 0.79 * least < bisected(cb, 3, least, 16) <= least


def test_each_device_starts_when_its_own_samples_arrived():
    # two stages; the best plan's second stage is a slow device at one sample beside a
    # fast one at three: the slow one's work starts after its one sample's hop, not
    # after the three samples' of the busiest device (priced so, the bound cut this
    # plan off by 0.1-1%)
    rng = np.random.default_rng(76)
    devices = int(rng.integers(2, 5))
    problem = knob_mix_problem(rng, int(rng.integers(2, 6)), devices, 76, ())
    least = least_per_program(problem)[4, 2]
    assert ChainBound(tables_of(problem), 4, 2).feasible(least * (1 + 1e-9))[1]


def test_a_stage_last_forward_feeds_the_next_stage_last_forward():
    # instance 5, micro-batch 2, two stages: the first stage's last forward ends after
    # all its forwards and the backwards before it; the second stage's last forward
    # waits for its output, then runs its trailing backward and its ring: that lifts
    # the bound from 0.967 to 0.973 of the least plan (brute force)
    problem = instances()[5]
    least = least_of(5)[2, 2]
    cb = ChainBound(tables_of(problem), 2, 2)
    assert 0.971 * least < bisected(cb, 2, least, 16) <= least


def test_meets_any_answers_whether_some_stage_count_of_the_mask_is_feasible() -> None:
    # the bisection's question (chain_bounds), against feasible's answer per stage count:
    # every mask of the point-to-point problem's stage counts, at limits from below the
    # least plan of one stage count to above all of them
    problem = point_to_point()
    least = least_per_program(problem)
    cb = ChainBound(tables_of(problem), 4, 3)
    for limit in (0.5 * least[4, 1], least[4, 2] * 0.999, least[4, 3] * 1.001,
                  1.001 * max(least.values())):
        per_count = cb.feasible(limit)
        for bits in range(8):
            mask = np.array([bool(bits >> i & 1) for i in range(3)])
            assert cb.meets_any(limit, mask) == bool((per_count & mask).any()), (limit, bits)


def test_a_stage_of_several_groups_holds_all_samples_within_each_device_capacity():
    # one stage of the three speeds at micro-batch 8: each device takes at most the
    # samples its terms fit, and together they take all 8 (with the fewest, y_lo, on
    # one of them); priced as one device of the fastest at y_d samples, the bound was
    # 0.957 of the least plan (brute force), now it is the least plan
    problem = three_speeds(0)
    least = least_per_program(problem)[8, 1]
    cb = ChainBound(tables_of(problem), 8, 1)
    assert bisected(cb, 1, least, 25) == pytest.approx(least, rel=1e-6)


def test_a_device_last_gradient_and_its_ring_chunks_share_its_uplink():
    # two types on a switch, micro-batch 8, two stages: after its last backward a device
    # of a stage of several sends its ring chunks and its last gradient over one uplink,
    # so the later of the two is delivered after both channel times; that lifts the
    # bound from 0.942 to 0.963 of the least plan (brute force)
    problem = two_types(6)
    least = least_per_program(problem)[8, 2]
    cb = ChainBound(tables_of(problem), 8, 2)
    assert 0.962 * least < bisected(cb, 2, least, 16) <= least
