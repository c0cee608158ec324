"""The cost model (planner.cost) against values worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from planner.cluster import Cluster, Device, Network
from planner.config import TrainingConfig
from planner.cost import (
    BoundaryCost,
    CostModel,
    batch_curve,
    channel_loads,
    closed_form_latency,
    reslice_pieces,
    ring_allreduce_ms,
    round_makespan,
    schedule_makespan,
)
from planner.partition import Partition, StageAssignment
from planner.problem import make_problem
from planner.profile import Block, ModelProfile, Timing
from planner.schedule import build
from planner.steps import Step, StepChain
from tests.synthetic import device_type


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


def test_a_middle_stage_shares_its_ports_on_a_switch():
    """a -> b -> c, one device each, F = B = 1 ms, every boundary 4 ms of channel time
    per direction, no latency, M = 3, warm-ups (3, 2, 1).

    Point-to-point (every direction its own channel):
      a: F0-F2 0-3, acts to b 1-5, 5-9, 9-13.  b: F0 5-6 (act 6-10), F1 9-10 (10-14).
      c: F0 10-11, B0 11-12 (grad 12-16), F1 14-15, B1 15-16 (grad 16-20).
      b: B0 16-17 (grad 17-21), F2 17-18 (act 18-22), B1 20-21 (grad 21-25).
      c: F2 22-23, B2 23-24 (grad 24-28).  b: B2 28-29 (grad 29-33).
      a: B0 21-22, B1 25-26, B2 33-34 -> 34.
    Switched (b's uplink carries its activations and gradients, its downlink a's
    activations and c's gradients; first come, first served):
      c's grad0 (ready 12) waits for b's downlink (a's act2 until 13): 13-17; grad1 17-21.
      b: B0 17-18 (grad0 on b's uplink 18-22), F2 18-19 (act2 ready 19, uplink 22-26),
      B1 21-22 (grad1 ready 22, behind act2: 26-30).  c: F2 26-27, B2 27-28 (grad 28-32).
      b: B2 32-33 (grad 33-37).  a: B0 22-23, B1 30-31, B2 37-38 -> 38.
    """
    schedule = build("1f1b", [3, 2, 1], 3)
    compute = [(1.0, 1.0)] * 3
    none = [(0.0, 0.0, ("a",)), (0.0, 0.0, ("b",)), (0.0, 0.0, ("c",))]
    p2p_links = [
        BoundaryCost((("a->b", 4.0),), (("b->a", 4.0),), 0.0),
        BoundaryCost((("b->c", 4.0),), (("c->b", 4.0),), 0.0),
    ]
    assert round_makespan(schedule, compute, p2p_links, none, "point_to_point") == 34.0
    switched_links = [
        BoundaryCost((("a up", 4.0), ("b down", 4.0)), (("b up", 4.0), ("a down", 4.0)), 0.0),
        BoundaryCost((("b up", 4.0), ("c down", 4.0)), (("c up", 4.0), ("b down", 4.0)), 0.0),
    ]
    assert round_makespan(schedule, compute, switched_links, none, "switched") == 38.0


def test_shared_medium_all_reduce_fills_the_gaps_the_pipeline_leaves():
    # One stage pair on a medium; stage 1 (2 devices) finishes its backward at 5 with a
    # 4 ms all-reduce (3 ms channel time + 1 ms latency) while its gradient (2 ms of
    # channel time) holds the medium 5-7: the ring's channel time runs 7-10, + 1 = 11.
    links = [BoundaryCost((("medium", 2.0),), (("medium", 2.0),), 0.0)]
    compute = [(1.0, 1.0), (1.0, 1.0)]
    ar = [(0.0, 0.0, ("a",)), (4.0, 1.0, ("c", "d"))]
    # a: F0 0-1, act 1-3; c: F0 3-4, B0 4-5; grad 5-7; a: B0 7-8; ring 7-10 (+1) = 11
    assert round_makespan(build("1f1b", [1, 1], 1), compute, links, ar, "shared_medium") == 11.0
    assert round_makespan(build("1f1b", [1, 1], 1), compute, links, ar, "point_to_point") == 9.0


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
