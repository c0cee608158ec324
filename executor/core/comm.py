"""Point-to-point transfers between stages, re-sliced by sample interval.

Every tensor a rank sends or receives goes through a :class:`Transport` (the hook the
heterogeneity emulation replaces to add per-link bandwidth, latency and a shared
channel). :class:`StageLinks` turns a stage boundary into transfers: for micro-batch
``m``, device ``i`` of stage ``p`` sends stage ``p+1``'s device ``j`` exactly the rows
both own (:func:`executor.core.layout.overlaps`), and gradients go back over the same pieces.
The receiver concatenates its pieces in position order.

Tags: ``2 m`` for the activations of micro-batch ``m``, ``2 m + 1`` for its gradients, so
messages of different micro-batches and directions between one pair never match each
other (gloo matches a recv to a send by peer and tag).

**Transfer times** (for ``edgepipe report``'s per-link rows, docs/executor.md): every
piece is stamped with the wall clock (``time.time()``, one machine's processes share
it): a send when it is posted, ``["send", peer, tag, posted_at]``; a receive when the
receiver begins to wait for it, when its wait returns and when it was posted,
``["recv", peer, tag, waited_at, done_at, posted_at]`` (the runtime posts receives
ahead of their action, :mod:`executor.core.receives`, so ``posted_at <= waited_at``;
gloo sends a piece only once both sides posted it). A gloo receive cannot say when its
data arrived without being waited for (torch's ``RecvWork`` has no completion flag), so
``done_at`` is the delivery when the receiver was waiting, and an upper bound on it
when the data was in before the wait began. :meth:`StageLinks.take_transfers` hands a
step's stamps over (the runtime puts them in its step record). Cost: one clock read per
piece, post and end of wait; no synchronisation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist
from edgepipe.executor.core.layout import Overlap, RankLayout, overlaps


class Work(Protocol):
    def wait(self) -> object: ...


def _posted(work: Work | None) -> Work:
    """The handle of a transfer on the default group; torch returns ``None`` instead when
    this rank is not in that group, which after ``init_process_group`` is a bug."""
    if work is None:
        raise RuntimeError("this rank is not in the default process group")
    return work


class Transport:
    """Sends and receives whole tensors between ranks: ``torch.distributed`` isend/irecv
    on the default group, or on ``pg`` (a raw process group of one generation, whose
    ranks are the generation's; :mod:`executor.worker`). Subclass and override
    :meth:`send` / :meth:`recv` to shape traffic (through :meth:`isend` /
    :meth:`irecv`); both must return an object with ``wait()``."""

    def __init__(self, pg: dist.ProcessGroup | None = None) -> None:
        self.pg = pg

    def isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        if self.pg is not None:
            return self.pg.send([tensor], dst, tag)
        return _posted(dist.isend(tensor, dst, tag=tag))

    def irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        if self.pg is not None:
            return self.pg.recv([tensor], src, tag)
        return _posted(dist.irecv(tensor, src, tag=tag))

    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        return self.isend(tensor, dst, tag)

    def recv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        return self.irecv(tensor, src, tag)


class StageGroup:
    """The collectives of one stage's data-parallel group, addressed by run rank:
    ``group`` is a ``torch.distributed`` group (``raw=False``: ranks are the default
    group's) or a raw process group of the members alone (``raw=True``: its rank ``j``
    is ``members[j]``)."""

    def __init__(self, group: dist.ProcessGroup, members: tuple[int, ...], raw: bool) -> None:
        self.group, self.members, self.raw = group, members, raw

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        if self.raw:
            self.group.broadcast(tensor, self.members.index(src)).wait()
        else:
            dist.broadcast(tensor, src=src, group=self.group)

    def all_reduce(self, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` over the members, in place."""
        if self.raw:
            self.group.allreduce(tensor).wait()
        else:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)


def forward_tag(m: int) -> int:
    return 2 * m


def backward_tag(m: int) -> int:
    return 2 * m + 1


def tag_parts(tag: int) -> tuple[int, bool]:
    """The micro-batch of a transfer's tag and whether it carries activations (forward)
    rather than gradients."""
    m, odd = divmod(tag, 2)
    return m, not odd


#: one stamped piece (module docstring, "Transfer times")
Stamp = list[Any]


@dataclass
class Pending:
    """Receives in flight for one tensor, posted at ``posted`` (``time.time()``): wait,
    then read :attr:`tensor`. ``peers[i]`` sent ``works[i]`` under ``tag``; :meth:`wait`
    appends each piece's stamp to ``stamps`` (module docstring)."""

    tensor: torch.Tensor
    tag: int = 0
    posted: float = 0.0
    stamps: list[Stamp] = field(default_factory=list)
    works: list[Work] = field(default_factory=list)
    peers: list[int] = field(default_factory=list)

    def wait(self) -> torch.Tensor:
        waited = time.time()
        for w, peer in zip(self.works, self.peers, strict=True):
            w.wait()
            self.stamps.append(["recv", peer, self.tag, waited, time.time(), self.posted])
        self.works.clear()
        self.peers.clear()
        return self.tensor


class StageLinks:
    """The transfers of one rank: activations to / from the neighbouring stages and
    gradients back.

    ``sample_shape[p]`` / ``dtype[p]`` describe one sample of stage ``p``'s output
    (found at start-up). Sends are asynchronous; their handles are kept until
    :meth:`wait_sends` (at the end of each step), so a send never blocks the schedule.
    """

    def __init__(
        self,
        layout: RankLayout,
        rank: int,
        transport: Transport,
        out_shape: dict[int, tuple[int, ...]],
        out_dtype: dict[int, torch.dtype],
        device: torch.device,
    ) -> None:
        me = layout.ranks[rank]
        self.rank, self.stage, self.offset = rank, me.stage, me.offset
        self.samples = me.samples
        self.transport = transport
        self.device = device
        self.out_shape, self.out_dtype = out_shape, out_dtype
        p = me.stage
        self.downstream: list[Overlap] = []
        self.upstream: list[Overlap] = []
        if p + 1 < layout.num_stages:
            self.downstream = [
                o
                for o in overlaps(layout.stage_members(p), layout.stage_members(p + 1))
                if o.src == rank
            ]
        if p > 0:
            self.upstream = [
                o
                for o in overlaps(layout.stage_members(p - 1), layout.stage_members(p))
                if o.dst == rank
            ]
        self._sends: list[tuple[Work, torch.Tensor]] = []
        self._stamps: list[Stamp] = []

    def take_transfers(self) -> list[Stamp]:
        """The stamps of the pieces sent and received since the last call (module
        docstring, "Transfer times"), in the order they were taken."""
        stamps, self._stamps = self._stamps, []
        return stamps

    def _send_pieces(
        self, rows: torch.Tensor, pieces: list[Overlap], to_dst: bool, tag: int
    ) -> None:
        for o in pieces:
            piece = rows[o.start - self.offset : o.end - self.offset].contiguous()
            peer = o.dst if to_dst else o.src
            self._stamps.append(["send", peer, tag, time.time()])
            self._sends.append((self.transport.send(piece, peer, tag), piece))

    def _recv_pieces(
        self, shape: tuple[int, ...], dtype: torch.dtype, pieces: list[Overlap], from_src: bool,
        tag: int,
    ) -> Pending:
        buf = torch.empty((self.samples, *shape), dtype=dtype, device=self.device)
        pending = Pending(buf, tag, time.time(), self._stamps)
        for o in pieces:
            view = buf[o.start - self.offset : o.end - self.offset]
            peer = o.src if from_src else o.dst
            pending.works.append(self.transport.recv(view, peer, tag))
            pending.peers.append(peer)
        return pending

    def send_activations(self, m: int, output: torch.Tensor) -> None:
        """SEND_F: this rank's output rows of micro-batch ``m`` to the next stage."""
        self._send_pieces(output, self.downstream, True, forward_tag(m))

    def recv_activations(self, m: int) -> Pending:
        """RECV_F: this rank's input rows of micro-batch ``m`` from the previous stage."""
        p = self.stage - 1
        return self._recv_pieces(self.out_shape[p], self.out_dtype[p], self.upstream, True,
                                 forward_tag(m))

    def send_gradients(self, m: int, grad: torch.Tensor) -> None:
        """SEND_B: gradient of this rank's input rows back to the previous stage."""
        self._send_pieces(grad, self.upstream, False, backward_tag(m))

    def recv_gradients(self, m: int) -> Pending:
        """RECV_B: gradient of this rank's output rows from the next stage."""
        p = self.stage
        return self._recv_pieces(self.out_shape[p], self.out_dtype[p], self.downstream, False,
                                 backward_tag(m))

    def wait_sends(self) -> None:
        for work, _ in self._sends:
            work.wait()
        self._sends.clear()
