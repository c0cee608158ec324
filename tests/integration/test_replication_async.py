"""Asynchronous replication (executor/ft/replication.py, "Asynchronous replication"): a
replication point is snapshotted at the commit point, completed and sent in the
background beside the next step's compute, and counts only once acknowledged.

In one process, no launcher: the snapshot against clones taken at the commit point (an
independent oracle), the buffers' turn by hand, and the background half of a point over
two real gloo ranks (threads of this process, one ``ProcessGroupGloo`` each on a shared
``HashStore``): a message that arrives after its generation died changes no copy and is
acknowledged under the dead generation's prefix only.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from edgepipe.executor.ft.control import GenerationAborted
from edgepipe.executor.ft.replication import (
    REPLICA_TAG,
    Background,
    Buffers,
    Copies,
    Snapshot,
    StaleGeneration,
    point_work,
    receive_body,
    receive_header,
)
from torch import nn


def bn_model() -> tuple[nn.Sequential, torch.optim.Optimizer]:
    """Two blocks, the first with batch-norm running statistics; one SGD+momentum step
    taken (so the optimizer has state)."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)), nn.Linear(4, 2))
    opt = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9, foreach=False)
    module(torch.randn(5, 3)).pow(2).sum().backward()
    opt.step()
    return module, opt


def clones(module: nn.Sequential, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Every weight, buffer and momentum of ``module``, cloned (the oracle)."""
    out = {f"w/{k}": v.detach().clone() for k, v in module.state_dict().items()}
    for name, p in module.named_parameters():
        out[f"o/{name}"] = opt.state[p]["momentum_buffer"].clone()
    return out


def as_clones(states) -> dict[str, torch.Tensor]:
    out = {}
    for i, s in states.items():
        out.update({f"w/{i}.{k}": v for k, v in s.weights.items()})
        out.update({f"o/{i}.{k}": slots["momentum_buffer"] for k, slots in s.optim.items()})
    return out


def test_a_snapshot_holds_the_state_at_its_point_though_the_next_forward_moves_the_buffers():
    module, opt = bn_model()
    want = clones(module, opt)
    snapshot = Snapshot.take(module, 0, opt, 1, Buffers())
    # the next step's forward runs before the background completes the snapshot: it
    # changes the running statistics (and their counter), never the parameters or the
    # optimizer state (the optimizer step waits for the point to be durable)
    module(torch.randn(5, 3) * 3 + 1)
    assert not torch.equal(module[0][1].running_mean, want["w/0.1.running_mean"])
    states = snapshot.complete()
    got = as_clones(states)
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key
    assert {s.step for s in states.values()} == {1}
    # the copy is the snapshot's own: a later optimizer step leaves it as it was
    module(torch.randn(5, 3)).pow(2).sum().backward()
    opt.step()
    assert not torch.equal(module[1].weight, want["w/1.weight"])
    assert torch.equal(as_clones(states)["w/1.weight"], want["w/1.weight"])


def test_buffers_come_in_two_sets_per_stream_and_layout_taken_in_turn():
    module, opt = bn_model()
    buffers = Buffers()
    header = Snapshot.take(module, 0, opt, 1, Buffers()).header
    a, b, c = (buffers.take("own", header) for _ in range(3))
    assert a is not b and c is a  # point n's set serves again at point n + 2
    assert buffers.take(("held", 0), header) is not a  # another stream, its own sets
    # a layout of other sizes (no optimizer state yet: the start of a run) has its own
    fresh = nn.Sequential(nn.Linear(3, 4))
    other = Snapshot.take(fresh, 0, torch.optim.SGD(fresh.parameters(), lr=0.1), 0,
                          Buffers()).header
    assert other.sizes != header.sizes and buffers.take("own", other) not in (a, b)


def pair(store: dist.Store, rank: int) -> dist.ProcessGroup:
    return dist.ProcessGroupGloo(dist.PrefixStore("gen1/repl", store), rank, 2,
                                 timedelta(seconds=30))


def test_a_late_message_of_a_dead_generation_changes_no_copy_and_counts_nowhere():
    store = dist.HashStore()
    groups: dict[int, dist.ProcessGroup] = {}
    threads = [threading.Thread(target=lambda r=r: groups.__setitem__(r, pair(store, r)))
               for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    dead: dict[int, set[int]] = {0: set(), 1: set()}  # each rank's own view
    copies = {r: Copies(lambda g, r=r: g not in dead[r]) for r in (0, 1)}
    gen1, gen2 = dist.PrefixStore("gen1", store), dist.PrefixStore("gen2", store)
    torch.manual_seed(1)
    # 2 x 4 MiB of weights and momentum: more than a socket buffer takes unreceived
    module = nn.Sequential(nn.Linear(1024, 1024, bias=False))
    opt = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9, foreach=False)
    own, held = Buffers(), Buffers()
    release = threading.Event()

    def holder(n: int, wait: threading.Event | None) -> None:
        if wait is not None:
            wait.wait(30)
        header = receive_header(groups[1], 0, REPLICA_TAG)
        got = receive_body(groups[1], 0, REPLICA_TAG, header, held.take("held", header))
        try:
            copies[1].add(1, got)
        except StaleGeneration:
            return
        gen1.set(f"repl/{n}/1", "1")

    def point(n: int) -> Background:
        module[0].weight.grad = torch.full_like(module[0].weight, float(n))
        opt.step()
        snapshot = Snapshot.take(module, 0, opt, n, own)
        return Background(f"point-{n}", point_work(
            copies[0], 1, snapshot, groups[0], [1], lambda: {}, lambda: None,
            lambda: gen1.set(f"repl/{n}/0", "1")))

    def alive() -> None:
        if 1 in dead[0]:
            raise GenerationAborted(1, "test")

    # point 1 goes through: both ranks acknowledge, both keep it
    receiver = threading.Thread(target=holder, args=(1, None))
    receiver.start()
    point(1).join(alive)
    receiver.join(30)
    assert gen1.check(["repl/1/0", "repl/1/1"])
    for r in (0, 1):
        copies[r].promote(1, 1)
    at_1 = {k: v.clone() for k, v in copies[1].at(1)[0].weights.items()}

    # point 2: the holder does not receive yet, so the owner's send stays in flight
    receiver = threading.Thread(target=holder, args=(2, release))
    receiver.start()
    background = point(2)
    time.sleep(0.5)
    assert not gen1.check(["repl/2/0"])  # blocked in the send, not acknowledged
    # the generation is aborted on both ranks (under the copies' locks, as the workers
    # do); the training thread waiting for the point stops at once
    for r in (0, 1):
        with copies[r].lock:
            dead[r].add(1)
    with pytest.raises(GenerationAborted):
        background.join(alive)
    # now the late message arrives: the holder refuses to keep it
    release.set()
    receiver.join(30)
    deadline = time.monotonic() + 30
    while not gen1.check(["repl/2/0"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gen1.check(["repl/2/0"]) and not gen1.check(["repl/2/1"])
    # the next generation sees neither acknowledgement; the holder's copy of point 1 is
    # bit for bit what it received, and it has nothing of point 2
    assert not gen2.check(["repl/2/0"]) and not gen2.check(["repl/2/1"])
    assert copies[1].at(2) == {}
    for k, v in copies[1].at(1)[0].weights.items():
        assert torch.equal(v, at_1[k])
    assert not torch.equal(module[0].weight, at_1["weight"])
