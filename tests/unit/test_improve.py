"""The local improvement pass (planner/solvers/improve.py): it finds the plan one cut
away, never returns a slower plan than it was given, and keeps its budgets."""

from __future__ import annotations

import json

import numpy as np
import pytest
from edgepipe.planner.cli.main import main
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.solvers.improve import (
    _Neighbourhood,
    improve,
    ladder,
    steady_estimate_ms,
)
from edgepipe.planner.solvers.solve import solve
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.dp_cases import hand_plan
from tests.helpers.oracles import all_partitions
from tests.helpers.synthetic import random_partition, random_problem

#: forward ms of the hand model's blocks (backward twice that): 2 | 2 | 1 | 1 | 1 | 1
TIMES = [2.0, 2.0, 1.0, 1.0, 1.0, 1.0]
#: parameter bytes per block large enough that one stage on both devices (data
#: parallel: an all-reduce of 6e8 bytes at 8 Gbit/s, 600 ms) loses to the pipeline
HEAVY = {"param_bytes": 1e8, "memory": {"a": 1e12, "b": 1e12, "c": 1e12}}


def two_stage(cut: int) -> tuple[StageAssignment, StageAssignment]:
    return (StageAssignment(0, cut, ("a",), (4,)), StageAssignment(cut, 6, ("b",), (4,)))


def steady_of_cut(problem, cut: int) -> float:
    cm = CostModel(problem)
    return cm.evaluate(Partition(4, 8, two_stage(cut))).steady_ms


def test_one_cut_off_is_moved_to_the_balanced_cut():
    """Two identical devices, one stage each: blocks 0-1 weigh 4 ms, blocks 2-5 weigh 4
    ms, so the balanced cut is 2 (by hand); the plan given cuts at 3 (5 | 3 ms) or 1
    (2 | 6 ms). The pass moves it to 2, the least steady step over every cut (brute
    force over the five cuts by the cost model)."""
    for given_cut in (1, 3, 5):
        plan = hand_plan(TIMES, [(0, given_cut, ("a",), (4,)), (given_cut, 6, ("b",), (4,))],
                         ["a", "b"], **HEAVY)
        by_cut = {c: steady_of_cut(plan.problem, c) for c in range(1, 6)}
        assert min(by_cut, key=by_cut.__getitem__) == 2
        result = improve(plan.problem, plan.partition)
        assert [s.first for s in result.partition.stages] == [0, 2]
        assert result.cost.steady_ms == pytest.approx(by_cut[2])
        assert result.start_ms == pytest.approx(by_cut[given_cut])
        assert result.moves >= 1 and result.status == "converged"


def test_an_optimal_plan_is_returned_unchanged():
    plan = hand_plan(TIMES, [(0, 2, ("a",), (4,)), (2, 6, ("b",), (4,))], ["a", "b"], **HEAVY)
    result = improve(plan.problem, plan.partition)
    assert result.partition == plan.partition and result.moves == 0


def test_a_device_and_a_cut_move_to_the_brute_force_best():
    """Three identical devices; the plan given puts two on block 0 and one on blocks 1-5
    (20 ms forward and backward a sample alone: the bottleneck). Two moves away lies the
    best plan of the pass's space (two stages, all three devices, micro-batch 4, the
    only candidate), found by enumerating every such plan (tests/helpers/oracles.py):
    the pair on blocks 0-3, one device on blocks 4-5, 292.000008 ms."""
    plan = hand_plan(TIMES, [(0, 1, ("a", "b"), (2, 2)), (1, 6, ("c",), (4,))],
                     ["a", "b", "c"])
    cm = CostModel(plan.problem)
    space = [p for p in all_partitions(plan.problem, 4)
             if p.num_stages == 2 and len(p.used_devices()) == 3]
    best = min(cm.evaluate(p).steady_ms for p in space)
    result = improve(plan.problem, plan.partition)
    assert result.cost.steady_ms == pytest.approx(best) == pytest.approx(292.000008)
    assert [(s.first, s.end, len(s.devices)) for s in result.partition.stages] == [
        (0, 4, 2), (4, 6, 1)]


def test_ladder_reaches_the_far_end_in_few_steps():
    assert ladder(3, 2) == [1, 2]
    assert ladder(3, 40) == [1, 2, 3, 4, 6, 9, 14, 22, 35, 40]
    assert ladder(3, 0) == []


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), blocks=st.integers(2, 8), devices=st.integers(1, 4))
def test_never_slower_than_the_plan_given(seed: int, blocks: int, devices: int):
    problem = random_problem(blocks, devices, seed=seed, global_batch=8, candidates=(1, 2, 4))
    part = random_partition(problem, np.random.default_rng(seed))
    before = CostModel(problem).evaluate(part)
    result = improve(problem, part, max_evaluations=60)
    assert result.cost.steady_ms <= before.steady_ms
    assert result.cost == CostModel(problem).evaluate(result.partition)
    if before.memory_ok:
        assert result.cost.memory_ok
    else:  # only feasible plans are improved
        assert result.partition == part
    assert sorted(result.partition.used_devices()) == sorted(part.used_devices())


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), blocks=st.integers(2, 8), devices=st.integers(1, 4))
def test_never_slower_than_any_start(seed: int, blocks: int, devices: int):
    """Restarts: the plan returned is no slower than the plan given nor any start that
    fits memory (each is a descent's first plan)."""
    problem = random_problem(blocks, devices, seed=seed, global_batch=8, candidates=(1, 2, 4))
    rng = np.random.default_rng(seed)
    part, other = random_partition(problem, rng), random_partition(problem, rng)
    cm = CostModel(problem)
    before, alt = cm.evaluate(part), cm.evaluate(other)
    result = improve(problem, part, starts=[other], max_evaluations=60)
    if before.memory_ok:
        feasible = [c.steady_ms for c in (before, alt) if c.memory_ok]
        assert result.cost.steady_ms <= min(feasible)
        assert result.cost.memory_ok


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), blocks=st.integers(2, 8), devices=st.integers(1, 4))
def test_the_estimate_is_the_steady_step_point_to_point(seed: int, blocks: int, devices: int):
    """Point to point no two transfers share a channel: the full-rate estimate that ranks
    candidates is the cost model's steady step itself; on a switch it is never above it
    on these plans."""
    for topology in ("point_to_point", "switch"):
        problem = random_problem(blocks, devices, seed=seed, global_batch=8,
                                 candidates=(1, 2, 4), topology=topology)
        part = random_partition(problem, np.random.default_rng(seed))
        cm = CostModel(problem)
        steady = cm.evaluate(part).steady_ms
        if topology == "point_to_point":
            assert steady_estimate_ms(cm, part) == pytest.approx(steady, rel=1e-9)
        else:
            assert steady_estimate_ms(cm, part) <= steady * (1 + 1e-9)


def test_same_plan_whatever_the_clock():
    """The budget is work: a generous safety stop and none give the same plan after the
    same evaluations (no wall clock in the search's decisions)."""
    problem = random_problem(12, 4, seed=3, global_batch=16, candidates=(2, 4, 8))
    part = random_partition(problem, np.random.default_rng(5))
    a = improve(problem, part, max_evaluations=40)
    b = improve(problem, part, max_evaluations=40, time_limit=1e6)
    assert (a.partition, a.evaluations, a.moves) == (b.partition, b.evaluations, b.moves)


def test_budgets_are_kept():
    problem = random_problem(12, 4, seed=3, global_batch=16, candidates=(2, 4, 8))
    part = random_partition(problem, np.random.default_rng(5))
    few = improve(problem, part, max_evaluations=3)
    assert few.evaluations <= 3
    none = improve(problem, part, max_evaluations=0)
    assert none.evaluations == 0 and none.partition == part
    assert none.status in ("evaluations", "converged")
    late = improve(problem, part, time_limit=1e-9)
    assert late.evaluations == 0 and late.status in ("time_limit", "converged")
    with pytest.raises(ValueError):
        improve(problem, part, radius=0)


def test_solve_improves_by_default_and_not_when_asked():
    problem = random_problem(10, 3, seed=7, global_batch=16, candidates=(2, 4, 8))
    plain = solve(problem, "dp", improve=False)
    polished = solve(problem, "dp")
    assert plain.solver.settings["improve"] is None
    record = polished.solver.settings["improve"]
    assert record["from_steady_ms"] == pytest.approx(plain.cost.steady_ms)
    assert polished.cost.steady_ms <= plain.cost.steady_ms


def test_cli_no_improve_returns_the_dps_plan(capsys):
    """``edgepipe plan --no-improve`` records no pass; without it the pass is recorded;
    ``--no-improve`` with a baseline is refused (it applies to dp only)."""
    args = ["plan", "--model", "pipedream-alexnet", "--cluster", "orin-pair-2", "--global-batch",
            "8", "-o", "-"]
    assert main([*args, "--no-improve"]) == 0
    assert json.loads(capsys.readouterr().out)["solver"]["settings"]["improve"] is None
    assert main(args) == 0
    record = json.loads(capsys.readouterr().out)["solver"]["settings"]["improve"]
    assert record["status"] in ("converged", "evaluations", "time_limit")
    assert main([*args, "--solver", "gpipe", "--no-improve"]) == 2
    assert "--no-improve" in capsys.readouterr().err


def test_dissolves_join_lone_devices_across_a_stage():
    """Plan (a) blocks 0-1 | (b, c) blocks 2-3 | (d) blocks 4-5 at micro-batch 2: a
    stage of two devices takes no third (2 samples), so the lone a and d are joined only
    by dissolving one end stage into its neighbour and moving its device to the other
    lone one; the inner stage's devices fit nowhere. By hand: exactly two regroupings
    (identical devices: no swaps), samples one each."""
    plan = hand_plan(TIMES, [(0, 2, ("a",), (2,)), (2, 4, ("b", "c"), (1, 1)),
                             (4, 6, ("d",), (2,))], ["a", "b", "c", "d"], batch=2)
    cm = CostModel(plan.problem)
    hood = _Neighbourhood(plan.problem, cm, 3)
    got = {tuple((s.first, s.end, s.devices, s.samples) for s in c.stages)
           for c in hood.regroupings(plan.partition)}
    assert got == {
        ((0, 4, ("b", "c"), (1, 1)), (4, 6, ("d", "a"), (1, 1))),
        ((0, 2, ("a", "d"), (1, 1)), (2, 6, ("b", "c"), (1, 1))),
    }


def test_a_re_split_never_leaves_a_device_idle():
    """A fast and a slow device (200 and 60 GFLOPS) at micro-batch 2: Algorithm 1 alone
    may give both samples to the fast one; the pass's re-split gives each one (a stage's
    every device works), and refuses 1 sample on 2 devices."""
    problem = random_problem(4, 2, seed=1, global_batch=8, candidates=(1, 2))
    part = Partition(2, 4, (StageAssignment(0, 4, ("d0", "d1"), (1, 1)),))
    hood = _Neighbourhood(problem, CostModel(problem), 3)
    assert hood.split(part, 0, 0, 4, ("d0", "d1"), 2, 4) == (1, 1)
    assert hood.split(part, 0, 0, 4, ("d0", "d1"), 1, 8) is None
