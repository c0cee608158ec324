"""Every public entry that takes a partition refuses one that does not fit its problem
(issue 27): the cost model's ``evaluate``, the simulator's ``simulate`` and ``make_plan``
raise :class:`PlanMismatchError` with the same one line, from the one check
(``planner.inputs.problem.check_partition``).

The problem: PipeDream's AlexNet (18 blocks) on the two Orins of ``orin-pair-2``, global
batch 8. Before the check, ``evaluate`` scored a partition without the model's first
block (an imported plan missing its head) as faster than the DP's plan of the whole
model, and a device given 0 samples or an empty stage as if they were work."""

from __future__ import annotations

import pytest
from edgepipe.planner import api
from edgepipe.planner.check.simulator import simulate
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.errors import PlanMismatchError
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.plan import SolverInfo, make_plan


@pytest.fixture(scope="module")
def problem():
    return api.load_problem("pipedream-alexnet", "orin-pair-2", global_batch=8)


def part(mb: int, m: int, *stages: tuple[int, int, tuple[str, ...], tuple[int, ...]]) -> Partition:
    return Partition(mb, m, tuple(StageAssignment(*s) for s in stages))


A, B = "orin-0", "orin-1"

#: (partition, the one line every entry raises), worked out from the rules of
#: check_partition: blocks [0, 18) tiled in order by non-empty stages, devices of the
#: cluster each in one stage once with >= 1 sample, samples summing to the micro-batch,
#: micro-batch size x count = 8
CASES = {
    "missing head": (
        part(8, 1, (1, 18, (A,), (8,))),
        "stage 0 covers blocks [1, 18) but should start at block 0 and be non-empty; "
        "stages must tile the model's 18 blocks in order",
    ),
    "gap between stages": (
        part(8, 1, (0, 5, (A,), (8,)), (6, 18, (B,), (8,))),
        "stage 1 covers blocks [6, 18) but should start at block 5 and be non-empty; "
        "stages must tile the model's 18 blocks in order",
    ),
    "empty stage": (
        part(8, 1, (0, 5, (A,), (8,)), (5, 5, (B,), (8,))),
        "stage 1 covers blocks [5, 5) but should start at block 5 and be non-empty; "
        "stages must tile the model's 18 blocks in order",
    ),
    "missing tail": (
        part(8, 1, (0, 17, (A,), (8,))),
        "the stages cover blocks [0, 17) but model 'pipedream-alexnet' has 18 blocks; the "
        "plan was made for another model, re-plan for this one",
    ),
    "no stages": (
        part(8, 1),
        "the stages cover blocks [0, 0) but model 'pipedream-alexnet' has 18 blocks; the "
        "plan was made for another model, re-plan for this one",
    ),
    "device with 0 samples": (
        part(8, 1, (0, 18, (A, B), (8, 0))),
        "stage 0 gives a device 0 samples; list only devices that take at least one "
        "(others stay idle)",
    ),
    "device with -1 samples": (
        part(8, 1, (0, 18, (A, B), (9, -1))),
        "stage 0 gives a device -1 samples; list only devices that take at least one "
        "(others stay idle)",
    ),
    "stage without devices": (
        part(8, 1, (0, 18, (), ())),
        "stage 0 needs at least one device and one sample count per device",
    ),
    "unknown device": (
        part(8, 1, (0, 18, ("nano-9",), (8,))),
        "stage 0 uses device 'nano-9', which is not in cluster 'orin-pair-2'; re-plan for "
        "this cluster",
    ),
    "device in two stages": (
        part(8, 1, (0, 9, (A,), (8,)), (9, 18, (A,), (8,))),
        "device 'orin-0' is listed twice (stage 1); a device serves one stage once",
    ),
    "samples short of the micro-batch": (
        part(8, 1, (0, 18, (A, B), (4, 3))),
        "stage 0's devices take 7 samples per micro-batch, but the micro-batch size is 8",
    ),
    "micro-batches short of the global batch": (
        part(4, 1, (0, 18, (A,), (4,))),
        "micro-batch size 4 x 1 micro-batches = 4, but the config's global batch is 8; "
        "re-plan for this config",
    ),
}

ENTRIES = {
    "CostModel.evaluate": lambda problem, p: CostModel(problem, 8).evaluate(p),
    "simulate": simulate,
    "make_plan": lambda problem, p: make_plan(problem, p, SolverInfo("hand")),
}


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("case", CASES)
def test_each_entry_refuses_each_malformed_partition_with_one_line(problem, entry, case):
    partition, message = CASES[case]
    with pytest.raises(PlanMismatchError) as caught:
        ENTRIES[entry](problem, partition)
    assert str(caught.value) == message


def test_a_partition_without_the_head_is_refused_not_scored_faster_than_the_optimum(problem):
    # the DP's plan of the whole model scores; dropping its first block was scored lower
    best = api.solve(problem).partition
    first = best.stages[0]
    headless = Partition(best.micro_batch_size, best.num_micro_batches,
                         (StageAssignment(1, first.end, first.devices, first.samples),
                          *best.stages[1:]))
    cm = CostModel(problem, best.micro_batch_size)
    assert cm.evaluate(best).iteration_ms > 0
    with pytest.raises(PlanMismatchError, match=r"^stage 0 covers blocks \[1, "):
        cm.evaluate(headless)


def test_evaluate_refuses_a_micro_batch_beyond_its_tables(problem):
    # a cost model's tables reach max_batch samples; beyond them numpy raised IndexError
    whole = part(8, 1, (0, 18, (A,), (8,)))
    with pytest.raises(PlanMismatchError) as caught:
        CostModel(problem, 4).evaluate(whole)
    assert str(caught.value) == (
        "micro-batch size 8 is above this cost model's max_batch 4; build it as "
        "CostModel(problem, 8)"
    )


def test_well_formed_partitions_pass_every_entry(problem):
    for p in (part(8, 1, (0, 18, (A, B), (5, 3))),
              part(1, 8, (0, 6, (A,), (1,)), (6, 18, (B,), (1,)))):
        cost = CostModel(problem, 8).evaluate(p)
        assert simulate(problem, p).makespan_ms > 0
        assert make_plan(problem, p, SolverInfo("hand")).cost == cost
