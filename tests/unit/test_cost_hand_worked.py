"""Cost-model figures worked out by hand on a three-block model: per-device slowdown,
link and all-reduce terms on a non-uniform network, derived timings, memory under each
warm-up rule, and the exact shortfalls of the infeasibility diagnosis.

Model (bytes; ms on type "t" at batch 1 and 2, backward = 2 x forward):

    block  params W  out/sample  saved/sample  forward ms (b=1, 2)
    b0     1000      10          100           1, 2
    b1     2000      20          200           2, 4
    b2     3000      30          300           3, 6
"""

from __future__ import annotations

import pytest
from edgepipe.planner import api
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.errors import InfeasibleError
from edgepipe.planner.inputs.cluster import Cluster, Device, Link, Network
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import make_problem
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.solvers.diagnosis import diagnose_infeasible

from tests.helpers.hand_model import MODEL, T, U


def cluster(*devices: Device, network: Network | None = None) -> Cluster:
    # 8 Mbit/s = 1000 bytes/ms, 1 ms latency, unless given
    return Cluster("hand", devices, network or Network(8.0, 1.0), {"t": T, "u": U})


def problem(cl: Cluster, config: TrainingConfig):
    return make_problem(MODEL, cl, config, catalog={"t": T, "u": U})


def stage(first: int, end: int, devices: tuple[str, ...], samples: tuple[int, ...]):
    return StageAssignment(first, end, devices, samples)


def test_a_slowed_device_multiplies_its_block_times():
    cl = cluster(Device("A", "t"), Device("B", "t", slowdown=2.5))
    prob = problem(cl, TrainingConfig(4, (2,)))
    part = Partition(2, 2, (stage(0, 1, ("A",), (2,)), stage(1, 3, ("B",), (2,))))
    first, second = CostModel(prob, 2).evaluate(part).stages
    assert (first.forward_ms, first.backward_ms) == (2.0, 4.0)
    # blocks b1 + b2 at batch 2: (4 + 6) x 2.5 forward, (8 + 12) x 2.5 backward
    assert (second.forward_ms, second.backward_ms) == (25.0, 50.0)


@pytest.mark.parametrize(("shared", "allreduce"), [(False, 38.0), (True, 68.0)])
def test_link_and_all_reduce_on_a_non_uniform_network(shared, allreduce):
    # A-B: 0.8 Mbit/s = 100 bytes/ms, 4 ms; B-C: 2 ms latency, default bandwidth
    net = Network(8.0, 1.0, shared, (Link("A", "B", 0.8, 4.0), Link("B", "C", None, 2.0)))
    cl = cluster(Device("A", "t"), Device("B", "t"), Device("C", "t"), network=net)
    prob = problem(cl, TrainingConfig(4, (2,)))
    part = Partition(2, 2, (stage(0, 2, ("A", "B"), (1, 1)), stage(2, 3, ("C",), (2,))))
    first, _ = CostModel(prob, 2).evaluate(part).stages
    # ring over A, B (g = 2) of W = 3000 bytes at the slowest pair, 100 bytes/ms, 4 ms:
    # switched 2(g-1)/g x 3000/100 + 2(g-1) x 4 = 30 + 8; shared 2(g-1) x 30 + 8 = 68
    assert first.allreduce_ms == pytest.approx(allreduce)
    # link to C: slowest pair 1000 bytes/ms, largest latency 2 ms (B-C), 2 x 20 bytes
    assert first.link_out_ms == pytest.approx(2.0 + 40 / 1000)


def test_a_type_without_times_gets_the_reference_times_scaled_by_effective_speed():
    prob = problem(cluster(Device("A", "u")), TrainingConfig(2, (2,)))
    derived = prob.timings["u"]
    # factor = effective GFLOP/s of t / of u = 50 / 200 = 0.25
    assert derived.forward_ms == ((0.25, 0.5), (0.5, 1.0), (0.75, 1.5))
    assert derived.backward_ms == ((0.5, 1.0), (1.0, 2.0), (1.5, 3.0))
    assert derived.source == "derived"
    assert prob.assumptions[0] == "times for u derived from t x 0.25 (effective GFLOP/s 50 / 200)"


@pytest.mark.parametrize(
    ("schedule", "warmup", "global_batch", "depths"),
    [
        ("1f1b", "asteroid", 8, (5, 3, 1)),  # 2(P - p) - 1
        ("1f1b", "classic", 8, (3, 2, 1)),  # P - p
        ("gpipe", "asteroid", 8, (8, 8, 8)),  # every micro-batch in flight
        ("1f1b", "asteroid", 2, (2, 2, 1)),  # clamped to M = 2
    ],
)
def test_memory_under_each_warm_up_rule(schedule, warmup, global_batch, depths):
    cl = cluster(Device("A", "t"), Device("B", "t"), Device("C", "t"))
    config = TrainingConfig(global_batch, (1,), schedule=schedule, warmup=warmup)
    part = Partition(1, global_batch, tuple(stage(b, b + 1, (d,), (1,)) for b, d in
                                            enumerate("ABC")))  # fmt: skip
    stages = CostModel(problem(cl, config), 1).evaluate(part).stages
    assert tuple(s.warmup for s in stages) == depths
    # momentum: (2 + 1) W + K x 1 sample x saved, plus the ring replica each device holds
    # (planner.replan.replicas): A holds C's stage, B holds A's, C holds B's, (1 + 1) W each
    state = (3 * 1000, 3 * 2000, 3 * 3000)
    saved = (100, 200, 300)
    ring = (2 * 3000, 2 * 1000, 2 * 2000)
    expected = [w + k * a + r for w, a, k, r in zip(state, saved, depths, ring, strict=True)]
    assert [s.memory_bytes[0] for s in stages] == expected


def memory_refusal(a_bytes: float, b_bytes: float) -> InfeasibleError:
    """What solving the model on devices A and B of ``a_bytes`` and ``b_bytes`` raises,
    checked to be a refusal for memory."""
    cl = cluster(Device("A", "t", memory_bytes=a_bytes), Device("B", "t", memory_bytes=b_bytes))
    with pytest.raises(InfeasibleError) as info:
        api.solve(problem(cl, TrainingConfig(2, (1,))))
    assert info.value.constraint == "memory"
    return info.value


def test_a_block_larger_than_every_device_is_short_by_the_exact_bytes():
    error = memory_refusal(2500.0, 2000.0)
    # block b0 alone: 3 x 1000 = 3000 bytes of state; the largest device has 2500
    assert error.shortfall == 500.0
    assert "block 0 (b0) alone needs" in str(error)


def test_a_search_that_fails_where_memory_fits_is_not_blamed_on_memory():
    # the diagnosis of a solver that gave up although a plan fits (it is called only
    # after a failure; here on a problem that has a plan): one device A of 20000 bytes;
    # the one-stage plan at micro-batch 1 needs the model's 3 x 6000 bytes of momentum
    # state + one micro-batch's saved activations, 100 + 200 + 300 = 600: 18600 bytes,
    # 1400 to spare. It used to say "device A is short by -1.37 KiB"
    cl = cluster(Device("A", "t", memory_bytes=20000.0))
    error = diagnose_infeasible(problem(cl, TrainingConfig(2, (1,))))
    assert (error.constraint, error.shortfall) == ("search", None)
    assert str(error).startswith(
        "no plan was found, though memory does not rule one out: with micro-batch 1 a "
        "1-stage plan fits every device's usable memory (the fullest, A, has 1.37 KiB to "
        "spare)")
    assert "short by" not in str(error)


def test_a_model_larger_than_all_devices_together_is_short_by_the_exact_bytes():
    error = memory_refusal(9100.0, 8800.0)
    # every block fits one device (9000 <= 9100), the model's 3 x 6000 = 18000 bytes of
    # state do not fit 9100 + 8800 = 17900
    assert error.shortfall == 100.0
    assert "all devices together" in str(error)
