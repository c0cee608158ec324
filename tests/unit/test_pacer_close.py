"""Specification of a pacer's core-waiting clock (executor/lab/pacing.py): the file it
opens is closed by :meth:`Pacer.close`, so a measurement that builds a pacer per rank
thread (executor/lab/runtime_work.py) leaves no descriptor open."""

from __future__ import annotations

import os
from pathlib import Path

from edgepipe.executor.lab.pacing import SCHEDSTAT, CoreWaitClock, Pacer


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_pacer_closes_the_clock_it_opened_and_none_it_was_given() -> None:
    kept = int(Path(SCHEDSTAT).exists())  # 0 where the kernel keeps no schedstat
    before = open_files()
    pacer = Pacer(0.5)
    assert open_files() == before + kept
    pacer.close()
    assert open_files() == before
    given = CoreWaitClock()
    pacer = Pacer(0.5, waited=given)
    pacer.close()
    assert open_files() == before + kept  # the caller's clock stays open
    given.close()
    assert open_files() == before
    assert given() == 0.0  # a closed clock reads 0
