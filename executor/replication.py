"""Block state: copies of committed blocks that survive a lost device, and their transfers.

A **block state** is one model block's weights (its ``state_dict``) and the optimizer
state of each of its parameters, after ``step`` optimizer steps; it is plan-independent
(keyed by block index), so a copy taken under one plan installs into a stage of any
other plan (reference/fault-tolerance.md §2 lesson 4: parameters *and* optimizer state).

Where the copies live (issue 8 item 3; :mod:`planner.replicas` decides the holders):

* every rank keeps the states of its own blocks at the last **durable** step (its
  "pre-step snapshot": the live module moves on, the copy stays), so a rollback to that
  step is always possible;
* the ring replica holder of a one-device stage keeps that stage's states at the same
  step, received over the generation's process group after each replication point;
* a data-parallel stage needs no transfer: every member's own copy is a replica.

:class:`Copies` keeps the durable set and the set being built for the next replication
point (``pending``); :meth:`Copies.at` answers "every block this rank holds at step d"
for a recovery from d. All its state changes are made under its lock and refused once
the generation that makes them is dead, so a training thread that a recovery abandoned
(blocked in a gloo op, torch-and-solvers.md P6) can never change what the next
generation restores from.

Transfers: a set of block states travels as one ``torch.save`` byte buffer (a uint8
tensor) after its length (an int64 tensor), point to point on the generation's raw
process group; sizes are O(weights + optimizer state of the blocks).
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

#: tags of replica and migration transfers: above every activation / gradient tag
#: (2 m + 1) and the emulation's header tags (2 m + 1 + 2**20)
REPLICA_TAG = 1 << 22
MIGRATION_TAG = REPLICA_TAG + 2


@dataclass(frozen=True)
class BlockState:
    """Block ``index`` after ``step`` optimizer steps: ``weights`` (its ``state_dict``)
    and ``optim`` (parameter name within the block -> that parameter's optimizer
    state; parameters without state are absent)."""

    index: int
    step: int
    weights: dict[str, torch.Tensor]
    optim: dict[str, dict[str, Any]]


def _copy(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def capture(
    module: nn.Sequential, first: int, optimizer: torch.optim.Optimizer, step: int
) -> dict[int, BlockState]:
    """Cloned states of the blocks of ``module`` (block ``first + k`` is its ``k``-th
    child) after ``step`` steps. O(weights + optimizer state)."""
    out = {}
    for k, block in enumerate(module.children()):
        weights = {name: _copy(v) for name, v in block.state_dict().items()}
        optim = {
            name: {key: _copy(v) for key, v in optimizer.state[p].items()}
            for name, p in block.named_parameters()
            if optimizer.state.get(p)
        }
        out[first + k] = BlockState(first + k, step, weights, optim)
    return out


def install(
    module: nn.Sequential, first: int, optimizer: torch.optim.Optimizer,
    states: Mapping[int, BlockState],
) -> None:
    """Load ``states`` (one per block of ``module``) into the module and its fresh
    optimizer; the states are copied, never shared, so they can serve again."""
    for k, block in enumerate(module.children()):
        state = states[first + k]
        block.load_state_dict(state.weights)
        params = dict(block.named_parameters())
        for name, slots in state.optim.items():
            optimizer.state[params[name]] = {key: _copy(v) for key, v in slots.items()}


def pack(states: Mapping[int, BlockState]) -> torch.Tensor:
    """``states`` as one uint8 tensor (``torch.save`` bytes)."""
    buf = io.BytesIO()
    torch.save({i: (s.step, s.weights, s.optim) for i, s in states.items()}, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def unpack(data: torch.Tensor) -> dict[int, BlockState]:
    raw = torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True)
    return {i: BlockState(i, step, w, o) for i, (step, w, o) in raw.items()}


class Outgoing:
    """Sends in flight (the tensors stay referenced until :meth:`wait`)."""

    def __init__(self) -> None:
        self._works: list[tuple[Any, tuple[torch.Tensor, ...]]] = []

    def send(self, pg: dist.ProcessGroup, dst: int, states: Mapping[int, BlockState],
             tag: int) -> int:
        """Post the transfer of ``states`` to ``dst``; returns its size in bytes."""
        data = pack(states)
        size = torch.tensor([data.numel()], dtype=torch.int64)
        self._works.append((pg.send([size], dst, tag), (size,)))
        self._works.append((pg.send([data], dst, tag + 1), (data,)))
        return int(data.numel())

    def wait(self) -> None:
        for work, _ in self._works:
            work.wait()
        self._works.clear()


def receive(pg: dist.ProcessGroup, src: int, tag: int) -> dict[int, BlockState]:
    """Receive one transfer posted by :meth:`Outgoing.send` on ``src``."""
    size = torch.empty(1, dtype=torch.int64)
    pg.recv([size], src, tag).wait()
    data = torch.empty(int(size[0]), dtype=torch.uint8)
    pg.recv([data], src, tag + 1).wait()
    return unpack(data)


class StaleGeneration(Exception):
    """A dead generation's thread tried to change the copies (it stops here)."""


class Copies:
    """The block states a rank holds for rollback and recovery (module docstring).

    State: ``durable`` (block -> state at ``durable_step``, the last step this rank
    knows every replica of) and ``pending`` (the states taken or received at the
    replication point in progress, ``pending_step``). ``alive(g)`` says whether
    generation ``g`` may still change them.
    """

    def __init__(self, alive: Callable[[int], bool]) -> None:
        self.lock = threading.Lock()
        self._alive = alive
        self.durable: dict[int, BlockState] = {}
        self.durable_step = -1
        self.pending: dict[int, BlockState] = {}
        self.pending_step = -1

    def _guard(self, generation: int) -> None:
        if not self._alive(generation):
            raise StaleGeneration(f"generation {generation} is dead")

    def add(self, generation: int, states: Mapping[int, BlockState]) -> None:
        """Keep ``states`` (all of one step) as part of the replication point of their
        step."""
        steps = {s.step for s in states.values()}
        if not steps:
            return
        (step,) = steps
        with self.lock:
            self._guard(generation)
            if step == self.durable_step:
                self.durable.update(states)
                return
            if step != self.pending_step:
                self.pending, self.pending_step = {}, step
            self.pending.update(states)

    def promote(self, generation: int, step: int) -> None:
        """Step ``step`` is durable (every replica of it exists): its pending states
        become the durable set, and the older durable states are dropped."""
        with self.lock:
            self._guard(generation)
            if step == self.pending_step and step > self.durable_step:
                self.durable, self.durable_step = self.pending, step
                self.pending, self.pending_step = {}, -1

    def at(self, step: int) -> dict[int, BlockState]:
        """Every block state this rank holds at ``step`` (durable or pending)."""
        with self.lock:
            if step == self.durable_step:
                return dict(self.durable)
            if step == self.pending_step:
                return dict(self.pending)
            return {}
