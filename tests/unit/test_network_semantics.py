"""The network semantics the lab measured (docs/decisions.md, "The shared medium is shared
by sender"; benchmarks/network_semantics.py): on the shared medium every device sending
gets an equal part of the air, split among its own transfers, in the cost model
(planner/cost/channels.py, fair_sharing.py) and, written apart, in the simulator
(planner/check/simulator.py); and the per-stage ``link ms`` / ``ar ms`` a plan prints are
the figures under the plan's own traffic.

The plan worked by hand (tests/helpers/hand_model.py's model, type ``t``; a shared medium
of 0.08 Mbit/s = 10 bytes/ms, latency 0): stage 0 = A (slowdown 2) on b0 with both
samples, stage 1 = B, C on b1 with one sample each, stage 2 = D on b2; micro-batches of
2 samples, M = 2.

    A's F at batch 2: 2 ms x 2 = 4 ms; B's and C's F at batch 1: 2 ms.
    boundary 0: pieces A -> B, A -> C of 1 sample x 10 B = 1 ms alone each;
    boundary 1: pieces B -> D, C -> D of 1 sample x 20 B = 2 ms alone each.
    t = 4: A posts F0's two pieces, alone on the air: 1/2 each, delivered at 6.
    t = 6-8: B and C run F0; A runs F1 from 4 to 8.
    t = 8: A posts F1's two pieces, B and C post F0's: three senders, 1/3 of the air
      each; A's pieces 1/6 each (6 ms for 1 ms of air), B's and C's 1/3 (6 ms for 2 ms):
      all four end at 14. One share per transfer instead (1/4 each) would end A's at 12
      and B's and C's at 14.
"""

from __future__ import annotations

import pytest
from edgepipe.planner.check.simulator import simulate
from edgepipe.planner.cost.channels import medium_shares
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.inputs.cluster import Cluster, Device, Network
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import make_problem
from edgepipe.planner.partition import Partition, StageAssignment

from tests.helpers.hand_model import MODEL, T


def medium_problem(topology: str = "shared_medium"):
    net = Network(0.08, 0.0, topology == "shared_medium", topology=topology)  # type: ignore[arg-type]
    devices = (Device("A", "t", slowdown=2.0), Device("B", "t"), Device("C", "t"),
               Device("D", "t"))
    cl = Cluster("medium", devices, net, {"t": T})
    part = Partition(2, 2, (StageAssignment(0, 1, ("A",), (2,)),
                            StageAssignment(1, 2, ("B", "C"), (1, 1)),
                            StageAssignment(2, 3, ("D",), (2,))))
    return make_problem(MODEL, cl, TrainingConfig(4, (2,)), catalog={"t": T}), part


def test_each_sender_gets_an_equal_part_of_the_medium():
    assert medium_shares(["a"]) == [1.0]
    assert medium_shares(["a", "a"]) == [0.5, 0.5]
    assert medium_shares(["a", "b", "c"]) == pytest.approx([1 / 3] * 3)
    # the lab's probe: d0 -> d1, d0 -> d2, d3 -> d1
    assert medium_shares(["d0", "d0", "d3"]) == [0.25, 0.25, 0.5]


def test_the_simulator_shares_the_medium_by_sender():
    problem, part = medium_problem()
    ends = {(t.kind, t.micro_batch, t.src, t.dst): t.end_ms
            for t in simulate(problem, part).transfers}
    assert ends[("F", 0, "A", "B")] == pytest.approx(6.0)
    assert ends[("F", 0, "A", "C")] == pytest.approx(6.0)
    for key in (("F", 1, "A", "B"), ("F", 1, "A", "C"), ("F", 0, "B", "D"),
                ("F", 0, "C", "D")):
        assert ends[key] == pytest.approx(14.0), key


def test_the_cost_model_agrees_with_the_simulator_on_the_medium():
    problem, part = medium_problem()
    cost = CostModel(problem, 2).evaluate(part)
    assert cost.iteration_ms == pytest.approx(simulate(problem, part).makespan_ms)


def spans_from_timeline(problem, part, read: int, iterations: int) -> list[tuple[float, float]]:
    """The per-stage link and all-reduce figures read off the simulator's timeline, by
    the definition of CostModel.stage_transfer_ms (an oracle that shares no code)."""
    tl = simulate(problem, part, iterations=iterations)
    m = part.num_micro_batches
    stage_of = {d: p for p, s in enumerate(part.stages) for d in s.devices}
    spans: dict[tuple[int, str, int], list[float]] = {}
    for t in tl.transfers:
        if t.kind == "AR" or t.micro_batch // m != read:
            continue
        q = stage_of[t.src] if t.kind == "F" else stage_of[t.dst]
        span = spans.setdefault((q, t.kind, t.micro_batch), [t.posted_ms, t.delivered_ms])
        span[0], span[1] = min(span[0], t.posted_ms), max(span[1], t.delivered_ms)
    out = []
    for p, stage in enumerate(part.stages):
        link = [b - a for (q, _, _), (a, b) in spans.items() if q == p]
        rings = [iv for d in stage.devices for iv in tl.devices[d] if iv.kind == "AR"]
        ring = 0.0
        if rings:  # the read-th ring of each member: from the last join to the last end
            mine = [[iv for iv in tl.devices[d] if iv.kind == "AR"][read]
                    for d in stage.devices]
            ring = max(iv.end_ms for iv in mine) - max(iv.start_ms for iv in mine)
        out.append((sum(link) / len(link) if link else 0.0, ring))
    return out


@pytest.mark.parametrize("topology", ["shared_medium", "switched", "point_to_point"])
def test_the_printed_columns_are_the_plan_s_own_contended_figures(topology):
    problem, part = medium_problem(topology)
    got = CostModel(problem, 2).stage_transfer_ms(part)
    want = spans_from_timeline(problem, part, read=3, iterations=5)
    assert [x for pair in got for x in pair] == pytest.approx([x for pair in want for x in pair])


def test_on_the_medium_the_contended_link_is_above_the_idle_one():
    problem, part = medium_problem()
    cost = CostModel(problem, 2).evaluate(part)
    (link0, _), (_, ar1), _ = CostModel(problem, 2).stage_transfer_ms(part)
    # boundary 0 alone: A's two 1 ms pieces one after the other on the air, 2 ms; in the
    # plan micro-batch 1's share the air with boundary 1's (6 ms above)
    assert cost.stages[0].link_out_ms == pytest.approx(2.0)
    assert link0 > cost.stages[0].link_out_ms
    # B and C's ring: g = 2, W = 2000 B, 2(g-1) x W / bw = 400 ms on the medium alone
    assert cost.stages[1].allreduce_ms == pytest.approx(400.0)
    assert ar1 >= 400.0 - 1e-9
