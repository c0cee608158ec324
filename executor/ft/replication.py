"""Block state: copies of committed blocks that survive a lost device, and their transfers.

A **block state** is one model block's weights (its ``state_dict``) and the optimizer
state of each of its parameters, after ``step`` optimizer steps; it is plan-independent
(keyed by block index), so a copy taken under one plan installs into a stage of any
other plan (reference/fault-tolerance.md §2 lesson 4: parameters *and* optimizer state).

Where the copies live (issue 8 item 3; :mod:`planner.replan.replicas` decides the holders):

* every rank keeps the states of its own blocks at the last **durable** step (its
  "pre-step snapshot": the live module moves on, the copy stays), so a rollback to that
  step is always possible;
* the ring replica holder of a one-device stage keeps that stage's states at the same
  step, received over the generation's replica process group at each replication point;
* a data-parallel stage needs no transfer: every member's own copy is a replica.

:class:`Copies` keeps the durable set and the set being built for the next replication
point (``pending``); :meth:`Copies.at` answers "every block this rank holds at step d"
for a recovery from d. All its state changes are made under its lock and refused once
the generation that makes them is dead, so a training thread that a recovery abandoned
(blocked in a gloo op, torch-and-solvers.md P6) can never change what the next
generation restores from.

**Asynchronous replication** (docs/fault-tolerance.md, "Recovery"). A replication
point n (steps applied) is taken in two halves. At the commit point, right after the
optimizer step of step n - 1, the training thread takes a :class:`Snapshot`: the layout
of the stage's state in flat buffers (:class:`Buffers`) and a copy of what the next
step changes before its own optimizer step, the module's buffers (batch-norm running
statistics); O(buffers). The rest runs in a :class:`Background` thread beside step n's
compute (:func:`point_work`): copy the parameters and optimizer state (nothing changes
them before the optimizer step of step n), keep the copy, send it to the ring holder on
the generation's replica process group (its own connections, beside the activations'
group; torch-and-solvers.md P7: a failed op poisons only its group), receive the
replicas this rank holds, then acknowledge ``repl/<n>/<rank>``. The rank applies step
n only once its own copy is complete (``copied``), so no optimizer step ever runs while
a snapshot is being completed; it votes the step whose commit makes the next point n'
only after the whole background half is done (:meth:`Background.join`, which stops at
once when the generation is aborted), and the coordinator commits that step only once
point n is durable (every member, standbys included, acknowledged it;
:func:`executor.ft.recovery.commit_blocked`). So point n travels beside the steps n ..
n' - 1 (docs/fault-tolerance.md, "Points in flight"), and a failure before it is
durable replays from the point before it, which every rank still holds (``durable``).

Transfers: a set of block states travels as its tensors' bytes, not serialised: an
int64 tensor with the length of a small header (:class:`Header`: the layout, by
``torch.save``), the header, then one flat tensor per dtype (:func:`post`,
:func:`receive_header`, :func:`receive_body`), point to point; sizes are O(weights +
optimizer state of the blocks). Replicas go into :class:`Buffers` reused every other
point (no allocation, no page faults on the hot path); a migration's transfer
(:class:`Outgoing`, :func:`receive`) into fresh ones.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
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


#: the wire format of a transfer (:func:`post`, :func:`receive_header`,
#: :func:`receive_body`), one tag for all its messages (gloo keeps their order per pair
#: and tag): an int64 tensor holding the header's length, the header (``torch.save`` of
#: :class:`Header`'s fields: small, O(tensors)), then one flat tensor per dtype in the
#: header's order, holding every tensor of the states back to back (no serialisation:
#: the bytes of the tensors themselves)
@dataclass(frozen=True)
class Header:
    """The layout of a set of block states of one ``step`` in flat buffers: ``slots``
    (block, ``"w"`` weights | ``"o"`` optimizer state, name, optimizer key or ``""``,
    dtype name, shape, offset in that dtype's buffer), ``values`` (the non-tensor
    optimizer slots: block, parameter name, key, value), ``sizes`` (dtype name ->
    elements of its buffer, in buffer order) and ``blocks`` (every block of the set,
    also one with no tensor at all)."""

    step: int
    slots: tuple[tuple[int, str, str, str, str, tuple[int, ...], int], ...]
    values: tuple[tuple[int, str, str, Any], ...]
    sizes: tuple[tuple[str, int], ...]
    blocks: tuple[int, ...]

    def to_tensor(self) -> torch.Tensor:
        buf = io.BytesIO()
        torch.save([self.step, list(self.slots), list(self.values), list(self.sizes),
                    list(self.blocks)], buf)
        return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)

    @classmethod
    def from_tensor(cls, data: torch.Tensor) -> Header:
        step, slots, values, sizes, blocks = torch.load(
            io.BytesIO(data.numpy().tobytes()), weights_only=True)
        return cls(step, tuple((b, sec, n, k, d, tuple(sh), o) for b, sec, n, k, d, sh, o
                               in slots),
                   tuple(tuple(v) for v in values), tuple(tuple(z) for z in sizes),
                   tuple(blocks))


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."))
    assert isinstance(dtype, torch.dtype)
    return dtype


def _layout(step: int, entries: list[tuple[int, str, str, str, Any]],
            blocks: Iterable[int]) -> tuple[Header, list[torch.Tensor]]:
    """The :class:`Header` of ``entries`` (block, section, name, key, value: a tensor or
    not) and their tensors in slot order. O(entries)."""
    slots, values, tensors = [], [], []
    sizes: dict[str, int] = {}
    for block, section, name, key, value in entries:
        if not isinstance(value, torch.Tensor):
            values.append((block, name, key, value))
            continue
        dtype = str(value.dtype)
        slots.append((block, section, name, key, dtype, tuple(value.shape),
                      sizes.get(dtype, 0)))
        sizes[dtype] = sizes.get(dtype, 0) + value.numel()
        tensors.append(value)
    return Header(step, tuple(slots), tuple(values), tuple(sizes.items()),
                  tuple(sorted(set(blocks)))), tensors


def _entries(states: Mapping[int, BlockState]) -> list[tuple[int, str, str, str, Any]]:
    out: list[tuple[int, str, str, str, Any]] = []
    for i, s in states.items():
        out += [(i, "w", name, "", v) for name, v in s.weights.items()]
        out += [(i, "o", name, key, v) for name, slots in s.optim.items()
                for key, v in slots.items()]
    return out


def empty_buffers(header: Header) -> dict[str, torch.Tensor]:
    """Uninitialised flat buffers for ``header`` (one per dtype)."""
    return {name: torch.empty(n, dtype=_dtype(name)) for name, n in header.sizes}


def flatten(states: Mapping[int, BlockState]) -> tuple[Header, dict[str, torch.Tensor]]:
    """``states`` (all of one step) copied into fresh flat buffers. O(their size)."""
    steps = {s.step for s in states.values()}
    header, tensors = _layout(steps.pop() if steps else -1, _entries(states), states)
    flats = empty_buffers(header)
    _fill(header, flats, tensors, range(len(tensors)))
    return header, flats


def _fill(header: Header, flats: Mapping[str, torch.Tensor], tensors: list[torch.Tensor],
          which: Iterable[int]) -> None:
    """Copy the tensors of slots ``which`` into their places in ``flats``."""
    for j in which:
        _, _, _, _, dtype, _, offset = header.slots[j]
        value = tensors[j]
        flats[dtype][offset : offset + value.numel()].copy_(value.detach().reshape(-1))


def unflatten(header: Header, flats: Mapping[str, torch.Tensor]) -> dict[int, BlockState]:
    """The block states laid out in ``flats`` (views into them: no copy; the buffers
    must not be written again while the states serve). O(slots)."""
    weights: dict[int, dict[str, torch.Tensor]] = {i: {} for i in header.blocks}
    optim: dict[int, dict[str, dict[str, Any]]] = {i: {} for i in header.blocks}
    for block, section, name, key, dtype, shape, offset in header.slots:
        n = 1
        for d in shape:
            n *= d
        view = flats[dtype][offset : offset + n].view(shape)
        if section == "w":
            weights[block][name] = view
        else:
            optim[block].setdefault(name, {})[key] = view
    for block, name, key, value in header.values:
        optim[block].setdefault(name, {})[key] = value
    return {i: BlockState(i, header.step, weights[i], optim[i]) for i in header.blocks}


class Buffers:
    """Flat buffers handed out in turn, two per key (double buffering), so that a hot
    replication path allocates (and page-faults) nothing after its first two points.

    A set handed out for point n is handed out again for the point two points later;
    by then point n is no longer needed by anyone: a point is taken and posted only
    after the commit of the step before it, which implies the point before it is
    durable (the rule of :func:`executor.ft.recovery.commit_blocked`, also with points
    travelling beside several steps), so the point before that one is neither durable
    nor pending anywhere and its sends were joined (module docstring, "Asynchronous
    replication"). Keys name a stream of points (own state, or a replica
    from one owner); one instance belongs to one generation's run. The next generation
    does read a dead generation's buffers (its restore reads the durable point's copies,
    views into them), and that is safe because a thread still running has not
    acknowledged its point, so that point is neither durable nor the restore point, and
    it writes only the set of its own point: the other set, holding the durable point,
    is written by nobody. A change to the turn of the sets or to the order of
    acknowledgement must keep that."""

    def __init__(self) -> None:
        self._sets: dict[tuple, list[dict[str, torch.Tensor]]] = {}
        self._turn: dict[tuple, int] = {}

    def take(self, key: Any, header: Header) -> dict[str, torch.Tensor]:
        k = (key, header.sizes)
        pair = self._sets.setdefault(k, [])
        turn = self._turn.get(k, 0)
        self._turn[k] = 1 - turn
        if len(pair) <= turn:
            pair.append(empty_buffers(header))
        return pair[turn]


class Snapshot:
    """The state of a stage at one replication point, taken cheaply at the commit point
    and completed in the background (:class:`Background`, :func:`point_work`).

    :meth:`take` (the training thread, right after the optimizer step of the point)
    lays the state out in flat buffers from ``buffers`` and copies only what the next
    step changes before its own optimizer step: the module's buffers (batch-norm
    running statistics change in every forward). :meth:`complete` (the background
    thread) copies the parameters and the optimizer state, which nothing changes until
    the next optimizer step, and that step waits for :meth:`complete` (``copied`` of
    :func:`point_work`). O(buffers) then O(weights + optimizer state)."""

    def __init__(self, header: Header, flats: dict[str, torch.Tensor],
                 tensors: list[torch.Tensor], late: list[int]) -> None:
        self.header, self.flats, self._tensors, self._late = header, flats, tensors, late

    @classmethod
    def take(cls, module: nn.Sequential, first: int, optimizer: torch.optim.Optimizer,
             step: int, buffers: Buffers) -> Snapshot:
        entries: list[tuple[int, str, str, str, Any]] = []
        early_names: set[tuple[int, str]] = set()
        children = list(module.children())
        for k, block in enumerate(children):
            params = {id(p) for p in block.parameters()}
            for name, v in block.state_dict(keep_vars=True).items():
                entries.append((first + k, "w", name, "", v))
                if id(v) not in params:
                    early_names.add((first + k, name))
            entries += [(first + k, "o", name, key, v)
                        for name, p in block.named_parameters() if optimizer.state.get(p)
                        for key, v in optimizer.state[p].items()]
        header, tensors = _layout(step, entries, range(first, first + len(children)))
        flats = buffers.take("own", header)
        early = [j for j, slot in enumerate(header.slots)
                 if slot[1] == "w" and (slot[0], slot[2]) in early_names]
        _fill(header, flats, tensors, early)
        late = sorted(set(range(len(tensors))) - set(early))
        return cls(header, flats, tensors, late)

    def complete(self) -> dict[int, BlockState]:
        """Copy the rest and return the states (views into the buffers)."""
        _fill(self.header, self.flats, self._tensors, self._late)
        self._tensors = []
        return unflatten(self.header, self.flats)


def post(pg: dist.ProcessGroup, dst: int, header: Header, flats: Mapping[str, torch.Tensor],
         tag: int) -> list[tuple[Any, torch.Tensor]]:
    """Post the transfer (wire format above) of ``header`` and ``flats`` to ``dst``;
    returns the works with the tensors they send (keep both until waited)."""
    data = header.to_tensor()
    size = torch.tensor([data.numel()], dtype=torch.int64)
    return [(pg.send([t], dst, tag), t) for t in (size, data, *(flats[d] for d, _ in
                                                                header.sizes))]


def receive_header(pg: dist.ProcessGroup, src: int, tag: int) -> Header:
    """The header of the next transfer from ``src`` (posted by :func:`post`)."""
    size = torch.empty(1, dtype=torch.int64)
    pg.recv([size], src, tag).wait()
    data = torch.empty(int(size[0]), dtype=torch.uint8)
    pg.recv([data], src, tag).wait()
    return Header.from_tensor(data)


def receive_body(pg: dist.ProcessGroup, src: int, tag: int, header: Header,
                 flats: dict[str, torch.Tensor] | None = None) -> dict[int, BlockState]:
    """The states of the transfer whose header :func:`receive_header` returned,
    received into ``flats`` (from :meth:`Buffers.take`; default fresh buffers)."""
    flats = flats if flats is not None else empty_buffers(header)
    for dtype, _ in header.sizes:
        pg.recv([flats[dtype]], src, tag).wait()
    return unflatten(header, flats)


def receive(pg: dist.ProcessGroup, src: int, tag: int) -> dict[int, BlockState]:
    """Receive one transfer posted by :meth:`Outgoing.send` on ``src``."""
    return receive_body(pg, src, tag, receive_header(pg, src, tag))


class Outgoing:
    """Sends in flight (the tensors stay referenced until :meth:`wait`)."""

    def __init__(self) -> None:
        self._works: list[tuple[Any, torch.Tensor]] = []

    def send(self, pg: dist.ProcessGroup, dst: int, states: Mapping[int, BlockState],
             tag: int) -> int:
        """Post the transfer of ``states`` (copied into flat buffers) to ``dst``;
        returns its size in bytes."""
        return self.send_flat(pg, dst, *flatten(states), tag)

    def send_flat(self, pg: dist.ProcessGroup, dst: int, header: Header,
                  flats: Mapping[str, torch.Tensor], tag: int) -> int:
        """Post the transfer of states already in flat buffers; returns its size."""
        self._works += post(pg, dst, header, flats, tag)
        return sum(t.numel() * t.element_size() for t in flats.values())

    def wait(self) -> None:
        for work, _ in self._works:
            work.wait()
        self._works.clear()


class Background:
    """The background half of one replication point: ``work`` in a daemon thread
    (:meth:`join` waits for it). A thread that a recovery abandons (blocked in a gloo
    op, torch-and-solvers.md P6) changes nothing: its writes to the copies are refused
    (:class:`Copies`) and its store keys are under a dead generation's prefix."""

    def __init__(self, name: str, work: Callable[[], None]) -> None:
        self.seconds = 0.0
        #: wall clock (``time.time()``) at which the work ended; None while it runs
        self.finished_at: float | None = None
        self.error: BaseException | None = None
        self._done = threading.Event()
        self._work = work
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        start = time.perf_counter()
        try:
            self._work()
        except BaseException as exc:  # re-raised by join in the training thread
            self.error = exc
        finally:
            self.seconds = time.perf_counter() - start
            self.finished_at = time.time()
            self._done.set()

    def join(self, check: Callable[[], None], poll_s: float = 0.005,
             until: threading.Event | None = None) -> float:
        """Wait until the work is done (or, given ``until``, until that event is set,
        e.g. :func:`point_work`'s ``copied``), calling ``check`` (which raises when the
        generation is aborted) every ``poll_s``; re-raise the work's error once it has
        ended. Returns the seconds waited."""
        start = time.perf_counter()
        while not (until is not None and until.is_set()) and not self._done.wait(poll_s):
            check()
        if self._done.is_set() and self.error is not None:
            raise self.error
        return time.perf_counter() - start


def point_work(
    copies: Copies, generation: int, snapshot: Snapshot, pg: dist.ProcessGroup,
    holders: Sequence[int], receive_held: Callable[[], Mapping[int, BlockState]],
    fault: Callable[[], None], acknowledge: Callable[[], None], *,
    announce: Callable[[], None] = lambda: None,
    pace: Callable[[int, int], None] = lambda holder, nbytes: None,
    copied: threading.Event | None = None,
) -> Callable[[], None]:
    """The background half of a replication point (for :class:`Background`), in this
    order: complete ``snapshot`` and keep it (the rank's own copy), set ``copied`` (from
    then on the training thread may apply its next optimizer step), ``announce()`` (the
    owner's ``posted`` key: a holder posts its receive only once it is there, so that a
    receive never waits out its group's per-operation timeout for a point the owner has
    not made yet), post it to each of ``holders`` (ranks of ``pg``), ``fault()`` (the
    fault point ``replication``: sends posted, nothing acknowledged), keep what
    ``receive_held()`` returns (the replicas this rank holds), wait for the sends,
    ``pace(holder, bytes)`` for each holder (an emulated run sleeps there until the
    transfer would have crossed the modelled link, executor/core/emulation.py),
    ``acknowledge()``. Every change of ``copies`` is refused once ``generation`` is
    dead, so a thread that outlives its generation (a late message) changes nothing;
    its acknowledgement goes to that generation's keys, which no later generation
    reads."""

    def work() -> None:
        copies.add(generation, snapshot.complete())
        if copied is not None:
            copied.set()
        out = Outgoing()
        if holders:
            announce()
        sizes = [out.send_flat(pg, holder, snapshot.header, snapshot.flats, REPLICA_TAG)
                 for holder in holders]
        fault()
        copies.add(generation, receive_held())
        out.wait()
        for holder, nbytes in zip(holders, sizes, strict=True):
            pace(holder, nbytes)
        acknowledge()

    return work


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
