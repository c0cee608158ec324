"""The Supervisor's waits during a recovery (executor/ft/recovery.py): event-driven, with
no fixed settling time, and still one recovery for devices that die together.

Real processes (the control-plane workers of tests/helpers/control_workers.py: a heartbeat, an
abort watcher, a check loop), real signals, a real store and a real re-plan. The
workers beat every 30 s, so within a test a survivor can acknowledge an abort only
through its wake key, never through a beat; every child is reaped by PID.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from edgepipe.executor.core.starting import process, worker_context
from edgepipe.executor.ft import recovery
from edgepipe.executor.ft.control import Coordinator, host_store
from edgepipe.executor.ft.recovery import Supervisor

from tests.helpers import control_workers
from tests.helpers.executor_helpers import make_test_plan, profile_mlp, write_plan

BEAT_S = 30.0


# when d3's exit status reaches the launcher: whenever the kernel reaps it, or in the
# middle of the Supervisor's first look, after the coordinator's poll read the exited
# processes and before the Supervisor asks whether d3 is alive (the order a loaded
# machine produced: d3 left the wait without being grouped, a recovery of d0 alone)
@pytest.mark.parametrize("d3_dies", ["before_the_wait", "mid_look"])
def test_two_devices_killed_together_make_one_recovery_that_ends_at_the_acknowledgements(
    tmp_path, monkeypatch, d3_dies
):
    # a bound no test run reaches: only the survivors' acknowledgements end the wait
    monkeypatch.setattr(recovery, "ABORT_SEEN_S", 60.0)
    profile = profile_mlp()
    # d0 alone in stage 0 (its ring replica on d1), d2 + d3 data-parallel in stage 2
    plan = make_test_plan(profile, [(0, 1, [2]), (1, 2, [2]), (2, 4, [1, 1])], 2, 2)
    path = write_plan(plan, tmp_path)
    store = host_store(0, timeout_s=120)  # start-up of four processes under load
    devices = ["d0", "d1", "d2", "d3"]
    # forked from the executor's preloaded forkserver (executor/core/starting.py), as its
    # workers are: a spawned one imported torch again (1.1-1.5 CPU s each)
    ctx = worker_context()
    procs = {d: process(ctx, control_workers.beat_and_check, (store.port, d, BEAT_S), d)
             for d in devices}

    def kill(device: str) -> None:
        if procs[device].exitcode is None:
            procs[device].kill()
        procs[device].join()

    # what the launcher knows of each process's exit; mid_look: d3's status arrives
    # right after the first look of the recovery read the exited processes
    arrived = {"d3": d3_dies == "before_the_wait"}
    in_recovery = False

    def exitcode(device: str) -> int | None:
        return procs[device].exitcode if arrived.get(device, True) else None

    def exited() -> list[str]:
        gone = [d for d in devices if exitcode(d) not in (None, 0)]
        if in_recovery and not arrived["d3"]:
            procs["d3"].join()
            arrived["d3"] = True
        return gone

    try:
        for p in procs.values():
            p.start()
        store.wait([f"t/ready/{d}" for d in devices])
        coordinator = Coordinator(
            store, devices, hang_timeout_s=120.0,
            exited=exited)
        supervisor = Supervisor(store, coordinator, plan, str(path), 4,
                                plans_dir=tmp_path / "plans", kill=kill,
                                alive=lambda d: exitcode(d) is None,
                                precompute_plans=False)
        deadline = time.monotonic() + 60
        while any(coordinator.beats(d) < 1 for d in devices):  # each beat once already
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.kill(procs["d0"].pid, signal.SIGKILL)
        while not (failures := coordinator.poll()):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert [(f.device, f.cause) for f in failures] == [("d0", "crash")]
        # d3 dies before the abort is written, so it can never acknowledge it; its exit
        # status arrives while the Supervisor waits for the acknowledgements
        os.kill(procs["d3"].pid, signal.SIGKILL)
        in_recovery = True
        start = time.monotonic()
        event = supervisor.recover(failures)
        took = time.monotonic() - start
    finally:
        for p in procs.values():
            if p.exitcode is None:
                p.kill()  # SIGKILL, by the process's own PID
            p.join(timeout=30)
    assert (event["cause"], event["device"]) == ("crash", "d0,d3")
    assert supervisor.lost == ["d0", "d3"]
    assert coordinator.is_fenced("d0") and coordinator.is_fenced("d3")
    assert set(supervisor.gen.members) == {"d1", "d2"}
    assert event["generation"] == supervisor.gen.number == 2
    assert all(store.check([f"ctl/seen/1/{d}"]) for d in ("d1", "d2"))
    # ended by the two acknowledgements (a store round trip each, plus the re-plan), not
    # by the bound nor by a beat 30 s away; generous for a loaded machine
    assert took < 10.0, took
