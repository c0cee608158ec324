"""The cost model (planner.cost) against values worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest
from edgepipe.planner.cost.chain import closed_form_latency, schedule_makespan
from edgepipe.planner.cost.channels import channel_loads, fair_shares
from edgepipe.planner.cost.formulas import ring_allreduce_ms
from edgepipe.planner.cost.makespan import round_makespan
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.cost.steps import Step, StepChain
from edgepipe.planner.cost.transfers import BoundaryCost, Piece, RingCost, reslice_pieces
from edgepipe.planner.inputs.cluster import Cluster, Device, Network
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import make_problem
from edgepipe.planner.inputs.profile import Block, ModelProfile, Timing, batch_curve
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.schedule import build

from tests.helpers.synthetic import device_type


def hand_problem(shared: bool = False, optimizer: str = "momentum"):
    """Two blocks timed at batch 1 and 4 on type "t"; 8 Mbit/s = 1000 bytes/ms, 1 ms."""
    t = device_type("t", 1e7, 100.0)
    model = ModelProfile(
        "hand",
        {"kind": "analytic"},
        100.0,
        (Block("b0", 1e6, 500.0, 1000.0), Block("b1", 2e6, 100.0, 3000.0)),
        {"t": Timing((1, 4), ((1.0, 4.0), (2.0, 5.0)), ((2.0, 8.0), (4.0, 10.0)))},
    )
    cluster = Cluster(
        "pair", (Device("A", "t"), Device("B", "t")), Network(8.0, 1.0, shared), {"t": t}
    )
    return make_problem(model, cluster, TrainingConfig(4, (2,), optimizer=optimizer), catalog={})


def test_batch_curve_interpolates_and_extrapolates():
    curve = batch_curve((1, 4), np.array([[1.0, 4.0]]), 8)[0]
    # 0 at batch 0; measured points; linear between; last slope (1 ms/sample) beyond
    assert curve.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]


def test_batch_curve_with_one_point_is_proportional():
    assert batch_curve((4,), np.array([[8.0]]), 5)[0].tolist() == [0, 2, 4, 6, 8, 10]


def test_batch_curve_is_not_proportional_when_measured_otherwise():
    # 3 ms at batch 1, 4 ms at batch 2: below batch 1 it scales to 0, above it follows
    curve = batch_curve((1, 2), np.array([[3.0, 4.0]]), 3)[0]
    assert curve.tolist() == [0.0, 3.0, 4.0, 5.0]


def test_two_stage_plan_figures_by_hand():
    problem = hand_problem()
    part = Partition(
        2, 2, (StageAssignment(0, 1, ("A",), (2,)), StageAssignment(1, 2, ("B",), (2,)))
    )
    cost = CostModel(problem).evaluate(part)
    s0, s1 = cost.stages
    # block 0 at 2 samples: fwd 1 + 3/3 = 2, bwd 2 + 6/3 = 4; block 1: fwd 3, bwd 6
    assert (s0.forward_ms, s0.backward_ms, s1.forward_ms, s1.backward_ms) == (2, 4, 3, 6)
    # link: 1 ms + 2 samples x 500 B / 1000 B/ms
    assert s0.link_out_ms == 2.0
    # warm-ups 2(P-p)-1 clamped to M = 2
    assert (s0.warmup, s1.warmup) == (2, 1)
    # memory: (2 + 1 momentum buffer) x params + K x y x saved, plus the ring replica of
    # the other single-device stage: (1 + 1 momentum buffer) x its params
    assert s0.memory_bytes == (3e6 + 2 * 2 * 1000 + 2 * 2e6,)
    assert s1.memory_bytes == (6e6 + 1 * 2 * 3000 + 2 * 1e6,)
    assert (s0.replica_bytes, s1.replica_bytes) == ((4e6,), (2e6,))
    # steps c = (6, 4, 9): D = max(2*6, 6 + 2*4, 10 + 2*9) = 28; no all-reduce
    assert cost.closed_form_ms == 28.0
    # exact 1F1B (worked in the docstring of test_schedule_by_hand): also 28; the link is
    # full duplex here, but in this plan activations and gradients never meet
    assert cost.iteration_ms == 28.0 and cost.chain_ms == 28.0
    assert cost.bottleneck == "stage 1"
    assert cost.samples_per_s == pytest.approx(4 / 28e-3)


def test_schedule_by_hand():
    """S0 (F2, B4), link (2, 2), S1 (F3, B6), M = 2, warm-ups (2, 2, 1).

    S1: F0 4-7, B0 7-13, F1 13-16, B1 16-22. link: B0 13-15, B1 22-24.
    S0: B0 15-19, B1 24-28. The round ends at 28.
    """
    chain = StepChain(
        (
            Step("stage", 0, 2.0, 4.0, 0.0, 2),
            Step("link", 0, 2.0, 2.0, 0.0, 2),
            Step("stage", 1, 3.0, 6.0, 0.0, 1),
        ),
        2,
    )
    assert schedule_makespan(chain) == 28.0


def test_data_parallel_stage_all_reduce_by_hand():
    problem = hand_problem()
    part = Partition(2, 2, (StageAssignment(0, 2, ("A", "B"), (1, 1)),))
    cost = CostModel(problem).evaluate(part)
    # ring over 2 devices: 2(g-1)/g x 3e6 B / 1000 B/ms + 2(g-1) x 1 ms = 3002 ms
    assert cost.stages[0].allreduce_ms == pytest.approx(3002.0)
    # one step: M x (F + B) at 1 sample = 2 x (1+2 + 2+4) = 18, then the all-reduce
    assert cost.iteration_ms == pytest.approx(18.0 + 3002.0)


def test_shared_medium_all_reduce_serialises_the_ring():
    # 2(g-1) x W / bw: 2 x 3e6 / 1000 = 6000 ms plus 2 ms latency
    assert ring_allreduce_ms(3e6, 2, 1000.0, 1.0, True) == pytest.approx(6002.0)
    assert ring_allreduce_ms(3e6, 1, 1000.0, 1.0, True) == 0.0


def test_adam_keeps_two_state_buffers():
    problem = hand_problem(optimizer="adam")
    assert CostModel(problem).static_bytes(0, 1) == 4e6


def test_reslicing_cuts_a_micro_batch_by_sample_intervals():
    # senders [0,1) [1,3), receiver [0,3): two pieces of 1 and 2 samples
    assert reslice_pieces((1, 2), (3,)) == [(0, 0, 1), (1, 0, 2)]
    # [0,2) [2,4) -> [0,1) [1,4): 1 to the first, 1 + 2 to the second
    assert reslice_pieces((2, 2), (1, 3)) == [(0, 0, 1), (0, 1, 1), (1, 1, 2)]
    assert reslice_pieces((0, 2), (2,)) == [(1, 0, 2)]  # a device without samples sends nothing


def test_channel_loads_by_topology():
    pieces = [("a", "c", 1.0), ("b", "c", 2.0)]
    assert channel_loads(pieces, "point_to_point") == (("a->c", 1.0), ("b->c", 2.0))
    assert dict(channel_loads(pieces, "switched")) == {"a up": 1.0, "c down": 3.0, "b up": 2.0}
    assert channel_loads(pieces, "shared_medium") == (("medium", 3.0),)


def test_fair_shares_by_hand():
    # no channel held twice (point-to-point pairs): everyone at its pair rate
    assert fair_shares([("a->b",), ("b->a",)]) == [1.0, 1.0]
    # one medium, four transfers: a quarter each
    assert fair_shares([("medium",)] * 4) == [0.25] * 4
    # a switch: a sends to b and c, d sends to c. a's uplink and c's downlink each carry
    # two transfers: all three are held to 1/2, so b's and d's own ports stay half idle
    held = [("a up", "b down"), ("a up", "c down"), ("d up", "c down")]
    assert fair_shares(held) == [0.5, 0.5, 0.5]
    # a sends to b, c and d; e sends to d: a's uplink gives a third to each of its three;
    # e's transfer takes the rest of d's downlink, 2/3
    held = [("a up", "b down"), ("a up", "c down"), ("a up", "d down"), ("e up", "d down")]
    assert fair_shares(held) == pytest.approx([1 / 3, 1 / 3, 1 / 3, 2 / 3])


def test_a_middle_stage_shares_its_ports_on_a_switch():
    """a -> b -> c, one device each, F = B = 1 ms, every piece 4 ms of channel time, no
    latency, M = 3, warm-ups (3, 2, 1).

    Point-to-point (every direction its own channel):
      a: F0-F2 0-3, acts to b 1-5, 5-9, 9-13 (one connection: in order).
      b: F0 5-6 (act 6-10), F1 9-10 (10-14).
      c: F0 10-11, B0 11-12 (grad 12-16), F1 14-15, B1 15-16 (grad 16-20).
      b: B0 16-17 (grad 17-21), F2 17-18 (act 18-22), B1 20-21 (grad 21-25).
      c: F2 22-23, B2 23-24 (grad 24-28).  b: B2 28-29 (grad 29-33).
      a: B0 21-22, B1 25-26, B2 33-34 -> 34.
    Switched (b's downlink carries a's activations and c's gradients, b's uplink its
    activations to c and its gradients to a; transfers on one port share it fairly):
      a's act2 (9-, b down) meets c's grad0 (12-, b down) at 12: both at 1/2, act2 ends
      14, grad0 has 3 ms left, ends 17.  b's act1 to c runs 10-14.
      c: F1 14-15, B1 15-16; grad1 (queued behind grad0 on c -> b) 17-21.
      b: B0 17-18 (grad0 to a on b up from 18), F2 18-19 (act2 to c on b up from 19):
      from 19 both at 1/2; grad0 (3 ms left) ends 25, act2 has 1 ms left at 25.
      b: B1 21-22, its grad1 to a waits behind grad0 until 25, then shares b up with
      act2: act2 ends 27, grad1 (3 ms left) 30.
      c: F2 27-28, B2 28-29 (grad2 29-33).  b: B2 33-34 (grad2 34-38).
      a: B0 25-26, B1 30-31, B2 38-39 -> 39.
    """
    schedule = build("1f1b", [3, 2, 1], 3)
    devices = [[("a", 1.0, 1.0)], [("b", 1.0, 1.0)], [("c", 1.0, 1.0)]]

    def links(topology):
        return [
            BoundaryCost((Piece("a", "b", 4.0, 0.0),), (Piece("b", "a", 4.0, 0.0),), topology),
            BoundaryCost((Piece("b", "c", 4.0, 0.0),), (Piece("c", "b", 4.0, 0.0),), topology),
        ]

    rings = [RingCost()] * 3
    p2p = round_makespan(schedule, devices, links("point_to_point"), rings, "point_to_point")
    assert p2p == 34.0
    assert round_makespan(schedule, devices, links("switched"), rings, "switched") == 39.0


def test_an_all_reduce_shares_the_channels_with_gradients():
    """Stage 0 = a, stage 1 = c + d (one sample each), F = B = 1 ms on every device,
    M = 1, no latency. Activation pieces a -> c, a -> d and gradient pieces back take
    1 ms each; the ring's chunks c -> d, d -> c 1.5 ms each, two ring steps.

    Shared medium: acts share it 1-3. c, d: F 3-4, B 4-5. At 5 the two gradients and the
    two step-0 chunks share it at 1/4: gradients end 9, chunks have 0.5 ms left, at 1/2
    end 10; step 1 (two chunks at 1/2) 10-13. a: B 9-10. The round ends at 13.
    Switched: acts share a's uplink 1-3; c, d: F 3-4, B 4-5. At 5 c's uplink carries c's
    gradient and its chunk, d's uplink likewise, a's downlink both gradients: all four
    at 1/2; gradients end 7, chunks (0.5 ms left, now alone) 7.5; step 1 7.5-9. -> 9.
    Point-to-point: acts 1-2, F 2-3, B 3-4, gradients 4-5, ring 4-5.5-7. -> 7.
    """
    devices = [[("a", 1.0, 1.0)], [("c", 1.0, 1.0), ("d", 1.0, 1.0)]]
    schedule = build("1f1b", [1, 1], 1)
    rings = [RingCost(), RingCost((Piece("c", "d", 1.5, 0.0), Piece("d", "c", 1.5, 0.0)))]
    for topology, expected in (("shared_medium", 13.0), ("switched", 9.0), ("point_to_point", 7.0)):
        link = BoundaryCost(
            (Piece("a", "c", 1.0, 0.0), Piece("a", "d", 1.0, 0.0)),
            (Piece("c", "a", 1.0, 0.0), Piece("d", "a", 1.0, 0.0)),
            topology,  # type: ignore[arg-type]
        )
        assert round_makespan(schedule, devices, [link], rings, topology) == expected  # type: ignore[arg-type]


def test_a_fast_device_sends_its_piece_before_its_slow_peer():
    """Stage 0 = a (F 1, B 2) + b (F 2, B 4), stage 1 = c (F 3, B 6), switched, M = 1; the
    pieces a <-> c take 1 ms, b <-> c 2 ms.

    a's piece crosses c's downlink alone 1-2, b's 2-4; c: F 4-7, B 7-13. The gradients
    share c's uplink: c -> a ends 15, c -> b (1 ms left) 16. a: B 15-17, b: B 16-20.
    Had the stage waited for its slowest device, both pieces would have left at 2,
    shared c's downlink and arrived at 4 and 5, and the round would end at 21.
    """
    devices = [[("a", 1.0, 2.0), ("b", 2.0, 4.0)], [("c", 3.0, 6.0)]]
    link = BoundaryCost(
        (Piece("a", "c", 1.0, 0.0), Piece("b", "c", 2.0, 0.0)),
        (Piece("c", "a", 1.0, 0.0), Piece("c", "b", 2.0, 0.0)),
        "switched",
    )
    rings = [RingCost(), RingCost()]
    assert round_makespan(build("1f1b", [1, 1], 1), devices, [link], rings, "switched") == 20.0


def test_latency_delays_delivery_without_holding_the_channel():
    # a -> b, GPipe, M = 2, F = B = 1, pieces 2 ms + 5 ms latency: act0 on the pair 1-3,
    # delivered 8; act1 (posted 2) follows on the connection 3-5, delivered 10.
    # b: F0 8-9, F1 10-11, B0 11-12, B1 12-13; grad0 12-14 (delivered 19), grad1 (posted
    # 13) 14-16 (delivered 21). a: B0 19-20, B1 21-22.
    devices = [[("a", 1.0, 1.0)], [("b", 1.0, 1.0)]]
    link = BoundaryCost(
        (Piece("a", "b", 2.0, 5.0),), (Piece("b", "a", 2.0, 5.0),), "point_to_point"
    )
    rings = [RingCost(), RingCost()]
    schedule = build("gpipe", [2, 2], 2)
    assert round_makespan(schedule, devices, [link], rings, "point_to_point") == 22.0


def test_closed_form_by_hand_with_a_hidden_all_reduce():
    # c = (2, 2, 0.5), M = 2: D = max(4, 2 + 4, 4 + 1) = 6; PB = (0, 1, 2):
    # X = max(0 - 0, 3 - 2) = 1 -> 7 (the exact round is 6.5: the closed form
    # starts stage 1's all-reduce after D - PB_2 = 4, the schedule after 3.5)
    chain = StepChain(
        (
            Step("stage", 0, 1.0, 1.0, 0.0, 2),
            Step("link", 0, 1.0, 1.0, 0.0, 2),
            Step("stage", 1, 0.25, 0.25, 3.0, 1),
        ),
        2,
    )
    assert closed_form_latency(chain) == (7.0, 1)
    assert schedule_makespan(chain) == 6.5
