"""Problem builders and probes shared by the DP's tests (tests/unit/test_dp*.py,
test_replan.py): tiny knob-mixing instances, fast/slow and identical clusters, a
non-uniform network, the least closed form per micro-batch size (brute force), a plan of
the hand model, and a recorder of the micro-batch sizes the DP searches."""

from __future__ import annotations

import numpy as np
from edgepipe.planner.cost.closed_form import pipeline_closed_form_ms
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.inputs.cluster import Cluster, Device, Link, Network
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import Problem, make_problem
from edgepipe.planner.inputs.profile import Block, ModelProfile, Timing
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.plan import SolverInfo, make_plan
from edgepipe.planner.solvers.classes import device_classes
from edgepipe.planner.solvers.dp.search import _BatchSearch
from edgepipe.planner.solvers.dp.tables import _Tables

from tests.helpers.oracles import all_partitions
from tests.helpers.synthetic import device_type, knob_mix_problem, random_problem

#: the hand model's parameter bytes per block (:func:`hand_plan`)
W = 1e6


def tiny(seed: int):
    """Tiny instances over the knobs the DP handles separately: mixed device types, a
    per-pair link override (a class of its own), slowdowns, tight memory, shared or
    switched networks, asteroid/classic warm-ups, 1F1B and GPipe."""
    rng = np.random.default_rng(1000 + seed)
    n_dev = int(rng.integers(2, 5))
    links = (Link("d0", "d1", bandwidth_mbps=40.0, latency_ms=4.0),) if seed % 3 == 0 else ()
    problem = knob_mix_problem(
        rng, int(rng.integers(2, 7)), n_dev, seed, links if n_dev >= 2 else ()
    )
    if seed % 4 == 1:  # one device runs 1.7x slower than its type
        cl = problem.cluster
        devices = (*cl.devices[:-1], Device(cl.devices[-1].id, cl.devices[-1].type, slowdown=1.7))
        problem = make_problem(
            problem.model,
            Cluster(cl.name, devices, cl.network, cl.device_types),
            problem.config,
            catalog=cl.device_types,
        )
    return problem


def mixed(n_fast: int, n_slow: int, blocks: int, seed: int):
    problem = random_problem(blocks, n_fast + n_slow, seed=seed, global_batch=16,
                             candidates=(2, 4, 8), bandwidth_mbps=1000.0)  # fmt: skip
    cl = problem.cluster
    devices = tuple(
        Device(f"d{i}", "fast" if i < n_fast else "slow") for i in range(n_fast + n_slow)
    )
    return make_problem(
        problem.model,
        Cluster(cl.name, devices, cl.network, cl.device_types),
        problem.config,
        catalog=cl.device_types,
    )


def identical(n: int, blocks: int, types: int = 1, seed: int = 0):
    """``n`` devices of ``types`` types (round robin) with generous memory."""
    base = random_problem(blocks, 2, seed=seed, global_batch=64, candidates=(4, 8, 16),
                          memory=(8e10, 8e10), bandwidth_mbps=1000.0)  # fmt: skip
    kinds = {f"t{k}": device_type(f"t{k}", 8e10, 100.0 + 40.0 * k, 1e5) for k in range(types)}
    timings = {f"t{k}": base.model.timings[("fast", "slow")[k % 2]] for k in range(types)}
    model = ModelProfile(base.model.name, base.model.source, base.model.input_bytes_per_sample,
                         base.model.blocks, timings)  # fmt: skip
    devices = tuple(Device(f"d{i}", f"t{i % types}") for i in range(n))
    cluster = Cluster("many", devices, Network(1000.0, 0.5, False), kinds)
    return make_problem(model, cluster, base.config, catalog=kinds)


NON_UNIFORM = (
    Link("d0", "d1", bandwidth_mbps=40.0, latency_ms=3.0),
    Link("d1", "d2", bandwidth_mbps=400.0, latency_ms=0.2),
    Link("d0", "d3", latency_ms=6.0),
)


def searched_sizes(monkeypatch) -> list[int]:
    """The micro-batch sizes the DP searches from now on, in order."""
    searched: list[int] = []
    run = _BatchSearch.run

    def recording(search):
        searched.append(search.batch)
        return run(search)

    monkeypatch.setattr(_BatchSearch, "run", recording)
    return searched


def least_closed_form(cm: CostModel, problem: Problem, batch: int) -> float:
    """The least closed form D + X over every memory-feasible plan of the full space at
    micro-batch size ``batch`` (the oracle's enumeration), inf where none fits."""
    return min(
        (
            pipeline_closed_form_ms(cm, part)
            for part in all_partitions(problem, batch)
            if cm.evaluate(part).memory_ok
        ),
        default=np.inf,
    )


def best_per_size(problem: Problem) -> tuple[_Tables, dict[int, float]]:
    """The DP's tables of ``problem`` and, per micro-batch size where some plan fits
    memory, the least closed form of :func:`least_closed_form`."""
    sizes = problem.config.micro_batch_sizes()
    cm = CostModel(problem, max(sizes))
    tables = _Tables(problem, cm, device_classes(problem))
    best = {batch: least_closed_form(cm, problem, batch) for batch in sizes}
    return tables, {batch: v for batch, v in best.items() if np.isfinite(v)}


def hand_plan(
    times: list[float],
    stages: list[tuple[int, int, tuple[str, ...], tuple[int, ...]]],
    devices: list[str],
    *,
    batch: int = 4,
    micro_batches: int = 8,
    memory: dict[str, float] | None = None,
    bandwidth_mbps: float = 8e3,
    interval: int = 1,
    param_bytes: float = W,
):
    """A plan of the hand model with ``stages`` = (first, end, devices, samples)."""
    t = device_type("t", 1e9, 100.0, 1e9)
    memory = memory or {}
    model = ModelProfile(
        "hand",
        {"kind": "analytic"},
        1.0,
        tuple(Block(f"b{i}", param_bytes, 1.0, 1.0) for i in range(len(times))),
        {"t": Timing((1,), tuple((float(f),) for f in times), tuple((2.0 * f,) for f in times))},
    )
    cluster = Cluster(
        "hand",
        tuple(Device(d, "t", memory_bytes=memory.get(d)) for d in devices),
        Network(bandwidth_mbps, 0.0),
        {"t": t},
    )
    config = TrainingConfig(batch * micro_batches, (batch,), replication_interval=interval)
    problem = make_problem(model, cluster, config, catalog={})
    partition = Partition(batch, micro_batches, tuple(StageAssignment(*s) for s in stages))
    return make_plan(problem, partition, SolverInfo("hand"))
