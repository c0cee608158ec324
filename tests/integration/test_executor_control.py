"""The launcher's control plane in `edgepipe run`: hangs are found by the heartbeat, an
abort reaches every rank, a slow device is left alone (issue 8, item 2).

Real processes over gloo, real signals. The gloo timeout is a minute in every test, so
a run stopped in a few seconds was stopped by the control plane, not by gloo.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from edgepipe.executor.core.metrics import read_jsonl
from edgepipe.executor.core.options import WorkerOptions
from edgepipe.executor.ft.control import Coordinator, host_store
from edgepipe.executor.launch import ABORT_GRACE_S, GRACE_S, RunFailed, launch
from edgepipe.planner.cli.main import main

from tests.helpers.executor_helpers import (
    MLP_DATASET,
    emulated_plan,
    make_test_plan,
    profile_mlp,
    write_plan,
)
from tests.helpers.load import wakeup_lateness_s
from tests.helpers.processes import alive

GLOO_TIMEOUT_S = 60.0
HANG_S, BEAT_S = 2.0, 0.1
#: scheduling slack on a loaded two-core machine
SLACK_S = 1.0


@pytest.fixture(scope="module")
def mlp_profile():
    return profile_mlp()


def stop_mid_run(tmp_path: Path, plan, device: str) -> tuple[RunFailed, dict]:
    """Run ``plan`` for ever without recovery (the stop-on-failure behaviour);
    SIGSTOP ``device`` once two steps are in the metrics."""
    path = write_plan(plan, tmp_path)
    seen: dict = {}

    def on_start(ranks):
        seen["ranks"] = ranks
        pid = next(r["pid"] for r in ranks if r["device"] == device)

        def stopper():
            metrics = tmp_path / "metrics.jsonl"
            while not metrics.exists() or len(read_jsonl(metrics)) < 2:
                time.sleep(0.05)
            seen["stopped_at"], seen["stopped_wall"] = time.monotonic(), time.time()
            os.kill(pid, signal.SIGSTOP)

        threading.Thread(target=stopper, daemon=True).start()

    try:
        with pytest.raises(RunFailed) as caught:
            launch(WorkerOptions(str(path), 100_000, str(tmp_path), dataset=MLP_DATASET,
                                 timeout_s=GLOO_TIMEOUT_S),
                   on_start=on_start, hang_timeout_s=HANG_S, heartbeat_s=BEAT_S,
                   recover=False)
    finally:
        seen["returned_at"] = time.monotonic()
        for r in seen.get("ranks", []):  # whatever happened, reap (SIGKILL ends a stopped one)
            if alive(r["pid"]):
                seen.setdefault("left_behind", []).append(r["device"])
                os.kill(r["pid"], signal.SIGKILL)
    return caught.value, seen


@pytest.mark.serial  # wall-clock verdict: declared in [1.9, 3) s of the stop +- the reference
def test_a_sigstopped_device_is_declared_hung_after_the_timeout_and_every_child_stopped(
    tmp_path, mlp_profile
):
    plan = make_test_plan(mlp_profile, [(0, 1, [2]), (1, 2, [1, 1]), (2, 4, [2])], 2, 2)
    failed, seen = stop_mid_run(tmp_path, plan, "d1")
    late = wakeup_lateness_s()  # the reference: this machine's load, measured now
    assert (failed.device, failed.cause, failed.exitcode) == ("d1", "hang", -signal.SIGKILL)
    assert str(failed).startswith("device 'd1' (rank 1, stage 1) hung: no heartbeat for ")
    assert f"(hang timeout {HANG_S:g} s)" in str(failed)
    # its last beat was at most one interval before the stop (plus how late a loaded
    # machine woke the beating thread): never declared before that
    took = failed.detected_at - seen["stopped_at"]
    assert HANG_S - BEAT_S - late <= took < HANG_S + SLACK_S + late, (took, late)
    assert (seen["returned_at"] - failed.detected_at
            < 2 * ABORT_GRACE_S + GRACE_S + SLACK_S + late), late
    assert "left_behind" not in seen


@pytest.mark.serial  # wall-clock verdict: the abort reaches d0 within 0.6 s
def test_the_abort_reaches_the_first_stage_when_the_last_stage_hangs(tmp_path, mlp_profile):
    plan = make_test_plan(mlp_profile, [(0, 1, [2]), (1, 2, [2]), (2, 4, [2])], 2, 2)
    failed, seen = stop_mid_run(tmp_path, plan, "d2")
    assert (failed.device, failed.cause) == ("d2", "hang")
    assert failed.aborted_at is not None and set(failed.abort_seen) == {"d0", "d1"}
    first = failed.abort_seen["d0"]
    # within one heartbeat of the abort, and the hang timeout + one beat of the stop
    assert first - failed.aborted_at < BEAT_S + SLACK_S / 2
    assert first - seen["stopped_wall"] < HANG_S + BEAT_S + SLACK_S < GLOO_TIMEOUT_S / 10
    assert "the abort reached 2 of 2 other worker(s)" in str(failed)
    assert "left_behind" not in seen


def test_a_hang_timeout_under_two_heartbeats_is_refused_before_any_process_starts(
    tmp_path, mlp_profile, capsys
):
    path = write_plan(make_test_plan(mlp_profile, [(0, 4, [2])], 2, 1), tmp_path)
    status = main(["run", str(path), "--steps", "1", "--out", str(tmp_path / "run"),
                   "--hang-timeout", "1", "--heartbeat", "0.5"])
    assert status == 2
    err = capsys.readouterr().err
    assert "--hang-timeout: 1 s must exceed twice the heartbeat interval (0.5 s)" in err
    assert not (tmp_path / "run" / "ranks.json").exists()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_start_up_silence_gets_the_start_timeout_and_a_retired_device_is_not_watched():
    store, clock = host_store(0), Clock()
    coordinator = Coordinator(store, ["a", "b", "c"], hang_timeout_s=1.0, clock=clock,
                              start_timeout_s=5.0)
    store.add("ctl/hb/a", 1)  # a has started; b and c have not beaten yet
    assert coordinator.poll() == []  # t = 100: a's first beat seen
    clock.now += 0.5
    assert coordinator.poll() == []
    coordinator.retire("c")  # c finished its work
    clock.now += 0.5  # t = 101: a silent for the hang timeout; b only for 1 s of 5
    assert [(f.device, f.cause, f.silent_s) for f in coordinator.poll()] == [("a", "hang", 1.0)]
    clock.now += 4.0  # t = 105: b silent since the generation opened; c retired
    assert [(f.device, f.silent_s) for f in coordinator.poll()] == [("a", 5.0), ("b", 5.0)]


def test_a_device_that_beat_before_a_generation_opened_gets_the_hang_timeout_in_it():
    # a joined device is admitted only once it beats (a survivor beat in the generation
    # before): hung right after the open, it is declared within the hang timeout, while
    # a device that never beat still gets the start timeout
    store, clock = host_store(0), Clock()
    coordinator = Coordinator(store, ["a"], hang_timeout_s=1.0, clock=clock,
                              start_timeout_s=5.0)
    store.add("ctl/hb/e", 3)  # e beat while it waited to join
    coordinator.open_generation(["a", "e"])  # t = 100; e then falls silent
    clock.now += 1.0
    assert [(f.device, f.cause) for f in coordinator.poll()] == [("e", "hang")]


def slowed_plan(profile, slowdowns):
    """Two stages of one device each, one micro-batch of 6, on devices of one CPU type
    with these slowdowns; links far faster than compute (the time scale stretches them
    too). The profile's times are made even (0.1 ms a sample forward, 0.2 backward, every
    block): its quick measurement (one round, no warm-up) under load once put a block's
    backward far above its forward, and the time scale fitted to a forward of 1.2 s then
    stretched that step past the gloo timeout (CI, session 9)."""
    timing = profile.timings["host-cpu"]
    even = replace(
        timing,
        forward_ms=tuple(tuple(0.1 * b for b in timing.batch_sizes) for _ in profile.blocks),
        backward_ms=tuple(tuple(0.2 * b for b in timing.batch_sizes) for _ in profile.blocks),
        forward_spread_ms=None, backward_spread_ms=None,
    )
    return emulated_plan(replace(profile, timings={"host-cpu": even}),
                         [(0, 2, [6]), (2, 4, [6])], 6, 1, slowdowns,
                         bandwidth_mbps=1e7, latency_ms=0.0)


@pytest.mark.serial  # wall-clock verdict: a beat late by 0.9 s would be a hang
@pytest.mark.slow
def test_a_device_three_times_slower_is_never_declared_dead_and_training_is_unchanged(
    tmp_path, mlp_profile
):
    plan = slowed_plan(mlp_profile, [1.0, 3.0])
    path = write_plan(plan, tmp_path)
    hang_s, beat_s = 1.0, 0.1
    # the slowed device's forward lasts 1.2 hang timeouts (its backward 2.4): a detector
    # that took silence of the training loop for death would fire. One step (4.8 s of
    # emulated compute) shows it and the step's training as a second one would (was 2)
    scale = 1.2 * hang_s * 1e3 / plan.cost.stages[1].device_forward_ms[0]
    slowed = launch(WorkerOptions(str(path), 1, str(tmp_path / "slowed"), dataset=MLP_DATASET,
                                  deterministic=True, timeout_s=GLOO_TIMEOUT_S, emulate=True,
                                  time_scale=scale, save_weights=True),
                    hang_timeout_s=hang_s, heartbeat_s=beat_s)
    timeline = read_jsonl(tmp_path / "slowed" / "timeline.jsonl")
    forwards = [e["end_ms"] - e["start_ms"] for e in timeline
                if e["device"] == "d1" and e["kind"] == "F"]
    assert len(forwards) == 1 and min(forwards) >= 1.2 * hang_s * 1e3
    plain = launch(WorkerOptions(str(path), 1, str(tmp_path / "plain"), dataset=MLP_DATASET,
                                 deterministic=True, timeout_s=GLOO_TIMEOUT_S,
                                 save_weights=True),
                   hang_timeout_s=None)
    assert slowed.losses == plain.losses
    for rank in (0, 1):
        a = torch.load(tmp_path / "slowed" / "weights" / f"rank{rank}.pt")
        b = torch.load(tmp_path / "plain" / "weights" / f"rank{rank}.pt")
        for key in b["model"]:
            assert torch.equal(a["model"][key], b["model"][key]), (rank, key)
