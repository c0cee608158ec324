"""The three-block model the hand-worked cost tests share (tests/unit/test_cost_hand_worked.py,
tests/unit/test_steady_state.py): block b_i has (i + 1) kB of parameters, (i + 1) x 10 B of
boundary activation and (i + 1) x 100 B saved per sample; on device type ``t`` its
forward takes (i + 1) ms at batch 1 and 2 (i + 1) ms at batch 2, backward twice that."""

from __future__ import annotations

from edgepipe.planner.inputs.cluster import DeviceType
from edgepipe.planner.inputs.profile import Block, ModelProfile, Timing

#: effective GFLOP/s: t 100 x 0.5 = 50, u 400 x 0.5 = 200
T = DeviceType("t", "test type", 1e9, 1.0, 100.0, 0.5, "test", 1e4, {})
U = DeviceType("u", "4x faster", 1e9, 1.0, 400.0, 0.5, "test", 1e4, {})
FORWARD = ((1.0, 2.0), (2.0, 4.0), (3.0, 6.0))
MODEL = ModelProfile(
    "hand3",
    {"kind": "analytic"},
    100.0,
    (Block("b0", 1000.0, 10.0, 100.0), Block("b1", 2000.0, 20.0, 200.0),
     Block("b2", 3000.0, 30.0, 300.0)),
    {"t": Timing((1, 2), FORWARD, tuple((2 * a, 2 * b) for a, b in FORWARD))},
)  # fmt: skip
