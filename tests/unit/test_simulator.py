"""Specification of planner.check.simulator, the independent reference: hand-worked iterations.

Every case below was worked out on paper from the semantics in the simulator's
docstring (devices run their own slices, transfers occupy their channels, channels are
shared max-min fairly). Units: the network moves 1000 bytes per ms (8 Mbit/s) with no
latency unless a case says otherwise, and every time curve is proportional to the batch
(one measured size), so a block of "2 ms per sample" takes 6 ms on 3 samples.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from edgepipe.planner.check.gantt import draw_gantt, rows, timeline_text
from edgepipe.planner.check.simulator import Interval, simulate
from edgepipe.planner.inputs.cluster import Cluster, Device, DeviceType, Network
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import Problem, make_problem
from edgepipe.planner.inputs.profile import Block, ModelProfile, Timing
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.schedule import build

from tests.helpers.paths import REPO

SPEC = DeviceType("t", "test device", 1e12, 1.0, 1.0, 1.0, "test", 1e6, {})


def make(
    blocks: list[tuple[float, float, float, float]],
    devices: list[str],
    topology: str,
    batch: int,
    micro_batches: int,
    latency_ms: float = 0.0,
    schedule: str = "1f1b",
) -> Problem:
    """Blocks as (forward ms/sample, backward ms/sample, output bytes/sample, params)."""
    cluster = Cluster(
        "c",
        tuple(Device(d, "t") for d in devices),
        Network(8.0, latency_ms, topology == "shared_medium", (), topology),  # type: ignore[arg-type]
        {"t": SPEC},
    )
    model = ModelProfile(
        "m",
        {"kind": "analytic"},
        1.0,
        tuple(Block(f"b{i}", p, out, 0.0) for i, (_, _, out, p) in enumerate(blocks)),
        {"t": Timing((1,), tuple((f,) for f, *_ in blocks), tuple((b,) for _, b, *_ in blocks))},
    )
    config = TrainingConfig(batch * micro_batches, (batch,), schedule=schedule)
    return make_problem(model, cluster, config, catalog={"t": SPEC})


def stages(batch: int, m: int, *parts: tuple[int, int, dict[str, int]]) -> Partition:
    return Partition(
        batch,
        m,
        tuple(StageAssignment(a, b, tuple(d), tuple(d.values())) for a, b, d in parts),
    )


def F(m: int, start: float, end: float) -> Interval:
    return Interval("F", m, start, end)


def B(m: int, start: float, end: float) -> Interval:
    return Interval("B", m, start, end)


# --- case 1: two stages with uneven groups --------------------------------------------------
# stage 0 = a (1 sample) + b (2 samples), 1 ms/sample forward, 2 backward; stage 1 = c
# (3 samples), same block times; 1000 bytes per sample cross the cut, M = 1.
UNEVEN = [(1.0, 2.0, 1000.0, 0.0), (1.0, 2.0, 0.0, 0.0)]
UNEVEN_PLAN = stages(3, 1, (0, 1, {"a": 1, "b": 2}), (1, 2, {"c": 3}))


def test_uneven_groups_point_to_point():
    # a: F0 0-1, its piece (1 sample, 1 ms) lands at 2; b: F0 0-2, piece (2 ms) lands at 4.
    # c waits for both: F0 4-7, B0 7-13; gradient pieces on their own channels land at 14
    # (to a) and 15 (to b); a: B0 14-16, b: B0 15-19; the 0-byte ring ends at 19.
    t = simulate(make(UNEVEN, ["a", "b", "c"], "point_to_point", 3, 1), UNEVEN_PLAN)
    assert t.devices["c"] == (F(0, 4, 7), B(0, 7, 13))
    assert t.devices["a"] == (F(0, 0, 1), B(0, 14, 16), Interval("AR", -1, 16, 19))
    assert t.devices["b"] == (F(0, 0, 2), B(0, 15, 19), Interval("AR", -1, 19, 19))
    assert t.makespan_ms == 19


def test_uneven_groups_switched_share_the_senders_uplink():
    # Both gradient pieces leave c's one uplink: at half rate each until c->a is done at
    # 15 (1 ms of work), then c->b's last 1 ms at full rate: 16. a: B0 15-17, b: B0 16-20.
    t = simulate(make(UNEVEN, ["a", "b", "c"], "switched", 3, 1), UNEVEN_PLAN)
    grads = {x.dst: (x.start_ms, x.end_ms) for x in t.transfers if x.kind == "B"}
    assert grads == {"a": (13, 15), "b": (13, 16)}
    assert t.devices["b"][1] == B(0, 16, 20)
    assert t.makespan_ms == 20


# --- case 2: a full-duplex link carrying an activation and a gradient at once ----------------
# a (stage 0): 4 ms forward and backward; c (stage 1): 1 ms each; 4000 bytes (4 ms) cross
# the cut; B = 1, M = 2, 1F1B with a keeping both forwards in flight.
DUPLEX = [(4.0, 4.0, 4000.0, 0.0), (1.0, 1.0, 0.0, 0.0)]
DUPLEX_PLAN = stages(1, 2, (0, 1, {"a": 1}), (1, 2, {"c": 1}))


@pytest.mark.parametrize("topology", ["point_to_point", "switched"])
def test_full_duplex_link_carries_activation_and_gradient_at_once(topology):
    # a: F0 0-4 (act0 4-8), F1 4-8 (act1 8-12). c: F0 8-9, B0 9-10, grad0 10-14 while
    # act1 is still on the wire in the other direction; F1 12-13, B1 13-14, grad1 14-18.
    # a: B0 14-18, B1 18-22.
    t = simulate(make(DUPLEX, ["a", "c"], topology, 1, 2), DUPLEX_PLAN)
    on_wire = {(x.kind, x.micro_batch): (x.start_ms, x.end_ms) for x in t.transfers}
    assert on_wire == {("F", 0): (4, 8), ("F", 1): (8, 12), ("B", 0): (10, 14), ("B", 1): (14, 18)}
    assert t.devices["a"] == (F(0, 0, 4), F(1, 4, 8), B(0, 14, 18), B(1, 18, 22))
    assert t.makespan_ms == 22


def test_half_duplex_medium_splits_activation_and_gradient():
    # The same plan on one shared channel: at 10 act1 has 2 ms left and grad0 starts; at
    # half rate each act1 ends at 14, grad0's last 2 ms run alone until 16. c: F1 14-15,
    # B1 15-16, grad1 16-20. a: B0 16-20, B1 20-24.
    t = simulate(make(DUPLEX, ["a", "c"], "shared_medium", 1, 2), DUPLEX_PLAN)
    on_wire = {(x.kind, x.micro_batch): (x.start_ms, x.end_ms) for x in t.transfers}
    assert on_wire == {("F", 0): (4, 8), ("F", 1): (8, 14), ("B", 0): (10, 16), ("B", 1): (16, 20)}
    assert t.makespan_ms == 24


# --- case 3: a shared medium where two links transfer at once ---------------------------------
# a -> b -> c, one device each: a 2 ms forward, 1 backward; b and c 1 ms each; 2000
# bytes (2 ms) cross each cut; B = 1, M = 2, 1F1B.
CHAIN = [(2.0, 1.0, 2000.0, 0.0), (1.0, 1.0, 2000.0, 0.0), (1.0, 1.0, 0.0, 0.0)]
CHAIN_PLAN = stages(1, 2, (0, 1, {"a": 1}), (1, 2, {"b": 1}), (2, 3, {"c": 1}))


def test_three_stages_on_point_to_point_links():
    # a: F0 0-2, F1 2-4 (acts land 4, 6). b: F0 4-5 (act 5-7), F1 6-7 (act 7-9).
    # c: F0 7-8, B0 8-9 (grad 9-11), F1 9-10, B1 10-11 (grad 11-13).
    # b: B0 11-12 (grad 12-14), B1 13-14 (grad 14-16). a: B0 14-15, B1 16-17.
    t = simulate(make(CHAIN, ["a", "b", "c"], "point_to_point", 1, 2), CHAIN_PLAN)
    assert t.devices["b"] == (F(0, 4, 5), F(1, 6, 7), B(0, 11, 12), B(1, 13, 14))
    assert t.devices["a"][2:] == (B(0, 14, 15), B(1, 16, 17))
    assert t.makespan_ms == 17


def test_shared_medium_splits_two_links_transferring_at_once():
    # act a->b m1 (4-) and act b->c m0 (5-) overlap: from 5 both run at half rate, a->b
    # ends at 7, b->c at 8. b: F1 7-8 (act 8-10). c: F0 8-9, B0 9-10 (grad 10-12), F1
    # 10-11, B1 11-12 (grad 12-). b: B0 12-13; its grad (13-) shares with c's grad m1:
    # c->b ends at 15, b->a at 16. b: B1 15-16 (grad 16-18). a: B0 16-17, B1 18-19.
    t = simulate(make(CHAIN, ["a", "b", "c"], "shared_medium", 1, 2), CHAIN_PLAN)
    on_wire = {(x.src, x.dst, x.micro_batch): (x.start_ms, x.end_ms) for x in t.transfers}
    assert on_wire[("a", "b", 1)] == (4, 7)
    assert on_wire[("b", "c", 0)] == (5, 8)
    assert on_wire[("c", "b", 1)] == (12, 15)
    assert on_wire[("b", "a", 0)] == (13, 16)
    assert t.devices["a"][2:] == (B(0, 16, 17), B(1, 18, 19))
    assert t.makespan_ms == 19


# --- case 4: an all-reduce overlapping a pipeline transfer ------------------------------------
# a (stage 0, 2 samples) -> c, d (stage 1, 1 sample each); every block 1 ms/sample forward
# and backward; 1000 bytes per sample cross the cut; stage 1 holds 2000 bytes of
# parameters, so its 2-device ring moves two chunks of 1000 bytes (1 ms) one after the
# other. B = 2, M = 1.
RING = [(1.0, 1.0, 1000.0, 0.0), (1.0, 1.0, 0.0, 2000.0)]
RING_PLAN = stages(2, 1, (0, 1, {"a": 2}), (1, 2, {"c": 1, "d": 1}))


@pytest.mark.parametrize(
    ("topology", "a_backward", "ring_ends", "makespan"),
    [
        # a: F0 0-2; pieces on their own channels 2-3; c, d: F0 3-4, B0 4-5, then the
        # gradients and ring step 0 together at 5-6 on separate channels, ring step 1 6-7;
        # a: B0 6-8.
        ("point_to_point", (6, 8), 7, 8),
        # the forward pieces share a's uplink: 2-4; c, d: F0 4-5, B0 5-6; a's downlink
        # takes both gradient pieces, c's and d's uplinks a gradient piece and a ring
        # chunk each: all four at half rate, 6-8; ring step 1 8-9; a: B0 8-10.
        ("switched", (8, 10), 9, 10),
        # one channel: forward pieces 2-4, c, d compute 4-6; two gradients and two ring
        # chunks share
        # it at a quarter rate each, 6-10; ring step 1 (two chunks) 10-12; a: B0 10-12.
        ("shared_medium", (10, 12), 12, 12),
    ],
)
def test_all_reduce_contends_with_pipeline_transfers(topology, a_backward, ring_ends, makespan):
    t = simulate(make(RING, ["a", "c", "d"], topology, 2, 1), RING_PLAN)
    assert t.devices["a"][1] == B(0, *a_backward)
    assert t.devices["c"][-1].kind == "AR" and t.devices["c"][-1].end_ms == ring_ends
    assert t.makespan_ms == makespan


def test_latency_delays_delivery_but_not_the_channel():
    # DUPLEX with 1 ms latency: act0 is on the wire 4-8 and lands at 9; act1 leaves at 8
    # right behind it (the channel is free) and lands at 13.
    t = simulate(make(DUPLEX, ["a", "c"], "point_to_point", 1, 2, latency_ms=1.0), DUPLEX_PLAN)
    acts = [(x.start_ms, x.end_ms, x.delivered_ms) for x in t.transfers if x.kind == "F"]
    assert acts == [(4, 8, 9), (8, 12, 13)]
    assert t.devices["c"][0] == F(0, 9, 10)


def test_gpipe_runs_all_forwards_first():
    problem = make(DUPLEX, ["a", "c"], "point_to_point", 1, 2, schedule="gpipe")
    t = simulate(problem, DUPLEX_PLAN)
    assert [iv.kind for iv in t.devices["c"]] == ["F", "F", "B", "B"]
    # c: F0 8-9, F1 12-13, B0 13-14, B1 14-15; grad1 waits behind grad0 on the pair's
    # connection: 14-18, 18-22; a: B0 18-22, B1 22-26
    grad1 = next(x for x in t.transfers if x.kind == "B" and x.micro_batch == 1)
    assert (grad1.posted_ms, grad1.start_ms, grad1.end_ms) == (15, 18, 22)
    assert t.makespan_ms == 26


def test_a_deadlocking_schedule_is_reported():
    problem = make(DUPLEX, ["a", "c"], "point_to_point", 1, 2)
    good = build("1f1b", [2, 1], 2)
    # stage 0 waits for micro-batch 0's gradient before sending its activation
    first = list(good[0])
    recv = next(a for a in first if str(a) == "0RECV_B0")
    first.remove(recv)
    first.insert(1, recv)
    with pytest.raises(ValueError, match=r"a \(stage 0\) waits at 0RECV_B0"):
        simulate(problem, DUPLEX_PLAN, (tuple(first), good[1]))


def test_the_simulator_imports_nothing_from_the_cost_model():
    source = REPO / "planner" / "check" / "simulator.py"
    imported = set()  # every name imported, as module.name for ``from module import name``
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported |= {f"{node.module}.{alias.name}" for alias in node.names}
    # it may import the schedule (edgepipe.planner.schedule), never the cost model or a solver
    banned = ("edgepipe.planner.cost.", "edgepipe.planner.solvers.")
    assert "edgepipe.planner.schedule.build" in imported
    assert not [name for name in imported if f"{name}.".startswith(banned)]


def test_gantt_and_text(tmp_path: Path) -> None:
    t = simulate(make(DUPLEX, ["a", "c"], "switched", 1, 2), DUPLEX_PLAN)
    labels = [label for label, _ in rows(t)]
    assert labels[:2] == ["stage 0 · a", "stage 1 · c"]
    assert "a up" in labels and "c up" in labels
    path = tmp_path / "gantt.png"
    draw_gantt(t, path, title="two stages")
    assert path.stat().st_size > 0
    text = timeline_text(t)
    assert text.splitlines()[0] == "makespan 22.000 ms (2 stages, 2 devices, M = 2, switched)"
