"""Synthetic planning problems for tests and benchmarks: random but seeded, so every
figure is reproducible. Device types are embedded, so nothing depends on the catalog.

Blocks get random parameter, boundary and saved-activation sizes; times on two device
types ("fast", 200 GFLOP/s peak, and "slow", 60) grow affinely with the batch
(0.4 + 0.6 b of a random per-block base), backward = 2 x forward."""

from __future__ import annotations

import random

import numpy as np
from edgepipe.planner.inputs.cluster import Cluster, Device, DeviceType, Link, Network, Topology
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.importers.pipedream import parse_pipedream
from edgepipe.planner.inputs.problem import Problem, make_problem
from edgepipe.planner.inputs.profile import Block, ModelProfile, Timing
from edgepipe.planner.partition import Partition, StageAssignment


def device_type(name: str, memory: float, gflops: float, bandwidth_mbps: float = 1e4) -> DeviceType:
    return DeviceType(name, name, memory, 1.0, gflops, 0.5, "test", bandwidth_mbps, {})


def random_problem(
    blocks: int,
    devices: int,
    *,
    seed: int = 0,
    global_batch: int = 8,
    candidates: tuple[int, ...] | None = (2, 4),
    memory: tuple[float, ...] = (8e9, 4e9),
    shared: bool = True,
    optimizer: str = "momentum",
    warmup: str = "asteroid",
    schedule: str = "1f1b",
    links: tuple[Link, ...] = (),
    bandwidth_mbps: float = 100.0,
    topology: Topology | None = None,
    latency_ms: float = 1.0,
) -> Problem:
    """``blocks`` random blocks on ``devices`` devices alternating between two types
    (fast with ``memory[0]`` bytes, slow with ``memory[1]``) on a uniform network
    (``bandwidth_mbps``, ``latency_ms``) unless ``links`` override pairs; ``topology``
    (when given) overrides ``shared``."""
    rng = np.random.default_rng(seed)
    types = {
        "fast": device_type("fast", memory[0], 200.0, 1e5),
        "slow": device_type("slow", memory[1], 60.0, 1e5),
    }
    names = ["fast", "slow"]
    devs = tuple(Device(f"d{i}", names[i % 2]) for i in range(devices))
    if topology is not None:
        shared = topology == "shared_medium"
    network = Network(bandwidth_mbps, latency_ms, shared, links, topology)
    cluster = Cluster("test", devs, network, types)
    blocks_ = tuple(
        Block(
            f"b{i}",
            param_bytes=float(rng.integers(1, 50)) * 1e5,
            output_bytes_per_sample=float(rng.integers(1, 20)) * 1e4,
            saved_bytes_per_sample=float(rng.integers(1, 50)) * 1e4,
        )
        for i in range(blocks)
    )
    sizes = (1, 2, 4, 8)
    timings = {}
    for name, spec in types.items():
        base = rng.uniform(1.0, 10.0, size=blocks) * 100.0 / spec.peak_fp32_gflops
        fwd = tuple(tuple(float(b * (0.4 + 0.6 * s)) for s in sizes) for b in base)
        bwd = tuple(tuple(2.0 * v for v in row) for row in fwd)
        timings[name] = Timing(sizes, fwd, bwd)
    model = ModelProfile("synthetic", {"kind": "analytic"}, 1e4, blocks_, timings)
    config = TrainingConfig(
        global_batch, candidates, optimizer=optimizer, schedule=schedule, warmup=warmup
    )
    return make_problem(model, cluster, config, catalog=types)


def knob_mix_problem(
    rng: np.random.Generator, blocks: int, devices: int, seed: int, links: tuple[Link, ...]
) -> Problem:
    """A tiny :func:`random_problem` (global batch 4, micro-batch candidates 2 and 4) whose
    knobs follow ``seed`` and ``rng``: memory budgets that bind or not and the bandwidth
    drawn from ``rng`` (in that order), a shared network for odd seeds, the classic
    warm-up for ``seed % 4`` in {2, 3}, GPipe for seeds divisible by 5 (1F1B otherwise)."""
    return random_problem(
        blocks,
        devices,
        seed=seed,
        global_batch=4,
        candidates=(2, 4),
        memory=(float(rng.choice([8e9, 6e7])), float(rng.choice([4e9, 3e7]))),
        bandwidth_mbps=float(rng.choice([1e2, 1e3, 1e4])),
        shared=bool(seed % 2),
        warmup=("asteroid", "classic")[seed % 4 // 2],
        schedule="gpipe" if seed % 5 == 0 else "1f1b",
        links=links,
    )


def random_partition(problem: Problem, rng: np.random.Generator) -> Partition:
    """A random valid partition of ``problem``: random micro-batch candidate, stage count,
    block cuts, device groups (some devices may stay idle) and positive sample splits."""
    batch = int(rng.choice(problem.config.micro_batch_sizes()))
    n_blocks, devices = problem.model.num_blocks, [d.id for d in problem.cluster.devices]
    stages = int(rng.integers(1, min(n_blocks, len(devices), batch * len(devices)) + 1))
    cuts = sorted(rng.choice(np.arange(1, n_blocks), size=stages - 1, replace=False).tolist())
    bounds = [0, *cuts, n_blocks]
    order = rng.permutation(len(devices)).tolist()
    used = int(rng.integers(stages, len(devices) + 1))
    group_cuts = sorted(rng.choice(np.arange(1, used), size=stages - 1, replace=False).tolist())
    group_bounds = [0, *group_cuts, used]
    assignment = []
    for p in range(stages):
        group = [devices[i] for i in order[group_bounds[p] : group_bounds[p + 1]]][:batch]
        split = rng.multinomial(batch - len(group), np.ones(len(group)) / len(group)) + 1
        assignment.append(
            StageAssignment(bounds[p], bounds[p + 1], tuple(group), tuple(int(y) for y in split))
        )
    return Partition(batch, problem.config.global_batch // batch, tuple(assignment))


def random_plans(
    count: int,
    seed: int,
    topologies: tuple[Topology, ...] = ("point_to_point", "switched", "shared_medium"),
) -> list[tuple[Problem, Partition]]:
    """``count`` random (problem, partition) pairs cycling through ``topologies``: 2-11
    blocks, 1-8 devices, global batch 32 with micro-batches 1-8, 10 / 100 / 1000 Mbit/s,
    0.1 / 1 / 5 ms latency, on every other problem a random third of the device pairs
    slower or faster (x 0.25, 0.5 or 2 bandwidth, x 0.5 or 2 latency), 1F1B or GPipe,
    Asteroid or classic warm-ups; seeded, so every figure reproduces."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        devices = int(rng.integers(1, 9))
        bandwidth = float(rng.choice([10.0, 100.0, 1e3]))
        latency = float(rng.choice([0.1, 1.0, 5.0]))
        links = tuple(
            Link(
                f"d{a}",
                f"d{b}",
                bandwidth * float(rng.choice([0.25, 0.5, 2.0])),
                latency * float(rng.choice([0.5, 2.0])),
            )
            for a in range(devices)
            for b in range(a + 1, devices)
            if i % 2 == 1 and rng.random() < 1 / 3
        )
        problem = random_problem(
            int(rng.integers(2, 12)),
            devices,
            seed=seed * 100_003 + i,
            global_batch=32,
            candidates=(1, 2, 4, 8),
            bandwidth_mbps=bandwidth,
            schedule=str(rng.choice(["1f1b", "gpipe"])),
            warmup=str(rng.choice(["asteroid", "classic"])),
            links=links,
            topology=topologies[i % len(topologies)],
            latency_ms=latency,
        )
        out.append((problem, random_partition(problem, rng)))
    return out


def nasnet_profile() -> ModelProfile:
    """The NASNet-like graph (:func:`nasnet_like`, 25 cells) imported by the PipeDream
    importer as the benchmarks and tests plan it: batch 32, times on a V100."""
    return parse_pipedream(nasnet_like(), "nasnet-like", batch_size=32, device_type="v100")


def nasnet_like(cells: int = 25, seed: int = 0, batch: int = 32) -> str:
    """A graph.txt of ``cells`` NASNet-style cells (16 layers each) at ``batch``: unit k of
    a cell adds two convolutions of two hidden states drawn from the cell's two inputs
    (the outputs of the two cells before) and its earlier units; the cell's output
    concatenates the units nothing inside the cell read. Seeded, so it reproduces."""
    rng = random.Random(seed)
    lines: list[str] = []
    edges: list[tuple[str, str]] = []

    def layer(name: str, desc: str, f: float, b: float, act: float, par: float) -> str:
        lines.append(
            f"{name} -- {desc} -- forward_compute_time={f:.3f}, backward_compute_time={b:.3f}, "
            f"activation_size={act * batch:.1f}, parameter_size={par:.1f}"
        )
        return name

    width = 32 * 16 * 16 * 4  # one 32-channel 16x16 fp32 feature map per sample
    layer("input", "Input", 0, 0, 3 * 64 * 64 * 4, 0)
    stem = layer("stem", "Conv2d(3, 32)", 0.8, 1.6, width, 3456)
    edges.append(("input", stem))
    prev = [stem, stem]
    for c in range(cells):
        hidden, used = list(prev), set()
        for k in range(5):
            ops = []
            for side in (0, 1):
                src = rng.choice(hidden)
                used.add(src)
                f = rng.uniform(0.2, 1.0)
                ops.append(layer(f"c{c}u{k}s{side}", "SepConv2d(32, 32)", f, 2 * f, width,
                                 rng.choice([1312, 2336, 4384])))  # fmt: skip
                edges.append((src, ops[-1]))
            hidden.append(layer(f"c{c}u{k}add", "Add()", 0, 0, width, 0))
            edges += [(op, hidden[-1]) for op in ops]
        out = layer(f"c{c}cat", "Concat(1)", 0, 0, width * 5, 0)
        edges += [(h, out) for h in hidden[2:] if h not in used]
        prev = [prev[1], out]
    head = layer("head", "Linear(160, 10)", 0.1, 0.2, 40, 6440)
    edges.append((prev[1], head))
    return "\n".join(lines + [f"\t{a} -- {b}" for a, b in edges])
