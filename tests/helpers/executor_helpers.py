"""Small models, datasets and hand-made plans for the executor tests.

The models are built through ``module:callable`` build specs (``tests.helpers.executor_helpers:
mlp``), so the executor's worker processes import this module; their weights come from
``executor.profiling.zoo.init_block`` with per-block seeds, as zoo models' do.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from edgepipe.executor.core.data import TensorPairs
from edgepipe.executor.profiling import zoo
from edgepipe.executor.profiling.profiler import profile_model
from edgepipe.planner.inputs.cluster import Cluster
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import make_problem
from edgepipe.planner.inputs.profile import BuildSpec, ModelProfile
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.plan import Plan, SolverInfo, make_plan, save_plan
from torch import nn

if TYPE_CHECKING:
    from tests.helpers.reference_trainer import Result

MLP_IN, MLP_CLASSES = 6, 3
#: :func:`mlp_dataset` as a ``--dataset``: by module path, for the worker processes to import
MLP_DATASET = "tests.helpers.executor_helpers:mlp_dataset"
#: the tests' device type, ``host-cpu``: this machine on a 1 Gbit/s loopback
HOST_CPU = {
    "description": "this machine (tests)", "memory_bytes": 8 * 2**30, "usable_fraction": 0.9,
    "peak_fp32_gflops": 100, "efficiency": 0.5,
    "network": {"interface": "loopback", "bandwidth_mbps": 1000},
    "sources": {"all": "test figures"},
}


def _seeded(blocks: list[nn.Module], seed: int) -> list[nn.Module]:
    for i, block in enumerate(blocks):
        zoo.init_block(block, zoo.block_seed(seed, i))
    return blocks


def mlp(width: int = 8, depth: int = 4, seed: int = 0) -> list[nn.Module]:
    """``depth`` blocks: Linear+Tanh chains from MLP_IN features to MLP_CLASSES logits."""
    dims = [MLP_IN] + [width] * (depth - 1) + [MLP_CLASSES]
    blocks: list[nn.Module] = [
        nn.Sequential(nn.Linear(a, b), nn.Tanh()) for a, b in pairwise(dims[:-1])
    ]
    blocks.append(nn.Linear(dims[-2], dims[-1]))
    return _seeded(blocks, seed)


def cnn(channels: int = 4, seed: int = 0) -> list[nn.Module]:
    """A no-batch-norm CNN on 3 x 8 x 8 images, 4 blocks, 10 classes."""
    blocks: list[nn.Module] = [
        nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.ReLU()),
        nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)),
        nn.Sequential(nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten()),
        nn.Linear(2 * channels, 10),
    ]
    return _seeded(blocks, seed)


def mlp_dataset(size: int = 96) -> TensorPairs:
    """A learnable task for :func:`mlp`: the label is the argmax of three fixed linear
    projections of a Gaussian input."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(size, MLP_IN, generator=gen)
    w = torch.randn(MLP_IN, MLP_CLASSES, generator=gen)
    return TensorPairs(x, (x @ w).argmax(dim=1))


def image_dataset(size: int = 64) -> TensorPairs:
    """Random 3 x 8 x 8 images with random labels (for parity, not learning)."""
    gen = torch.Generator().manual_seed(11)
    return TensorPairs(torch.randn(size, 3, 8, 8, generator=gen),
                       torch.randint(10, (size,), generator=gen))


def profile_of(
    build: BuildSpec, example: Any, name: str = "model", batch_sizes: Sequence[int] = (1, 2)
) -> ModelProfile:
    """A quick profile (one timed round per batch size) carrying ``build``."""
    if build.zoo is not None:
        model = zoo.build_model(build.zoo, seed=build.seed, **build.sizes)
    else:
        model = zoo.load_model(build.callable, **build.kwargs)
    return profile_model(model, example, list(batch_sizes), "host-cpu", name=name, warmup=0,
                         repeats=1, build=build)


def profile_mlp() -> ModelProfile:
    """A quick profile (:func:`profile_of`) of :func:`mlp` of width 8, whose build spec
    names it by module path, for the worker processes to import."""
    build = BuildSpec(callable="tests.helpers.executor_helpers:mlp", kwargs={"width": 8})
    return profile_of(build, lambda b: torch.randn(b, MLP_IN))


def cluster(n: int, memory_bytes: float = 8 * 2**30) -> Cluster:
    """``n`` identical devices ``d0..d{n-1}`` of a type ``host-cpu`` on a 1 Gbit/s LAN."""
    doc = {
        "schema_version": 1,
        "kind": "edgepipe.cluster",
        "name": f"test-{n}",
        "device_types": {"host-cpu": {**HOST_CPU, "memory_bytes": memory_bytes}},
        "devices": [{"id": f"d{i}", "type": "host-cpu"} for i in range(n)],
        "network": {"bandwidth_mbps": 1000, "latency_ms": 0.1},
    }
    return Cluster.from_dict(doc, "test cluster", catalog={})


def make_test_plan(
    profile: ModelProfile,
    stages: Sequence[tuple[int, int, Sequence[int]]],
    micro_batch: int,
    num_micro_batches: int,
    *,
    optimizer: str = "sgd",
    schedule: str = "1f1b",
    warmup: str = "asteroid",
    learning_rate: float | None = 0.1,
    memory_bytes: float = 8 * 2**30,
    replication_interval: int | str = 1,
    **config: Any,
) -> Plan:
    """A hand-made plan: ``stages`` = [(first block, end block, samples per device)],
    devices numbered d0, d1, ... in stage order. Replicated every step unless told
    otherwise: ``auto`` would resolve from this machine's measured profile, so the
    points, and what a loss replays, would vary with its load."""
    n = sum(len(s[2]) for s in stages)
    cfg = TrainingConfig(
        global_batch=micro_batch * num_micro_batches,
        micro_batch_candidates=(micro_batch,),
        optimizer=optimizer,
        schedule=schedule,
        warmup=warmup,
        learning_rate=learning_rate,
        replication_interval=replication_interval,
        **config,
    )
    problem = make_problem(profile, cluster(n, memory_bytes), cfg, catalog={})
    assigned, dev = [], 0
    for first, end, samples in stages:
        ids = tuple(f"d{dev + k}" for k in range(len(samples)))
        dev += len(samples)
        assigned.append(StageAssignment(first, end, ids, tuple(samples)))
    partition = Partition(micro_batch, num_micro_batches, tuple(assigned))
    return make_plan(problem, partition, SolverInfo("hand"))


def write_plan(plan: Plan, folder: Path, name: str = "plan.json") -> Path:
    path = folder / name
    save_plan(plan, path)
    return path


def assert_saved_state_equals(out: Path, build: BuildSpec, want: Result) -> None:
    """Every rank's saved weights and optimizer state (``out/weights/rank*.pt``) are
    ``torch.equal`` to the reference trainer's ``want``, and together they cover every
    parameter of ``build``'s model. A stage's parameters are a contiguous run of the
    model's, so its optimizer state number ``i`` is the model's ``first + i``."""
    params = [n for n, _ in zoo.build_model(build.zoo, seed=build.seed, **build.sizes)
              .named_parameters()]
    seen: set[str] = set()
    for saved in sorted((out / "weights").glob("rank*.pt")):
        rank = torch.load(saved)
        for key, value in rank["model"].items():
            assert torch.equal(value, want.state[key]), f"{saved.name}: {key}"
            seen.add(key)
        first = params.index(next(k for k in rank["model"] if k in params))
        for local, state in rank["optimizer"]["state"].items():
            expected = want.optimizer["state"][first + local]
            assert state.keys() == expected.keys()
            for k in state:
                assert torch.equal(torch.as_tensor(state[k]), torch.as_tensor(expected[k])), k
    assert seen == set(want.state)


def emulated_plan(profile, stages, micro_batch, micro_batches, slowdowns, *,
                  bandwidth_mbps=1000.0, latency_ms=0.1, shared=False):
    """A hand-made plan on devices d0.. of one CPU type with per-device slowdowns,
    replicated every step (as :func:`make_test_plan`)."""
    doc = {
        "schema_version": 1, "kind": "edgepipe.cluster", "name": "emulated",
        "device_types": {"host-cpu": HOST_CPU},
        "devices": [{"id": f"d{i}", "type": "host-cpu", "slowdown": s}
                    for i, s in enumerate(slowdowns)],
        "network": {"bandwidth_mbps": bandwidth_mbps, "latency_ms": latency_ms,
                    "shared_medium": shared},
    }
    cluster = Cluster.from_dict(doc, "emulated cluster", catalog={})
    config = TrainingConfig(global_batch=micro_batch * micro_batches,
                            micro_batch_candidates=(micro_batch,), optimizer="sgd",
                            learning_rate=0.1, replication_interval=1)
    problem = make_problem(profile, cluster, config, catalog={})
    assigned, dev = [], 0
    for first, end, samples in stages:
        ids = tuple(f"d{dev + k}" for k in range(len(samples)))
        dev += len(samples)
        assigned.append(StageAssignment(first, end, ids, tuple(samples)))
    return make_plan(problem, Partition(micro_batch, micro_batches, tuple(assigned)),
                     SolverInfo("hand"))
