"""Standbys of a one-device plan under the cross-host coordinator (executor/ft/coordinator.py,
"Standbys"): what ``edgepipe coordinate --recover --standbys N`` and a worker's
``--standby DEV`` refuse, each with one line naming the problem and the fix and exit
status 2, before anything runs. The run itself (a standby taking the stage over when the
serving host is lost, bit-identical to the reference) is tested across network
namespaces in tests/integration/test_multihost.py.

The coordinator is a real ``python -m executor.ft.coordinator`` process and the first
standby a real ``python -m executor.worker --standby`` process where the refusal needs
them; the refused workers run in this process (:func:`executor.worker.main`, or
:func:`executor.ft.coordinator.join`, its step that refuses). Every process is reaped by
PID.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import replace

import pytest
from edgepipe.executor import worker
from edgepipe.executor.core.options import Endpoint, WorkerOptions
from edgepipe.executor.ft import coordinator
from edgepipe.executor.ft.control import connect_store, host_store
from edgepipe.executor.ft.coordinator import join, standbys_of
from edgepipe.planner.cli.main import main as edgepipe
from edgepipe.planner.errors import InputError

from tests.helpers.executor_helpers import make_test_plan, write_plan
from tests.helpers.paths import REPO
from tests.helpers.processes import PY, free_port
from tests.helpers.recovery_runs import (
    GLOO_TIMEOUT_S,
    THREE_STAGES,
    assert_final_state_is_the_references,
    fixed_profile,
    one_device_plan,
    profile,
    reference,
)


def refusal(capsys, argv: list[str]) -> str:
    """``python -m executor.ft.coordinator argv``'s exit status must be 2; its one line."""
    assert coordinator.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.strip()


def test_the_coordinator_names_the_standbys_it_expects_best_first():
    plan = one_device_plan(3)
    assert standbys_of(plan, 0) == ()
    assert standbys_of(plan, 1) == ("d1",)
    assert standbys_of(plan, 2) == ("d1", "d2")


def test_standbys_are_refused_without_recovery(tmp_path, capsys):
    path = write_plan(one_device_plan(3), tmp_path)
    assert refusal(capsys, [str(path), "--standbys", "1"]) == (
        "error: --standbys: only with --recover (a standby holds the replica a recovery "
        "restores)")


@pytest.mark.parametrize("flag", ["--watch-slowdown", "--no-watch-slowdown"])
def test_the_slowdown_watch_flags_are_refused_without_recovery(tmp_path, capsys, flag):
    path = write_plan(one_device_plan(3), tmp_path)
    assert refusal(capsys, [str(path), flag]) == (
        f"error: {flag}: only with --recover (re-partitioning a slowed device is part of "
        "in-process recovery); drop it")


def test_more_standbys_than_idle_devices_that_fit_are_refused(tmp_path, capsys):
    path = write_plan(one_device_plan(3), tmp_path)
    assert refusal(capsys, [str(path), "--recover", "--steps", "2", "--standbys", "3"]) == (
        "error: --standbys: 3, but only 2 idle device(s) can hold the replica (d1, d2); "
        "give at most 2")


def test_a_plan_of_several_devices_has_no_standbys(tmp_path, capsys):
    plan = make_test_plan(profile(), THREE_STAGES, 2, 2, optimizer="adam")
    path = write_plan(plan, tmp_path)
    assert refusal(capsys, [str(path), "--recover", "--steps", "2", "--standbys", "1"]) == (
        "error: --standbys: the plan runs 4 devices, which hold each other's replicas (a "
        "data-parallel peer or the next stage); standbys serve a plan of one stage on one "
        "device; omit --standbys")


def test_a_plan_that_does_not_replicate_has_no_standbys(tmp_path, capsys):
    path = write_plan(one_device_plan(2, replication_interval=0), tmp_path)
    # through `edgepipe coordinate`, the documented command
    assert edgepipe(["coordinate", str(path), "--recover", "--steps", "2",
                     "--standbys", "1"]) == 2
    err = capsys.readouterr().err
    assert err.strip().endswith(
        "error: --standbys: the plan does not replicate (replication_interval 0); omit "
        "--standbys"), err


def test_edgepipe_coordinate_names_the_standbys_it_expects_and_how_to_start_them(
    tmp_path, capsys
):
    # the banner comes before the store is hosted; a hang timeout the coordinator then
    # refuses ends the command there
    path = write_plan(one_device_plan(3), tmp_path)
    assert edgepipe(["coordinate", str(path), "--port", "29511", "--recover", "--steps", "5",
                     "--standbys", "1", "--hang-timeout", "0.5"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert (f"expecting standby(s) d1: start each on its host with python -m executor.worker "
            f"{path} --steps 5 --coordinator <this host>:29511 --standby DEV") in err, err
    assert err.endswith("error: --hang-timeout: 0.5 s must exceed twice the workers' "
                        "heartbeat (0.5 s)"), err


def test_a_standby_needs_a_coordinator_that_expects_standbys():
    store = host_store(0)
    client = connect_store("127.0.0.1", store.port)
    for settings, how in ((None, "does not recover"), ({"standbys": []}, "runs no standbys")):
        with pytest.raises(InputError) as caught:
            coordinator._check_standby(client, "d1", settings)
        assert str(caught.value) == (
            f"--standby: the coordinator {how}: start it with --recover --standbys N to "
            "keep a one-device plan's replica on standbys")


@pytest.mark.parametrize("argv, message", [
    (["--standby", "d1"], "error: --standby: needs --coordinator HOST:PORT (the running "
     "job's coordinator admits the device)"),
    (["--standby", "d1", "--coordinator", "127.0.0.1:1", "--join", "e.json"],
     "error: --standby: a worker either joins (--join) or stands by (--standby); give one "
     "of them"),
])
def test_a_standby_worker_refuses_contradictory_flags(tmp_path, capsys, argv, message):
    path = write_plan(one_device_plan(2), tmp_path)
    assert worker.main([str(path), "--steps", "2", *argv]) == 2
    assert capsys.readouterr().err.strip() == message


@pytest.mark.slow
def test_a_standby_the_coordinator_does_not_expect_or_a_second_one_is_refused(
    tmp_path, capsys
):
    # a real coordinator expecting d1 alone (--standbys 1 of d0's idle d1, d2) and the
    # real d1 standby registered with it; then three refused ones (the worker's
    # coordinator.join, which main turns into one line and exit 2): d2 (idle, but not
    # expected), d0 (the serving device) and a second d1
    path = write_plan(one_device_plan(3), tmp_path)
    port = free_port()
    address = f"127.0.0.1:{port}"
    common = [str(path), "--steps", "2", "--timeout", str(GLOO_TIMEOUT_S),
              "--coordinator", address]
    procs = [subprocess.Popen(
        [PY, "-m", "edgepipe.executor.ft.coordinator", str(path), "--port", str(port), "--recover",
         "--steps", "2", "--standbys", "1", "--out", str(tmp_path / "run"),
         "--no-watch-slowdown"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                store = connect_store("127.0.0.1", port, timeout_s=5)
                store.wait(["ctl/recover"])
                break
            except Exception:  # not listening yet (the store client raises several)
                assert procs[0].poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
        assert json.loads(store.get("ctl/recover"))["standbys"] == ["d1"]
        opts = WorkerOptions(str(path), 2, timeout_s=GLOO_TIMEOUT_S, coordinator=address)
        # a d1 start refused for a flag takes nothing: the corrected one below is d1
        with pytest.raises(InputError, match="--steps: 5 but the coordinator runs"):
            join(replace(opts, device="d1", steps=5), Endpoint(0, 1, "", 0), address)
        procs.append(subprocess.Popen([PY, "-m", "edgepipe.executor.worker", *common,
                                       "--standby", "d1"], cwd=REPO,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        while not store.add("ctl/hb/d1", 0):  # the real d1 passed the checks: it beats
            assert procs[1].poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        for device in ("d2", "d0"):
            with pytest.raises(InputError) as caught:
                join(replace(opts, device=device), Endpoint(0, 1, "", 0), address)
            assert str(caught.value) == (
                f"--standby: device {device!r} is not a standby of this run: the "
                "coordinator expects d1 (its --standbys N takes the plan's first N idle "
                "devices that can hold the replica, best first); start this worker with "
                "one of them")
        with pytest.raises(InputError) as caught:
            join(replace(opts, device="d1"), Endpoint(0, 1, "", 0), address)
        assert str(caught.value) == (
            "--standby: device 'd1' already runs as a standby of this run: a second "
            "process under its id is refused while the first lives; stop that one (a "
            "standby lost mid-run comes back with --join FILE once the coordinator has "
            "declared it lost)")
        assert store.get("ctl/host/d1") == b"127.0.0.1"  # the refused ones wrote nothing
        assert not store.check(["ctl/host/d2"]) and not store.check(["ctl/host/d0"])
        assert all(p.poll() is None for p in procs)  # neither was disturbed
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(timeout=30)


@pytest.mark.slow
def test_a_standby_that_never_starts_is_declared_lost_and_the_run_goes_on(tmp_path):
    # the coordinator expects d1 and d2 (--standbys 2) but only d0 (torchrun's rank 0)
    # and d1 are started: d2 never beats, so the first rendezvous of d0 and d1 fails
    # after their --timeout (6 s) and they wait for the coordinator's abort, which comes
    # when d2's start time-out (22 s) runs out (a worker's own wait, 10 s, would end
    # first); the plan keeps d0 with d1 as the holder and the run replays from its
    # start, bit-identical
    from edgepipe.executor.core.metrics import read_jsonl
    from edgepipe.planner.plan import load_plan, replica_placement

    plan = one_device_plan(3, model_profile=fixed_profile())
    path = write_plan(plan, tmp_path)
    port, steps, start_s = free_port(), 4, 22.0
    out, workers = tmp_path / "run", tmp_path / "workers"
    common = [str(path), "--steps", str(steps), "--out", str(workers), "--deterministic",
              "--save-weights", "--timeout", "6", "--coordinator", f"127.0.0.1:{port}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    torchrun = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    # all three start together: the workers' imports end about when the coordinator
    # opens its first generation, so their rendezvous starts then, fails 6 s later
    procs = [subprocess.Popen([PY, "-m", "edgepipe.executor.worker", *common], cwd=REPO,
                              env={**env, **torchrun}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True),
             subprocess.Popen([PY, "-m", "edgepipe.executor.worker", *common, "--standby", "d1"],
                              cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True),
             subprocess.Popen(
                 [PY, "-m", "edgepipe.executor.ft.coordinator", str(path), "--port", str(port),
                  "--recover", "--steps", str(steps), "--standbys", "2", "--start-timeout",
                  str(start_s), "--hang-timeout", "5", "--out", str(out), "--deterministic",
                  "--no-watch-slowdown"],
                 cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                 text=True)]
    try:
        logs = [p.communicate(timeout=180)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], logs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
    lines = read_jsonl(out / "metrics.jsonl")
    (event,) = [m for m in lines if m.get("type") == "recovery"]
    assert (event["cause"], event["device"], event["replay_from_step"]) == ("hang", "d2", 0)
    assert event["t_detect_s"] >= start_s
    assert "warning" not in event
    kept = load_plan(out / "plans" / f"{event['new_plan']}.json")
    assert kept.partition == plan.partition
    assert [r.holders for r in replica_placement(kept)] == [("d1",)]
    metrics = [m for m in lines if "type" not in m]
    want = reference(plan, steps)
    assert [m["step"] for m in metrics] == list(range(steps))
    assert [m["loss"] for m in metrics] == want.losses
    assert_final_state_is_the_references(workers, want)
