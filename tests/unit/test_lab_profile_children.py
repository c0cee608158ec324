"""Specification of who computes in a lab profile (executor/lab/profiling.py;
docs/lab.md, "Lab profiles", "At the same time"): one child per device of the cluster,
all at once, as in a lab run of every device; the first device of each type measures
the type at slowdown 1 under the type's smallest memory limit, every other device
computes beside it under its own run confinement (``keep_busy``: each block's forward
and backward after a pace point, until told to stop)."""

from __future__ import annotations

import json
import multiprocessing as mp
import signal
from pathlib import Path

import torch
from edgepipe.executor.lab import profiling
from edgepipe.executor.lab.cgroups import PROCESS_BASELINE_BYTES, Confinement
from edgepipe.executor.lab.profiling import Child, Job, child_main, keep_busy, profile_children
from edgepipe.executor.profiling.noise import NoisePolicy
from edgepipe.executor.profiling.sources import ModelSource
from edgepipe.planner.inputs.cluster import Cluster
from torch import nn

GIB = 2**30


def test_every_device_computes_and_the_first_of_each_type_measures(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({
        "schema_version": 1, "kind": "edgepipe.cluster", "name": "three",
        "devices": [{"id": "o0", "type": "jetson-orin-nano"},
                    {"id": "t0", "type": "jetson-tx2", "memory_bytes": 4 * GIB},
                    {"id": "t1", "type": "jetson-tx2", "slowdown": 2}],
        "network": {"bandwidth_mbps": 100, "latency_ms": 0, "shared_medium": False},
    }))
    # speeds 576, 266.24 and 266.24 / 2 GFLOP/s: half of 2 cores over their sum 975.36
    # gives k = 1 / 975.36 core per GFLOP/s (under 1 / 576), quotas rounded down to 1e-4
    # core: the Orin 0.5905, a TX2 at slowdown 1 0.2729 (the type's), t1 0.1364 (its
    # own); memory: 0.7 of the device's (8 GiB unless said) plus the process baseline,
    # the TX2 type's the smaller of its devices' (t0's 4 GiB)
    children = profile_children(Cluster.load(path), 0.5, cores=2)
    assert children == [
        Child("o0", "jetson-orin-nano",
              Confinement(0.5905, int(8 * GIB * 0.7) + PROCESS_BASELINE_BYTES, True), True),
        Child("t0", "jetson-tx2",
              Confinement(0.2729, int(4 * GIB * 0.7) + PROCESS_BASELINE_BYTES, True), True),
        Child("t1", "jetson-tx2",
              Confinement(0.1364, int(8 * GIB * 0.7) + PROCESS_BASELINE_BYTES, True), False),
    ]
    unpaced = profile_children(Cluster.load(path), 0.5, pace=False, cores=2)
    assert [c.confinement.paced for c in unpaced] == [False, False, False]


def test_a_busy_child_trains_block_after_block_each_after_a_pace_point_until_stopped() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    log: list[str] = []
    for i, block in enumerate(model):
        block.register_forward_hook(
            lambda _m, args, _out, i=i: log.append(f"F{i}@{len(args[0])}"))
    checks = 0

    def stop() -> bool:
        nonlocal checks
        checks += 1
        return checks == 5

    keep_busy(model, lambda b: torch.zeros(b, 3), [1, 2], lambda: log.append("pace"), stop)
    # the block-input pass (no pace point) at each batch size, then blocks 0-2 at batch
    # 1 and block 0 at batch 2, each after a pace point; the fifth check stops it
    assert log == ["F0@1", "F1@1", "F2@1", "F0@2", "F1@2", "F2@2",
                   "pace", "F0@1", "pace", "F1@1", "pace", "F2@1", "pace", "F0@2"]
    first, last = model[0], model[2]
    assert isinstance(first, nn.Linear) and isinstance(last, nn.Linear)
    # backward from each output's sum: the first block ran twice (batches 1 and 2)
    assert first.weight.grad is not None and last.weight.grad is not None
    assert torch.equal(last.bias.grad, torch.ones(2))


def test_a_busy_childs_torch_error_is_sent_as_one_line(tmp_path: Path, monkeypatch) -> None:
    # a model whose BatchNorm cannot train at batch 1 (torch raises ValueError): the
    # non-measuring child sends ("ready",), then the error as one line, not a traceback
    (tmp_path / "bn_at_one.py").write_text(
        "import torch\nfrom torch import nn\n\n\n"
        "def model():\n    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))\n\n\n"
        "def batch(b):\n    return torch.zeros(b, 3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    job = Job(ModelSource("bn_at_one:model", input="bn_at_one:batch"), "jetson-tx2", (1,),
              warmup=0, repeats=1, policy=NoisePolicy())
    parent, child = mp.Pipe()
    parent.send("go")
    parent.send("start")
    sigint, threads = signal.getsignal(signal.SIGINT), torch.get_num_threads()
    try:  # in this process (what it sets of the process is restored): it must not raise
        child_main(child, job, measures=False)
    finally:
        signal.signal(signal.SIGINT, sigint)
        torch.set_num_threads(threads)
    assert parent.recv() == ("ready",)
    kind, line = parent.recv()
    assert kind == "error"
    assert line.startswith("the model failed on this device: Expected more than 1 value")
    assert "\n" not in line


def test_a_child_that_never_gets_ready_is_blamed_not_the_measuring_one_waiting_for_it(
    monkeypatch,
) -> None:
    # two children over real pipes: the measuring tx2-0 says ready, the busy tx2-1 never
    # does (a hung build), so the start never comes; past the time-out tx2-1 is named
    monkeypatch.setattr(profiling, "CHILD_TIMEOUT_S", 0.3)
    conf = Confinement(0.5, GIB, True)
    children = [Child("tx2-0", "jetson-tx2", conf, True),
                Child("tx2-1", "jetson-tx2", conf, False)]
    pipes = [mp.Pipe() for _ in children]
    pipes[0][1].send(("ready",))
    try:
        failure = profiling._converse(children, [ours for ours, _ in pipes], None, {})
    finally:
        for ours, theirs in pipes:
            ours.close()
            theirs.close()
    assert failure == (1, "did not build its model within 0 s")
