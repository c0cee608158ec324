"""Devices that join a recovering run mid-training: emulated locally (``edgepipe run
--emulate-join FILE@STEP``), the launcher's side (docs/fault-tolerance.md, "Joining").

A join names a cluster document (``FILE``, ``schemas/cluster.schema.json``; device types
not embedded in it are taken from the plan's cluster, then the shipped catalog) whose
devices enter the run at the step boundary ``STEP``: steps ``0 .. STEP-1`` train without
them, the re-plan (:func:`planner.replan` with ``joined``) trains from ``STEP`` on. A
device of the file is either **new** (an id the plan's cluster does not have) or a
**rejoin** (a device of the plan lost earlier, ``--inject DEV:S:PHASE`` with ``S <
STEP``), which comes back as a fresh process with nothing in memory.

Protocol (:class:`JoinSchedule`, polled by the launcher between its other duties; the
joins due at one step, every ``--emulate-join`` file with that ``STEP`` and any number of
devices each, together, in step order):

1. The :class:`~executor.ft.recovery.Supervisor` holds commits from ``STEP`` on
   (:meth:`~executor.ft.recovery.Supervisor.hold`), so the run waits at that boundary.
2. Each device's process is started as soon as it can be: a new one at once (its start-up,
   seconds, overlaps the training before ``STEP``), a rejoining one once the device is
   lost and its old process is gone, with the incarnation
   :meth:`~executor.ft.recovery.Supervisor.readmit` gives it
   (:mod:`executor.ft.control`, "Re-admission"). It runs
   :class:`executor.ft.generation.RecoveringWorker` with ``WorkerOptions.device`` set and waits,
   beating, until a generation includes it.
3. Once the run stands at the boundary (every state up to ``STEP`` durable:
   :meth:`~executor.ft.recovery.Supervisor.at_boundary`) and every joining process beats,
   the Supervisor re-partitions (cause ``join``) once for all the files due there
   (:func:`merged`: one re-plan, one generation, one event naming every device): the
   current generation is aborted (nobody fenced), the re-plan opens the next
   generation, and each joined device receives its blocks and their optimizer state from
   their current holders (the migration) before its first step. A joined device the
   re-plan leaves idle is a spare.

**Failed joins** (:class:`JoinFailed`; training goes on): a joining process that exits
before it is admitted, or does not beat within ``start_timeout_s`` of its start (it is
then SIGKILLed), or a rejoin whose device still serves at the boundary (its fault did
not take it out) drops that join (its file): its processes are stopped, the other files
due at that step are admitted without it (or, when none is left, the hold is released),
the run goes on under its current plan, bit for bit as without the join, and one line
(``join of e at step 2 (--emulate-join e.json@2) failed: joining device 'e' exited with
status -9 before it was admitted; the run goes on without it``) goes to
``metrics.jsonl`` (``"type": "join_failed"``: ``device``, ``step``, ``detected_at``,
``reason``) and ``edgepipe run``'s stderr. A join is an offer of capacity: refusing it
costs the run nothing, while stopping would turn a flaky newcomer into an outage.

**Across hosts** (``edgepipe coordinate --recover``; :class:`JoinRequests`): a device
that shows up is started by hand, outside the torchrun job, as ``python -m
executor.worker plan.json --steps N --coordinator HOST:PORT --join FILE[@STEP]``
(FILE: a cluster document naming that one device; STEP: not before that step). Once its
process is up (torch imported, plan loaded) it registers (:func:`register`): it writes
``{"cluster": document, "step": STEP or null}`` to ``ctl/join/<n>`` (``n`` from the
counter ``ctl/join/next``) and waits for the coordinator's reply
``ctl/join/<n>/reply``: its incarnation (0 for a new device, a fresh one for a device
lost earlier) or a one-line refusal (the id serves the run; the document names not one
device or does not validate). The coordinator then holds commits at the next step
boundary (or at STEP, when later), waits until the run stands there and the device
beats, and re-partitions (cause ``join``), as above. Every registered device due at
that boundary (its STEP at or before it) is admitted in the one re-partition, once each
beats (:func:`merged`: one re-plan with all of them). A registered device that does not
beat within ``start_timeout_s`` is dropped with one ``join_failed`` line and fenced (its
process exits should it wake up; registering again re-admits it); the run goes on.

**A second process under a serving device's id** is refused with one line, the serving
one untouched: a registration proves only that some process claims the id, not that
the serving one is gone, so fencing on that claim would let a mistaken duplicate (a
start command run twice, a wrong file) kill a healthy device and force a recovery. A
device that really restarted is declared lost by the control plane within the hang
timeout (its old process is silent or gone); then the new process registers and is
re-admitted. Locally the same holds for an emulated rejoin (``JoinSchedule``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from edgepipe.executor.ft.faults import Fault
from edgepipe.executor.ft.recovery import Supervisor
from edgepipe.planner.errors import EdgepipeError, InputError
from edgepipe.planner.inputs.cluster import Cluster, load_catalog
from edgepipe.planner.plan import Plan
from torch.distributed import Store

FLAG = "--emulate-join"


class JoinFailed(EdgepipeError):
    """A joining device could not be admitted; ``device`` names it. Recorded, not
    raised (module docstring, "Failed joins"): the run goes on without it."""

    def __init__(self, message: str, device: str) -> None:
        self.device = device
        super().__init__(message)


@dataclass(frozen=True)
class EmulatedJoin:
    """The devices of ``cluster`` (read from ``path``) join at step ``step``."""

    path: str
    cluster: Cluster
    step: int

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(d.id for d in self.cluster.devices)

    @classmethod
    def parse(cls, spec: str, plan: Plan) -> EmulatedJoin:
        """``FILE@STEP``; the file's device types may be the plan's. Raises
        :class:`InputError` (one line) for a bad spec or a malformed file."""
        path, sep, step = spec.rpartition("@")
        if not sep or not path or not step.isdigit():
            raise InputError(FLAG, spec, "expected FILE@STEP: a cluster file naming the "
                             "joining devices and the step at which they enter, e.g. "
                             "new-device.json@3")
        catalog = {**load_catalog(), **plan.problem.cluster.device_types}
        try:
            cluster = Cluster.load(path, catalog=catalog)
        except InputError as exc:
            raise InputError(FLAG, spec, str(exc).splitlines()[0]) from None
        return cls(path, cluster, int(step))


def check_joins(plan: Plan, joins: Sequence[EmulatedJoin], steps: int,
                faults: Sequence[Fault]) -> None:
    """Refuse joins the run cannot honour before any process starts (module docstring):
    a step beyond the run, a device named twice, or a device of the plan's cluster that
    no fault takes out before the join (it would still be serving)."""
    seen: set[str] = set()
    for join in joins:
        where = f"{join.path}@{join.step}"
        if join.step >= steps:
            raise InputError(FLAG, where, f"step {join.step} is beyond the run (--steps "
                             f"{steps} trains steps 0..{steps - 1}); join at a step below "
                             f"{steps}")
        for dev in join.devices:
            if dev in seen:
                raise InputError(FLAG, where, f"device {dev!r} joins twice; give each "
                                 "joining device its own id")
            seen.add(dev)
            if plan.problem.cluster.has_device(dev) and not any(
                f.device == dev and (f.step is None or f.step < join.step) for f in faults
            ):
                raise InputError(FLAG, where, f"device {dev!r} already serves the plan "
                                 f"({', '.join(d.id for d in plan.problem.cluster.devices)}); "
                                 "a join names a new device, or one lost earlier "
                                 f"(--inject {dev}:STEP:PHASE with STEP < {join.step})")


@dataclass
class _Entrant:
    device: str
    proc: Any = None
    beats_at_start: int = 0
    started: float = 0.0
    #: the emulated join (file) it belongs to (:class:`JoinSchedule`)
    join: EmulatedJoin | None = None


#: ``metrics.jsonl`` line of a join that failed (module docstring, "Failed joins")
FAILED = "join_failed"


@dataclass
class JoinSchedule:
    """The launcher's side of the joins (module docstring).

    Args:
        joins: the joins, any order.
        supervisor: the run's supervisor.
        spawn: ``spawn(device, incarnation)`` starts a joining process (returns it:
            ``exitcode`` is None while it runs; ``kill()`` and ``join()`` end it).
        gone: ``gone(device)`` whether the device's previous process has exited.
        start_timeout_s: how long a joining process may take to beat.

    ``failures``: the joins that failed (:class:`JoinFailed`, one line each), in order.
    """

    joins: list[EmulatedJoin]
    supervisor: Supervisor
    spawn: Callable[[str, int], Any]
    gone: Callable[[str], bool]
    start_timeout_s: float
    failures: list[JoinFailed] = field(default_factory=list)
    _entrants: list[_Entrant] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.joins = sorted(self.joins, key=lambda j: j.step)
        self._next()

    def _next(self) -> None:
        """Hold at the earliest step a join is due; the devices of every join due there
        are the entrants."""
        step = self.joins[0].step if self.joins else None
        self._entrants = [_Entrant(d, join=j) for j in self.joins if j.step == step
                          for d in j.devices]
        self.supervisor.hold(step)

    def poll(self) -> None:
        """Start what can start; drop a join of the current step as soon as one of its
        processes exits or stays silent past the start time-out, or, at the boundary,
        names a device that still serves (:meth:`_fail`); admit every join left at that
        step in one re-partition once the run stands at its boundary and every entrant
        beats. O(entrants) store round trips."""
        if not self.joins:
            return
        sup = self.supervisor
        coordinator = sup.coordinator
        for e in self._entrants:
            if e.proc is None:
                rejoin = e.device in sup.devices
                if rejoin and not (e.device in sup.lost and self.gone(e.device)):
                    continue
                incarnation = sup.readmit(e.device) if rejoin else 0
                e.beats_at_start = coordinator.beats(e.device)
                e.started = time.monotonic()
                e.proc = self.spawn(e.device, incarnation)
        silent = []
        for e in self._entrants:
            if e.proc is None:
                continue
            if e.proc.exitcode is not None:
                return self._fail(e, f"joining device {e.device!r} exited with status "
                                  f"{e.proc.exitcode} before it was admitted")
            if coordinator.beats(e.device) == e.beats_at_start:
                if time.monotonic() - e.started > self.start_timeout_s:
                    return self._fail(e, f"joining device {e.device!r} sent no heartbeat "
                                      f"within {self.start_timeout_s:g} s of its start "
                                      "(its process was killed)")
                silent.append(e)
        if not sup.at_boundary():
            return
        for e in self._entrants:
            if e.proc is None:
                assert e.join is not None
                return self._fail(e, f"device {e.device!r} still serves the run at the step "
                                  f"boundary {e.join.step}: it was not lost before, so it "
                                  "cannot rejoin")
        if silent:
            return
        due = [j for j in self.joins if any(e.join is j for e in self._entrants)]
        sup.repartition("join", ",".join(e.device for e in self._entrants),
                        joined=merged([j.cluster for j in due]))
        self.joins = [j for j in self.joins if not any(j is d for d in due)]
        self._next()

    def _fail(self, entrant: _Entrant, reason: str) -> None:
        """Drop the join (file) of ``entrant``: stop its processes and record one line
        (``failures`` and a ``join_failed`` line in ``metrics.jsonl``); the other joins
        due at its step stay entrants, and when none is left the hold is released, so
        the run goes on under its current plan (or holds at the next join's step)."""
        join = entrant.join
        assert join is not None
        self.joins = [j for j in self.joins if j is not join]
        for e in self._entrants:
            if e.join is join and e.proc is not None and e.proc.exitcode is None:
                e.proc.kill()  # SIGKILL also ends a SIGSTOPped process
                e.proc.join()
        self._entrants = [e for e in self._entrants if e.join is not join]
        failure = JoinFailed(f"join of {','.join(join.devices)} at step {join.step} "
                             f"({FLAG} {join.path}@{join.step}) failed: {reason}; the run "
                             "goes on without it", entrant.device)
        self.failures.append(failure)
        if self.supervisor.writer is not None:
            self.supervisor.writer.write_event({
                "type": FAILED, "device": ",".join(join.devices), "step": join.step,
                "detected_at": time.time(), "reason": str(failure)})
        if not self._entrants:
            self._next()


#: store keys of registrations across hosts (module docstring, "Across hosts")
NEXT_KEY = "ctl/join/next"


def read_join(spec: str, plan: Plan) -> tuple[dict, int | None]:
    """The cluster document of ``--join FILE[@STEP]`` (one device; types may be the
    plan's), as it is sent to the coordinator (types embedded), and STEP (None: the next
    boundary). Raises :class:`InputError`."""
    path, sep, step = spec.rpartition("@")
    if not sep:
        path, step = spec, ""
    elif not step.isdigit():
        raise InputError("--join", spec, "expected FILE or FILE@STEP (STEP a step number)")
    catalog = {**load_catalog(), **plan.problem.cluster.device_types}
    try:
        cluster = Cluster.load(path, catalog=catalog)
    except InputError as exc:
        raise InputError("--join", "", str(exc).splitlines()[0]) from None
    if len(cluster.devices) != 1:
        raise InputError("--join", path, f"names {len(cluster.devices)} devices; a joining "
                         "worker runs exactly one (start one worker per device)")
    return cluster.to_dict(), int(step) if step else None


def register(store: Store, document: dict, timeout_s: float, step: int | None = None) -> int:
    """A joining worker's side across hosts: register ``document`` (a cluster document
    naming this one device) to join at the next step boundary, not before ``step``, and
    return the incarnation the coordinator gives; raises :class:`InputError` with its
    refusal, or when no reply comes within ``timeout_s``."""
    n = store.add(NEXT_KEY, 1) - 1
    store.set(f"ctl/join/{n}", json.dumps({"cluster": document, "step": step}))
    deadline = time.monotonic() + timeout_s
    while not store.check([f"ctl/join/{n}/reply"]):
        if time.monotonic() > deadline:
            raise InputError("--join", "", f"the coordinator did not answer within "
                             f"{timeout_s:g} s; is it running with --recover?")
        time.sleep(0.05)
    reply = json.loads(store.get(f"ctl/join/{n}/reply"))
    if "refused" in reply:
        raise InputError("--join", "", reply["refused"])
    return int(reply["incarnation"])


def merged(clusters: Sequence[Cluster]) -> Cluster:
    """One cluster document's worth of joining devices from several single-device
    registrations: their devices in order, every type and link (the network defaults
    are ignored by the re-plan, which keeps the run's)."""
    first = clusters[0]
    return replace(
        first, name=",".join(d.id for c in clusters for d in c.devices),
        devices=tuple(d for c in clusters for d in c.devices),
        device_types={k: v for c in clusters for k, v in c.device_types.items()},
        network=replace(first.network,
                        links=tuple(ln for c in clusters for ln in c.network.links)))


@dataclass
class JoinRequests:
    """The cross-host coordinator's side of registrations (module docstring, "Across
    hosts"). ``poll`` costs one store round trip, one more per pending join.

    ``failures``: the registrations dropped (:class:`JoinFailed`, one line each)."""

    store: Store
    supervisor: Supervisor
    plan: Plan
    start_timeout_s: float
    failures: list[JoinFailed] = field(default_factory=list)
    _next: int = 0
    #: registered, not yet admitted: (devices, earliest step, the entrant)
    _pending: list[tuple[Cluster, int, _Entrant]] = field(default_factory=list)

    def poll(self) -> dict[str, Any] | None:
        """Answer new registrations; drop the ones silent past the start time-out; at
        the held step boundary admit every pending device due there (registered for
        that step or earlier) in one re-partition, once each of them beats. Returns the
        recovery event of an admission (else None)."""
        while self.store.check([f"ctl/join/{self._next}"]):
            key = f"ctl/join/{self._next}"
            self._next += 1
            try:
                reply: dict[str, Any] = {"incarnation": self._accept(key)}
            except (InputError, ValueError) as exc:
                # the worker names the flag itself (register)
                if isinstance(exc, InputError) and exc.source == "--join":
                    message = exc.problem
                else:
                    message = str(exc)
                reply = {"refused": message.splitlines()[0]}
            self.store.set(f"{key}/reply", json.dumps(reply))
        sup = self.supervisor
        beating = set()
        for item in list(self._pending):
            entrant = item[2]
            if sup.coordinator.beats(entrant.device) != entrant.beats_at_start:
                beating.add(entrant.device)
            elif time.monotonic() - entrant.started > self.start_timeout_s:
                self._drop(item)
        if not self._pending:
            if sup.held is not None:
                sup.hold(None)
            return None
        # hold at the earliest step any pending registration asks for (lowered when a
        # later registration asks for an earlier one; never below what is committed)
        earliest = max(sup.gen.next_commit, min(item[1] for item in self._pending))
        if sup.held is None or earliest < sup.held:
            sup.hold(earliest)
        assert sup.held is not None  # held just above
        held = max(sup.held, sup.gen.resume)
        due = [item for item in self._pending if item[1] <= held]
        if not due or any(e.device not in beating for _, _, e in due) or not sup.at_boundary():
            return None
        for item in due:
            self._pending.remove(item)
        return sup.repartition("join", ",".join(e.device for _, _, e in due),
                               joined=merged([c for c, _, _ in due]))

    def _drop(self, item: tuple[Cluster, int, _Entrant]) -> None:
        """A registered device that never beat: the run goes on without it. It is
        fenced, so its process exits should it wake up; it may register again (it is
        then re-admitted, :meth:`_accept`)."""
        self._pending.remove(item)
        device, sup = item[2].device, self.supervisor
        sup.coordinator.fence(device)
        failure = JoinFailed(f"join of {device} failed: it registered but sent no heartbeat "
                             f"within {self.start_timeout_s:g} s (--start-timeout); the run "
                             "goes on without it", device)
        self.failures.append(failure)
        if sup.writer is not None:
            sup.writer.write_event({"type": FAILED, "device": device, "step": item[1],
                                    "detected_at": time.time(), "reason": str(failure)})
        sup.hold(None)  # the next poll holds again for whichever join is still pending

    def _accept(self, key: str) -> int:
        """Check one registration; returns the incarnation (readmits a device lost, or
        dropped, earlier)."""
        catalog = {**load_catalog(), **self.plan.problem.cluster.device_types}
        request = json.loads(self.store.get(key))
        cluster = Cluster.from_dict(request["cluster"], key, catalog=catalog)
        sup = self.supervisor
        if len(cluster.devices) != 1:
            raise InputError("--join", "", f"the document names {len(cluster.devices)} "
                             "devices; a joining worker runs exactly one")
        device = cluster.devices[0].id
        waiting = {e.device for _, _, e in self._pending}
        if device in waiting or (device in sup.devices and device not in sup.lost):
            raise InputError("--join", "", f"device {device!r} already serves the run (or "
                             "waits to join it): a second process under its id is refused "
                             "while the first lives; stop that one, or let the coordinator "
                             "declare it lost (--hang-timeout), then start this one again")
        if device in sup.devices:
            incarnation = sup.readmit(device)
        elif sup.coordinator.is_fenced(device):  # dropped before: a fresh incarnation
            incarnation = sup.coordinator.readmit(device)
        else:
            incarnation = 0
        self._pending.append((cluster, int(request["step"] or 0),
                              _Entrant(device, None, sup.coordinator.beats(device),
                                       time.monotonic())))
        return incarnation
