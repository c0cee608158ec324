"""The round time's two computations (planner.cost.makespan.round_makespan): the longest path, which
point to point is the figure, agrees with the fair-sharing event simulation there, and
is not the figure where a channel is shared; schedules and orders are cached safely."""

from __future__ import annotations

import functools

import pytest
from edgepipe.planner.cost.channels import fair_shares
from edgepipe.planner.cost.fair_sharing import fair_sharing_makespan
from edgepipe.planner.cost.makespan import longest_path_makespan, round_makespan
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.cost.order import cached_schedule
from edgepipe.planner.cost.transfers import BoundaryCost, Piece, RingCost
from edgepipe.planner.inputs.problem import Problem
from edgepipe.planner.partition import Partition
from edgepipe.planner.schedule import build, from_csv

from tests.helpers.synthetic import random_plans


@functools.cache
def grid() -> list[tuple[Problem, Partition]]:
    """300 random plans per network kind (uneven groups and splits, per-pair links,
    GPipe and 1F1B, both warm-up rules: tests.helpers.synthetic.random_plans)."""
    return random_plans(900, seed=5)


def round_inputs(problem: Problem, part: Partition) -> tuple:
    """What CostModel.evaluate hands round_makespan, built from the public pieces."""
    cm = CostModel(problem)
    cost = cm.evaluate(part)
    cluster = problem.cluster
    schedule = build(
        problem.config.schedule, [s.warmup for s in cost.stages], part.num_micro_batches
    )
    devices = [
        list(zip(stage.devices, s.device_forward_ms, s.device_backward_ms, strict=True))
        for stage, s in zip(part.stages, cost.stages, strict=True)
    ]
    links = [cm.link_transfer(a, b) for a, b in zip(part.stages, part.stages[1:], strict=False)]
    rings = [
        cm.ring(s.first, s.end, [cluster.index(d) for d in s.devices]) for s in part.stages
    ]
    return schedule, devices, links, rings, cluster.network.kind


def test_point_to_point_longest_path_equals_the_fair_sharing_simulation():
    checked = 0
    for problem, part in grid():
        schedule, devices, links, rings, kind = round_inputs(problem, part)
        if kind != "point_to_point":
            continue
        fast = longest_path_makespan(schedule, devices, links, rings)
        slow = fair_sharing_makespan(schedule, devices, links, rings, kind)
        assert fast == pytest.approx(slow, rel=1e-9, abs=1e-9)
        checked += 1
    assert checked == 300


def test_the_evaluated_figure_is_the_longest_path_point_to_point_only():
    for problem, part in grid()[:90]:
        schedule, devices, links, rings, kind = round_inputs(problem, part)
        expected = (
            longest_path_makespan(schedule, devices, links, rings)
            if kind == "point_to_point"
            else fair_sharing_makespan(schedule, devices, links, rings, kind)
        )
        assert CostModel(problem).evaluate(part).iteration_ms == expected


def three_stage_chain(topology):
    """The hand-worked chain of tests/unit/test_cost.py (a -> b -> c, F = B = 1 ms, pieces of
    4 ms, M = 3): 34 ms point to point, 39 ms switched, where b's ports are shared."""
    devices = [[("a", 1.0, 1.0)], [("b", 1.0, 1.0)], [("c", 1.0, 1.0)]]
    links = [
        BoundaryCost((Piece("a", "b", 4.0, 0.0),), (Piece("b", "a", 4.0, 0.0),), topology),
        BoundaryCost((Piece("b", "c", 4.0, 0.0),), (Piece("c", "b", 4.0, 0.0),), topology),
    ]
    return build("1f1b", [3, 2, 1], 3), devices, links, [RingCost()] * 3


def test_the_longest_path_ignores_shared_ports_so_a_switch_is_simulated():
    schedule, devices, links, rings = three_stage_chain("switched")
    assert longest_path_makespan(schedule, devices, links, rings) == 34.0
    assert fair_sharing_makespan(schedule, devices, links, rings, "switched") == 39.0
    assert round_makespan(schedule, devices, links, rings, "switched") == 39.0


def test_the_ring_follows_the_last_backward_on_the_longest_path():
    # stage 0 = a, stage 1 = c + d; F = B = 1, pieces 1 ms, chunks 1.5 ms, no latency:
    # acts 1-2, F 2-3, B 3-4, gradients 4-5, a: B 5-6; ring steps 4-5.5, 5.5-7 -> 7
    devices = [[("a", 1.0, 1.0)], [("c", 1.0, 1.0), ("d", 1.0, 1.0)]]
    link = BoundaryCost(
        (Piece("a", "c", 1.0, 0.0), Piece("a", "d", 1.0, 0.0)),
        (Piece("c", "a", 1.0, 0.0), Piece("d", "a", 1.0, 0.0)),
        "point_to_point",
    )
    rings = [RingCost(), RingCost((Piece("c", "d", 1.5, 0.0), Piece("d", "c", 1.5, 0.0)))]
    assert longest_path_makespan(build("1f1b", [1, 1], 1), devices, [link], rings) == 7.0


def test_a_deadlocking_schedule_is_refused_by_both_computations():
    # stage 0 starts with B0, which waits for stage 1's B0, which runs after its F0,
    # which waits for stage 0's F0
    schedule = from_csv("0B0,0F0\n1F0,1B0\n")
    devices = [[("a", 1.0, 1.0)], [("b", 1.0, 1.0)]]
    link = BoundaryCost((Piece("a", "b", 1.0, 0.0),), (Piece("b", "a", 1.0, 0.0),), "switched")
    rings = [RingCost(), RingCost()]
    with pytest.raises(ValueError, match="deadlocks"):
        longest_path_makespan(schedule, devices, [link], rings)
    with pytest.raises(ValueError, match="deadlocks"):
        fair_sharing_makespan(schedule, devices, [link], rings, "switched")


def test_a_cached_schedule_is_the_schedule_built():
    # the cost model caches schedules (immutable) per name, warm-ups and M
    assert cached_schedule("1f1b", (3, 2, 1), 4) == build("1f1b", [3, 2, 1], 4)
    assert cached_schedule("gpipe", (3, 2, 1), 4) == build("gpipe", [3, 2, 1], 4)
    assert cached_schedule("1f1b", (3, 2, 1), 4) is cached_schedule("1f1b", (3, 2, 1), 4)


def test_equal_schedules_built_apart_give_the_same_round():
    # the per-schedule order cache is keyed by identity: a rebuilt schedule is a new
    # entry, a different one a different figure
    schedule, devices, links, rings = three_stage_chain("point_to_point")
    again = build("1f1b", [3, 2, 1], 3)
    assert again is not schedule
    assert longest_path_makespan(again, devices, links, rings) == 34.0
    gpipe = build("gpipe", [3, 3, 3], 3)
    assert longest_path_makespan(gpipe, devices, links, rings) != 34.0


def test_one_shared_port_slows_only_the_transfers_on_it():
    # a sends to b and c (a's uplink held twice), d sends to e alone: 1/2, 1/2, 1
    held = [("a up", "b down"), ("a up", "c down"), ("d up", "e down")]
    assert fair_shares(held) == [0.5, 0.5, 1.0]
    # three on a's uplink, one elsewhere: 1/3 each and 1
    held = [("a up", "b down"), ("a up", "c down"), ("a up", "d down"), ("e up", "f down")]
    assert fair_shares(held) == [1 / 3, 1 / 3, 1 / 3, 1.0]
