"""The exact planner (planner.solvers.exact.solver) against brute force, the DP and its own
backends."""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from edgepipe.planner import api
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.errors import InfeasibleError, InputError
from edgepipe.planner.inputs.cluster import Cluster, Device, Link, Network
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import make_problem
from edgepipe.planner.inputs.profile import Block, ModelProfile, Timing
from edgepipe.planner.inputs.schema import validate
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.plan import plan_to_dict
from edgepipe.planner.solvers.baselines import BASELINES, plan_baseline
from edgepipe.planner.solvers.classes import device_classes
from edgepipe.planner.solvers.dp.driver import plan_dp
from edgepipe.planner.solvers.exact.backends import solve_cpsat
from edgepipe.planner.solvers.exact.bounds import program_bounds, quick_bound
from edgepipe.planner.solvers.exact.formulation import Builder
from edgepipe.planner.solvers.exact.solutions import pin, solution_hint
from edgepipe.planner.solvers.exact.solver import BACKENDS, plan_milp
from edgepipe.planner.solvers.exact.tables import Tables, stage_orders

from tests.helpers.oracles import all_partitions, brute_force_best
from tests.helpers.synthetic import device_type, knob_mix_problem, random_problem


def tiny(seed: int):
    """Tiny random instances over the knobs the formulation handles separately: shared
    or switched network, a slow per-pair link, asteroid/classic warm-up, 1F1B/GPipe and
    memory budgets that bind."""
    rng = np.random.default_rng(seed)
    devices = int(rng.integers(2, 5))
    links = ()
    if seed % 3 == 0 and devices >= 3:
        links = (Link("d0", "d1", bandwidth_mbps=50.0, latency_ms=3.0),)
    return knob_mix_problem(rng, int(rng.integers(2, 6)), devices, seed, links)


@pytest.mark.parametrize("seed", range(12))
def test_exact_optimum_equals_brute_force_on_tiny_instances(seed):
    problem = tiny(seed)
    oracle, _ = brute_force_best(problem)
    result = plan_milp(problem, time_limit=60)
    assert result.status == "optimal"
    assert result.cost.memory_ok
    assert result.cost.iteration_ms == pytest.approx(oracle, rel=1e-6)


@pytest.mark.parametrize("seed", range(2))
def test_backends_agree_on_the_optimum(seed):
    # switched: the rows' relaxation is tight there, so CBC and HiGHS also close fast
    problem = random_problem(6, 4, seed=seed, global_batch=8, candidates=(2, 4),
                             bandwidth_mbps=[1e3, 1e4][seed % 2], shared=False)  # fmt: skip
    values = {b: plan_milp(problem, backend=b, time_limit=60) for b in BACKENDS}
    assert {r.status for r in values.values()} == {"optimal"}
    ms = [r.cost.iteration_ms for r in values.values()]
    assert max(ms) == pytest.approx(min(ms), rel=1e-4)


NON_UNIFORM = (
    Link("d0", "d1", bandwidth_mbps=40.0, latency_ms=3.0),
    Link("d1", "d2", bandwidth_mbps=400.0, latency_ms=0.2),
    Link("d0", "d3", latency_ms=6.0),
)


def program_value(problem, partition) -> float:
    """The exact solver's program for the partition's (B, P) with every decision
    variable pinned to the partition: the least T its rows allow for that one plan."""
    cm = CostModel(problem)
    tables = Tables(problem, cm, device_classes(problem))
    reference = cm.evaluate(partition).iteration_ms
    form = Builder(tables, partition.micro_batch_size, partition.num_stages).build(
        2 * reference, 4 * reference
    )
    pin(form, solution_hint(form, tables, partition))
    outcome = solve_cpsat(form.model, {}, 30, 1e8 / reference)
    assert outcome.status == "optimal"
    return outcome.values[form.model.objective]


def non_uniform(topology: str):
    # per-pair bandwidths (40 and 400 Mbit/s beside the 100 Mbit/s default) and mixed
    # latencies (0.2, 1, 3 and 6 ms); memory never binds
    return random_problem(5, 4, seed=1, global_batch=8, candidates=(2, 4, 8),
                          links=NON_UNIFORM, topology=topology, memory=(8e9, 8e9))  # fmt: skip


EXACT_CASES = [
    # point-to-point: three single-device stages over the 40 Mbit/s / 3 ms and the 6 ms
    # pairs; a data-parallel pair over the 400 Mbit/s / 0.2 ms link (its ring)
    (
        "point_to_point",
        ((0, 1, ("d1",), (4,)), (1, 3, ("d0",), (4,)), (3, 5, ("d3",), (4,))),
    ),
    ("point_to_point", ((0, 5, ("d1", "d2"), (4, 4)),)),
    # switched: the 40 Mbit/s / 3 ms pair, a middle stage's port carrying both streams
    # over the 6 ms pair, a ring over the default pair
    ("switched", ((0, 2, ("d1",), (4,)), (2, 5, ("d0",), (4,)))),
    ("switched", ((0, 1, ("d1",), (4,)), (1, 3, ("d0",), (4,)), (3, 5, ("d3",), (4,)))),
    ("switched", ((0, 5, ("d0", "d2"), (4, 4)),)),
    # the shared medium carrying both directions of the 40 Mbit/s / 3 ms pair
    ("shared_medium", ((0, 2, ("d1",), (4,)), (2, 5, ("d0",), (4,)))),
]


@pytest.mark.parametrize("topology, stages", EXACT_CASES)
def test_program_prices_a_fixed_plan_as_the_cost_model_does_on_a_non_uniform_network(
    topology, stages
):
    # plans of the rows' exact class (planner/solvers/exact/formulation.py): single-device stages
    # (three on point-to-point or a switch, two on the medium) or one data-parallel pair;
    # the program's value of the plan is then the cost model's iteration time
    problem = non_uniform(topology)
    batch = sum(stages[0][3])
    partition = Partition(batch, 8 // batch, tuple(StageAssignment(*s) for s in stages))
    expected = CostModel(problem).evaluate(partition).iteration_ms
    assert program_value(problem, partition) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("topology", ["point_to_point", "switched", "shared_medium"])
def test_program_never_prices_a_plan_above_the_cost_model(topology):
    # the rows are a relaxation: on random plans over per-pair bandwidths and mixed
    # latencies the program's value never exceeds the cost model's, so a program's bound
    # is a bound on the cost model's figure (and the reported gap is one of it)
    problem = random_problem(4, 4, seed=3, global_batch=4, candidates=(2, 4),
                             links=NON_UNIFORM, topology=topology)  # fmt: skip
    cm = CostModel(problem)
    plans = [p for b in (2, 4) for p in all_partitions(problem, b)]
    checked = 0
    for i in np.random.default_rng(7).permutation(len(plans))[:60]:
        plan = plans[i]
        cost = cm.evaluate(plan)
        balanced = all(max(s.samples) - min(s.samples) <= 1 for s in plan.stages)
        if not cost.memory_ok or not balanced:
            continue  # outside the program's space (memory rows, balance rows)
        assert program_value(problem, plan) <= cost.iteration_ms * (1 + 1e-6)
        checked += 1
    assert checked >= 20


@pytest.mark.parametrize("seed", range(4))
def test_exact_search_beats_a_poor_start_and_reaches_the_dp_unaided(seed):
    # Started from the worst feasible baseline plan instead of the DP's, the solver must
    # find a plan at least as good as the DP's by its own search (with the DP's plan as
    # the start, "exact <= DP" would hold by construction).
    problem = random_problem(
        10, 5, seed=seed, global_batch=16, candidates=(2, 4, 8), memory=(6e7, 3e7)
    )
    dp = plan_dp(problem)
    feasible = []
    for name in BASELINES:
        with contextlib.suppress(InfeasibleError):
            feasible.append(plan_baseline(problem, name))
    start, start_cost = max(feasible, key=lambda pc: pc[1].iteration_ms)
    assert start_cost.iteration_ms > dp.cost.iteration_ms  # a poorer start than the DP's
    result = plan_milp(problem, time_limit=60, warm_start=start)
    assert result.warm_start_ms == pytest.approx(start_cost.iteration_ms)
    assert result.cost.iteration_ms <= dp.cost.iteration_ms * (1 + 1e-9)
    assert result.cost.memory_ok


def memory_tight_problem(big_memory: float = 3.2e8):
    """Two blocks on a big and a small device: only block 0 fits the small device and
    the two blocks together do not fit the big one, so the small (and slow) device must
    take stage 0 (Asteroid's memory-descending device order alone misses it)."""
    types = {
        "big": device_type("big", big_memory, 200.0),
        "small": device_type("small", 5e7, 60.0),
    }
    cluster = Cluster(
        "tight", (Device("big-0", "big"), Device("small-0", "small")), Network(1e4, 1.0), types
    )
    blocks = (Block("b0", 1e7, 1e4, 1e6), Block("b1", 1e8, 1e4, 1e6))
    timings = {
        name: Timing((1, 2), ((s, 2 * s), (s, 2 * s)), ((2 * s, 4 * s), (2 * s, 4 * s)))
        for name, s in (("big", 1.0), ("small", 3.0))
    }
    model = ModelProfile("tight", {"kind": "analytic"}, 1e4, blocks, timings)
    # ring replicas off: each device holds only its own stage (replicas would not fit)
    config = TrainingConfig(4, (2,), replication_interval=0)
    return make_problem(model, cluster, config, catalog=types)


def test_memory_tight_instance_puts_the_small_device_first_in_both_planners():
    problem = memory_tight_problem()
    dp = plan_dp(problem)
    result = plan_milp(problem, time_limit=30)
    assert result.status == "optimal"
    for partition in (dp.partition, result.partition):
        first, second = partition.stages
        assert (first.first, first.end, first.devices) == (0, 1, ("small-0",))
        assert (second.first, second.end, second.devices) == (1, 2, ("big-0",))
    assert result.cost.memory_ok


def test_both_planners_report_memory_when_nothing_fits():
    problem = memory_tight_problem(big_memory=2.9e8)  # block 1 alone no longer fits
    with pytest.raises(InfeasibleError) as dp_error:
        plan_dp(problem)
    with pytest.raises(InfeasibleError) as milp_error:
        plan_milp(problem, time_limit=30)
    for error in (dp_error.value, milp_error.value):
        assert error.constraint == "memory" and "memory" in str(error)
        assert error.shortfall > 0


def replica_problem(interval: int = 1):
    """Stage 0 must be ``big-0`` (only it holds block 0's activations); block 1 goes to
    the two slower-to-beat ``mid`` devices. With momentum a block of W = 1e7 bytes costs
    3 W = 3e7 on its owner and its ring replica 2 W = 2e7; block 1's activations 1e7 per
    sample (one in flight on the last stage). A mid of 6.5e7 usable bytes fits block 1
    with 3 samples (6e7), or with 1 sample plus stage 0's replica (6e7), not with 2
    samples plus the replica (7e7)."""
    types = {"big": device_type("big", 1e9, 200.0), "mid": device_type("mid", 6.5e7, 100.0)}
    devices = (Device("big-0", "big"), Device("mid-0", "mid"), Device("mid-1", "mid"))
    cluster = Cluster("replica", devices, Network(1e4, 0.1), types)
    blocks = (Block("b0", 1e7, 1e3, 1e8), Block("b1", 1e7, 1e3, 1e7))
    timings = {
        "big": Timing((1, 4), ((1.0, 4.0), (100.0, 400.0)), ((2.0, 8.0), (200.0, 800.0))),
        "mid": Timing((1, 4), ((1.0, 4.0), (10.0, 40.0)), ((2.0, 8.0), (20.0, 80.0))),
    }
    model = ModelProfile("replica", {"kind": "analytic"}, 1e4, blocks, timings)
    config = TrainingConfig(4, (4,), replication_interval=interval)
    return make_problem(model, cluster, config, catalog=types)


def replica_plan(samples: tuple[int, int]) -> Partition:
    return Partition(
        4,
        1,
        (
            StageAssignment(0, 1, ("big-0",), (4,)),
            StageAssignment(1, 2, ("mid-0", "mid-1"), samples),
        ),
    )


def test_replica_memory_is_in_the_rows_a_plan_that_overflows_with_it_is_out():
    # the even split fits without replication (5e7 each) but with it the first-listed
    # mid holds stage 0's replica: 3e7 + 2e7 + 2e7 = 7e7 > 6.5e7
    even = replica_plan((2, 2))
    for interval, fits in ((0, True), (1, False)):
        problem = replica_problem(interval)
        assert CostModel(problem).evaluate(even).memory_ok is fits
        cm = CostModel(problem)
        tables = Tables(problem, cm, device_classes(problem))
        form = Builder(tables, 4, 2).build(1e4, 1e4)
        pin(form, solution_hint(form, tables, even))
        assert solve_cpsat(form.model, {}, 30, 1e4).status == ("optimal" if fits else "infeasible")


def test_replica_on_the_device_with_fewer_samples_is_found_and_is_optimal():
    # feasible only when the replica is counted once, on the holder, at its replica size:
    # the holder takes 1 sample and the other mid 3 (charging every mid, or the full
    # 3 W state, would leave no two-stage plan)
    problem = replica_problem()
    oracle, best = brute_force_best(problem)
    assert sorted(best.stages[1].samples) == [1, 3]
    result = plan_milp(problem, time_limit=30)
    assert result.status == "optimal"
    assert result.cost.iteration_ms == pytest.approx(oracle, rel=1e-9)
    holder = result.partition.stages[1]
    assert result.cost.stages[1].replica_bytes == (2e7, 0.0)
    assert holder.samples == (1, 3)
    assert all(s.excluded == 0 for s in result.subproblems)  # the rows did it, no retries


def test_device_classes_group_interchangeable_devices():
    problem = api.load_problem("pipedream-alexnet", "jetson-testbed-6")
    counts = {c.type: c.count for c in device_classes(problem)}
    assert counts == {
        "jetson-nano": 2, "jetson-tx2": 2, "jetson-xavier-nx": 1, "jetson-orin-nano": 1
    }  # fmt: skip
    # d0, d2, d4 are "fast", d1, d3, d5 "slow"; a link override sets d0 and d2 apart
    linked = random_problem(3, 6, links=(Link("d0", "d2", bandwidth_mbps=10.0),))
    members = sorted(c.members for c in device_classes(linked))
    assert members == [(0,), (1, 3, 5), (2,), (4,)]


def test_plan_records_backend_status_bound_and_gap():
    problem = random_problem(6, 3, seed=2, global_batch=8, candidates=(2, 4))
    plan = api.solve(problem, "milp", backend="highs", time_limit=30)
    assert plan.solver.name == "milp"
    assert plan.solver.settings["backend"] == "highs"
    assert plan.solver.settings["time_limit_s"] == 30
    assert plan.solver.status == "optimal"
    assert plan.solver.gap == 0.0
    assert plan.solver.objective_bound_ms == pytest.approx(plan.cost.iteration_ms)
    validate(plan_to_dict(plan), "edgepipe.plan", "test")


def test_time_limit_returns_the_warm_start_with_an_honest_status():
    # the limit covers everything, the warm start's DP included (issue 29): the plan is
    # the DP's plan found within its share of the 0.05 s, or better
    problem = api.load_problem("pipedream-vgg16", "pi-lab-4")
    result = plan_milp(problem, time_limit=0.05)
    assert result.status in ("timed_out", "feasible")
    assert result.warm_start_ms is not None
    assert result.cost.iteration_ms <= result.warm_start_ms
    assert any(s.status == "skipped" for s in result.subproblems)
    assert result.gap is None or 0.0 <= result.gap <= 1.0


def test_bad_backend_and_time_limit_are_input_errors():
    problem = random_problem(3, 2, seed=0)
    with pytest.raises(InputError, match="backend"):
        plan_milp(problem, backend="gurobi")
    with pytest.raises(InputError, match="positive"):
        plan_milp(problem, time_limit=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_solver_prints_nothing_to_stdout(backend, capfd):
    plan_milp(random_problem(4, 3, seed=1, global_batch=4), backend=backend, time_limit=30)
    out, _ = capfd.readouterr()
    assert out == ""


@pytest.mark.parametrize("backend", BACKENDS)
def test_another_threads_output_survives_a_solve(backend, capfd):
    # the solver must not silence the process's stdout: a thread writing to descriptor
    # 1 meanwhile (as print does outside pytest) keeps every line, and no solver banner
    # appears among them
    stop = threading.Event()
    printed = []

    def chatter() -> None:
        while not stop.is_set() or not printed:
            printed.append(len(printed))
            os.write(1, f"tick {printed[-1]}\n".encode())
            time.sleep(0.002)

    thread = threading.Thread(target=chatter)
    thread.start()
    try:
        plan_milp(random_problem(5, 4, seed=2, global_batch=8), backend=backend, time_limit=30)
    finally:
        stop.set()
        thread.join()
    out, _ = capfd.readouterr()
    assert out.splitlines() == [f"tick {i}" for i in printed]


def test_plan_json_on_stdout_is_clean_in_a_fresh_process():
    # HiGHS prints its banner on the first solver object of a process: run in a new one
    command = [
        sys.executable, "-m", "edgepipe.planner.cli", "plan", "--model", "pipedream-alexnet",
        "--cluster", "orin-pair-2", "--solver", "milp", "--backend", "highs", "-o", "-",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    doc = json.loads(done.stdout)
    validate(doc, "edgepipe.plan", "stdout")
    assert doc["solver"]["settings"]["backend"] == "highs"
    assert doc["solver"]["status"] == "optimal"


@pytest.mark.parametrize("seed", range(3))
def test_quick_bound_is_below_every_plan_of_its_program(seed):
    # the bound a program reports without a solver (and that prunes programs) is below
    # the cost model's figure of every plan with its micro-batch size and stage count
    problem = tiny(seed)
    cm = CostModel(problem)
    tables = Tables(problem, cm, device_classes(problem))
    least: dict[tuple[int, int], float] = {}
    for batch in problem.config.micro_batch_sizes():
        for plan in all_partitions(problem, batch):
            key = (batch, plan.num_stages)
            least[key] = min(least.get(key, math.inf), cm.evaluate(plan).iteration_ms)
    for (batch, stages), value in least.items():
        assert quick_bound(tables, batch, stages) <= value * (1 + 1e-9)
    # and not vacuous: within a factor 5 of the best plan somewhere
    assert max(quick_bound(tables, *key) / value for key, value in least.items()) > 0.2


def slow_network(seed: int):
    """Tiny instances where the links dominate: 5 Mbit/s on each topology, micro-batches
    of 1-4 samples (so M = 1 .. 4: the pipeline's fill weighs in)."""
    rng = np.random.default_rng(seed)
    return random_problem(
        int(rng.integers(3, 6)),
        int(rng.integers(2, 5)),
        seed=seed,
        global_batch=4,
        candidates=(1, 2, 4),
        bandwidth_mbps=5.0,
        latency_ms=float(rng.choice([0.1, 5.0])),
        topology=("switched", "shared_medium", "point_to_point")[seed % 3],
    )


def wide_switch_problem():
    """Weightless blocks with large activations on a 10 Mbit/s switch: a boundary costs
    80 ms per sample, the all-reduce next to nothing, so the best two-stage plan splits
    each micro-batch over two devices per stage (each uplink sends half the samples)."""
    types = {"dev": device_type("dev", 1e9, 100.0)}
    cluster = Cluster(
        "wide", tuple(Device(f"d{i}", "dev") for i in range(4)), Network(10.0, 0.1), types
    )
    blocks = (Block("b0", 1e3, 1e5, 1e3), Block("b1", 1e3, 1e3, 1e3))
    timing = Timing((1, 4), ((1.0, 4.0), (1.0, 4.0)), ((2.0, 8.0), (2.0, 8.0)))
    model = ModelProfile("wide", {"kind": "analytic"}, 1e4, blocks, {"dev": timing})
    return make_problem(model, cluster, TrainingConfig(4, (4,)), catalog=types)


BOUND_INSTANCES = {
    **{("tiny", s): lambda s=s: tiny(s) for s in range(8)},
    **{("slow", s): lambda s=s: slow_network(s) for s in range(6)},
    ("wide", 0): wide_switch_problem,
}


@pytest.mark.parametrize("instance", list(BOUND_INSTANCES))
def test_program_bounds_are_below_every_plan_that_fits_memory(instance):
    # the min-max over partitions (fill + work + ring + sent bytes per stage) bounds the
    # cost model's figure of every memory-feasible plan of its (micro-batch, stage
    # count); checked against the brute-force enumeration of every plan (tests/helpers/oracles.py)
    problem = BOUND_INSTANCES[instance]()
    cm = CostModel(problem)
    tables = Tables(problem, cm, device_classes(problem))
    max_p = min(problem.model.num_blocks, len(problem.cluster.devices))
    tighter = 0
    for batch in problem.config.micro_batch_sizes():
        least = [math.inf] * (max_p + 1)
        for plan in all_partitions(problem, batch):
            cost = cm.evaluate(plan)
            if cost.memory_ok:
                least[plan.num_stages] = min(least[plan.num_stages], cost.iteration_ms)
        bounds = program_bounds(tables, batch, max_p)
        for stages in range(1, max_p + 1):
            assert bounds[stages] <= least[stages] * (1 + 1e-9), (batch, stages)
            tighter += bounds[stages] > quick_bound(tables, batch, stages) * 1.01
    # and stronger than the work / fill bound somewhere on every instance
    assert tighter > 0


def chain(batch: int, activation: float, slowdown: float = 1.0, micro_batches: int = 1):
    """Two blocks on two devices, one micro-batch of ``batch`` samples, a 10 Mbit/s
    switch (1250 bytes/ms) with 5 ms latency, block 0's activation ``activation`` bytes
    per sample, the weights next to nothing. Per sample on d0: forward 3 and 1 ms,
    backward 6 and 2 ms (times proportional to the batch); d1 is of d0's type, or with
    ``slowdown`` != 1 of a type ``slowdown`` times slower; ``micro_batches`` of them."""
    slow = "dev" if slowdown == 1.0 else "slow"
    types = {name: device_type(name, 1e9, 100.0) for name in ("dev", slow)}
    cluster = Cluster("chain", (Device("d0", "dev"), Device("d1", slow)), Network(10.0, 5.0), types)
    blocks = (Block("b0", 1e2, activation, 1e3), Block("b1", 1e2, 1e3, 1e3))
    timings = {
        name: Timing((1, 2), ((3.0 * x, 6.0 * x), (1.0 * x, 2.0 * x)),
                     ((6.0 * x, 12.0 * x), (2.0 * x, 4.0 * x)))
        for name, x in (("dev", 1.0), (slow, slowdown))
    }  # fmt: skip
    model = ModelProfile("chain", {"kind": "analytic"}, 1e4, blocks, timings)
    config = TrainingConfig(batch * micro_batches, (batch,))
    return make_problem(model, cluster, config, catalog=types)


@pytest.mark.parametrize(
    "batch, activation, hop",
    [
        (1, 1e5, 80.0 + 5.0),  # one sample: the hop is the whole activation
        (2, 1.0, 0.0008 + 5.0),  # two samples on each device: the fill is both samples'
    ],
)
def test_program_bounds_are_the_plans_figures_on_a_chain(batch, activation, hop):
    # one micro-batch: every term of the bound is tight. One stage on one device is its
    # compute, batch x (3 + 1 + 6 + 2) ms; with two samples the stage on both devices
    # adds its ring all-reduce instead (2 steps of 100 bytes + 5 ms) and is the faster;
    # two stages add the activation's and the gradient's hop (with two samples the bound
    # counts one sample's bytes, 0.0008 ms below the plan's: the latency dominates). So
    # the fill (all samples through stage 0), the hops, the ring and the work all enter
    # the bound at their full value.
    problem = chain(batch, activation)
    cm = CostModel(problem)
    tables = Tables(problem, cm, device_classes(problem))
    compute = 12.0 * batch
    one = [Partition(batch, 1, (StageAssignment(0, 2, ("d0",), (batch,)),))]
    if batch == 2:
        one.append(Partition(2, 1, (StageAssignment(0, 2, ("d0", "d1"), (1, 1)),)))
    two = Partition(batch, 1, (StageAssignment(0, 1, ("d0",), (batch,)),
                               StageAssignment(1, 2, ("d1",), (batch,))))  # fmt: skip
    figures = [cm.evaluate(plan).iteration_ms for plan in one]
    assert figures == pytest.approx([compute, 12.0 + 2 * (100 / 1250 + 5.0)][: len(one)])
    assert cm.evaluate(two).iteration_ms == pytest.approx(
        compute + 2 * (batch * activation / 1250.0 + 5.0)
    )
    bounds = program_bounds(tables, batch, 2, rel_tol=1e-9)
    assert bounds[1] == pytest.approx(min(figures), rel=1e-6)
    assert bounds[2] == pytest.approx(compute + 2 * hop, rel=1e-6)


def test_program_bounds_count_each_class_once():
    # a fast and a three times slower device, one sample: two stages need both, so the
    # best is the slow device on the light stage, 3 + 3 + 6 + 6 ms of compute plus two
    # 85 ms hops; a bound that gave both stages the fast device's times (12 ms) would be
    # 6 ms lower
    problem = chain(1, 1e5, slowdown=3.0)
    cm = CostModel(problem)
    tables = Tables(problem, cm, device_classes(problem))
    fast_first = Partition(1, 1, (StageAssignment(0, 1, ("d0",), (1,)),
                                  StageAssignment(1, 2, ("d1",), (1,))))  # fmt: skip
    assert cm.evaluate(fast_first).iteration_ms == pytest.approx(18.0 + 2 * 85.0)
    bounds = program_bounds(tables, 1, 2, rel_tol=1e-9)
    assert bounds[2] == pytest.approx(18.0 + 2 * 85.0, rel=1e-6)


def test_program_bounds_start_a_late_ring_after_the_forward_fill():
    # three devices; block 1 keeps 6e8 bytes per sample, so one device holds one sample
    # and the two-stage plan runs block 0 on d0 (2 samples) and block 1 on d1 and d2 (1
    # each), whose ring over block 1's 1e6 bytes of weights (2 steps of 400 ms + 5 ms)
    # ends the round: 6 ms of forward, a 5 ms hop, 3 ms of compute, 810 ms of ring. The
    # bound's ring branch starts at the forward part of the fill before the stage, which
    # it knows only as alpha x the round trip (here 1/3 x 18 ms, forward : backward =
    # 1 : 2): exactly 6 ms
    types = {"dev": device_type("dev", 1e9, 100.0)}
    devices = tuple(Device(f"d{i}", "dev") for i in range(3))
    cluster = Cluster("ring", devices, Network(10.0, 5.0), types)
    blocks = (Block("b0", 1e2, 1.0, 1e3), Block("b1", 1e6, 1e3, 6e8))
    timing = Timing((1, 2), ((3.0, 6.0), (1.0, 2.0)), ((6.0, 12.0), (2.0, 4.0)))
    model = ModelProfile("ring", {"kind": "analytic"}, 1e4, blocks, {"dev": timing})
    config = TrainingConfig(2, (2,), replication_interval=0)
    problem = make_problem(model, cluster, config, catalog=types)
    cm = CostModel(problem)
    plan = Partition(2, 1, (StageAssignment(0, 1, ("d0",), (2,)),
                            StageAssignment(1, 2, ("d1", "d2"), (1, 1))))  # fmt: skip
    cost = cm.evaluate(plan)
    assert cost.memory_ok
    assert cost.iteration_ms == pytest.approx(6.0 + 5.0 + 3.0 + 2 * (5e5 / 1250 + 5.0), rel=1e-5)
    tables = Tables(problem, cm, device_classes(problem))
    bounds = program_bounds(tables, 2, 2, rel_tol=1e-9)
    assert bounds[2] == pytest.approx(cost.iteration_ms, rel=1e-5)


def test_program_bounds_follow_a_micro_batch_through_the_later_stages_and_back():
    # two micro-batches of one sample, latency-bound hops (1 byte, 5 ms): stage 0 runs
    # F0 F1 B0 B1 (Asteroid warm-up), and B0 waits for micro-batch 0's way through stage
    # 1 and back: 3 (F0) + 5.0008 + 1 + 2 + 5.0008 + 6 (B0) + 6 (B1) ms. Neither stage's
    # work (18 ms) nor the fill before stage 1 (9 + 10.0016 + 6 ms) reaches it
    problem = chain(1, 1.0, micro_batches=2)
    assert stage_orders(problem, 1, 2)[0] == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    cm = CostModel(problem)
    two = Partition(1, 2, (StageAssignment(0, 1, ("d0",), (1,)),
                           StageAssignment(1, 2, ("d1",), (1,))))  # fmt: skip
    expected = 3.0 + 2 * (1 / 1250 + 5.0) + 1.0 + 2.0 + 6.0 + 6.0
    assert cm.evaluate(two).iteration_ms == pytest.approx(expected)
    tables = Tables(problem, cm, device_classes(problem))
    assert program_bounds(tables, 1, 2, rel_tol=1e-9)[2] == pytest.approx(expected, rel=1e-6)
