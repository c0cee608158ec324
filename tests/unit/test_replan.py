"""Incremental re-planning (planner.replan.incremental) and replica placement
(planner.replan.replicas),
table by table: a plan given by hand, what changed, and the exact new assignment and
source of every migrated block, worked out by hand in each test's comment.

Unless a test says otherwise, the hand model has blocks of 1 MB of parameters, boundary
and saved activations of 1 byte per sample, forward time f_l ms per sample on every
device (backward 2 f_l), proportional to the batch; devices have 1 GB (memory never
binds), the network is 8 Gbit/s (1e6 bytes/ms) with no latency (links cost ~0), and the
optimizer is SGD with momentum (state = 3 W live, replica and migration = 2 W).
"""

from __future__ import annotations

import json

import pytest
from edgepipe.planner import api
from edgepipe.planner.cli.main import main
from edgepipe.planner.cost.formulas import hiding_interval
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.errors import (
    InfeasibleError,
    InputError,
    PlanMismatchError,
    UnrecoverableError,
)
from edgepipe.planner.inputs.cluster import Cluster, Device, Network
from edgepipe.planner.inputs.problem import make_problem
from edgepipe.planner.inputs.schema import validate
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.plan import (
    load_plan,
    plan_to_dict,
    replica_placement,
    save_plan,
)
from edgepipe.planner.replan.incremental import precompute, replan
from edgepipe.planner.replan.replicas import DP_PEER, NONE, RING, Replica, placement
from edgepipe.planner.solvers.dp.driver import plan_dp

from tests.helpers.dp_cases import W, hand_plan


def unit(first: int, end: int) -> float:
    """Replica size of 1 byte per block, for the placement tests."""
    return float(end - first)


def layout(plan):
    return [(s.first, s.end, s.devices, s.samples) for s in plan.partition.stages]


def moves(plan):
    """(to, from, first, end, from_replica) of every transfer."""
    return [(t.to, t.source, t.first, t.end, t.from_replica) for t in plan.migration]


# -- replica placement -------------------------------------------------------------------


def test_placement_uses_dp_peers_else_the_largest_device_of_the_next_stage_in_a_ring():
    part = Partition(
        4,
        1,
        (
            StageAssignment(0, 1, ("a", "b"), (2, 2)),
            StageAssignment(1, 2, ("c",), (4,)),
            StageAssignment(2, 3, ("d", "e"), (2, 2)),
        ),
    )
    budget = {"a": 5.0, "b": 5.0, "c": 1.0, "d": 1.0, "e": 2.0}
    assert placement(part, budget, True, unit) == (
        Replica(0, 0, 1, DP_PEER, ("a", "b")),
        Replica(1, 1, 2, RING, ("e",)),  # stage 2's larger device
        Replica(2, 2, 3, DP_PEER, ("d", "e")),
    )


def test_last_stage_replicates_to_the_first_and_ties_go_to_the_first_listed():
    part = Partition(
        2, 1, (StageAssignment(0, 1, ("a", "b"), (1, 1)), StageAssignment(1, 2, ("c",), (2,)))
    )
    reps = placement(part, {"a": 3.0, "b": 3.0, "c": 1.0}, True, unit)
    assert reps[1] == Replica(1, 1, 2, RING, ("a",))


def test_no_ring_replicas_when_replication_is_off_or_there_is_no_other_device():
    two = Partition(
        2, 1, (StageAssignment(0, 1, ("a",), (2,)), StageAssignment(1, 2, ("b",), (2,)))
    )
    assert [r.kind for r in placement(two, {"a": 1.0, "b": 1.0}, False, unit)] == [NONE, NONE]
    one = Partition(2, 1, (StageAssignment(0, 2, ("a",), (2,)),))
    assert placement(one, {"a": 1.0}, True, unit) == (Replica(0, 0, 2, NONE, ()),)


def test_a_one_stage_plan_replicates_to_the_largest_idle_device_that_can_hold_it():
    # the replica of blocks [0, 2) takes 2 bytes (unit: 1 per block)
    one = Partition(2, 1, (StageAssignment(0, 2, ("a",), (2,)),))
    assert placement(one, {"a": 9.0, "b": 3.0, "c": 5.0, "d": 5.0}, True, unit) == (
        Replica(0, 0, 2, RING, ("c",)),
    )
    assert placement(one, {"a": 9.0, "b": 1.0}, True, unit) == (Replica(0, 0, 2, NONE, ()),)


def test_replica_holder_pays_the_stage_weights_and_optimizer_state():
    # a [0,1) and b [1,3) single-device: a holds b's 2 blocks, b holds a's 1 block.
    # momentum: replica = (1 + 1) x W per block
    plan = hand_plan([1, 1, 1], [(0, 1, ("a",), (4,)), (1, 3, ("b",), (4,))], ["a", "b"])
    s0, s1 = plan.cost.stages
    assert (s0.replica_bytes, s1.replica_bytes) == ((4 * W,), (2 * W,))
    # live state 3 W per block + K x samples x 1 byte (K = 3 and 1) + replica
    assert s0.memory_bytes == (3 * W + 3 * 4 + 4 * W,)
    assert s1.memory_bytes == (6 * W + 1 * 4 * 2 + 2 * W,)
    off = hand_plan([1, 1, 1], [(0, 1, ("a",), (4,)), (1, 3, ("b",), (4,))], ["a", "b"], interval=0)
    assert off.cost.stages[0].memory_bytes == (3 * W + 3 * 4,)


def test_dp_never_returns_a_plan_whose_replicas_overflow():
    # two blocks of 1 MB on a (20 MB) and b (4.5 MB), block 1 ten times slower. Splitting
    # them over a and b (either way) puts 3 MB live + the other's 2 MB replica = 5 MB >
    # 4.5 MB on b, so with replication the DP must keep both blocks on a (one stage, one
    # device: nothing to replicate to); without it the split fits and is faster.
    kwargs = dict(memory={"a": 2e7, "b": 4.5e6}, bandwidth_mbps=8e3)
    stages = [(0, 2, ("a",), (4,))]
    with_rep = plan_dp(hand_plan([1, 10], stages, ["a", "b"], **kwargs).problem)
    assert with_rep.cost.memory_ok
    assert [s.devices for s in with_rep.partition.stages] == [("a",)]
    without = plan_dp(hand_plan([1, 10], stages, ["a", "b"], interval=0, **kwargs).problem)
    assert sorted(s.devices for s in without.partition.stages) == [("a",), ("b",)]


# -- lost devices --------------------------------------------------------------------------


def test_lost_dp_peer_resplits_its_stage_and_moves_nothing():
    # f = (1, 1, 3, 3). Stage 0 [0,2) on a,b (2+2), stage 1 [2,4) on c,d (2+2).
    # Lose b: a takes all 4 samples, stage 0 = 4 x 2 = 8 ms forward, still below stage
    # 1's 2 x 6 = 12 ms. Moving block 2 left gives a 4 x 5 = 20, block 1 right gives c,d
    # 2 x 7 = 14: both worse. a already holds [0,2): no migration.
    old = hand_plan(
        [1, 1, 3, 3],
        [(0, 2, ("a", "b"), (2, 2)), (2, 4, ("c", "d"), (2, 2))],
        ["a", "b", "c", "d"],
    )
    new = replan(old, lost=["b"])
    assert layout(new) == [(0, 2, ("a",), (4,)), (2, 4, ("c", "d"), (2, 2))]
    assert new.migration == ()
    assert new.parent_id == old.id
    assert new.changes.lost == ("b",) and new.changes.path == "fast"
    # within 5% of the old plan's figure (a bound on the full solve): not computed
    assert new.solver.settings["full_ms"] is None


def test_lost_dp_peer_can_shift_a_cut_and_the_block_comes_from_the_live_owner():
    # f = (1, 1, 1, 1), same layout. Lose b: a alone at 4 x 2 = 8 ms forward vs c,d at
    # 2 x 2 = 4. Moving block 1 to c,d: a 4 x 1 = 4, c,d 2 x 3 = 6: the best cut (moving
    # block 2 left instead makes a 12). c and d get block 1 from a, its surviving owner.
    old = hand_plan(
        [1, 1, 1, 1],
        [(0, 2, ("a", "b"), (2, 2)), (2, 4, ("c", "d"), (2, 2))],
        ["a", "b", "c", "d"],
    )
    # (the fast path's answer; on links this cheap the full solve, >5% better, would
    # regroup everything into pure data parallelism: see the fallback tests)
    new = replan(old, lost=["b"], full_solve=False)
    assert layout(new) == [(0, 1, ("a",), (4,)), (1, 4, ("c", "d"), (2, 2))]
    assert moves(new) == [("c", "a", 1, 2, False), ("d", "a", 1, 2, False)]
    # each transfer: weights + momentum of block 1 = 2 MB over 1e6 B/ms = 2 ms
    assert [t.bytes for t in new.migration] == [2 * W, 2 * W]
    assert [t.ms for t in new.migration] == [2.0, 2.0]
    # two transfers out of a share its uplink (switched network): 4 ms
    assert new.migration_ms == 4.0


def test_lost_middle_stage_goes_to_its_neighbours_at_the_best_cut():
    # f = (1, 1, 2), single-device stages a [0,1), b [1,2), c [2,3); ring replicas:
    # a's on b, b's on c, c's on a. Lose b: cut k = 1 gives a 1 | c 3 ms per sample,
    # k = 2 gives a 2 | c 2: the best. a needs block 1; its owner b is lost, so it comes
    # from b's ring replica holder c.
    old = hand_plan(
        [1, 1, 2],
        [(0, 1, ("a",), (4,)), (1, 2, ("b",), (4,)), (2, 3, ("c",), (4,))],
        ["a", "b", "c"],
    )
    new = replan(old, lost=["b"])
    assert layout(new) == [(0, 2, ("a",), (4,)), (2, 3, ("c",), (4,))]
    assert moves(new) == [("a", "c", 1, 2, True)]


def test_lost_stage_absorbed_by_its_replica_holder_is_a_local_promotion():
    # f = (2, 1, 1), a [0,1), b [1,2), c [2,3). Lose b: k = 1 gives a 2 | c 2, k = 2 gives
    # a 3 | c 1: k = 1 wins, so c takes block 1, whose ring replica it already holds:
    # promoted locally, no bytes.
    old = hand_plan(
        [2, 1, 1],
        [(0, 1, ("a",), (4,)), (1, 2, ("b",), (4,)), (2, 3, ("c",), (4,))],
        ["a", "b", "c"],
    )
    new = replan(old, lost=["b"], full_solve=False)  # the fast path's answer
    assert layout(new) == [(0, 1, ("a",), (4,)), (1, 3, ("c",), (4,))]
    assert moves(new) == [("c", "c", 1, 2, True)]
    assert new.migration[0].bytes == 0 and new.migration_ms == 0


def test_an_idle_device_takes_over_an_emptied_stage():
    # a [0,1), b [1,2), e idle, f = (1, 1). Lose b: merging gives a 2 ms per sample,
    # e taking the stage over keeps 1 | 1. e gets block 1 from b's replica holder a.
    old = hand_plan([1, 1], [(0, 1, ("a",), (4,)), (1, 2, ("b",), (4,))], ["a", "b", "e"])
    new = replan(old, lost=["b"])
    assert layout(new) == [(0, 1, ("a",), (4,)), (1, 2, ("e",), (4,))]
    assert moves(new) == [("e", "a", 1, 2, True)]


def test_lost_stage_merged_into_a_dp_group_takes_its_blocks_from_the_replica_holder():
    # a,b [0,2) (2+2), c [2,4), no idle device, f = (1, 1, 1, 1). c's ring replica sits on
    # stage 0's largest device: b (2 GB). Lose c: a,b take [0,4). b promotes its replica,
    # a receives [2,4) from b.
    old = hand_plan(
        [1, 1, 1, 1],
        [(0, 2, ("a", "b"), (2, 2)), (2, 4, ("c",), (4,))],
        ["a", "b", "c"],
        memory={"b": 2e9},
    )
    new = replan(old, lost=["c"])
    assert layout(new) == [(0, 4, ("a", "b"), (2, 2))]
    assert moves(new) == [("a", "b", 2, 4, True), ("b", "b", 2, 4, True)]
    assert new.migration[0].bytes == 2 * 2 * W


def test_two_devices_lost_in_different_stages():
    # a,b [0,1), c [1,2), d,e [2,3), f = (1, 1, 1), d has the most memory so it holds c's
    # replica. Lose b and c: stage 0 is a alone, stage 1 empties. Cut k = 1 gives
    # a 4 x 1 | d,e 2 x 2 = 4 ms; k = 2 gives a 4 x 2 = 8 | d,e 2: k = 1 wins. d promotes
    # its replica of block 1, e receives it from d.
    old = hand_plan(
        [1, 1, 1],
        [(0, 1, ("a", "b"), (2, 2)), (1, 2, ("c",), (4,)), (2, 3, ("d", "e"), (2, 2))],
        ["a", "b", "c", "d", "e"],
        memory={"d": 2e9},
    )
    new = replan(old, lost=["b", "c"])
    assert layout(new) == [(0, 1, ("a",), (4,)), (1, 3, ("d", "e"), (2, 2))]
    assert moves(new) == [("d", "d", 1, 2, True), ("e", "d", 1, 2, True)]


def test_losing_a_stage_with_its_replica_holder_is_unrecoverable_and_names_the_blocks():
    # a [0,1) -> replica on b, b [1,3) -> on c, c [3,4) -> on a. Lose a and b: blocks
    # [0,1) had copies only on a and b.
    old = hand_plan(
        [1, 1, 1, 1],
        [(0, 1, ("a",), (4,)), (1, 3, ("b",), (4,)), (3, 4, ("c",), (4,))],
        ["a", "b", "c", "d"],
    )
    with pytest.raises(UnrecoverableError, match=r"blocks \[0, 1\)") as info:
        replan(old, lost=["a", "b"])
    assert info.value.blocks == ((0, 1),) and info.value.lost == ("a", "b")


def test_without_replication_a_single_device_stage_cannot_be_recovered():
    old = hand_plan(
        [1, 1], [(0, 1, ("a",), (4,)), (1, 2, ("b",), (4,))], ["a", "b", "e"], interval=0
    )
    with pytest.raises(UnrecoverableError, match="replication_interval is 0") as info:
        replan(old, lost=["b"])
    assert info.value.blocks == ((1, 2),)


def test_losing_the_only_device_of_a_one_stage_plan_hands_it_to_idle_devices():
    # a runs [0,2) alone; its replica sits on the larger idle device, e (2 GB; d has 1).
    # Lose a: e takes the stage over by promoting its replica (d would need 4 MB moved
    # for the same speed), then d joins as a data-parallel peer (half the samples each,
    # the all-reduce costs ~0 here) and receives the blocks from e.
    old = hand_plan([1, 1], [(0, 2, ("a",), (4,))], ["a", "d", "e"], memory={"e": 2e9})
    assert replica_placement(old)[0].holders == ("e",)
    new = replan(old, lost=["a"])
    assert layout(new) == [(0, 2, ("e", "d"), (2, 2))]
    assert moves(new) == [("e", "e", 0, 2, True), ("d", "e", 0, 2, True)]


def test_losing_an_idle_device_changes_nothing():
    old = hand_plan([1, 1], [(0, 1, ("a",), (4,)), (1, 2, ("b",), (4,))], ["a", "b", "e"])
    new = replan(old, lost=["e"])
    assert new.partition == old.partition and new.migration == ()
    assert not new.problem.cluster.has_device("e")


# -- fast path or full solve ------------------------------------------------------------


def test_full_solve_replaces_a_fast_path_worse_by_more_than_the_margin():
    # a [0,1), b,c [1,2), 1 MB blocks on a slow network (8 Mbit/s = 1000 B/ms). Lose a:
    # the only local repair merges [0,2) into the b,c group, whose all-reduce of 2 MB
    # takes 2 MB / 1000 B/ms = 2000 ms per step; the full solve pipelines b | c with no
    # all-reduce. b holds a's ring replica (tie between b and c: first listed), so the
    # full plan needs only a local promotion on b.
    old = hand_plan(
        [1, 1],
        [(0, 1, ("a",), (4,)), (1, 2, ("b", "c"), (2, 2))],
        ["a", "b", "c"],
        bandwidth_mbps=8.0,
    )
    new = replan(old, lost=["a"])
    assert new.changes.path == "full"
    assert new.solver.settings["fast_ms"] > 2000 > new.cost.iteration_ms
    assert layout(new) == [(0, 1, ("b",), (4,)), (1, 2, ("c",), (4,))]
    assert moves(new) == [("b", "b", 0, 1, True)]
    # the fast path alone keeps the merge
    fast = replan(old, lost=["a"], full_solve=False)
    assert layout(fast) == [(0, 2, ("b", "c"), (2, 2))]


def test_full_solve_runs_when_the_fast_path_does_not_fit():
    # 1 MB blocks, a and b hold 5.5 MB. a,b [0,1), c [1,2). Lose c: merging puts 2 blocks
    # (6 MB live) on a and b: overflow. The full solve pipelines a | b: each holds 3 MB
    # live + the other's 2 MB replica = 5 MB.
    old = hand_plan(
        [1, 1],
        [(0, 1, ("a", "b"), (2, 2)), (1, 2, ("c",), (4,))],
        ["a", "b", "c"],
        memory={"a": 5.5e6, "b": 5.5e6},
    )
    new = replan(old, lost=["c"])
    assert new.changes.path == "full" and new.changes.reason == "fast path infeasible"
    assert layout(new) == [(0, 1, ("a",), (4,)), (1, 2, ("b",), (4,))]
    # a kept block 0 live; b needs block 1: c is lost, its replica is on a
    assert moves(new) == [("b", "a", 1, 2, True)]
    with pytest.raises(InfeasibleError):
        replan(old, lost=["c"], full_solve=False)


# -- slowed and joined devices ---------------------------------------------------------


def test_slowed_device_gets_fewer_samples():
    # a,b [0,2) (2+2), c,d [2,4) (2+2), f = (1, 1, 1, 1). b 3x slower: splits (y_a, y_b)
    # cost max(2 y_a, 6 y_b) ms forward: (3, 1) gives 6 = the best ((2, 2): 12, (4, 0): 8).
    old = hand_plan(
        [1, 1, 1, 1],
        [(0, 2, ("a", "b"), (2, 2)), (2, 4, ("c", "d"), (2, 2))],
        ["a", "b", "c", "d"],
    )
    new = replan(old, slowed={"b": 3.0})
    assert layout(new) == [(0, 2, ("a", "b"), (3, 1)), (2, 4, ("c", "d"), (2, 2))]
    assert new.migration == () and new.changes.slowed == (("b", 3.0),)
    assert new.problem.cluster.devices[1].slowdown == 3.0


def test_slowed_device_gives_up_blocks_to_the_holder_of_its_replica():
    # a [0,2), b [2,4), f = (1, 1, 1, 1). a 3x slower: a 6 | b 2 ms per sample; moving
    # the cut to 1 gives a 3 | b 3 (to 0 is not allowed). b already holds a's ring
    # replica, so block 1 is promoted locally.
    old = hand_plan([1, 1, 1, 1], [(0, 2, ("a",), (4,)), (2, 4, ("b",), (4,))], ["a", "b"])
    new = replan(old, slowed={"a": 3.0}, full_solve=False)  # the fast path's answer
    assert layout(new) == [(0, 1, ("a",), (4,)), (1, 4, ("b",), (4,))]
    assert moves(new) == [("b", "b", 1, 2, True)]


def test_replanning_is_hysteresis_free_a_small_gain_moves_samples_and_no_gain_nothing():
    # a,b [0,2) (2+2), c,d [2,4) (2+2), f = (1, 1, 1, 1).
    # b 1.2x: (2, 2) costs max(4, 4.8) = 4.8 < (3, 1): 6, so nothing moves.
    # b 1.6x: (2, 2) costs 6.4 > (3, 1): max(6, 3.2) = 6, so a 6% gain moves a sample:
    # the planner applies no threshold (the executor adds hysteresis).
    old = hand_plan(
        [1, 1, 1, 1],
        [(0, 2, ("a", "b"), (2, 2)), (2, 4, ("c", "d"), (2, 2))],
        ["a", "b", "c", "d"],
    )
    assert layout(replan(old, slowed={"b": 1.2}))[0] == (0, 2, ("a", "b"), (2, 2))
    assert layout(replan(old, slowed={"b": 1.6}))[0] == (0, 2, ("a", "b"), (3, 1))
    # no memory between calls: the same question gets the same answer
    assert replan(old, slowed={"b": 1.6}).partition == replan(old, slowed={"b": 1.6}).partition


def test_joined_device_enters_the_group_where_it_helps_most():
    # a [0,1), b [1,2), f = (1, 2): stage 1 is the bottleneck (2 vs 1 ms per sample).
    # e joins: with b it halves stage 1 (b,e 2+2 x 2 = 4 vs a 4 x 1 = 4 ms); with a it
    # changes nothing. e receives block 1 from b, its live owner.
    old = hand_plan([1, 2], [(0, 1, ("a",), (4,)), (1, 2, ("b",), (4,))], ["a", "b"])
    t = old.problem.cluster.device_types["t"]
    joined = Cluster("new", (Device("e", "t"),), Network(8e3, 0.0), {"t": t})
    new = replan(old, joined=joined, full_solve=False)
    assert layout(new) == [(0, 1, ("a",), (4,)), (1, 2, ("b", "e"), (2, 2))]
    assert moves(new) == [("e", "b", 1, 2, False)]
    assert new.changes.joined == ("e",)
    # a join can make a better plan than the old one, so the full solve is computed
    assert replan(old, joined=joined).solver.settings["full_ms"] is not None


# -- bad requests ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "nothing changed"),
        ({"lost": ["zz"]}, "'zz' is not in the plan's cluster"),
        ({"lost": ["a", "a"]}, "named twice"),
        ({"slowed": {"a": 0.0}}, "positive"),
        ({"slowed": {"a": 2.0}, "lost": ["a"]}, "also lost"),
        ({"lost": ["a", "b"]}, "every device is lost"),
    ],
)
def test_bad_requests_are_input_errors(kwargs, message):
    old = hand_plan([1, 1], [(0, 1, ("a",), (4,)), (1, 2, ("b",), (4,))], ["a", "b"])
    with pytest.raises(InputError, match=message):
        replan(old, **kwargs)


# -- plan documents, precompute and the CLI --------------------------------------------


def test_replanned_plan_round_trips_with_its_lineage_and_migration(tmp_path):
    old = hand_plan(
        [1, 1, 2],
        [(0, 1, ("a",), (4,)), (1, 2, ("b",), (4,)), (2, 3, ("c",), (4,))],
        ["a", "b", "c"],
    )
    new = replan(old, lost=["b"])
    path = tmp_path / "new.json"
    save_plan(new, path)
    doc = json.loads(path.read_text())
    assert doc["parent_id"] == old.id
    assert doc["changes"]["lost"] == ["b"]
    assert doc["migration"]["transfers"] == [
        {"to": "a", "from": "c", "layers": [1, 2], "from_replica": True, "bytes": 2 * W, "ms": 2.0}
    ]
    assert doc["replicas"] == [
        {"stage": 0, "layers": [0, 2], "kind": "ring", "holders": ["c"]},
        {"stage": 1, "layers": [2, 3], "kind": "ring", "holders": ["a"]},
    ]
    back = load_plan(path)
    assert back.changes == new.changes and back.migration == new.migration
    assert back.partition == new.partition


def test_plans_without_the_new_fields_still_load(tmp_path):
    old = hand_plan([1, 1], [(0, 1, ("a",), (4,)), (1, 2, ("b",), (4,))], ["a", "b"])
    doc = plan_to_dict(old)
    assert "changes" not in doc and "migration" not in doc
    del doc["replicas"]
    for stage in doc["stages"]:
        for dev in stage["devices"]:
            del dev["replica_bytes"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    assert load_plan(path).partition == old.partition


def test_changes_without_migration_is_rejected_by_the_schema():
    old = hand_plan([1, 1], [(0, 1, ("a",), (4,)), (1, 2, ("b",), (4,))], ["a", "b", "e"])
    doc = plan_to_dict(replan(old, lost=["e"]))
    del doc["migration"]
    with pytest.raises(InputError, match="migration"):
        validate(doc, "edgepipe.plan", "doc")


def test_precompute_gives_the_replan_of_every_single_device_loss():
    old = hand_plan(
        [1, 1, 2],
        [(0, 1, ("a",), (4,)), (1, 2, ("b",), (4,)), (2, 3, ("c",), (4,))],
        ["a", "b", "c", "e"],
    )
    table = precompute(old)
    assert set(table) == {"a", "b", "c", "e"}
    for dev, plan in table.items():
        assert plan.partition == replan(old, lost=[dev]).partition
    assert table["e"].partition == old.partition


def test_precompute_maps_an_unrecoverable_loss_to_its_error():
    old = hand_plan(
        [1, 1], [(0, 1, ("a",), (4,)), (1, 2, ("b",), (4,))], ["a", "b", "e"], interval=0
    )
    table = precompute(old)
    assert isinstance(table["a"], UnrecoverableError) and table["e"].partition == old.partition


def test_cli_replan_writes_the_child_plan(tmp_path, capsys):
    old = hand_plan(
        [1, 1, 2],
        [(0, 1, ("a",), (4,)), (1, 2, ("b",), (4,)), (2, 3, ("c",), (4,))],
        ["a", "b", "c"],
    )
    src, dst = tmp_path / "plan.json", tmp_path / "new.json"
    save_plan(old, src)
    assert main(["replan", str(src), "--lost", "b", "-o", str(dst)]) == 0
    assert "migration: 1 transfers" in capsys.readouterr().out
    new = load_plan(dst)
    assert new.parent_id == old.id
    assert [t.source for t in new.migration] == ["c"]


def test_cli_replan_rejects_a_malformed_slowed_option(tmp_path, capsys):
    old = hand_plan([1, 1], [(0, 1, ("a",), (4,)), (1, 2, ("b",), (4,))], ["a", "b"])
    src = tmp_path / "plan.json"
    save_plan(old, src)
    assert main(["replan", str(src), "--slowed", "a"]) == 2
    err = capsys.readouterr().err
    assert "DEV=FACTOR" in err and "Traceback" not in err


def test_the_survivors_problem_is_what_make_problem_builds():
    # the re-planner reuses the old timings (derived from v100 for every Jetson type)
    # instead of deriving them again; make_problem on the same cluster is the oracle
    old = api.solve(api.load_problem(api.DEMO_MODEL, api.DEMO_CLUSTER))
    new = replan(old, lost=["nx-0"], slowed={"tx2-0": 2.0})
    fresh = make_problem(old.problem.model, new.problem.cluster, old.problem.config, catalog={})
    assert new.problem.timings == fresh.timings
    assert new.problem.assumptions == fresh.assumptions
    assert [d.id for d in new.problem.cluster.devices] == [
        "nano-0",
        "nano-1",
        "tx2-0",
        "tx2-1",
        "orin-0",
    ]
    assert new.problem.cluster.devices[2].slowdown == 2.0


def test_cli_replan_reads_joined_devices_from_a_cluster_file(tmp_path, capsys):
    old = hand_plan([1, 2], [(0, 1, ("a",), (4,)), (1, 2, ("b",), (4,))], ["a", "b"])
    t = old.problem.cluster.device_types["t"]
    joined = tmp_path / "joined.json"
    joined.write_text(
        json.dumps(Cluster("new", (Device("e", "t"),), Network(8e3, 0.0), {"t": t}).to_dict())
    )
    src, dst = tmp_path / "plan.json", tmp_path / "new.json"
    save_plan(old, src)
    assert main(["replan", str(src), "--joined", str(joined), "-o", str(dst)]) == 0
    new = load_plan(dst)
    assert new.changes.joined == ("e",)
    assert "e" in new.partition.used_devices()


def test_a_plan_overflowing_only_by_its_replica_says_so():
    # a [0,1), b [1,2); b holds a's replica, 2 MB, and has 4 MB: 3 MB live + 2 MB > 4 MB
    with pytest.raises(PlanMismatchError, match="of it ring replicas of another stage"):
        hand_plan(
            [1, 1],
            [(0, 1, ("a",), (4,)), (1, 2, ("b",), (4,))],
            ["a", "b"],
            memory={"b": 4e6},
        )
    fits = hand_plan(
        [1, 1],
        [(0, 1, ("a",), (4,)), (1, 2, ("b",), (4,))],
        ["a", "b"],
        memory={"b": 4e6},
        interval=0,
    )
    assert fits.cost.memory_ok


# -- replication interval of the re-plan ---------------------------------------------------


def _ring_of_three(interval):
    # f = (1, 1, 2), a [0,1), b [1,2), c [2,3), ring replicas, 80 Mbit/s = 1e4 B/ms
    return hand_plan(
        [1, 1, 2],
        [(0, 1, ("a",), (4,)), (1, 2, ("b",), (4,)), (2, 3, ("c",), (4,))],
        ["a", "b", "c"],
        bandwidth_mbps=80.0,
        interval=interval,
    )


def _transfer_ms(plan):
    return CostModel(plan.problem, plan.partition.micro_batch_size).replica_transfer_ms(
        plan.partition)


def test_a_replan_of_an_auto_plan_resolves_its_interval_again_for_the_new_plan(tmp_path):
    # Each stage's ring replica is 1 block = weights + momentum = 2 MB: 2e6 / 1e4 = 200 ms
    # (plus the little the iteration's own activations take of the channel) beside a
    # step of 216 ms: auto resolves to 1. Lose b: a takes [0,2) (test above), its replica
    # is 4 MB = 400 ms, so 1 step no longer hides it: ceil(400 / 216) = 2. Keeping 1
    # would hold every step until the transfer ends (216 / 400 = 54% of the throughput).
    old = _ring_of_three("auto")
    assert old.problem.config.replication_interval == 1
    assert old.problem.config.replication_interval_auto
    assert 200 < _transfer_ms(old) < 201 and old.cost.iteration_ms == pytest.approx(216, abs=0.1)
    save_plan(old, tmp_path / "old.json")  # the choice survives the plan file
    new = replan(load_plan(tmp_path / "old.json"), lost=["b"])
    assert layout(new) == [(0, 2, ("a",), (4,)), (2, 3, ("c",), (4,))]
    transfer, step = _transfer_ms(new), new.cost.iteration_ms
    assert 400 < transfer < 401 and step == pytest.approx(216, abs=0.1)
    assert hiding_interval(transfer, step) == 2
    assert new.problem.config.replication_interval == 2
    assert new.problem.config.replication_interval_auto  # and again at the next re-plan


def test_a_replan_keeps_an_interval_the_user_chose_and_the_flag_overrides_it(tmp_path, capsys):
    old = _ring_of_three(1)
    assert not old.problem.config.replication_interval_auto
    new = replan(old, lost=["b"])
    assert new.problem.config.replication_interval == 1  # as given, though 2 would hide it
    assert not new.problem.config.replication_interval_auto
    assert replan(old, lost=["b"], interval="auto").problem.config.replication_interval == 2
    assert replan(_ring_of_three("auto"), lost=["b"],
                  interval=3).problem.config.replication_interval == 3
    src, dst = tmp_path / "plan.json", tmp_path / "new.json"
    save_plan(old, src)
    assert main(["replan", str(src), "--lost", "b", "--replication-interval", "5",
                 "-o", str(dst)]) == 0
    assert load_plan(dst).problem.config.replication_interval == 5
    assert main(["replan", str(src), "--lost", "b", "--replication-interval", "-1"]) == 2
    assert "--replication-interval" in capsys.readouterr().err
