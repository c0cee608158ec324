"""Fault injection at named points of a recovering run (tests, benchmarks; torchft's
``EventInjector.fail_at(rank, step)`` and PyTorch's elastic tests do the same).

A spec is ``DEVICE:STEP:PHASE[:SIGNAL]``, several separated by commas
(``WorkerOptions.faults``, ``python -m executor.worker --inject``):

* ``DEVICE`` the plan device that faults; ``STEP`` the 0-based training step (``*``:
  the first time the phase is reached);
* ``PHASE`` one of ``forward`` (after the device's first forward of the step),
  ``backward`` (after its first backward; in a recovering run both fire only once the
  replication point posted before the step is durable: its replicas travel in the
  background beside the step's compute, and a fault while they are in flight is the
  ``replication`` phase, so these two always replay from the step itself),
  ``optimizer`` (the coordinator committed the
  step; before this device applies its optimizer step: every other device may already
  have applied it), ``replication`` (its replica sends of the state after the step are
  posted, not yet acknowledged; on a standby holding a one-device plan's replica:
  received, not yet acknowledged; STEP counts the steps whose state is replicated minus
  one), ``restore`` (a recovery generation's process groups are built, its state not yet
  restored; STEP is the step it replays from, ``*`` any), ``join`` (a joining device's
  process, or a standby's, which waits for its generation the same way, is up and
  connected to the store, before its first heartbeat: KILL is a joiner that exits
  before it is admitted, or a standby lost before it first beats, STOP one that never
  beats; STEP must be ``*``, such a process has this point once);
* ``SIGNAL`` ``KILL`` (default: a crash) or ``STOP`` (a hang: no FIN, no heartbeat).

The device signals itself (``signal.pthread_kill`` of the calling thread: a process-directed
signal can stop another thread first while this one runs on) after writing the wall-clock
time on the store (``ctl/fault/<device>``), so the coordinator can measure the time to
detect exactly. Each spec fires at most once per process. A run without recovery
(``--no-recover``) has the ``forward`` and ``backward`` points only.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from edgepipe.executor.core.runtime import ComputeHook
from edgepipe.planner.errors import InputError
from edgepipe.planner.schedule import Action, ActionType
from torch.distributed import Store

PHASES = ("forward", "backward", "optimizer", "replication", "restore", "join")
SIGNALS = {"KILL": signal.SIGKILL, "STOP": signal.SIGSTOP}


@dataclass(frozen=True)
class Fault:
    device: str
    step: int | None
    phase: str
    signal: str = "KILL"


def parse(spec: str) -> tuple[Fault, ...]:
    """The faults of ``spec`` (module docstring); raises :class:`InputError` naming a bad
    one."""
    out = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        parts = item.split(":")
        if len(parts) not in (3, 4) or parts[2] not in PHASES or (
            len(parts) == 4 and parts[3] not in SIGNALS
        ) or not (parts[1] == "*" or (parts[1].isdigit() and parts[2] != "join")):
            raise InputError(
                "--inject", item, f"expected DEVICE:STEP:PHASE[:SIGNAL] with STEP a number "
                f"or * (* for join), PHASE one of {', '.join(PHASES)}, SIGNAL one of "
                f"{', '.join(SIGNALS)}; e.g. d1:2:forward"
            )
        step = None if parts[1] == "*" else int(parts[1])
        out.append(Fault(parts[0], step, parts[2], parts[3] if len(parts) == 4 else "KILL"))
    return tuple(out)


def check(spec: str, running: Sequence[str], steps: int, recovering: bool) -> None:
    """Refuse a spec that could never fire, before any process starts: one that does not
    parse (:func:`parse`), names a device outside ``running`` (the devices that run a
    process in this run: the plan's, its standbys, the joining ones), a step at or beyond
    ``steps``, or, in a run that does not recover, a phase other than ``forward`` and
    ``backward``. One :class:`InputError` naming the spec and the fix. O(faults x
    devices)."""
    for fault in parse(spec):
        where = f"{fault.device}:{'*' if fault.step is None else fault.step}:{fault.phase}"
        if fault.device not in running:
            raise InputError("--inject", where, f"device {fault.device!r} runs no process in "
                             f"this run; name one of {', '.join(running)}")
        if fault.step is not None and fault.step >= steps:
            raise InputError("--inject", where, f"step {fault.step} is beyond the run (--steps "
                             f"{steps} trains steps 0..{steps - 1}); give a step below {steps}")
        if not recovering and fault.phase not in ("forward", "backward"):
            raise InputError("--inject", where, f"phase {fault.phase} happens only in a run "
                             "that recovers in-process; this one does not (--no-recover, or "
                             "the plan does not replicate): use forward or backward")


class Injector:
    """The faults of one device; :meth:`at` fires the one matching (step, phase)."""

    def __init__(self, device: str, faults: tuple[Fault, ...], store: Store | None) -> None:
        self.faults = [f for f in faults if f.device == device]
        self.device, self.store = device, store

    def due(self, step: int, phase: str) -> bool:
        """Whether :meth:`at` of (``step``, ``phase``) would fire."""
        return any(f.phase == phase and f.step in (None, step) for f in self.faults)

    def at(self, step: int, phase: str) -> None:
        for f in self.faults:
            if f.phase == phase and f.step in (None, step):
                self.faults.remove(f)
                if self.store is not None:
                    self.store.set(f"ctl/fault/{self.device}", repr(time.time()))
                # to this thread, not the process: a process-directed SIGSTOP may stop
                # another thread first while this one runs on into its next write
                signal.pthread_kill(threading.get_ident(), SIGNALS[f.signal])
                return


class FaultHook(ComputeHook):
    """The compute hook with the fault points ``forward`` / ``backward`` (module
    docstring) of the step in :attr:`step`; ``settle(step)`` runs before one fires (a
    recovering run's: when the step is itself a replication point, wait until that point
    is durable; at a step beside which a point travels it fires at once,
    docs/fault-tolerance.md, "Fault injection")."""

    def __init__(self, inner: ComputeHook, faults: Injector,
                 settle: Callable[[int], None] = lambda step: None) -> None:
        self.inner, self.faults, self.step, self.settle = inner, faults, -1, settle

    def after_compute(self, action: Action, real_seconds: float) -> None:
        self.inner.after_compute(action, real_seconds)
        phase = {ActionType.F: "forward", ActionType.B: "backward"}.get(action.type)
        if phase is not None and self.faults.due(self.step, phase):
            self.settle(self.step)
            self.faults.at(self.step, phase)

    def after_reduce(self, action: Action, real_seconds: float) -> None:
        self.inner.after_reduce(action, real_seconds)
