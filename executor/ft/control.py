"""The control plane: heartbeats, failure detection, generations, abort and fencing.

It is owned by the launcher (or, across hosts, by one coordinator process), never by a
worker (reference/fault-tolerance.md §2, lesson 1; torch-and-solvers.md P5: the store
must outlive the workers). It is separate from the data plane: gloo carries tensors, the
control plane carries liveness and decisions, over a ``torch.distributed.TCPStore``
hosted by the coordinator.

Store layout (every key under ``ctl/``):

======================  ==========================================================
``ctl/generation``      the current generation g (decimal); workers build their
                        process groups on ``PrefixStore(f"gen{g}", store)``, so an
                        old generation's sockets never meet the new one's (P4)
``ctl/abort``           ``"g:cause"``: generation g is aborted (every rank stops it)
``ctl/hb/<device>``     a counter the device's heartbeat thread increments every
                        ``interval_s``; the coordinator only reads it (``add(k, 0)``)
``ctl/fenced/<dev>``    the generation in which ``dev`` was declared dead; a fenced
                        worker that wakes up (e.g. after SIGSTOP) sees it and exits
``ctl/seen/<g>/<dev>``  wall-clock time at which ``dev`` first saw the abort of
                        generation g (its acknowledgement, written once; the
                        coordinator reads it to tell how far an abort reached, how
                        fast, and when every survivor has stopped the generation)
``ctl/wake/<dev>``      set by the coordinator after every abort for each member (and
                        by ``dev``'s own heartbeat thread when it stops): wakes
                        ``dev``'s abort watcher, which deletes it and reads
                        ``ctl/abort`` and its fence at once
======================  ==========================================================

Failure classes (reference/fault-tolerance.md §2, lesson 2) and how each is detected:

* **crash** (process gone): the launcher polls its children's exit codes every
  ``poll_s`` and reports the death at once (well under a second); across hosts a crash
  shows as a silent heartbeat, as a hang does.
* **hang / lost link** (SIGSTOP, power or Wi-Fi loss: no FIN): the heartbeat counter
  stops moving; the device is declared dead when it has not moved for ``hang_timeout_s``.
* **slow but alive**: the heartbeat thread runs beside the compute, so a device that
  computes 3x slower keeps beating and is never declared dead; slowness is the
  planner's business (re-partitioning), not the detector's.

Detection bound: a hang is declared between ``hang_timeout_s`` and
``hang_timeout_s + poll_s`` after the device's last beat. An abort reaches every rank,
not only the failed device's neighbours (P3), event-driven: each worker's abort watcher
thread blocks in a store ``wait`` on its ``ctl/wake/<dev>`` key, which the coordinator
sets right after ``ctl/abort``, so a live rank sees (and acknowledges) an abort within a
few store round trips; every beat also reads ``ctl/abort``, so it is seen within one
heartbeat interval even without the wake (a device that joined after the abort, a
watcher that is gone).

**Re-admission** (a device that was lost comes back, a fresh process under the same
id): :meth:`Coordinator.readmit` gives it an **incarnation**, a number above both the
current generation and its fence; a process of incarnation ``k`` counts as fenced only by
a fence of value ``k`` or more (a fence is the generation it is written in, or the fenced
process's incarnation if that is later: a re-admitted process dropped before the next
generation opens). So the new process is not fenced by its
predecessor's fence, while the old process (incarnation below the fence's generation),
should it wake up, still is; a later loss of the new one fences it again.

The coordinator is the single point of failure of a run: when it is gone every worker's
next beat fails (after the store client's reconnection attempts: about three store
timeouts), :class:`WorkerControl` records :class:`CoordinatorLost`, and the worker stops
at its next check without writing anything, so the last checkpoint stays intact.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from edgepipe.planner.errors import EdgepipeError
from torch.distributed import PrefixStore, Store, TCPStore

FailureCause = Literal["crash", "hang"]
#: the abort watcher's wait for its wake key: no timeout in practice (a timed-out store
#: wait logs a warning and can stall its connection for a whole store timeout); an abort
#: or the device's own stop wakes it, a lost coordinator ends it with a connection error
_WATCH_FOREVER = timedelta(days=365)


class GenerationAborted(EdgepipeError):
    """The current generation was aborted by the coordinator; stop and await the next."""

    def __init__(self, generation: int, cause: str) -> None:
        self.generation = generation
        self.cause = cause
        super().__init__(f"generation {generation} aborted: {cause}")


class Fenced(EdgepipeError):
    """This device was declared dead; it must not touch the run again."""


class CoordinatorLost(EdgepipeError):
    """The coordinator (the store host) is unreachable: the run stops cleanly."""


@dataclass(frozen=True)
class Failure:
    """A device declared dead: why, when the coordinator decided (monotonic s) and for
    how long its heartbeat had not moved by then (s)."""

    device: str
    cause: FailureCause
    detected_at: float
    silent_s: float = 0.0


def host_store(port: int = 0, timeout_s: float = 30.0) -> TCPStore:
    """Host the control-plane store on ``port`` (0: a free one; read ``store.port``)."""
    return TCPStore(
        "0.0.0.0",
        port,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=timeout_s),
    )


def connect_store(host: str, port: int, timeout_s: float = 30.0) -> TCPStore:
    """Connect to the coordinator's store (a worker's side)."""
    return TCPStore(
        host, port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=timeout_s)
    )


def generation_store(store: Store, generation: int) -> PrefixStore:
    """The store a generation's process groups rendezvous on: a fresh prefix per
    generation (torch-and-solvers.md P4)."""
    return PrefixStore(f"gen{generation}", store)


class Coordinator:
    """The coordinator's view: opens generations, watches heartbeats, aborts and fences.

    Args:
        store: the control-plane store (the coordinator hosts it).
        devices: the devices of the first generation.
        hang_timeout_s: silence after which a device is declared hung (must exceed the
            heartbeat interval by a margin; it bounds hang detection, not slowness).
        exited: optional callback naming the devices whose process has exited (the
            local launcher passes one; across hosts there is none).
        clock: monotonic seconds (a parameter for tests of the timing rules).
        start_timeout_s: silence allowed to a device that has never beaten (process
            start-up: interpreter, torch import, plan load); default ``hang_timeout_s``.
            A device that beat before a generation opened (a survivor, a joined device,
            which is admitted only once it beats) gets ``hang_timeout_s`` in it, so one
            that hangs right after the open is declared within that.

    State: per device the heartbeat count at the generation's start, the last count
    seen and when it last moved. Every :meth:`poll` costs one store round trip per
    live device.
    """

    def __init__(
        self,
        store: Store,
        devices: Iterable[str],
        hang_timeout_s: float,
        exited: Callable[[], Iterable[str]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        start_timeout_s: float | None = None,
    ) -> None:
        if hang_timeout_s <= 0:
            raise ValueError(f"hang_timeout_s must be > 0, got {hang_timeout_s}")
        self.store = store
        self.hang_timeout_s = hang_timeout_s
        self.start_timeout_s = hang_timeout_s if start_timeout_s is None else start_timeout_s
        #: each re-admitted device's incarnation (module docstring; absent: 0)
        self.incarnations: dict[str, int] = {}
        self._exited = exited
        self._clock = clock
        self.generation = 0
        self.members: tuple[str, ...] = ()
        self._seen: dict[str, tuple[int, float]] = {}
        self.open_generation(devices)

    def open_generation(self, devices: Iterable[str]) -> int:
        """Start the next generation with ``devices`` (none of them fenced); returns g."""
        members = tuple(devices)
        fenced = [d for d in members if self.is_fenced(d)]
        if fenced:
            raise ValueError(f"devices {fenced} are fenced and cannot rejoin this run")
        self.generation += 1
        self.members = members
        now = self._clock()
        self._seen = {d: (self.beats(d), now) for d in members}
        self.store.set("ctl/generation", str(self.generation))
        return self.generation

    def beats(self, device: str) -> int:
        """The heartbeat count of ``device`` (0 before its first beat)."""
        return self.store.add(f"ctl/hb/{device}", 0)

    def poll(self) -> list[Failure]:
        """The members declared dead now: exited processes first, then silent ones."""
        now = self._clock()
        gone = set(self._exited()) if self._exited is not None else set()
        failures = [
            Failure(d, "crash", now, now - self._seen[d][1]) for d in self.members if d in gone
        ]
        for device in self.members:
            if device in gone:
                continue
            count, since = self._seen[device]
            current = self.beats(device)
            if current != count:
                self._seen[device] = (current, now)
            elif now - since >= (self.hang_timeout_s if current else self.start_timeout_s):
                failures.append(Failure(device, "hang", now, now - since))
        return failures

    def retire(self, device: str) -> None:
        """Stop watching ``device`` (its process finished the run cleanly and no longer
        beats); it stays a member for fencing purposes only."""
        self.members = tuple(d for d in self.members if d != device)
        self._seen.pop(device, None)

    def abort_seen(self, devices: Iterable[str]) -> dict[str, float]:
        """Wall-clock time at which each of ``devices`` saw the current generation's
        abort (only those that have)."""
        keys = {d: f"ctl/seen/{self.generation}/{d}" for d in devices}
        return {d: float(self.store.get(k)) for d, k in keys.items() if self.store.check([k])}

    def abort(self, cause: str, fence: Iterable[str] = ()) -> None:
        """Abort the current generation and fence the devices declared dead, so they
        can never act in a later generation; then wake every member's abort watcher
        (each sees the abort within a few store round trips, at the latest at its next
        beat). Costs one store write per fenced device and per member."""
        for device in fence:
            self.fence(device)
        self.store.set("ctl/abort", f"{self.generation}:{cause}")
        for device in self.members:  # after the abort: a woken watcher reads it
            self.store.set(f"ctl/wake/{device}", str(self.generation))

    def fence(self, device: str) -> None:
        """Fence ``device``'s current incarnation without aborting the generation (also
        a device that is no member: a joiner dropped before it was admitted). The fence
        is written at the current generation or at the device's incarnation, whichever
        is later: a device re-admitted in this generation (incarnation g + 1) and then
        dropped is fenced too."""
        fence = max(self.generation, self.incarnations.get(device, 0))
        self.store.set(f"ctl/fenced/{device}", str(fence))

    def is_fenced(self, device: str) -> bool:
        """Whether the current incarnation of ``device`` is fenced."""
        key = f"ctl/fenced/{device}"
        return self.store.check([key]) and fenced_by(
            self.store.get(key), self.incarnations.get(device, 0))

    def readmit(self, device: str) -> int:
        """Let a fenced ``device`` come back as a fresh process; returns the incarnation
        that process must run with (:class:`WorkerControl`'s ``incarnation``)."""
        if not self.is_fenced(device):
            raise ValueError(f"device {device} was never fenced: nothing to readmit")
        fence = int(self.store.get(f"ctl/fenced/{device}"))
        self.incarnations[device] = max(self.generation, fence) + 1
        return self.incarnations[device]


def fenced_by(fence: bytes, incarnation: int) -> bool:
    """Whether a fence written in the generation ``fence`` (the key's value) stops a
    process of ``incarnation`` (module docstring, "Re-admission")."""
    return int(fence) >= incarnation


class WorkerControl:
    """A worker's side: a heartbeat thread, and an abort watcher thread that reacts to
    the coordinator's abort and fencing as soon as they are written.

    Start it once per process. The heartbeat thread beats every ``interval_s`` and also
    reads the abort and this device's fence (the fallback: every abort is seen within a
    beat). The watcher blocks in a store ``wait`` on ``ctl/wake/<device>`` (module
    docstring) and reads them as soon as it is woken. Each thread has its own store
    connection (a store client is not shared across threads). Whichever thread sees an
    abort first acknowledges it (``ctl/seen/<g>/<device>``, once) before recording it.
    The training loop calls :meth:`check` between actions and at commit points; it
    raises the first of :class:`Fenced`, :class:`CoordinatorLost` or
    :class:`GenerationAborted` that applies; :meth:`wait` sleeps until that would
    happen. ``incarnation``: that of a re-admitted device (module docstring). Cost:
    one store round trip per interval (two while fenced), a few per abort.
    """

    def __init__(self, connect: Callable[[], Store], device: str, interval_s: float,
                 incarnation: int = 0) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.device = device
        self.incarnation = incarnation
        self.interval_s = interval_s
        self._connect = connect
        self._stop = threading.Event()
        self._state = threading.Condition()
        self._aborted: tuple[int, str] | None = None
        self._fenced = False
        self._lost: str | None = None
        self._wake_key = f"ctl/wake/{device}"
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{device}", daemon=True)
        self._watcher: threading.Thread | None = None  # started by the heartbeat thread

    def start(self) -> WorkerControl:
        """Start the heartbeat thread (it connects the watcher and starts it);
        :meth:`stop` runs at interpreter exit at the latest."""
        self._thread.start()
        atexit.register(self.stop)
        return self

    def stop(self) -> None:
        """End both threads (the heartbeat at once, or after its store call; its last
        act wakes the watcher). It must run before the interpreter finalises (it is
        registered with :mod:`atexit`; call it earlier where the beats should stop
        earlier): a daemon thread that returns from a store call while the interpreter
        finalises is torn down through a C++ frame, which aborts the whole process
        (SIGABRT). The watcher's connection is made before it starts, so a coordinator
        that died closed it and the watcher has returned; only one whose coordinator
        went silent (no FIN) cannot be woken and is left blocked (it never returns into
        Python)."""
        self._stop.set()
        self._thread.join(timeout=10 * self.interval_s + 1.0)
        if self._watcher is not None and self._watcher.is_alive():
            self._watcher.join(timeout=10 * self.interval_s + 1.0)

    def _stops(self, generation: int) -> bool:
        aborted = self._aborted is not None and self._aborted[0] >= generation
        return self._fenced or self._lost is not None or aborted

    def check(self, generation: int) -> None:
        """Raise if this worker must stop working on ``generation``."""
        with self._state:
            if self._fenced:
                raise Fenced(f"device {self.device} was declared dead; it must exit")
            if self._lost is not None:
                raise CoordinatorLost(f"the coordinator is unreachable ({self._lost})")
            if self._aborted is not None and self._aborted[0] >= generation:
                raise GenerationAborted(*self._aborted)

    def wait(self, generation: int, timeout_s: float) -> None:
        """Sleep ``timeout_s``, or less: return as soon as :meth:`check` of
        ``generation`` would raise."""
        with self._state:
            self._state.wait_for(lambda: self._stops(generation), timeout_s)

    def _observe(self, store: Store, fence_key: str) -> None:
        """Read the abort and this device's fence and record them (waking
        :meth:`wait`); an abort not seen before is acknowledged first, under the lock,
        so nothing acts on an abort it has not acknowledged and it is acknowledged once.
        The coordinator writes the fence before the abort, so read in the opposite
        order: a worker that sees an abort also sees its fence."""
        abort = store.get("ctl/abort").decode() if store.check(["ctl/abort"]) else None
        fenced = store.check([fence_key]) and fenced_by(store.get(fence_key), self.incarnation)
        with self._state:
            self._fenced = self._fenced or fenced
            if abort is not None:
                g, cause = abort.split(":", 1)
                if self._aborted != (int(g), cause):
                    store.set(f"ctl/seen/{g}/{self.device}", repr(time.time()))
                self._aborted = (int(g), cause)
            self._state.notify_all()

    def _run(self) -> None:
        try:
            store = self._connect()
            # the watcher's connection, made here: a store client blocked in its
            # connection attempts could not be ended by stop()
            self._watcher = threading.Thread(target=self._watch, args=(self._connect(),),
                                             name=f"abort-watch-{self.device}", daemon=True)
            self._watcher.start()
            key = f"ctl/hb/{self.device}"
            fence_key = f"ctl/fenced/{self.device}"
            while not self._stop.is_set():
                store.add(key, 1)
                self._observe(store, fence_key)
                self._stop.wait(self.interval_s)
            store.set(self._wake_key, "stop")  # the watcher returns
        except Exception as err:  # any store failure means the coordinator is gone
            with self._state:
                self._lost = str(err).splitlines()[0][:200]
                self._state.notify_all()

    def _watch(self, store: Store) -> None:
        fence_key = f"ctl/fenced/{self.device}"
        try:
            while True:
                store.wait([self._wake_key], _WATCH_FOREVER)
                # delete before reading: a wake written after this is kept for the next
                # wait, and every abort woken for before it is already in ctl/abort
                store.delete_key(self._wake_key)
                if self._stop.is_set():
                    return
                self._observe(store, fence_key)
        except Exception:  # the coordinator is gone: the heartbeat thread reports it
            return
