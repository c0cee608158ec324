"""Pacing: a lab device's process computes at its rate continuously, as the slow device
it stands for does, instead of in the bursts a CFS quota gives.

Why (docs/lab.md, "Compute", and docs/decisions.md, "Lab devices are paced"): a CFS
quota of ``q`` of a core meters CPU time per period, so a process under it runs at a
whole core until it has used ``q`` x the period, then stops until the next period. Over
many periods its rate is ``q``, but an action that needs less than what is left of the
period's quota runs at a whole core (a stage with idle time measured 14-48% faster than
CPU time / ``q``), and one that crosses the period's end waits ``(1 - q)`` of a period.
Coupled devices of a pipeline whose off-phases do not line up lose throughput that no
real device of rate ``q`` loses: a real slow device computes continuously at low speed.

The recurrence (:class:`Pacer`). Inputs: the device's rate ``q`` (cores), a CPU clock
``cpu`` (the process's: every thread's CPU time, gloo's I/O threads included, as the
quota meters it), the wall clock and ``waited``, the pacing thread's time spent
runnable but waiting for a core (``/proc/thread-self/schedstat``'s second field; 0
where the kernel does not keep it). State: the mark ``m``, where the device's last
stretch of work ended on its own time line, and the readings at the last pace point.
At each pace point (the end of every action of the runtime,
:func:`executor.core.runtime.pace_every_action`), with ``dc``, ``dr`` the CPU and the
core-waiting time since the last one and ``now`` the wall clock:

    target = max(m + dc / q, now - dr)
    sleep max(0, target - now)
    m = target

so a stretch of work of CPU time ``x`` takes ``x / q`` of wall time, and one that
waited for a message ends no earlier than the message came. A real device has its own
core; in the lab a runnable device may wait for one (measured at load 8 on 2 cores:
1.2-1.7 s of 7-10 s per device, a median 0.6 ms a wake-up), so time spent waiting for a
core is not the device's: ``now - dr`` leaves it out, and a device held up by it
(``target < now``) sleeps less in its next stretches until it has caught up, as the
CFS quota's next period would let it. Time spent blocked (a receive, a collective) is
not credited: the stretch ends when the message came. The mark moves to the target,
not to the moment the sleep returned, so a late wake-up is paid back by the next
stretch. CPU spent by other threads while the pacing thread sleeps is charged to the
next stretch. O(1) per pace point: two clock reads, one ``pread`` of schedstat
(about 1 us) and at most one sleep.

The CFS quota stays, as a ceiling (:data:`CEILING` x ``q`` over a period of
:data:`PERIOD_US`, :class:`executor.lab.cgroups.Confinement`'s ``paced``): a paced
process uses ``q`` on average, and over any window of length ``P`` at most ``q P`` plus
its longest uninterrupted stretch of work, so with a 1 s period the ceiling throttles
only a stretch of more than ``(CEILING - 1) q / (1 - q)`` s of CPU at a whole core.

Linux only (the lab is): the pacing thread's timer slack is set to 1 ns
(``prctl(PR_SET_TIMERSLACK)``) so that a sleep returns within tens of microseconds
(measured: a 0.5 ms sleep overshot by a median 71 us at the default slack of 50 us,
23 us at 1 ns).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import time
from collections.abc import Callable

#: the cgroup quota of a paced device is this times its rate: a ceiling it rarely meets
CEILING = 1.25
#: the CFS period of a paced device's ceiling, microseconds (the kernel's largest)
PERIOD_US = 1_000_000
#: prctl(2) option that sets the calling thread's timer slack (linux/prctl.h)
_PR_SET_TIMERSLACK = 29
#: the calling thread's scheduler statistics: ns on a core, ns runnable waiting for one,
#: time slices (Documentation/scheduler/sched-stats.rst)
SCHEDSTAT = "/proc/thread-self/schedstat"


class Pacer:
    """Stretches the work of this process to CPU time / ``rate`` (module docstring).

    ``cpu``, ``wall``, ``waited`` (the pacing thread's seconds waiting for a core) and
    ``sleep`` are the clocks and the sleep (seconds); the defaults are the process's CPU
    clock, the monotonic wall clock, a :class:`CoreWaitClock` of the constructing thread
    (which must be the one that paces; :meth:`close` closes it) and :func:`time.sleep`.
    The mark starts at
    construction: a lab worker builds its pacer once torch is imported, before it
    builds its model and joins its process groups, so that part of its start-up is
    paced too, at its first action (of the warm-up step)."""

    def __init__(
        self,
        rate: float,
        cpu: Callable[[], float] = time.process_time,
        wall: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
        waited: Callable[[], float] | None = None,
    ) -> None:
        if not 0 < rate <= 1:
            raise ValueError(f"rate {rate} must be in (0, 1] of a core")
        self.rate = rate
        self._cpu, self._wall, self._sleep = cpu, wall, sleep
        self._own: CoreWaitClock | None = None
        if waited is None:
            self._own = waited = CoreWaitClock()
        self._waited = waited
        self._mark = wall()
        self._last_cpu, self._last_waited = cpu(), self._waited()

    def pace(self) -> None:
        """End the stretch of work begun at the mark (module docstring's recurrence)."""
        now, used, waited = self._wall(), self._cpu(), self._waited()
        target = max(self._mark + (used - self._last_cpu) / self.rate,
                     now - (waited - self._last_waited))
        self._mark, self._last_cpu, self._last_waited = target, used, waited
        if target > now:
            self._sleep(target - now)

    def close(self) -> None:
        """Close the core-waiting clock this pacer opened (none where ``waited`` was
        given); the pacer must not pace after it."""
        if self._own is not None:
            self._own.close()


class CoreWaitClock:
    """The constructing thread's seconds spent runnable waiting for a core, read from
    :data:`SCHEDSTAT`, kept open until :meth:`close`; 0 where the kernel does not keep
    it (nothing is kept open then)."""

    def __init__(self) -> None:
        self._fd: int | None = None
        try:
            fd = os.open(SCHEDSTAT, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        self._fd = fd
        with contextlib.suppress(OSError, IndexError, ValueError):
            self()
            return
        self.close()

    def __call__(self) -> float:
        if self._fd is None:
            return 0.0
        return int(os.pread(self._fd, 128, 0).split()[1]) / 1e9

    def close(self) -> None:
        """Close the file (once; the clock reads 0 after)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def fine_timer_slack() -> bool:
    """Set the calling thread's timer slack to 1 ns; False where the call failed (not
    Linux), which only makes sleeps overshoot more."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False
