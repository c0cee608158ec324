"""A one-device plan nothing can displace (planner/solvers/dp/one_device.py, issue 29 item
5): the bound on every plan of two or more devices is a lower bound on their exact
figures, and where :func:`nothing_displaces` holds, no plan of the problem changes the tie
rule's pick, so ``solve`` may skip the coarse views. Checked against every plan of small
random problems (:func:`tests.helpers.oracles.all_partitions`, scored by the cost model)."""

from __future__ import annotations

import pytest
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.inputs.cluster import Cluster, Device
from edgepipe.planner.inputs.problem import Problem, make_problem
from edgepipe.planner.solvers.dp.driver import multilevel_above, plan_dp
from edgepipe.planner.solvers.dp.multilevel import plan_multilevel
from edgepipe.planner.solvers.dp.one_device import (
    multi_device_at_least,
    nothing_displaces,
    settled_alone,
)
from edgepipe.planner.solvers.dp.sizes import choose
from edgepipe.planner.solvers.time_limit import Deadline

from tests.helpers.oracles import all_partitions
from tests.helpers.synthetic import random_problem


def one_slowed(seed: int, bandwidth_mbps: float) -> Problem:
    """4 random blocks on 3 devices (fast, slow, fast at 1.5x its type's times: no two
    alike) on a shared medium of ``bandwidth_mbps``, global batch 4, sizes 1, 2 and 4."""
    base = random_problem(4, 3, seed=seed, global_batch=4, candidates=(1, 2, 4),
                          bandwidth_mbps=bandwidth_mbps)  # fmt: skip
    cl = base.cluster
    devices = (*cl.devices[:-1], Device(cl.devices[-1].id, cl.devices[-1].type, slowdown=1.5))
    cluster = Cluster(cl.name, devices, cl.network, cl.device_types)
    return make_problem(base.model, cluster, base.config, catalog=cl.device_types)


def slow_chain() -> Problem:
    """120 random blocks on the 3 devices of :func:`one_slowed` at 0.1 Mbit/s: a chain
    coarse to fine planning takes, on which one device is the pick."""
    cluster = one_slowed(0, 0.1).cluster
    chain = random_problem(120, 3, seed=7, global_batch=4, candidates=(1, 2, 4),
                           bandwidth_mbps=0.1)  # fmt: skip
    return make_problem(chain.model, cluster, chain.config, catalog=cluster.device_types)


# a slow medium (3 Mbit/s: the DP's plan is one device, several devices are 2-18x
# slower), one where some plan of two devices is within 4-8% of it (10 Mbit/s), and one
# where a plan of two devices is 4% faster (15 Mbit/s)
CASES = [(0, 3.0), (0, 10.0), (2, 10.0), (0, 15.0)]


@pytest.mark.parametrize(("seed", "bandwidth_mbps"), CASES)
def test_no_plan_changes_the_pick_where_nothing_displaces_it(seed, bandwidth_mbps):
    problem = one_slowed(seed, bandwidth_mbps)
    cm = CostModel(problem)
    result = plan_dp(problem)
    found = [*result.scored, (result.cost, result.partition, 0.0)]
    every = []
    for batch in problem.config.micro_batch_sizes():
        several = []
        for plan in all_partitions(problem, batch):
            cost = cm.evaluate(plan)
            if cost.memory_ok:
                every.append((cost, plan, 0.0))
            if len(plan.used_devices()) > 1:
                several += [cost.iteration_ms, cost.steady_ms]
        # a lower bound: no plan of several devices below it
        assert not multi_device_at_least(cm, batch, min(several) * (1 + 1e-6))
    # the DP's plans, and the fastest one-device plan alone
    alone = min((f for f in every if len(f[1].used_devices()) == 1), key=lambda f: f[0].steady_ms)
    for known in (found, [alone]):
        if nothing_displaces(cm, known):
            assert choose([*known, *every])[1] == choose(known)[1]
            assert choose([*every, *known])[1] == choose(known)[1]


def test_nothing_displaces_the_one_device_plan_on_a_slow_medium():
    # not vacuous: on these the views are skipped, and the pick is a one-device plan
    held = [nothing_displaces(CostModel(p), [*r.scored, (r.cost, r.partition, 0.0)])
            for p in (one_slowed(s, b) for s, b in CASES) for r in [plan_dp(p)]]  # fmt: skip
    assert held == [True, False, True, False]


def test_a_long_chain_settled_by_the_bound_gets_the_plan_its_coarse_to_fine_dp_finds():
    # 120 blocks on the 3 devices of one_slowed, 0.1 Mbit/s: plan_dp answers without a
    # search (graph "none") and with the plan the coarse to fine DP finds
    problem = slow_chain()
    assert problem.model.num_blocks > multilevel_above(problem)
    settled = plan_dp(problem)
    searched = plan_multilevel(problem)
    assert settled.graph == "none" and searched is not None and searched.graph != "none"
    assert settled.partition == searched.partition
    assert len(settled.partition.used_devices()) == 1


def test_a_passed_deadline_settles_nothing():
    # the bound runs before the time-limited DP (plan_dp): a passed limit stops it (the
    # DP then returns its first plan, timed out); with time left it settles this chain
    problem = slow_chain()
    assert settled_alone(problem, Deadline(60.0)) is not None
    assert settled_alone(problem, Deadline(1e-9)) is None
    with pytest.raises(TimeoutError):
        multi_device_at_least(CostModel(problem), 1, 1e9, Deadline(1e-9))
