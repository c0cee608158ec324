"""Heterogeneity emulation (``edgepipe run --emulate [--time-scale k]``).

Runs a plan for a cluster of edge devices on this machine with every device's profiled
speed and every link's bandwidth and latency, so that the measured run can be set
against the plan's prediction. All emulated durations are multiplied by ``k``
(``--time-scale``, default 1), for when this machine's real compute is slower than the
plan's devices.

**Compute** (:class:`EmulatedCompute`, the runtime's ``ComputeHook``). Budgets per rank
come from the plan's cost model (``plan.cost.stages[p]``, :mod:`planner.cost.model`): forward
``device_forward_ms[j]`` and backward ``device_backward_ms[j]`` of the rank's device
``j`` at its sample count per micro-batch. After every F and B the runtime reports the
real seconds it took; the hook sleeps ``k * budget - real``. Real compute above the
budget is an *overrun*: nothing to wait, and the action is counted.

**Links** (:class:`EmulatedTransport`, the links' ``Transport``). A transfer of ``n``
bytes from device ``i`` to ``j`` occupies its channel for ``k * n / bw(i, j)`` and
arrives ``k * lat(i, j)`` after it leaves (``Cluster.bytes_per_ms``, ``latency_ms``; the
same figures the cost model uses). Channels follow the cluster's topology
(``network.kind``, as the cost model and the simulator do): ``point_to_point``, one
channel per ordered device pair; ``switched``, the sender's uplink and the receiver's
downlink (a transfer holds both: it starts when the uplink is free and then takes the
downlink first come, first served); ``shared_medium`` (Wi-Fi), **one channel for the
whole cluster**. The sender reserves when it posts the send: ``start = max(now,
channel free)``, ``channel free = start + duration``; a pair's channel and an uplink
live in the sender process, a downlink and the shared channel in the run's store (the
launcher's, or torchrun's agent's), reserved by compare-and-set on ``emu/down/<rank>``
or ``emu/channel`` (first come, first served, in wall-clock order of posting; each
channel also counts the seconds ever reserved on it, for the replicas below). The real
data and a one-element header carrying the arrival time
``start + duration + latency`` go at once (header tag = data tag + ``HEADER_TAG``); the
receiver's ``wait()`` returns when both are in and the arrival time has passed; the
sender's ``wait()`` when its data is out and ``start + duration`` has passed.

**Replicas** (:meth:`EmulatedTransport.occupy`, called by a replication point's
background thread, executor/ft/replication.py): a **background flow, of lower priority
than the training's transfers**, as a replica paced beside training would be sent on
a real link (a lower-priority access category or traffic class). A replica's real bytes
go over the replica process group at once; the owner then sleeps through the transfer
on the link to the holder, ``k * n / bw`` of channel time, and acknowledges the point
only then. Every channel has a background lane beside its foreground one (store key or
channel table entry + :data:`BACKGROUND`): the replica takes it one piece of ``k *
PIECE_MS`` at a time, first come, first served among replicas, and a piece counts only
for the part of it in which the foreground channels of the transfer were free (the
busiest of them: :func:`busy_between`; on a switched network the uplink's and the
downlink's busy times are not added up), so pieces follow until the counted time makes
up the transfer; then ``k * lat`` passes. The foreground never waits for a replica:
activations, gradients and all-reduces reserve the foreground lane alone, as without
replicas. A replica thus takes the channel time that training leaves, which is what
:meth:`planner.cost.model.CostModel.replica_transfer_ms` predicts (docs/decisions.md, "Replicas
yield to the pipeline"). The links of a recovering generation's rank reach its spares
too (a standby holds a one-device plan's replica).

**All-reduce** (the hook's ``after_reduce``). After the real ``REDUCE_GRAD`` of a group
of ``g > 1`` devices (which returns once the last member arrives), every member waits
``k * allreduce_ms`` more (the cost model's ring time for the group). On a shared
medium the ring's transfers occupy the one channel: the group's first member reserves
it for that time and publishes the end on the store (``emu/ar/<stage>/<n>``); the others
wait for the same end.

**Slowdown mid-run** (``--emulate-slowdown DEV=S@T``, :class:`EmulatedSlowdown`): from
the rank's step ``T`` on (steps counted from the first this process ran), device ``DEV``
computes as a device of ``slowdown`` ``S`` would (the cluster's ``slowdown`` field,
planner/inputs/cluster.py: 1 = its type's profiled speed), whatever the plan it runs assumes:
every F and B budget is multiplied by ``S / s_plan``, ``s_plan`` being the device's
``slowdown`` in the plan. So a device slowed to 3 runs 3x its budget under a plan that
does not know (the slowdown detector's case, executor/ft/slowdown.py) and exactly its
budget under the plan that ``api.replan(slowed={DEV: 3})`` made for it. Several
slowdowns of one device apply each from its step on (``d1=3@4`` and ``d1=1@5``: one
slow step, 4).

Clock: ``time.time()``, common to all processes of one machine (the emulation is for
local runs; across hosts it assumes synchronised clocks). Not emulated: the optimizer
step (the cost model has no term for it), per-device receive serialisation, memory.

**Report.** Each rank appends one JSON line per step to ``<out>/emulation/rank<r>.jsonl``:
``step, device, rank, budget_ms`` (the step's summed compute budgets x k),
``real_ms`` (summed real compute), ``overruns`` (actions whose real compute exceeded
their budget), ``worst_overrun_ms``, ``late_ms`` (how much later than asked the
compute waits woke, summed: the host's scheduling delay, not the emulation's) and
``time_scale``. ``edgepipe report`` and ``edgepipe run`` say when there were overruns
(then raise ``--time-scale``).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
import torch.distributed as dist
from edgepipe.executor.core.comm import Transport, Work
from edgepipe.executor.core.layout import RankLayout
from edgepipe.executor.core.runtime import ComputeHook
from edgepipe.planner.inputs.cluster import Topology
from edgepipe.planner.inputs.profile import ModelProfile, batch_curve
from edgepipe.planner.plan import Plan
from edgepipe.planner.schedule import Action, ActionType

#: added to a data tag to make the tag of its arrival-time header
HEADER_TAG = 1 << 20
#: store key of the shared channel: its free-at time (seconds since the epoch), the
#: seconds ever reserved on it and the claimant (:func:`reserve`)
CHANNEL_KEY = "emu/channel"
#: a fresh channel's value
EMPTY = "0 0 -"
#: store key prefix of each rank's downlink on a switched network (``emu/down/<rank>``)
DOWNLINK_KEY = "emu/down"
#: the sender's own uplink in :class:`EmulatedTransport`'s channel table
UPLINK = -1
#: the suffix of a channel's background lane (store key or channel table entry): the
#: pieces of replicas (:meth:`EmulatedTransport.occupy`) queue among themselves there,
#: and the foreground (activations, gradients, all-reduce) never waits for them
BACKGROUND = "/background"
#: link time (ms, before the time scale) of one piece of a long transfer that
#: :meth:`EmulatedTransport.occupy` reserves at a time
PIECE_MS = 10.0


def _sleep_until(deadline: float) -> None:
    delay = deadline - time.time()
    if delay > 0:
        time.sleep(delay)


def reserve(store: dist.Store, key: str, duration_s: float, not_before: float = 0.0) -> float:
    """Reserve the channel at ``key`` for ``duration_s`` from ``max(now, not_before,
    free)``; returns the start. Compare-and-set on the store, retried until it wins:
    O(contenders).

    The value is ``"<free-at> <reserved> <claimant>"``: ``reserved``, the seconds ever
    reserved on the key, lets a background flow count the channel's busy time
    (:func:`busy_between`); the claimant (a fresh random token per attempt) makes two
    contenders' new values differ even when their times agree, so a loser can never
    mistake the winner's value for its own."""
    current = store.compare_set(key, "", EMPTY).decode()
    while True:
        free, reserved = (float(x) for x in current.split()[:2])
        start = max(time.time(), not_before, free)
        desired = f"{start + duration_s!r} {reserved + duration_s!r} {secrets.token_hex(8)}"
        got = store.compare_set(key, current, desired).decode()
        if got == desired:
            return start
        current = got


@dataclass(frozen=True)
class Reading:
    """A channel read at clock ``at``: it is reserved until ``free`` (seconds since the
    epoch) and ``reserved`` seconds were ever reserved on it."""

    at: float
    free: float
    reserved: float


def read(store: dist.Store, key: str) -> Reading:
    """The channel at ``key`` (kept by :func:`reserve`) now."""
    at = time.time()
    free, reserved = (float(x) for x in store.compare_set(key, "", EMPTY).decode().split()[:2])
    return Reading(at, free, reserved)


def busy_between(a: Reading, b: Reading) -> float:
    """Seconds of ``[a.at, b.at]`` for which the channel was reserved, from two readings.

    Reservations start no earlier than they are made and queue first come, first
    served (``start = max(now, free)``), so at any moment ``t`` what is reserved after
    ``t`` is the one stretch ``[t, free]``: the busy time after ``a.at`` known at ``b.at``
    is ``max(0, a.free - a.at)`` plus what was reserved in between, ``b.reserved -
    a.reserved``, of which ``max(0, b.free - b.at)`` lies after ``b.at``. O(1)."""
    busy = (b.reserved - a.reserved + max(0.0, a.free - a.at) - max(0.0, b.free - b.at))
    return min(max(busy, 0.0), b.at - a.at)


@dataclass(frozen=True)
class LinkFigures:
    """Bytes per ms and latency ms from this rank's device to every rank's device."""

    bytes_per_ms: tuple[float, ...]
    latency_ms: tuple[float, ...]
    topology: Topology

    @property
    def shared_medium(self) -> bool:
        return self.topology == "shared_medium"


def _shared(store: dist.Store | None) -> dist.Store:
    """The run's store, through which ranks share a channel (a shared medium, a switched
    downlink); an emulation with a shared channel is always given one."""
    if store is None:
        raise RuntimeError("an emulated shared channel needs the run's store; none was given")
    return store


class EmulatedTransport(Transport):
    """A :class:`~executor.core.comm.Transport` that delivers at the cluster's link figures
    (module docstring). ``store`` is needed on a shared medium only."""

    def __init__(self, links: LinkFigures, time_scale: float, store: dist.Store | None,
                 pg: dist.ProcessGroup | None = None):
        super().__init__(pg)
        self.links, self.k, self.store = links, time_scale, store
        # this process's channels (a pair's, its uplink) by (lane, rank or UPLINK): free-at
        # and the seconds ever reserved; the training thread's sends and a replication
        # thread's :meth:`occupy` use them side by side
        self._free: dict[tuple[str, int], tuple[float, float]] = {}
        self._lock = threading.Lock()

    def _local(self, key: tuple[str, int], duration: float) -> float:
        """:func:`reserve` on a channel of this process (``self._lock`` held)."""
        free, reserved = self._free.get(key, (0.0, 0.0))
        start = max(time.time(), free)
        self._free[key] = (start + duration, reserved + duration)
        return start

    def _reserve(self, dst: int, duration: float, lane: str = "") -> float:
        """Reserve the channels of a transfer to ``dst`` on ``lane`` ("" the foreground,
        :data:`BACKGROUND`); returns the start."""
        if self.links.topology == "point_to_point":
            with self._lock:
                return self._local((lane, dst), duration)
        store = _shared(self.store)
        if self.links.topology == "shared_medium":
            return reserve(store, CHANNEL_KEY + lane, duration)
        with self._lock:
            free, reserved = self._free.get((lane, UPLINK), (0.0, 0.0))
            start = reserve(store, f"{DOWNLINK_KEY}/{dst}{lane}", duration,
                            not_before=max(time.time(), free))
            self._free[(lane, UPLINK)] = (start + duration, reserved + duration)
        return start

    def _foreground(self, dst: int) -> list[Reading]:
        """The foreground channels of a transfer to ``dst``, read now."""
        topology = self.links.topology
        if topology == "shared_medium":
            return [read(_shared(self.store), CHANNEL_KEY)]
        own = dst if topology == "point_to_point" else UPLINK
        with self._lock:
            mine = Reading(time.time(), *self._free.get(("", own), (0.0, 0.0)))
        if topology == "point_to_point":
            return [mine]
        return [mine, read(_shared(self.store), f"{DOWNLINK_KEY}/{dst}")]

    def occupy(self, dst: int, nbytes: int, piece_ms: float = PIECE_MS,
               check: Callable[[], None] = lambda: None) -> None:
        """Sleep through the emulated transfer of ``nbytes`` to ``dst`` whose real data
        has already gone (a replica, executor/ft/replication.py), as a **background** flow
        that yields to the foreground (module docstring, "Replicas"): pieces of at most
        ``piece_ms`` of link time (x the time scale) queue one after the other on the
        channels' background lane, and each counts only for the part of it in which
        its busiest foreground channel was free (:func:`busy_between`); pieces follow
        until the counted time makes up the transfer, then the link's latency passes.
        Returns at the emulated arrival. ``check()`` runs before each piece (a
        recovering rank's: raises once its generation is aborted, so a dead
        generation's thread stops). O(transfer time / (piece x the foreground's idle
        share)) reservations."""
        total, most = self.k * nbytes / self.links.bytes_per_ms[dst] / 1e3, self.k * piece_ms / 1e3
        sent = 0.0
        while total - sent > 1e-9:
            check()
            piece = min(most, total - sent)
            start = self._reserve(dst, piece, BACKGROUND)
            _sleep_until(start)
            before = self._foreground(dst)
            _sleep_until(start + piece)
            busy = max(busy_between(a, b)
                       for a, b in zip(before, self._foreground(dst), strict=True))
            sent += max(0.0, piece - busy)
        _sleep_until(time.time() + self.k * self.links.latency_ms[dst] / 1e3)

    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        nbytes = tensor.numel() * tensor.element_size()
        duration = self.k * nbytes / self.links.bytes_per_ms[dst] / 1e3
        start = self._reserve(dst, duration)
        arrival = start + duration + self.k * self.links.latency_ms[dst] / 1e3
        header = torch.tensor([arrival], dtype=torch.float64)
        works = [self.isend(header, dst, tag + HEADER_TAG), self.isend(tensor, dst, tag)]
        return _Timed(works, lambda: start + duration, keep=(header, tensor))

    def recv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        header = torch.empty(1, dtype=torch.float64)
        works = [self.irecv(header, src, tag + HEADER_TAG), self.irecv(tensor, src, tag)]
        return _Timed(works, lambda: float(header[0]), keep=(header,))


class _Timed:
    """Works that complete when the real works are done and the emulated time passed."""

    def __init__(
        self, works: list[Work], ready_at: Callable[[], float], keep: tuple[torch.Tensor, ...]
    ) -> None:
        self.works, self.ready_at, self.keep = works, ready_at, keep

    def wait(self) -> None:
        for w in self.works:
            w.wait()
        _sleep_until(self.ready_at())


@dataclass(frozen=True)
class EmulatedSlowdown:
    """From step ``from_step`` on, ``device`` computes at the cluster ``slowdown``
    ``slowdown`` (module docstring)."""

    device: str
    slowdown: float
    from_step: int = 0

    def __post_init__(self) -> None:
        if not self.slowdown > 0:
            raise ValueError(f"slowdown must be positive, got {self.slowdown}")
        if self.from_step < 0:
            raise ValueError(f"from_step must be >= 0, got {self.from_step}")

    @classmethod
    def parse(cls, text: str) -> EmulatedSlowdown:
        """``DEV=S`` or ``DEV=S@T`` (e.g. ``d1=3@2``); ValueError names the form."""
        device, sep, rest = text.partition("=")
        factor, _, step = rest.partition("@")
        try:
            if not (device and sep and factor):
                raise ValueError
            return cls(device, float(factor), int(step) if step else 0)
        except ValueError as exc:
            detail = f" ({exc})" if str(exc) else ""
            raise ValueError(
                f"{text!r} is not DEVICE=SLOWDOWN[@STEP], e.g. d1=3@2{detail}"
            ) from None


@dataclass(frozen=True)
class ComputeBudget:
    """One rank's emulated figures (ms, before the time scale)."""

    device: str
    rank: int
    stage: int
    first_member: bool
    forward_ms: float
    backward_ms: float
    allreduce_ms: float


class EmulatedCompute(ComputeHook):
    """Waits out every F, B and REDUCE_GRAD to the plan's figures (module docstring) and
    writes the per-step report lines to ``report`` (a text file, or None)."""

    def __init__(self, budget: ComputeBudget, time_scale: float, shared_medium: bool,
                 store: dist.Store | None, report: IO[str] | None,
                 slowdown: tuple[tuple[int, float], ...] = (), first_step: int = 0) -> None:
        self.budget, self.k = budget, time_scale
        self.shared_medium, self.store, self.report = shared_medium, store, report
        self.slowdown = slowdown  # (from step, factor on the budgets), by step
        self.step = first_step
        #: actions that overran their budget in the last finished step
        self.step_overruns = 0
        self._reset()

    def factor(self) -> float:
        """The emulated slowdown's factor on this step's budgets: that of the latest
        slowdown whose step has come (1 before the first, or without one)."""
        started = [f for step, f in self.slowdown if step <= self.step]
        return started[-1] if started else 1.0

    def _reset(self) -> None:
        self.budget_ms = self.real_ms = self.worst_ms = self.late_ms = 0.0
        self.overruns = 0

    def after_compute(self, action: Action, real_seconds: float) -> None:
        ms = self.budget.forward_ms if action.type is ActionType.F else self.budget.backward_ms
        budget_s = self.k * self.factor() * ms / 1e3
        self.budget_ms += budget_s * 1e3
        self.real_ms += real_seconds * 1e3
        if real_seconds > budget_s:
            self.overruns += 1
            self.worst_ms = max(self.worst_ms, (real_seconds - budget_s) * 1e3)
        else:
            wake = time.perf_counter() + budget_s - real_seconds
            time.sleep(budget_s - real_seconds)
            self.late_ms += max(0.0, time.perf_counter() - wake) * 1e3

    def after_reduce(self, action: Action, real_seconds: float) -> None:
        duration = self.k * self.budget.allreduce_ms / 1e3
        if duration > 0:
            if self.shared_medium:
                store = _shared(self.store)
                key = f"emu/ar/{self.budget.stage}/{self.step}"
                if self.budget.first_member:
                    end = reserve(store, CHANNEL_KEY, duration) + duration
                    store.set(key, repr(end))
                else:
                    end = float(store.get(key).decode())
                _sleep_until(end)
            else:
                time.sleep(duration)
        self._end_step()

    def _end_step(self) -> None:
        if self.report is not None:
            line = {
                "step": self.step,
                "device": self.budget.device,
                "rank": self.budget.rank,
                "budget_ms": round(self.budget_ms, 4),
                "real_ms": round(self.real_ms, 4),
                "overruns": self.overruns,
                "worst_overrun_ms": round(self.worst_ms, 4),
                "late_ms": round(self.late_ms, 4),
                "time_scale": self.k,
            }
            self.report.write(json.dumps(line) + "\n")
            self.report.flush()
        self.step_overruns = self.overruns
        self.step += 1
        self._reset()


@dataclass
class Emulation:
    """The transport and compute hook of one rank of an emulated run."""

    transport: EmulatedTransport
    hook: EmulatedCompute

    @classmethod
    def for_rank(cls, plan: Plan, rank: int, store: dist.Store, time_scale: float,
                 out: str | None, slowdowns: tuple[EmulatedSlowdown, ...] = (),
                 pg: dist.ProcessGroup | None = None, first_step: int = 0,
                 spares: tuple[str, ...] = ()) -> Emulation:
        """Budgets of ``rank`` from ``plan.cost`` and its links from the plan's cluster
        to every rank's device, then to each of ``spares`` (a recovering generation's
        members beyond the plan's ranks, in rank order: a standby holds a replica);
        ``slowdowns``: the emulated slowdowns of the run (only this rank's device's
        applies); transfers on ``pg`` when given (a generation's raw group).
        O(world size)."""
        if not time_scale > 0:
            raise ValueError(f"time scale must be positive, got {time_scale}")
        layout = RankLayout.from_plan(plan)
        me = layout.ranks[rank]
        cluster = plan.problem.cluster
        i = cluster.index(me.device)
        # a spare outside this plan's cluster (a device that joined after the plan the
        # generation re-planned from) holds no replica of it: NaN figures, so a transfer
        # to it would fail loudly (time.sleep refuses NaN) instead of being timed wrong
        peers = [cluster.index(d) if cluster.has_device(d) else None
                 for d in (*(r.device for r in layout.ranks), *spares)]
        nan = float("nan")
        links = LinkFigures(
            tuple(nan if j is None else float("inf") if j == i else cluster.bytes_per_ms(i, j)
                  for j in peers),
            tuple(nan if j is None else 0.0 if j == i else cluster.latency_ms(i, j)
                  for j in peers),
            cluster.network.kind,
        )
        stage = plan.cost.stages[me.stage]
        budget = ComputeBudget(
            me.device, rank, me.stage, me.index == 0, stage.device_forward_ms[me.index],
            stage.device_backward_ms[me.index],
            stage.allreduce_ms if len(layout.stage_ranks[me.stage]) > 1 else 0.0,
        )
        report = None
        if out is not None:
            folder = Path(out) / "emulation"
            folder.mkdir(parents=True, exist_ok=True)
            # a recovery generation (first_step > 0) appends to the run's lines
            report = (folder / f"rank{rank}.jsonl").open("a" if first_step else "w")
        s_plan = cluster.devices[i].slowdown
        slowdown = tuple(sorted((s.from_step, s.slowdown / s_plan)
                                for s in slowdowns if s.device == me.device))
        return cls(
            EmulatedTransport(links, time_scale, store, pg),
            EmulatedCompute(budget, time_scale, links.shared_medium, store, report, slowdown,
                            first_step),
        )


def read_reports(out: str | Path) -> list[dict[str, Any]]:
    """Every rank's per-step emulation lines of run directory ``out`` (no torch needed
    to read them; this helper is here for the tests and the CLI)."""
    lines: list[dict[str, Any]] = []
    for path in sorted(Path(out, "emulation").glob("rank*.jsonl")):
        lines += [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return lines


def time_scale_for(plan: Plan, host: ModelProfile, host_type: str = "host-cpu",
                   margin: float = 1.5, floor: float = 0.25) -> float:
    """A time scale at which this machine keeps up with ``plan``'s devices.

    For every rank: ``real`` = its stage's forward + backward time per micro-batch at its
    sample count on ``host`` (a profile of the same blocks measured here, timing
    ``host_type``), against ``max(budget, floor x D)``, its budget in the plan (forward +
    backward) or a ``floor`` share of the plan's dominant step ``D`` (forward + backward
    of the slowest stage or link), whichever is larger. The scale is the largest ratio x
    ``margin``, at least 1. The floor keeps a rank with a negligible budget (a
    classifier head) from forcing a huge scale: its real compute then overruns its
    budget but stays well inside the bottleneck's time, which sets the iteration.
    O(ranks x blocks)."""
    timing = host.timings.get(host_type)
    if timing is None or host.num_blocks != plan.problem.model.num_blocks:
        raise ValueError(f"profile {host.name!r} has no {host_type!r} timing of the plan's "
                         f"{plan.problem.model.num_blocks} blocks")
    top = plan.partition.micro_batch_size
    fwd = batch_curve(timing.batch_sizes, np.asarray(timing.forward_ms), top)
    bwd = batch_curve(timing.batch_sizes, np.asarray(timing.backward_ms), top)
    dominant = max(s.forward_ms + s.backward_ms for s in plan.cost.chain.steps)
    worst = 0.0
    for stage, cost in zip(plan.partition.stages, plan.cost.stages, strict=True):
        for j, y in enumerate(stage.samples):
            blocks = slice(stage.first, stage.end)
            real = float(fwd[blocks, y].sum() + bwd[blocks, y].sum())
            budget = cost.device_forward_ms[j] + cost.device_backward_ms[j]
            worst = max(worst, real / max(budget, floor * dominant, 1e-9))
    return max(1.0, worst * margin)


def calibrated_time_scale(plan: Plan, lines: list[dict[str, Any]], margin: float = 1.5,
                          floor: float = 0.25) -> float:
    """:func:`time_scale_for` from a short emulated run's report ``lines``
    (:func:`read_reports`) instead of a profile: each rank's real compute per unit of
    budget as measured here, now (under whatever load the machine carries). Lines of the
    first step (start-up) are skipped when there are later ones. O(lines)."""
    dominant = max(s.forward_ms + s.backward_ms for s in plan.cost.chain.steps)
    m = plan.partition.num_micro_batches
    later = [x for x in lines if x["step"] > 0] or lines
    worst = 0.0
    for x in later:
        budget = x["budget_ms"] / x["time_scale"]  # the step's unscaled budget, all F and B
        worst = max(worst, x["real_ms"] / max(budget, floor * dominant * m, 1e-9))
    return max(1.0, worst * margin)


def rerun_time_scale(plan: Plan, lines: list[dict[str, Any]], used: float,
                     margin: float = 1.5, floor: float = 0.25) -> float | None:
    """The time scale to run ``plan`` again at, after a run at scale ``used`` whose report
    ``lines`` (:func:`read_reports`) show a rank's real compute above its whole step's
    budget at that scale (or above the floor, :func:`calibrated_time_scale`): the machine
    got busier after the calibration, so the run timed this machine, not the plan. The
    scale is that run's own calibration (its worst ratio x ``margin``); ``None`` where
    every rank kept within its budget. O(lines)."""
    needed = calibrated_time_scale(plan, lines, margin=1.0, floor=floor)
    return needed * margin if needed > used else None
