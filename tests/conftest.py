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
import json
import os
import resource
import sys
import time
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class DemoRun:
    """One ``edgepipe demo --emulate --run-steps 2 --time-limit 10``: its exit status, its
    ``--out`` folder and what it printed on standard output and on standard error."""

    status: int
    out: Path
    printed: str
    warned: str


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """The whole demo, run once for every test that checks a part of it.

    It profiles the demo's model here, plans it with every planner (the exact solver
    under a 10 s limit here, the demo's default being 20 s) and runs its four plans on
    local processes with emulated devices, 2 steps each after 2 of calibration
    (``--emulate``: the lab demo, where the machine hosts one, takes minutes). Standard
    output and standard error are captured by swapping ``sys.stdout`` and ``sys.stderr``
    (the CLI's rich consoles write to whatever they are when it prints); standard error is
    written on again, for pytest to show where a test fails.
    """
    from edgepipe.planner.cli.main import main

    out = tmp_path_factory.mktemp("demo")
    printed, warned = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(warned):
        status = main(["demo", "--out", str(out), "--run-steps", "2", "--time-limit", "10",
                       "--emulate"])
    print(warned.getvalue(), file=sys.stderr, end="")
    return DemoRun(status, out, printed.getvalue(), warned.getvalue())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every ``serial`` test's file says ``mark.serial`` in its text.

    ``make test``'s serial call collects only the test files that do (found with grep: a
    full collection is 5 of its CPU seconds), so a test marked another way would run in
    neither call; the parallel call, which collects every file, stops here naming it.
    """
    said: dict[Path, bool] = {}
    for item in items:
        if item.get_closest_marker("serial") is None:
            continue
        path = Path(item.path)
        if path not in said:
            said[path] = "mark.serial" in path.read_text(encoding="utf-8")
        if not said[path]:
            raise pytest.UsageError(
                f"{item.nodeid} is serial, but its file does not say mark.serial: mark it "
                "with @pytest.mark.serial (make test's serial call collects the test files "
                "that do)")


def _cpu_s(who: int) -> float:
    """User plus system CPU seconds of ``resource.getrusage(who)``."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    """Opt-in CPU accounting per test (docs/testing.md, "CPU per test").

    With ``EDGEPIPE_TEST_CPU=<path>`` set, each test (set-up, call and tear-down) appends
    one JSON line to ``<path>``: its node id, its xdist worker (``worker``: ``gw0``...,
    ``master`` outside xdist), the CPU seconds of this pytest process
    (``self_s``) and of the child processes it reaped meanwhile (``children_s``:
    ``RUSAGE_CHILDREN`` counts a child once it is waited for, with the children it
    reaped in turn; not the executor's workers, which the preloaded forkserver reaps:
    executor/core/starting.py, so measure a launching test's whole cgroup instead), its
    wall time, when it ended (``end``, Unix time: each worker's timeline, and so the
    parallel call's tail, can be drawn from the file) and the 1-minute load average at
    its end. One
    ``write`` on a file opened for appending per line, so xdist workers can share the
    path. Without the variable this does nothing.
    """
    path = os.environ.get("EDGEPIPE_TEST_CPU")
    if not path:
        yield
        return
    self_0, children_0 = _cpu_s(resource.RUSAGE_SELF), _cpu_s(resource.RUSAGE_CHILDREN)
    wall_0 = time.monotonic()
    yield
    line = json.dumps({
        "test": item.nodeid,
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "master"),
        "self_s": round(_cpu_s(resource.RUSAGE_SELF) - self_0, 3),
        "children_s": round(_cpu_s(resource.RUSAGE_CHILDREN) - children_0, 3),
        "wall_s": round(time.monotonic() - wall_0, 3),
        "end": round(time.time(), 3),
        "load_1m": round(os.getloadavg()[0], 2),
    })
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
