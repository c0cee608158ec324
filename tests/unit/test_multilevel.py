"""Coarse-to-fine planning of long chains (planner/solvers/dp/multilevel.py): merging blocks prices
every plan on the merged cuts exactly as the full chain does, and the DP on a chain of
more than MULTILEVEL_ABOVE blocks plans on merged blocks, then near the coarse cuts."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from edgepipe.planner import api
from edgepipe.planner.cost.closed_form import pipeline_closed_form_ms
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.cluster import Cluster
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import make_problem
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.plan import check_partition
from edgepipe.planner.solvers.dp import driver as dp_driver
from edgepipe.planner.solvers.dp import multilevel
from edgepipe.planner.solvers.dp.driver import MULTILEVEL_ABOVE, SMALL_MULTILEVEL_ABOVE, plan_dp
from edgepipe.planner.solvers.dp.multilevel import coarse_cuts, contract, expand, merge_blocks
from edgepipe.planner.solvers.dp.sizes import TIE_TOLERANCE

from tests.helpers.synthetic import nasnet_profile, random_problem


def one_device_stages(problem, cuts, batch):
    """The plan cutting at ``cuts`` (0 < .. < L), one device per stage in cluster order."""
    bounds = [0, *cuts, problem.model.num_blocks]
    devices = [d.id for d in problem.cluster.devices]
    stages = tuple(
        StageAssignment(a, b, (devices[i],), (batch,))
        for i, (a, b) in enumerate(itertools.pairwise(bounds))
    )
    return Partition(batch, problem.config.global_batch // batch, stages)


def with_falling_block(problem):
    """``problem`` with block 3's times falling from batch 4 to 8 on every type, so that
    its batch curve beyond 8 is flat (the cost model clips the slope at 0) while the
    summed measurements of a merged block that holds it would still rise."""

    def fall(timing):
        def edit(rows):
            rows = [list(r) for r in rows]
            rows[3][-1] = rows[3][-2] * 0.5
            return tuple(tuple(r) for r in rows)

        return dataclasses.replace(timing, forward_ms=edit(timing.forward_ms),
                                   backward_ms=edit(timing.backward_ms))  # fmt: skip

    timings = {k: fall(t) for k, t in problem.model.timings.items()}
    model = dataclasses.replace(problem.model, timings=timings)
    timings = {k: fall(t) for k, t in problem.timings.items()}
    return dataclasses.replace(problem, model=model, timings=timings)


@pytest.mark.parametrize("seed", range(4))
def test_a_merged_chain_prices_every_plan_on_its_cuts_as_the_full_chain(seed):
    # global batch 32, micro-batch 16: beyond the measured sizes (1, 2, 4, 8), where
    # block 3's curve is flat but its merged neighbours' summed measurements still rise
    problem = with_falling_block(
        random_problem(24, 4, seed=seed, global_batch=32, candidates=(4, 16))
    )
    rng = np.random.default_rng(seed)
    cuts = sorted({0, 24, *rng.choice(np.arange(1, 24), size=9, replace=False).tolist()})
    merged = merge_blocks(problem, cuts)
    assert merged.model.num_blocks == len(cuts) - 1
    full_cm, merged_cm = CostModel(problem, 16), CostModel(merged, 16)
    for batch in (4, 16):
        for _ in range(5):
            inner = sorted(rng.choice(np.arange(1, len(cuts) - 1), size=3, replace=False))
            plan = one_device_stages(merged, [int(i) for i in inner], batch)
            on_blocks = expand(plan, cuts)
            assert [s.first for s in on_blocks.stages] == [0] + [cuts[i] for i in inner]
            full, short = full_cm.evaluate(on_blocks), merged_cm.evaluate(plan)
            assert short.iteration_ms == pytest.approx(full.iteration_ms, rel=1e-12)
            assert short.memory_ok == full.memory_ok
            assert pipeline_closed_form_ms(merged_cm, plan) == pytest.approx(
                pipeline_closed_form_ms(full_cm, on_blocks), rel=1e-12
            )


def test_the_coarse_grid_keeps_the_cheapest_boundary_of_every_window():
    problem = random_problem(10, 2, seed=0)
    # position c cuts after block c - 1: bytes by position 1..9
    by_position = [5, 3, 4, 9, 9, 1, 2, 8, 2]
    blocks = tuple(
        dataclasses.replace(b, output_bytes_per_sample=float(by_position[i]) if i < 9 else 7.0)
        for i, b in enumerate(problem.model.blocks)
    )
    problem = dataclasses.replace(
        problem, model=dataclasses.replace(problem.model, blocks=blocks)
    )
    # windows {1, 2, 3}, {4, 5, 6}, {7, 8, 9} at width 3; {1..4}, {5..8}, {9} at width 4
    assert coarse_cuts(problem, 3) == [0, 2, 6, 7, 10]
    assert coarse_cuts(problem, 4) == [0, 2, 6, 9, 10]
    assert coarse_cuts(problem, 1) == list(range(11))


def test_a_branchy_graphs_cheap_boundaries_stay_cuttable():
    # the NASNet-like graph (252 blocks) on the six-device testbed: its cheap crossings
    # lie off every third position, and the plan on every block cuts at three of them
    # (86, 142, 230; moving any by 1-3 blocks costs 27-31% of the iteration)
    cluster = Cluster.load(api.resolve("jetson-testbed-6", "clusters"))
    problem = make_problem(nasnet_profile(), cluster, TrainingConfig(32))
    grid = coarse_cuts(problem, 3)
    assert {86, 142, 230} <= set(grid)
    # measured: 3,464.9 ms coarse to fine and on every block (a grid of every third
    # position gave 3,526.9, cut at 48, 147 and 230); 3,453.5 for the same cuts before
    # the medium was shared by sender (6293103)
    assert plan_dp(problem).cost.iteration_ms == pytest.approx(3464.9, abs=0.1)


def test_contract_inverts_expand():
    problem = random_problem(12, 3, seed=5)
    cuts = [0, 2, 5, 6, 9, 12]
    plan = one_device_stages(merge_blocks(problem, cuts), [1, 3], 2)
    assert contract(expand(plan, cuts), cuts) == plan
    assert [(s.first, s.end) for s in expand(plan, cuts).stages] == [(0, 2), (2, 6), (6, 12)]


def long_chain(seed=0, blocks=MULTILEVEL_ABOVE + 40):
    return random_problem(blocks, 6, seed=seed, global_batch=16, candidates=(2, 4, 8))


def test_a_long_chain_is_planned_coarse_to_fine_and_the_fine_run_improves_the_coarse():
    problem = long_chain()
    coarse_to_fine = plan_dp(problem)
    check_partition(problem, coarse_to_fine.partition)
    # figures scored by the full chain's cost model, not a merged one's
    assert coarse_to_fine.cost == CostModel(problem, 8).evaluate(coarse_to_fine.partition)
    assert coarse_to_fine.status == "complete"
    # the coarse run alone: one cut kept per 3 positions (ceil(240 / 100)); the fine run
    # starts from its plan, so it is never slower, and here it moved a cut off the grid
    grid = coarse_cuts(problem, 3)
    coarse = plan_dp(merge_blocks(problem, grid), multilevel=False)
    assert coarse_to_fine.cost.iteration_ms <= coarse.cost.iteration_ms * (1 + TIE_TOLERANCE)
    assert coarse_to_fine.cost.iteration_ms < coarse.cost.iteration_ms
    assert {s.first for s in coarse_to_fine.partition.stages} - set(grid)


def test_a_long_chain_stays_near_the_dp_on_every_block():
    # a heuristic against a heuristic: measured on this instance 9,434.6 ms against
    # 9,281.0 (+1.65%, the worst seen; benchmarks/multilevel_quality.py has the spread)
    problem = long_chain()
    every_block = plan_dp(problem, multilevel=False)
    assert plan_dp(problem).cost.iteration_ms <= every_block.cost.iteration_ms * 1.02


def refuse_coarse_to_fine(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("planned coarse to fine")

    monkeypatch.setattr(dp_driver, "plan_multilevel", refuse)


def test_a_chain_up_to_the_threshold_is_planned_on_every_block(monkeypatch):
    # long_chain's 6 devices: a small cluster's threshold (test_small_problems has both)
    refuse_coarse_to_fine(monkeypatch)
    assert not plan_dp(long_chain(blocks=SMALL_MULTILEVEL_ABOVE)).coarse_to_fine
    with pytest.raises(AssertionError, match="coarse to fine"):
        plan_dp(long_chain(blocks=SMALL_MULTILEVEL_ABOVE + 1))


def test_every_block_when_asked(monkeypatch):
    refuse_coarse_to_fine(monkeypatch)
    assert not plan_dp(long_chain(), multilevel=False).coarse_to_fine


def test_the_coarse_to_fine_plan_is_never_slower_than_its_warm_start():
    problem = long_chain()
    warm = plan_dp(problem, multilevel=False).partition
    cm = CostModel(problem, 8)
    warm_ms = cm.evaluate(warm).iteration_ms
    # without it the coarse-to-fine plan is 1.65% slower on this instance
    assert plan_dp(problem).cost.iteration_ms > warm_ms * (1 + TIE_TOLERANCE)
    result = plan_dp(problem, incumbent=warm)
    assert result.cost.iteration_ms <= warm_ms * (1 + TIE_TOLERANCE)
    # what comes back carries its figures: its DP value is its closed form, and its
    # micro-batch size's candidate figure is at most its own
    assert result.dp_value_ms == pytest.approx(pipeline_closed_form_ms(cm, result.partition))
    batch = result.partition.micro_batch_size
    assert result.candidates[batch] <= result.cost.iteration_ms


def test_a_warm_start_returned_at_once_keeps_its_figures():
    # out of time after the coarse run's first level: the warm start is the best plan
    problem = long_chain()
    warm = plan_dp(problem, multilevel=False).partition
    cm = CostModel(problem, 8)
    result = plan_dp(problem, incumbent=warm, time_limit=1e-3)
    assert result.status == "timed_out"
    assert result.partition == warm
    assert result.dp_value_ms == pytest.approx(pipeline_closed_form_ms(cm, warm))
    assert result.candidates[warm.micro_batch_size] == cm.evaluate(warm).iteration_ms


def test_a_fit_off_the_coarse_grid_falls_back_to_every_block():
    # 201 blocks of equal parameters and no activations on two devices that each hold at
    # most 101 of them: the only cuts that fit are 100 and 101; the boundaries at
    # positions 3, 6, .., 198 are the cheapest of their windows of 3, so the coarse cuts
    # are 3, 6, .., 198, 199 (the last window {199, 200} is even) and the coarse chain
    # has no plan
    problem = random_problem(201, 2, seed=1, global_batch=8, candidates=(4,),
                             memory=(4e9, 4e9))  # fmt: skip
    budget = CostModel(problem).budget[0]
    state = 2 + problem.config.optimizer_state_factor
    blocks = tuple(
        dataclasses.replace(b, param_bytes=budget / (state * 101.5), saved_bytes_per_sample=0.0,
                            output_bytes_per_sample=1e4 if (i + 1) % 3 == 0 else 2e4)
        for i, b in enumerate(problem.model.blocks)
    )  # fmt: skip
    model = dataclasses.replace(problem.model, blocks=blocks)
    config = dataclasses.replace(problem.config, replication_interval=0)  # no ring replicas
    problem = dataclasses.replace(problem, model=model, config=config)
    seen: list[tuple[int, int]] = []
    result = plan_dp(problem, progress=lambda done, total: seen.append((done, total)))
    assert [s.first for s in result.partition.stages][1] in (100, 101)
    assert result.partition == plan_dp(problem, multilevel=False).partition
    assert not result.coarse_to_fine
    assert api.solve(problem, "dp").solver.settings["coarse_to_fine"] is False
    # the run on every block reports on from the coarse half
    fractions = [d / t for d, t in seen]
    assert fractions == sorted(fractions)
    assert fractions[-1] > 0.5


def test_a_time_limit_returns_the_coarse_plan_timed_out(monkeypatch):
    runs: list[int] = []  # blocks of each chain the DP searched
    search = multilevel.best_plan

    def spy(problem, *args, **kwargs):
        runs.append(problem.model.num_blocks)
        return search(problem, *args, **kwargs)

    monkeypatch.setattr(multilevel, "best_plan", spy)
    problem = long_chain()
    result = plan_dp(problem, time_limit=1e-3)
    assert result.status == "timed_out"
    check_partition(problem, result.partition)
    # the coarse chain only (81 blocks: 80 windows of 3 positions, the last of 2): the
    # fine run is not begun
    assert runs == [len(coarse_cuts(problem, 3)) - 1] == [81]


def test_by_class_false_plans_coarse_to_fine_too():
    problem = long_chain(blocks=MULTILEVEL_ABOVE + 10)
    result = plan_dp(problem, by_class=False)
    assert result.coarse_to_fine
    check_partition(problem, result.partition)


def test_progress_runs_through_the_coarse_half_then_the_fine_half():
    seen: list[tuple[int, int]] = []
    plan_dp(long_chain(), progress=lambda done, total: seen.append((done, total)))
    # the coarse run reports up to half, the fine run beyond (a run that skips micro-batch
    # sizes by their bounds ends short of its total, as the DP on every block does)
    fractions = [d / t for d, t in seen]
    assert fractions == sorted(fractions)
    assert fractions[0] <= 0.5 < fractions[-1] <= 1.0


def test_the_plan_records_whether_it_was_planned_coarse_to_fine():
    problem = long_chain()
    assert api.solve(problem, "dp").solver.settings["coarse_to_fine"] is True
    assert plan_dp(problem).coarse_to_fine
    # without the improvement pass (on by default in solve, planner/solvers/improve.py)
    every_block = api.solve(problem, "dp", multilevel=False, improve=False)
    assert every_block.solver.settings["coarse_to_fine"] is False
    assert every_block.partition == plan_dp(problem, multilevel=False).partition
    short = random_problem(40, 4, seed=3)
    assert api.solve(short, "dp").solver.settings["coarse_to_fine"] is False


def test_a_long_chain_refuses_a_warm_start_of_another_micro_batch_size():
    problem = long_chain()
    warm = plan_dp(problem).partition
    odd = dataclasses.replace(warm, micro_batch_size=16, num_micro_batches=1,
                              stages=tuple(dataclasses.replace(s, samples=tuple(
                                  16 * y // warm.micro_batch_size for y in s.samples))
                                  for s in warm.stages))  # fmt: skip
    with pytest.raises(InputError, match="micro-batch size is not one of"):
        plan_dp(problem, incumbent=odd)
