"""Baseline planners (planner.baselines) on hand-checkable instances."""

from __future__ import annotations

import numpy as np
import pytest

from planner.baselines import BASELINES, balanced_split, even_split, plan_baseline
from planner.cost import CostModel
from planner.errors import InfeasibleError, InputError
from planner.milp import plan_milp
from planner.synthetic import random_problem
from tests.oracles import best_contiguous_split


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
    from dataclasses import replace

    first = problem.cluster.devices[0].type
    devices = tuple(replace(d, type=first) for d in problem.cluster.devices)
    cluster = replace(problem.cluster, devices=devices)
    timings = {first: problem.timings[first]}
    return replace(problem, cluster=cluster, timings=timings)
