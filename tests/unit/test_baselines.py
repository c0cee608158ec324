"""Baseline planners (planner.solvers.baselines) on hand-checkable instances."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from edgepipe.planner import api
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.errors import InfeasibleError, InputError
from edgepipe.planner.solvers.baselines import (
    BASELINES,
    balanced_split,
    even_split,
    pipedream_partition,
    plan_baseline,
)
from edgepipe.planner.solvers.exact.solver import plan_milp

from tests.helpers.oracles import best_contiguous_split
from tests.helpers.synthetic import random_problem


def ranges(partition):
    return [(s.first, s.end) for s in partition.stages]


def test_even_split_of_six_blocks_on_three_devices_is_two_each():
    assert even_split(6, 3) == [0, 2, 4, 6]
    assert even_split(7, 3) == [0, 3, 5, 7]  # the remainder goes to the first stages


@pytest.mark.parametrize("seed", range(20))
def test_balanced_split_is_the_min_max_partition(seed):
    rng = np.random.default_rng(seed)
    weights = rng.integers(1, 20, size=int(rng.integers(3, 9))).astype(float)
    parts = int(rng.integers(1, len(weights) + 1))
    prefix = np.concatenate([[0.0], np.cumsum(weights)])

    def cost(_p, i, j):
        return float(prefix[j] - prefix[i])

    bounds = balanced_split(cost, len(weights), parts)
    assert bounds[0] == 0 and bounds[-1] == len(weights) and len(bounds) == parts + 1
    got = max(cost(p, bounds[p], bounds[p + 1]) for p in range(parts))
    assert got == best_contiguous_split(cost, len(weights), parts)


def test_gpipe_one_device_per_stage_even_blocks():
    problem = random_problem(6, 3, seed=0, global_batch=8, candidates=(2, 4))
    partition, cost = plan_baseline(problem, "gpipe")
    assert ranges(partition) == [(0, 2), (2, 4), (4, 6)]
    assert [s.devices for s in partition.stages] == [("d0",), ("d1",), ("d2",)]
    assert all(s.samples == (partition.micro_batch_size,) for s in partition.stages)
    assert cost.memory_ok


def test_gpipe_picks_the_micro_batch_size_by_the_cost_model():
    problem = random_problem(6, 3, seed=0, global_batch=8, candidates=(2, 4))
    cm = CostModel(problem, 4)
    _, cost = plan_baseline(problem, "gpipe")
    for batch in (2, 4):
        other = BASELINES["gpipe"](problem, cm, batch)
        assert cost.iteration_ms <= cm.evaluate(other).iteration_ms


def test_deepspeed_balances_parameter_bytes():
    problem = random_problem(5, 2, seed=3, global_batch=4, candidates=(2,))
    params = [b.param_bytes for b in problem.model.blocks]
    partition, _ = plan_baseline(problem, "deepspeed")
    (a, cut), (_, end) = ranges(partition)
    assert (a, end) == (0, 5)
    best = min(max(sum(params[:c]), sum(params[c:])) for c in range(1, 5))
    assert max(sum(params[:cut]), sum(params[cut:])) == best


def test_torchgpipe_balances_time_on_the_first_device():
    problem = random_problem(5, 2, seed=4, global_batch=4, candidates=(2,))
    cm = CostModel(problem, 2)
    partition, _ = plan_baseline(problem, "torchgpipe")
    [(_, cut), _] = ranges(partition)

    def stage_time(i, j):
        f, b = cm.device_times(i, j, 0, 2)  # device d0's type, for both stages
        return f + b

    best = min(max(stage_time(0, c), stage_time(c, 5)) for c in range(1, 5))
    assert max(stage_time(0, cut), stage_time(cut, 5)) == pytest.approx(best)


def test_data_parallel_puts_every_device_in_one_stage_split_by_speed():
    problem = random_problem(4, 2, seed=0, global_batch=16, candidates=(16,))
    partition, _ = plan_baseline(problem, "data-parallel")
    [stage] = partition.stages
    assert (stage.first, stage.end) == (0, 4)
    samples = dict(zip(stage.devices, stage.samples, strict=True))
    assert set(samples) == {"d0", "d1"} and sum(samples.values()) == 16
    # d0 ("fast", 200 GFLOP/s peak) gets more than d1 ("slow", 60), about 10/3 as many
    assert samples["d0"] > samples["d1"] >= 1
    assert samples["d0"] / samples["d1"] == pytest.approx(200 / 60, rel=0.35)


def test_data_parallel_is_infeasible_when_the_model_fits_no_device():
    problem = random_problem(6, 2, seed=0, memory=(3e6, 3e6))
    with pytest.raises(InfeasibleError) as info:
        plan_baseline(problem, "data-parallel")
    assert info.value.constraint == "memory"
    assert "data-parallel" in str(info.value) and "short by" in str(info.value)


def test_data_parallel_needs_a_sample_for_every_device():
    problem = random_problem(4, 6, seed=0, global_batch=4, candidates=(1, 2, 4))
    with pytest.raises(InfeasibleError) as info:
        plan_baseline(problem, "data-parallel")
    assert info.value.constraint == "micro_batch" and ">= 6" in str(info.value)


# -- PipeDream's recurrence (optimizer_graph_hierarchical.py), worked by hand ------------
# stage(i, j, r) = (T + 4 (r-1) W / (r bw)) / r; a split also pays 2 a / (r bw) per transfer
def test_pipedream_divides_a_replicated_stage_s_all_reduce_by_its_replicas():
    # one stage on 2 machines: (42 + 4 * 1 * 10 / (2 * 1)) / 2 = 31; the split pays
    # max(10, 32, 2 * 0.5 / 1) = 32. (T/r + all-reduce, 21 + 20 = 41, would split.)
    got = pipedream_partition([10, 32], [0, 10], [0, 0], [0.5, 0], 2, 1.0)
    assert got == (31.0, [(0, 2, 2)])


def test_pipedream_replicates_the_heavy_stage_of_three_blocks_on_three_machines():
    # single stage: (24 + 4*2*6/3)/3 = 40/3; [0,1) x1 + [1,3) x2: max(6, (18 + 4*3/2)/2) = 12;
    # [0,2) on 2 (best 6: [0,1),[1,2) split) + [2,3) x1: max(6, 12) = 12, found later: a tie
    got = pipedream_partition([6, 6, 12], [3, 3, 0], [0, 0, 0], [0, 0, 0], 3, 1.0)
    assert got == (12.0, [(0, 1, 1), (1, 3, 2)])


def test_pipedream_pipelines_when_the_transfer_is_cheaper_than_the_all_reduce():
    # single: (22 + 4*10/2)/2 = 21; split: max(10, 12, 2*2/1) = 12
    assert pipedream_partition([10, 12], [5, 5], [0, 0], [2, 0], 2, 1.0) == (
        12.0,
        [(0, 1, 1), (1, 2, 1)],
    )
    # a 15-byte boundary costs 2*15/1 = 30 > 21: one replicated stage
    assert pipedream_partition([10, 12], [5, 5], [0, 0], [15, 0], 2, 1.0) == (21.0, [(0, 2, 2)])


def test_pipedream_memory_constraint_counts_stashed_versions():
    # stash of [0,1) on 1 of 3 machines: ceil((3-1)/1) * (1 + 3) = 8 > 7, so both splits
    # through A(1, 1) and A(2, 2) are out; left: one stage, 40/3, or [0,1)x2 + [1,3)x1 = 18
    got = pipedream_partition([6, 6, 12], [3, 3, 0], [1, 1, 1], [0, 0, 0], 3, 1.0, 7.0)
    assert got is not None
    assert got[0] == pytest.approx(40 / 3) and got[1] == [(0, 3, 3)]
    assert pipedream_partition([6, 6, 12], [3, 3, 0], [1, 1, 1], [0, 0, 0], 3, 1.0, 8.0)[0] == 12


def test_pipedream_caps_replicas_and_uses_every_machine():
    # with at most one replica per stage, 2 blocks cannot use 3 machines
    assert pipedream_partition([1, 1], [0, 0], [0, 0], [0, 0], 3, 1.0, max_replicas=1) is None
    value, stages = pipedream_partition([4, 4, 4, 4], [0] * 4, [0] * 4, [0] * 4, 4, 1.0)
    assert value == 4.0 and sum(r for _, _, r in stages) == 4


def test_pipedream_replicates_everything_on_a_fast_network_of_identical_devices():
    problem = random_problem(4, 2, seed=1, global_batch=8, candidates=(4,), bandwidth_mbps=1e9)
    problem = _identical(problem)
    partition, _ = plan_baseline(problem, "pipedream")
    [stage] = partition.stages
    assert stage.devices == ("d0", "d1") and stage.samples == (2, 2)


def test_hetpipe_virtual_workers_mix_device_speeds():
    problem = random_problem(6, 4, seed=2, global_batch=8, candidates=(4,))
    partition, _ = plan_baseline(problem, "hetpipe")
    sizes = {len(s.devices) for s in partition.stages}
    assert len(sizes) == 1  # k virtual workers: every stage has k devices
    speed = {d.id: d.type for d in problem.cluster.devices}
    for stage in partition.stages:
        assert len({speed[d] for d in stage.devices}) == 1  # one speed rank per stage
        assert max(stage.samples) - min(stage.samples) <= 1


@pytest.mark.parametrize("seed", range(3))
def test_exact_solver_beats_or_ties_every_baseline(seed):
    problem = random_problem(
        7, 4, seed=seed, global_batch=8, candidates=(2, 4, 8), bandwidth_mbps=[1e3, 1e4, 1e2][seed]
    )
    exact = plan_milp(problem, time_limit=60).cost.iteration_ms
    for name in BASELINES:
        try:
            _, cost = plan_baseline(problem, name)
        except InfeasibleError:
            continue
        assert cost.memory_ok
        assert exact <= cost.iteration_ms * (1 + 1e-9), name


def test_unknown_baseline_is_an_input_error():
    with pytest.raises(InputError, match="unknown baseline"):
        plan_baseline(random_problem(3, 2), "alpa")


def _identical(problem):
    """The same problem with every device of the first device's type."""
    first = problem.cluster.devices[0].type
    devices = tuple(replace(d, type=first) for d in problem.cluster.devices)
    cluster = replace(problem.cluster, devices=devices)
    timings = {first: problem.timings[first]}
    return replace(problem, cluster=cluster, timings=timings)


#: 8 blocks on 4 devices over 100 Mbit/s: unconstrained, the DP and the exact solver
#: use 3 stages and the other pipeline planners 4 (data-parallel always uses one)
SLOW_NETWORK = random_problem(
    8, 4, seed=1, global_batch=8, candidates=(2, 4, 8), bandwidth_mbps=1e2
)


@pytest.mark.parametrize("name", [n for n in api.planners() if n != "data-parallel"])
def test_every_planner_keeps_to_max_stages(name):
    free = api.solve(SLOW_NETWORK, name, time_limit=30).partition.num_stages
    assert free > 2  # the limit binds
    limited = replace(SLOW_NETWORK, config=replace(SLOW_NETWORK.config, max_stages=2))
    assert api.solve(limited, name, time_limit=30).partition.num_stages <= 2
