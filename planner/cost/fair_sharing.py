"""The round's iteration time where transfers share channels (a switch, a shared medium):
a fluid event simulation of the plan's schedule whose transfers progress at their max-min
fair shares (:func:`planner.cost.channels.fair_shares`; on a shared medium each sender's
share, :func:`planner.cost.channels.medium_shares`).

Three named parts: :class:`_Sharing` is the channel sharing (the transfers in progress,
their rates and predicted ends), :class:`_Round` the devices and the event loop
(:meth:`_Round.run`) with what happens at each completion (a piece or ring chunk
delivered, an action ended), and :func:`fair_sharing_makespan` the entry point.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from heapq import heapify, heappop, heappush

from edgepipe.planner.cost.channels import EPS, channel_ids, fair_shares, medium_shares
from edgepipe.planner.cost.order import DEADLOCK, stage_order
from edgepipe.planner.cost.transfers import BoundaryCost, RingCost
from edgepipe.planner.inputs.cluster import Topology
from edgepipe.planner.schedule import Schedule

#: what a transfer carries: ``(0, receiver, is forward, micro-batch)`` a piece,
#: ``(1, stage, receiving member, 0)`` a ring chunk
_Tag = tuple[int, int, int, int]

_INF = float("inf")


def fair_sharing_makespan(
    schedule: Schedule,
    devices: list[list[tuple[str, float, float]]],
    links: list[BoundaryCost],
    rings: list[RingCost],
    topology: Topology,
    optim: list[list[float]] | None = None,
) -> float:
    """Iteration time of one round: the first of :func:`fair_sharing_ends` (one
    iteration)."""
    return fair_sharing_ends(schedule, devices, links, rings, topology, 1, optim)[0]


def fair_sharing_ends(
    schedule: Schedule,
    devices: list[list[tuple[str, float, float]]],
    links: list[BoundaryCost],
    rings: list[RingCost],
    topology: Topology,
    iterations: int,
    optim: list[list[float]] | None = None,
) -> list[float]:
    """When each of ``iterations`` chained rounds ends, as a fluid event simulation (what
    :func:`planner.cost.makespan.round_makespan` computes; it runs this where a channel is
    shared).

    Inputs: ``schedule`` (per stage its actions, :mod:`planner.schedule`); per stage
    ``devices[p]``, each device's id and its forward and backward ms for its samples
    (Eq. 8 before the max), ``rings[p]`` (the ring all-reduce's chunks, §3.3) and
    ``optim[p]`` (each device's optimizer step ms per iteration; None: 0); per
    boundary p -> p+1 its re-sliced pieces (:class:`BoundaryCost`).

    Devices: a device of stage p runs the stage's F/B in schedule order; its ``F m``
    waits until every activation piece of m addressed to it is delivered, its ``B m``
    every gradient piece. When its ``F m`` ends it posts its activation pieces
    (``SEND_F``), when its ``B m`` ends its gradient pieces (``SEND_B``). After its last
    backward it joins the ring (``REDUCE_GRAD``): once all g members have joined, every
    member r posts its chunk to r+1 (step 0), a member posts step k+1 when it has
    received step k, and it is done when it has received step 2(g-1)-1. Then (with no
    ring: at its last action's end) it runs its optimizer step, ``optim[p][d]`` ms.
    Chained iterations (:mod:`planner.cost.steady`): a device's first action of
    iteration i+1 waits for its own iteration i, its last action, its ring (its last
    chunk received) and its optimizer step, as the executor's loop does; pairs keep
    posting order across iterations, so iteration i+1's pieces share channels with
    iteration i's rings.

    Transfers: a transfer holds :func:`planner.cost.channels.channels` of the topology;
    transfers between one ordered pair go one at a time in posting order (one connection
    per pair); those at the head of their pairs progress at :func:`fair_shares` (on a
    shared medium :func:`medium_shares`: each sender an equal share) of their
    pair rates, so a piece of ms channel time alone ends ms after it starts; each is
    delivered its latency after its last byte. Between two events (a compute end, a
    delivery, a transfer's end) the rates are constant, so the clock jumps from event to
    event.

    Iteration i ends with its last compute, delivery, ring step or optimizer step. E events (O(M x
    (devices + pieces)) plus 2(g-1)g per ring), each O(T C) for T transfers in progress
    over C channels.

    Raises:
        ValueError: the schedule deadlocks.
    """
    return _Round(schedule, devices, links, rings, topology, iterations, optim).run()


def stage_transfer_ms(
    schedule: Schedule,
    devices: list[list[tuple[str, float, float]]],
    links: list[BoundaryCost],
    rings: list[RingCost],
    topology: Topology,
    iterations: int,
    read: int,
    optim: list[list[float]] | None = None,
) -> list[tuple[float, float]]:
    """Per stage, its outgoing boundary's transfer and its all-reduce as they take under
    the plan's own traffic: the ``read``-th of ``iterations`` chained rounds of
    :func:`fair_sharing_ends` (inputs and rules as there), every topology run as the
    fluid simulation (point to point each pair its own channel).

    Link (0 for the last stage): for each micro-batch of that round and each direction,
    the time from the first of the boundary's pieces posted to the last one delivered,
    averaged over both directions and the round's micro-batches (what
    ``edgepipe report`` measures per boundary, from post to delivery). All-reduce (0 for
    one device): from the ring's start (its last member joined) to its last member's
    last chunk received. Cost: one :func:`fair_sharing_ends` of ``iterations``, then one
    pass over the spans it recorded (O(P + spans) for P stages).
    """
    r = _Round(schedule, devices, links, rings, topology, iterations, optim)
    r.spans = {}
    r.run()
    m_count = r.m_count
    links_of: list[list[float]] = [[] for _ in devices]  # per boundary: its spans' lengths
    for (q, _, m), (a, b) in r.spans.items():
        if q >= 0 and m // m_count == read:  # a boundary's (a ring's q is -1 - stage)
            links_of[q].append(b - a)
    out = []
    for p, link in enumerate(links_of):
        ring = r.spans.get((-1 - p, 0, read))
        out.append((sum(link) / len(link) if link else 0.0,
                    ring[1] - ring[0] if ring else 0.0))
    return out


class _Transfer:
    """A transfer posted on its pair's connection: ``left`` ms of channel time (at its
    pair's full rate) left at time ``since``, progressing at ``rate`` (its fair share);
    ``version`` counts its re-ratings (an end predicted before the last one is stale)."""

    __slots__ = (
        "channels",
        "key",
        "latency",
        "left",
        "queue",
        "rate",
        "sender",
        "since",
        "tag",
        "version",
    )

    def __init__(self, left: float, since: float, channels: tuple[int, ...],
                 queue: deque[_Transfer], latency: float, tag: _Tag, key: int,
                 sender: int) -> None:
        self.left, self.since, self.rate, self.version = left, since, 0.0, 0
        self.channels, self.queue, self.latency, self.tag, self.key = (
            channels, queue, latency, tag, key)
        self.sender = sender


class _Sharing:
    """Channel sharing: the transfers of a round on the numbered channels
    (:func:`planner.cost.channels.channel_ids`) of each ordered pair ``chans[pair]``,
    sent by device ``senders[pair]``.

    State: per pair a queue of its transfers in posting order, the head in progress;
    per channel the keys of the transfers in progress holding it; a heap of predicted
    ends ``(end, key, version)``, stale once the transfer is re-rated; the channels whose
    holders changed since the last re-rating (``dirty``); the clock ``now``, set by the
    event loop. A transfer that begins alone on its channels runs at its full rate until
    something joins; otherwise :meth:`rerate` gives the connected transfers around the
    changed channels new :func:`fair_shares` (on a shared medium: every transfer in
    progress, by sender: :func:`medium_shares`). Each re-rating is O(T C) for T
    transfers over C channels.
    """

    def __init__(self, chans: list[tuple[int, ...]], senders: list[int], shared: bool) -> None:
        self.chans, self.senders = chans, senders
        self.shared = shared
        self.queues: list[deque[_Transfer]] = [deque() for _ in chans]
        self.holders: dict[int, set[int]] = {ch: set() for held in chans for ch in held}
        self.held_by: dict[int, _Transfer] = {}  # key -> transfer, of those in progress
        self.ends: list[tuple[float, int, int]] = []
        self.dirty: set[int] = set()
        self.in_flight = 0  # posted, not ended
        self.serial = 0
        self.now = 0.0

    def post(self, pair: int, ms: float, lat: float, tag: _Tag) -> None:
        """Queue a transfer of ``ms`` channel time on ``pair``'s connection, delivered
        ``lat`` after its last byte; it begins at once if the connection is idle."""
        queue = self.queues[pair]
        x = _Transfer(ms, self.now, self.chans[pair], queue, lat, tag, self.serial,
                      self.senders[pair])
        self.serial += 1
        queue.append(x)
        self.in_flight += 1
        if len(queue) == 1:
            self._begin(x)

    def _begin(self, x: _Transfer) -> None:
        """``x`` reaches the head of its pair: it holds its channels."""
        x.since = self.now
        key = x.key
        self.held_by[key] = x
        alone = True
        for ch in x.channels:
            held = self.holders[ch]
            if held:
                alone = False
                self.dirty.add(ch)
            held.add(key)
        if alone:  # nothing shares its channels: full rate until something joins
            x.rate = 1.0
            x.version += 1
            heappush(self.ends, (self.now + x.left, key, x.version))

    def rerate(self) -> None:
        """New fair shares around the channels whose holders changed (``dirty``)."""
        holders, held_by, now = self.holders, self.held_by, self.now
        if self.shared:  # one channel: everything in progress shares it
            group = [held_by[key] for key in holders[0]]
        else:  # the connected transfers and channels around the changed ones
            todo, seen, group = list(self.dirty), set(self.dirty), []
            members: set[int] = set()
            while todo:
                for key in holders[todo.pop()]:
                    if key not in members:
                        members.add(key)
                        x = held_by[key]
                        group.append(x)
                        for ch in x.channels:
                            if ch not in seen:
                                seen.add(ch)
                                todo.append(ch)
        self.dirty.clear()
        if len(group) <= 1:
            shares = [1.0]
        elif self.shared:
            shares = medium_shares([x.sender for x in group])
        else:
            shares = fair_shares([x.channels for x in group])
        for x, share in zip(group, shares, strict=False):
            x.left -= (now - x.since) * x.rate
            x.since, x.rate = now, share
            x.version += 1
        if self.shared:  # every transfer in progress is re-rated: a new heap
            self.ends[:] = [(now + x.left / x.rate, x.key, x.version) for x in group]
            heapify(self.ends)
        else:
            for x in group:
                heappush(self.ends, (now + x.left / x.rate, x.key, x.version))

    def next_end(self) -> float:
        """The earliest predicted end of a transfer in progress (dropping stale entries),
        ``inf`` if none."""
        ends, held_by = self.ends, self.held_by
        while ends:
            x = held_by.get(ends[0][1])
            if x is not None and x.version == ends[0][2]:
                return ends[0][0]
            heappop(ends)
        return _INF

    def ended(self, limit: float) -> Iterator[tuple[_Tag, float]]:
        """Completion: every transfer whose last byte leaves by ``limit``, in end order,
        as its tag and delivery time; each frees its channels and the next transfer on
        its pair begins."""
        ends, held_by, holders = self.ends, self.held_by, self.holders
        while ends and ends[0][0] <= limit:
            _, key, ver = heappop(ends)
            x = held_by.get(key)
            if x is None or ver != x.version:
                continue
            del held_by[key]
            self.in_flight -= 1
            queue = x.queue
            queue.popleft()
            for ch in x.channels:
                held = holders[ch]
                held.discard(key)
                if held:
                    self.dirty.add(ch)
            if queue:
                self._begin(queue[0])
            yield x.tag, self.now + x.latency


class _Round:
    """The devices of one round and its event loop (:func:`fair_sharing_makespan`).

    State: per device its next action not yet started (``pos``), actions ended
    (``done``), the end of its last action started (``free``); per device, is-forward
    and micro-batch the pieces whose last byte has left (``got``) and the latest
    delivery among them (``ready``); per ring the members joined and per member the
    chunks received; per device its optimizer step (``step``); a heap of events
    ``(time, seq, kind, a, b, c)``, kind 0: device a
    ends action (b: forward, c: micro-batch), kind 1: member b of stage a's ring
    receives a chunk; the transfers (:class:`_Sharing`); the round's end so far.
    """

    def __init__(
        self,
        schedule: Schedule,
        devices: list[list[tuple[str, float, float]]],
        links: list[BoundaryCost],
        rings: list[RingCost],
        topology: Topology,
        iterations: int = 1,
        optim: list[list[float]] | None = None,
    ) -> None:
        self.lanes, _, m_count = stage_order(schedule)
        self.m_count, self.iterations = m_count, iterations
        self.last = len(self.lanes) - 1
        index: dict[str, int] = {}
        self.stage_of: list[int] = []
        self.members: list[list[int]] = [[] for _ in devices]
        self.dur: list[tuple[float, float]] = []  # per device: (B ms, F ms), by is-forward
        for p, devs in enumerate(devices):
            for d, f, b in devs:
                index[d] = len(self.dur)
                self.members[p].append(len(self.dur))
                self.stage_of.append(p)
                self.dur.append((b, f))
        n = len(self.dur)
        self.step = [0.0] * n if optim is None else [ms for row in optim for ms in row]
        pairs: dict[tuple[int, int], int] = {}
        chans: list[tuple[int, ...]] = []  # per pair: the channels its transfers hold
        senders: list[int] = []  # per pair: its sender

        def pair_of(src: str, dst: str) -> int:
            key = (index[src], index[dst])
            if key not in pairs:
                pairs[key] = len(chans)
                chans.append(channel_ids(key[0], key[1], topology) or (-1 - len(chans),))
                senders.append(key[0])
            return pairs[key]

        # per device and is-forward: its pieces (pair, ms, latency, receiver)
        self.sends: list[tuple[list, list]] = [([], []) for _ in range(n)]
        self.need = [[0, 0] for _ in range(n)]
        for link in links:
            for forward, pieces in ((1, link.forward), (0, link.backward)):
                for piece in pieces:
                    dst = index[piece.dst]
                    sender = self.sends[index[piece.src]][forward]
                    sender.append((pair_of(piece.src, piece.dst), piece.ms, piece.latency_ms,
                                   dst))
                    self.need[dst][forward] += 1
        self.ring_chunks = [
            [(pair_of(x.src, x.dst), x.ms, x.latency_ms) for x in ring.chunks] for ring in rings
        ]
        count = m_count * iterations  # micro-batch m of iteration i is i x M + m
        self.got = [([0] * count, [0] * count) for _ in range(n)]
        self.ready = [([0.0] * count, [0.0] * count) for _ in range(n)]
        self.rings_done = [0] * n  # per device: its rings completed
        self.pos = [0] * n
        self.done = [0] * n
        self.free = [0.0] * n
        self.joined = [0] * len(rings)
        self.received = [[0] * len(r) for r in self.ring_chunks]
        self.events: list[tuple[float, int, int, int, int, int]] = []
        self.seq = 0  # events pushed: the tie-break of equal times
        self.net = _Sharing(chans, senders, topology == "shared_medium")
        self.ends = [0.0] * iterations
        # when recorded (stage_transfer_ms): (boundary, is forward, micro-batch) or
        # (-1 - stage, 0, iteration) of a ring -> [first post, last delivery]
        self.spans: dict[tuple[int, int, int], list[float]] | None = None

    def run(self) -> list[float]:
        """The event loop: re-rate what changed, jump to the next event or transfer end,
        complete every transfer and event due then (within a relative EPS), repeat until
        nothing is left; each iteration's end. Raises ValueError if a device never ends."""
        net, events = self.net, self.events
        rerate, next_end, ended = net.rerate, net.next_end, net.ended
        delivered, action_ended = self._delivered, self._action_ended
        for d in range(len(self.dur)):
            self._start_ready(d)
        while events or net.in_flight:
            if net.dirty:
                rerate()
            first_end = next_end()
            now = events[0][0] if events else _INF
            if first_end < now:
                now = first_end
            net.now = now
            limit = now + EPS * (now if now > 1.0 else 1.0)
            if first_end <= now:
                for tag, arrive in ended(limit):
                    delivered(tag, arrive)
            while events and events[0][0] <= limit:
                _, _, kind, a, b, c = heappop(events)
                if kind == 0:
                    i = c // self.m_count
                    if now > self.ends[i]:
                        self.ends[i] = now
                    action_ended(a, b, c)
                else:
                    self._chunk_received(a, b)
        if any(self.done[d] < len(self.lanes[self.stage_of[d]]) * self.iterations
               for d in range(len(self.dur))):
            raise ValueError(DEADLOCK)
        return self.ends

    def _start_ready(self, d: int) -> None:
        """Start every next action of device ``d`` whose inputs are all on their way: it
        begins when its last piece is delivered and ``d`` is free; an iteration's first
        action once ``d``'s ring of the previous one is done."""
        p = self.stage_of[d]
        lane = self.lanes[p]
        got, need, ready = self.got[d], self.need[d], self.ready[d]
        free, dur = self.free, self.dur[d]
        k, size = self.pos[d], len(lane)
        ringed = bool(self.ring_chunks[p])
        while k < size * self.iterations:
            i, j = divmod(k, size)
            if j == 0 and ringed and self.rings_done[d] < i:
                break
            forward, m = lane[j]
            m += i * self.m_count
            if got[forward][m] < need[forward]:
                break
            t = free[d]
            arrive = ready[forward][m]
            free[d] = (arrive if arrive > t else t) + dur[forward]
            heappush(self.events, (free[d], self.seq, 0, d, forward, m))
            self.seq += 1
            if j == size - 1 and not ringed:  # its last action: then its optimizer step
                self._optimize(d, i)
            k += 1
        self.pos[d] = k

    def _delivered(self, tag: _Tag, arrive: float) -> None:
        """A transfer's last byte left; it is delivered at ``arrive``."""
        kind, a, b, c = tag
        if kind == 0:  # a piece for device a's action (b, c)
            if self.spans is not None:
                span = self.spans[(self.stage_of[a] - b, b, c)]
                span[1] = max(span[1], arrive)
            i = c // self.m_count
            if arrive > self.ends[i]:
                self.ends[i] = arrive
            count = self.got[a][b]
            count[c] += 1
            if arrive > self.ready[a][b][c]:
                self.ready[a][b][c] = arrive
            if count[c] == self.need[a][b]:
                self._start_ready(a)
        else:  # a ring chunk for member b of stage a
            heappush(self.events, (arrive, self.seq, 1, a, b, 0))
            self.seq += 1

    def _action_ended(self, d: int, forward: int, m: int) -> None:
        """Device ``d`` ended its forward (or backward) of micro-batch ``m``: it posts its
        pieces, and after its last action joins its stage's ring."""
        p = self.stage_of[d]
        self.done[d] += 1
        if (forward and p < self.last) or (not forward and p > 0):
            sends = self.sends[d][forward]
            if self.spans is not None and sends:
                now = self.net.now
                # the clock never goes back: the first post of m is the span's start
                self.spans.setdefault((p - 1 + forward, forward, m), [now, now])
            for pair, ms, lat, dst in sends:
                self.net.post(pair, ms, lat, (0, dst, forward, m))
        chunks = self.ring_chunks[p]
        if chunks and self.done[d] % len(self.lanes[p]) == 0:
            self.joined[p] += 1
            if self.joined[p] % len(chunks) == 0:
                if self.spans is not None:
                    i = self.joined[p] // len(chunks) - 1
                    self.spans[(-1 - p, 0, i)] = [self.net.now, self.net.now]
                for r, (pair, ms, lat) in enumerate(chunks):
                    self.net.post(pair, ms, lat, (1, p, (r + 1) % len(chunks), 0))

    def _chunk_received(self, p: int, member: int) -> None:
        """``member`` of stage ``p``'s ring received a chunk: it posts the next step's."""
        self.received[p][member] += 1
        chunks = self.ring_chunks[p]
        steps = 2 * (len(chunks) - 1)
        i = (self.received[p][member] - 1) // steps  # the ring's iteration
        if self.net.now > self.ends[i]:
            self.ends[i] = self.net.now
        if self.received[p][member] % steps:
            pair, ms, lat = chunks[member]
            self.net.post(pair, ms, lat, (1, p, (member + 1) % len(chunks), 0))
        else:  # its ring is done: its next iteration may start
            if self.spans is not None:
                self.spans[(-1 - p, 0, i)][1] = self.net.now  # the last member's end
            d = self.members[p][member]
            self.rings_done[d] += 1
            if self.net.now > self.free[d]:
                self.free[d] = self.net.now
            self._optimize(d, i)
            self._start_ready(d)

    def _optimize(self, d: int, i: int) -> None:
        """Device ``d`` runs iteration ``i``'s optimizer step from ``free[d]`` (its last
        action's end, or its ring's last chunk received), before its next action; the
        iteration lasts at least until it ends."""
        if self.step[d]:
            self.free[d] += self.step[d]
            if self.free[d] > self.ends[i]:
                self.ends[i] = self.free[d]
