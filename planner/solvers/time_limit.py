"""Solver time limits: the check of a limit given by a user (:func:`check_time_limit`,
made by every public entry that takes one: :func:`planner.solvers.solve.solve`,
:func:`planner.solvers.dp.driver.plan_dp`, :func:`planner.solvers.exact.solver.plan_milp`),
the running limit a search polls (:class:`Deadline`: wall clock and, optionally, this
process's CPU time) and the default wall-clock limit of a problem
(:func:`default_time_limit`).

A wall-clock limit bounds how long a caller waits; on a busy machine it also cuts the
search short by however much CPU other processes took (issue 29: a 256-device plan came
back ``timed_out`` after 4.3 CPU s of its 60 s). A CPU-time limit counts only this
process's work (every thread of it: CP-SAT's solver threads included; CBC's and HiGHS's
worker processes are not this process and are stopped by the wall-clock equivalent,
:meth:`Deadline.left_s`), so the same problem stops at the same point of its search
however busy the machine is. With both, the first to run out stops the search.
"""

from __future__ import annotations

import math
import time

from edgepipe.planner.errors import InputError

#: the default wall-clock limit of a problem of up to DEFAULT_DEVICES devices, seconds
DEFAULT_TIME_LIMIT = 60.0
DEFAULT_DEVICES = 256


def check_time_limit(time_limit: object, option: str = "--time-limit") -> float:
    """``time_limit`` as seconds; raises :class:`InputError` naming the value (and
    ``option``) and the fix unless it is a finite number above 0 (not a bool). A limit
    of 0 or below would stop a search before it starts (the DP then returns its first,
    slower plan); an infinite or NaN one cannot be written into a plan file (JSON has no
    such numbers)."""
    if isinstance(time_limit, bool) or not isinstance(time_limit, int | float):
        raise InputError(option, "", f"expected seconds as a number, got a "
                         f"{type(time_limit).__name__}; give e.g. 60")
    if not math.isfinite(time_limit) or time_limit <= 0:
        raise InputError(option, "", f"must be positive seconds (a finite number), "
                         f"got {time_limit!r}; give e.g. 60")
    return float(time_limit)


def default_time_limit(devices: int) -> float:
    """The wall-clock limit used when none is given, for a cluster of ``devices``:
    ``DEFAULT_TIME_LIMIT`` x max(1, devices / ``DEFAULT_DEVICES``), i.e. 60 s up to 256
    devices, 240 s at the schema's 1,024. Why: the DP's work grows about linearly in the
    device count at a fixed model and type count (its states count devices per class, its
    levels go up to min(L, N) stages; planner_scaling: 100 blocks x 64 devices ~1 CPU s,
    x 512 of 8 types ~30 CPU s), and the 1,024-device case measured 57.6 CPU s on an idle
    machine, next to a flat 60 s default (issue 29): four times the limit at four times
    256 devices leaves it the same margin as the 256-device cases have."""
    return DEFAULT_TIME_LIMIT * max(1.0, devices / DEFAULT_DEVICES)


class Deadline:
    """A time limit that started running when this was made: ``wall_s`` seconds of wall
    clock (``time.perf_counter``) and, when given, ``cpu_s`` seconds of this process's
    CPU time (``time.process_time``: all its threads). Searches poll :meth:`passed`;
    :meth:`left_s` is what a solver that only knows wall clock may be given.
    :meth:`share` is a deadline at a fraction of the way, for a phase of a search."""

    def __init__(self, wall_s: float, cpu_s: float | None = None) -> None:
        self.wall_s, self.cpu_s = wall_s, cpu_s
        self.wall_start = time.perf_counter()
        self.cpu_start = time.process_time()
        self._fraction = 1.0

    def share(self, fraction: float) -> Deadline:
        """The same limits' point ``fraction`` (0-1) of the way from their start."""
        part = Deadline.__new__(Deadline)
        part.wall_s, part.cpu_s = self.wall_s, self.cpu_s
        part.wall_start, part.cpu_start = self.wall_start, self.cpu_start
        part._fraction = self._fraction * fraction
        return part

    def portion(self, fraction: float) -> Deadline:
        """A deadline starting now at ``fraction`` (0-1) of what is left of each limit:
        the wall clock's and, where there is one, the CPU budget's, each on its own
        clock. Why: a portion of :meth:`left_s` alone is wall-clock seconds, which under
        load run out before the CPU seconds they stand for (issue 29: the chain bound's
        per-size shares under a CPU budget)."""
        wall_left = self._fraction * self.wall_s - self.elapsed_s()
        cpu_left = None if self.cpu_s is None else self._fraction * self.cpu_s - self.cpu_used_s()
        return Deadline(max(0.0, fraction * wall_left),
                        None if cpu_left is None else max(0.0, fraction * cpu_left))  # fmt: skip

    def elapsed_s(self) -> float:
        """Wall-clock seconds since the start."""
        return time.perf_counter() - self.wall_start

    def cpu_used_s(self) -> float:
        """This process's CPU seconds since the start."""
        return time.process_time() - self.cpu_start

    def left_s(self, threads: int = 1) -> float:
        """Seconds left (<= 0 once passed): the wall clock's, or, when less, the CPU
        budget's divided by ``threads`` (the threads that will spend it at once: each
        spends at most one CPU second per wall second, so this many wall seconds cannot
        overspend it)."""
        left = self._fraction * self.wall_s - self.elapsed_s()
        if self.cpu_s is not None:
            left = min(left, (self._fraction * self.cpu_s - self.cpu_used_s()) / threads)
        return left

    def passed(self) -> bool:
        """Whether either limit has run out."""
        return self.left_s() <= 0

    def cpu_bound(self) -> bool:
        """Whether the CPU budget is the limit that stopped (or will stop) the search."""
        if self.cpu_s is None:
            return False
        return (self.cpu_s - self.cpu_used_s()) < (self.wall_s - self.elapsed_s())
