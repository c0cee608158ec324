"""Specification of the lab's pacing recurrence (executor/lab/pacing.py) and of the
quota a paced device's group gets: the pacer is driven by a scripted device (work
advances its CPU and wall clocks together, a wait or a late wake-up the wall clock
alone), every figure worked by hand."""

from __future__ import annotations

import pytest
from edgepipe.executor.lab.cgroups import Confinement
from edgepipe.executor.lab.pacing import Pacer


class Device:
    """Three clocks and a sleep: ``work(s)`` spends ``s`` of CPU at a whole core,
    ``wait(s)`` passes ``s`` of wall time blocked (no CPU), ``queue(s)`` passes ``s``
    runnable but waiting for a core, ``sleep(s)`` records the sleep and passes ``s``
    plus ``late`` (a wake-up that returns late)."""

    def __init__(self, late: float = 0.0) -> None:
        self.cpu = self.wall = self.queued = 0.0
        self.late = late
        self.sleeps: list[float] = []

    def work(self, s: float) -> None:
        self.cpu += s
        self.wall += s

    def wait(self, s: float) -> None:
        self.wall += s

    def queue(self, s: float) -> None:
        self.wall += s
        self.queued += s

    def sleep(self, s: float) -> None:
        self.sleeps.append(round(s, 9))
        self.wall += s + self.late

    def pacer(self, rate: float) -> Pacer:
        return Pacer(rate, lambda: self.cpu, lambda: self.wall, self.sleep,
                     lambda: self.queued)


def test_work_takes_its_cpu_time_over_the_rate() -> None:
    d = Device()
    p = d.pacer(0.25)
    d.work(0.002)  # 2 ms at a whole core: 8 ms on a quarter-core device
    p.pace()
    assert d.sleeps == [0.006] and d.wall == pytest.approx(0.008)
    d.work(0.010)
    p.pace()
    assert d.sleeps == [0.006, 0.030] and d.wall == pytest.approx(0.048)


def test_a_stretch_that_waited_longer_than_its_work_needs_no_sleep() -> None:
    d = Device()
    p = d.pacer(0.5)
    d.work(0.001)
    d.wait(0.010)  # waited for a message: 11 ms > 2 ms of paced work
    p.pace()
    assert d.sleeps == []
    d.work(0.003)  # the next stretch starts at the end of the wait, not before it
    p.pace()
    assert d.sleeps == [0.003] and d.wall == pytest.approx(0.017)


def test_a_late_wake_up_is_paid_back_by_the_next_stretch() -> None:
    d = Device(late=0.001)
    p = d.pacer(0.25)
    d.work(0.001)
    p.pace()  # target 4 ms; the sleep of 3 ms returns at 5 ms
    d.work(0.001)
    p.pace()  # target 8 ms (from the 4 ms target, not from 5 + 4 = 9)
    assert d.sleeps == [0.003, 0.002]
    assert d.wall == pytest.approx(0.009)  # 8 ms and the second wake-up's 1 ms


def test_time_spent_waiting_for_a_core_is_caught_up_by_the_next_stretches() -> None:
    d = Device()
    p = d.pacer(0.25)
    d.work(0.001)
    d.queue(0.005)  # runnable, but another process had the core: 6 ms for 4 ms of work
    p.pace()  # target max(0 + 4, 6 - 5) = 4 ms: late, no sleep
    assert d.sleeps == []
    d.work(0.001)
    p.pace()  # target max(4 + 4, 7 - 0) = 8 ms: the second stretch sleeps 1 ms, not 3
    assert d.sleeps == [0.001] and d.wall == pytest.approx(0.008)


def test_a_wake_up_that_waited_for_a_core_ends_its_wait_when_the_message_came() -> None:
    d = Device()
    p = d.pacer(0.5)
    d.wait(0.010)  # blocked on a receive; the message came at 10 ms
    d.queue(0.002)  # and the device waited 2 ms for a core to take it
    p.pace()  # target max(0, 12 - 2) = 10 ms
    d.work(0.002)
    p.pace()  # target max(10 + 4, 14 - 0) = 14 ms: on time again, no sleep
    assert d.sleeps == [] and d.wall == pytest.approx(0.014)
    d.work(0.001)
    p.pace()
    assert d.sleeps == [0.001]


def test_a_rate_outside_one_core_is_refused() -> None:
    for rate in (0.0, 1.5):
        with pytest.raises(ValueError, match=r"must be in \(0, 1\]"):
            Pacer(rate)


def test_a_paced_group_gets_a_ceiling_over_a_one_second_period() -> None:
    # 0.3 of a core: 100 ms periods of 30 ms bare; paced, 1.25 x 0.3 x 1 s = 375 ms
    assert Confinement(0.3, None).quota_us() == (30_000, 100_000)
    assert Confinement(0.3, None, paced=True).quota_us() == (375_000, 1_000_000)
    assert Confinement(0.005, None).quota_us() == (1_000, 100_000)  # the kernel's least
