"""Set-up shared across test modules: expensive runs that several tests only read.

A session-scoped fixture runs once per pytest process, so once per xdist worker that
runs a test using it: every check of :func:`demo_run` is in one test
(tests/integration/test_emulation.py), since ``xdist_group`` marks no longer keep tests on
one worker
under pytest 9.2 (pytest-dev/pytest-xdist#1386; README, "Tests").
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class DemoRun:
    """One ``edgepipe demo --emulate --run-steps 2 --time-limit 10``: its exit status, its
    ``--out`` folder and what it printed on standard output."""

    status: int
    out: Path
    printed: str


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """The whole demo, run once for every test that checks a part of it.

    It profiles the demo's model here, plans it with every planner (the exact solver
    under a 10 s limit here, the demo's default being 20 s) and runs its four plans on
    local processes with emulated devices, 2 steps each after 2 of calibration
    (``--emulate``: the lab demo, where the machine hosts one, takes minutes). Standard
    output is captured by swapping ``sys.stdout``: the CLI's rich console writes to
    whatever ``sys.stdout`` is when it prints.
    """
    from edgepipe.planner.cli.main import main

    out = tmp_path_factory.mktemp("demo")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = main(["demo", "--out", str(out), "--run-steps", "2", "--time-limit", "10",
                       "--emulate"])
    return DemoRun(status, out, printed.getvalue())
