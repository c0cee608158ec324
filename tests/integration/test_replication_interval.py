"""Replication every k > 1 steps (docs/fault-tolerance.md, "Points in flight").

The toy model of ``tests.helpers.recovery_runs`` on ``d0`` alone, the replica on the standby
``d1`` (its ``one_device_plan``), emulated (``--emulate``) so that a step
lasts a set wall-clock time. Real processes over gloo, real signals, deterministic
mode: every run ends bit-identical to the single-process reference trainer (losses,
samples, final weights and Adam state). Every child is reaped by PID.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from edgepipe.executor.core.options import WorkerOptions
from edgepipe.executor.ft.recovery import commit_blocked
from edgepipe.planner.cli.main import main
from edgepipe.planner.cost.channels import background_ms
from edgepipe.planner.cost.formulas import hiding_interval, replication_points
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.plan import replication_note

from tests.helpers.executor_helpers import emulated_plan, write_plan
from tests.helpers.recovery_runs import (
    BEAT_S,
    GLOO_TIMEOUT_S,
    HANG_S,
    assert_matches_reference,
    launch_reaped,
    one_device_plan,
    plan_of,
    profile,
)


def emulated_run(tmp_path: Path, steps: int, interval: int, step_s: float, timeout_s: float,
                 faults: str = "", devices: int = 2, transfer_steps: float | None = None):
    """Run :func:`one_device_plan` emulated at a time scale that makes one step of
    ``d0`` last ``step_s`` seconds, with gloo's per-operation timeout ``timeout_s``;
    ``transfer_steps``: the cluster's bandwidth is set so that the replica's transfer
    (weights + Adam state, the cost model's ``replica_bytes``) to the holder lasts that
    many steps on the emulated link (default: the test cluster's 1 Gbit/s)."""
    plan = one_device_plan(devices, replication_interval=interval)
    if transfer_steps is not None:
        need = CostModel(plan.problem, 1).replica_bytes(0, plan.problem.model.num_blocks)
        # bytes / (bandwidth in bytes per ms) = transfer_steps * the predicted step
        per_ms = need / (transfer_steps * plan.cost.iteration_ms)
        plan = one_device_plan(devices, network={"bandwidth_mbps": per_ms * 8e3 / 1e6},
                               replication_interval=interval)
    path = write_plan(plan, tmp_path)
    scale = step_s * 1e3 / plan.cost.iteration_ms
    return plan, launch_reaped(
        WorkerOptions(str(path), steps, str(tmp_path), deterministic=True,
                      timeout_s=timeout_s, save_weights=True, faults=faults,
                      emulate=True, time_scale=scale))


@pytest.mark.slow
def test_a_standby_waits_out_an_interval_longer_than_the_gloo_timeout(tmp_path):
    # points 0, 3 and 4: the standby holds point 0 at the start and point 3 only after
    # three steps of 3 s, 9 s against a per-operation timeout of 6 s; d0 then dies in
    # step 3's forward (once point 3 is durable), so the run goes on from the standby's
    # replica of point 3, which must be exact
    plan, result = emulated_run(tmp_path, steps=4, interval=3, step_s=3.0, timeout_s=6.0,
                                faults="d0:3:forward")
    assert_matches_reference(tmp_path, plan, result, 4)
    (event,) = result.events  # d1 was never declared lost
    assert (event["cause"], event["device"], event["replay_from_step"]) == ("crash", "d0", 3)
    new = plan_of(tmp_path, event)
    assert new.partition.used_devices() == ["d1"]
    assert {t.source for t in new.migration} == {"d1"}


# -- points in flight: a point travels beside the steps up to the next point's --------
def test_a_commit_waits_only_for_the_point_before_the_one_its_step_makes():
    # points of a generation from 0, interval 4, 10 steps: 0, 4, 8, 10
    points = replication_points(0, 10, 4)
    assert points == [0, 4, 8, 10]
    # nothing durable yet: steps 0, 1, 2 commit (point 0 travels beside them), step 3
    # makes point 4 and needs point 0
    assert [commit_blocked(t, points) for t in range(5)] == [False, False, False, True, True]
    # point 0 durable: steps 3 .. 6 commit while point 4 travels, step 7 needs it
    assert [commit_blocked(t, points[1:]) for t in range(3, 9)] == [
        False, False, False, False, True, True]
    # point 8 travels beside step 8 only: step 9 makes the last point, 10
    assert [commit_blocked(t, points[2:]) for t in (8, 9)] == [False, True]
    assert not commit_blocked(9, points[3:])  # only the last point is left
    # interval 1: every point up to the step is durable, as before
    assert [commit_blocked(t, [2, 3, 4]) for t in (1, 2)] == [False, True]


#: interval 4 over 8 steps of 0.5 s (points 0, 4, 8), the replica's transfer 3.2 steps
#: on the emulated link: point 4 leaves at the end of step 3 and lands during step 6
FLIGHT = {"steps": 8, "interval": 4, "step_s": 0.5, "timeout_s": 20.0,
          "transfer_steps": 3.2}


@pytest.mark.slow
def test_the_steps_after_a_point_commit_while_it_is_in_flight(tmp_path):
    plan, result = emulated_run(tmp_path, **FLIGHT)
    assert result.events == []
    assert_matches_reference(tmp_path, plan, result, 8)
    d0 = [m["devices"]["d0"] for m in result.metrics]
    # each point is joined before the vote of the step whose commit makes the next one
    joined = {m["step"]: m["devices"]["d0"].get("replication_point") for m in result.metrics}
    assert joined == {0: None, 1: None, 2: None, 3: 0, 4: None, 5: None, 6: None, 7: 4}
    # step 6 starts after the commit of step 5 (and its optimizer step): both came
    # before point 4 was acknowledged, so neither waited for its transfer
    assert d0[6]["started_at"] < d0[7]["replication_acked_at"]
    # its 3.2 steps end within step 7's compute, so hardly any wait is left before
    # step 7's vote (the transfer is hidden)
    assert d0[7]["replication_background_ms"] > 2.5 * FLIGHT["step_s"] * 1e3


@pytest.mark.slow
@pytest.mark.parametrize(("signal", "cause"), [("KILL", "crash"), ("STOP", "hang")])
def test_losing_the_owner_while_a_point_is_in_flight_replays_from_the_point_before(
    tmp_path, signal, cause,
):
    # d0 dies in step 5's forward, one step after point 4 left, 2.2 steps before it lands:
    # point 4 is not durable, so the run replays from point 0, which the standby d1
    # holds, and every committed step before the loss (0 .. 4) is computed again
    plan, result = emulated_run(tmp_path, devices=3, faults=f"d0:5:forward:{signal}",
                                **FLIGHT)
    assert_matches_reference(tmp_path, plan, result, 8)
    (event,) = result.events
    assert (event["cause"], event["device"], event["replay_from_step"]) == (cause, "d0", 0)
    assert {t.source for t in plan_of(tmp_path, event).migration} == {"d1"}
    # no line of the first generation: none of its steps was durable
    assert [m["generation"] for m in result.metrics] == [2] * 8


# -- the planner's side: a point's transfer, the interval that hides it --------------
def test_a_one_device_plan_predicts_its_replicas_transfer_on_the_link_to_the_holder():
    # 8 Mbit/s = 1000 bytes per ms, latency 0.1 ms (the test cluster's)
    plan = one_device_plan(2, network={"bandwidth_mbps": 8.0})
    cm = CostModel(plan.problem, 2)
    need = cm.replica_bytes(0, plan.problem.model.num_blocks)
    assert cm.replica_transfer_ms(plan.partition) == pytest.approx(0.1 + need / 1000)
    # with replication off there is nothing to send
    off = one_device_plan(2, network={"bandwidth_mbps": 8.0}, replication_interval=0)
    assert CostModel(off.problem, 2).replica_transfer_ms(off.partition) == 0.0


@pytest.mark.parametrize(("shared", "channels"), [(False, "its own"), (True, "one")])
def test_two_ring_replicas_share_the_medium_and_take_their_own_switch_ports(shared, channels):
    # stage 0 on d0 -> its replica on d1, stage 1 on d1 -> on d0; 8 Mbit/s, 1 ms latency
    plan = emulated_plan(profile(), [(0, 3, [2]), (3, 6, [2])], 2, 2, [1, 1],
                         bandwidth_mbps=8.0, latency_ms=1.0, shared=shared)
    cm = CostModel(plan.problem, 2)
    a, b = cm.replica_bytes(0, 3) / 1000, cm.replica_bytes(3, 6) / 1000
    # the iteration's own transfers: each of the 2 micro-batches' activations (2
    # samples) d0 -> d1 and its gradients back, at 1000 bytes per ms
    act = 2 * plan.problem.model.blocks[2].output_bytes_per_sample / 1000
    # switched: d0's uplink and d1's downlink for one, the reverse for the other, so
    # they run side by side, each in the time its ports' busier direction leaves free
    # (2 activations, or 2 gradients); Wi-Fi: one medium, one after the other, in the
    # time all 4 transfers leave free
    free = 1 - (4 if channels == "one" else 2) * act / plan.cost.iteration_ms
    want = (a + b if channels == "one" else max(a, b)) / free + 1.0
    assert cm.replica_transfer_ms(plan.partition) == pytest.approx(want)


def test_a_background_transfer_takes_the_channel_time_training_leaves():
    # 100 ms of replica on a medium that each 50 ms iteration holds for 25 ms: 200 ms,
    # then 1 ms latency
    assert background_ms([("a", "b", 100.0, 1.0)], {"medium": 25.0}, 50.0,
                         "shared_medium") == 201.0
    # two on one medium go one after the other: (100 + 50) / (1 - 10 / 40), latency 2
    assert background_ms([("a", "b", 100.0, 1.0), ("b", "a", 50.0, 2.0)],
                         {"medium": 10.0}, 40.0, "shared_medium") == 202.0
    # switched: the busier of its uplink (10 of 40 ms) and downlink (20), not their sum
    assert background_ms([("a", "b", 100.0, 0.0)], {"a up": 10.0, "b down": 20.0}, 40.0,
                         "switched") == 200.0
    # point to point: only its own pair's foreground counts
    assert background_ms([("a", "b", 100.0, 0.0)], {"b->a": 30.0}, 40.0,
                         "point_to_point") == 100.0
    # a channel never free: no interval hides it
    never = background_ms([("a", "b", 1.0, 0.0)], {"medium": 40.0}, 40.0, "shared_medium")
    assert never == math.inf
    assert hiding_interval(never, 40.0) == sys.maxsize


def test_the_interval_that_hides_a_transfer_is_its_length_in_steps_rounded_up():
    assert hiding_interval(7484.28768, 21.986753) == 341  # the demo plan on Wi-Fi
    assert hiding_interval(100.0, 100.0) == 1
    assert hiding_interval(100.1, 100.0) == 2
    assert hiding_interval(0.0, 50.0) == 1
    assert hiding_interval(10.0, 0.0) == 1  # no step time: nothing to hide behind


def test_a_plan_whose_interval_does_not_hide_its_transfer_says_so_in_one_line():
    assert replication_note(1, 7484.28768, 21.986753) == (
        "a replication point's transfer takes 7484 ms on the modelled links, 340.4 steps "
        "of 22.0 ms: at replication_interval 1 throughput falls to about 0.3% of an "
        "unreplicated run; replication_interval 341 hides it (a loss then replays up to "
        "681 steps)")
    assert replication_note(341, 7484.28768, 21.986753) is None
    assert replication_note(0, 7484.28768, 21.986753) is None  # replication off
    # the test cluster's LAN: the toy replica crosses in well under a step
    assert one_device_plan(2).assumptions == ()


def test_edgepipe_run_warns_once_when_the_interval_does_not_hide_the_transfer(
    tmp_path, capsys,
):
    # 0.008 Mbit/s = 1 byte per ms: the toy replica's transfer lasts tens of steps
    plan = one_device_plan(2, network={"bandwidth_mbps": 0.008})
    (note,) = plan.assumptions
    assert note.startswith("a replication point's transfer takes ")
    path = write_plan(plan, tmp_path)
    assert main(["run", str(path), "--out", str(tmp_path), "--steps", "1",
                 "--deterministic", "--hang-timeout", str(HANG_S), "--heartbeat",
                 str(BEAT_S), "--timeout", str(GLOO_TIMEOUT_S)]) == 0
    assert capsys.readouterr().err.count(f"warning: {note}") == 1


def test_edgepipe_run_says_once_which_points_a_run_shorter_than_its_auto_interval_skips(
    tmp_path, capsys,
):
    # auto resolves to the interval that hides the transfer, so the plan itself is
    # sound, but a run of one step cannot hide its start state's point (review 8 F3):
    # it skips it, sends no replica of its final state and says so (issue 28)
    plan = one_device_plan(2, network={"bandwidth_mbps": 0.008}, replication_interval="auto")
    k = plan.problem.config.replication_interval
    assert k > 1 and plan.assumptions == ()
    path = write_plan(plan, tmp_path)
    assert main(["run", str(path), "--out", str(tmp_path), "--steps", "1",
                 "--deterministic", "--hang-timeout", str(HANG_S), "--heartbeat",
                 str(BEAT_S), "--timeout", str(GLOO_TIMEOUT_S)]) == 0
    err = capsys.readouterr().err
    assert err.count("warning: a run of 1 steps skips replication point 0 and sends no "
                     "replica of its final state (point 1): ") == 1
    assert "(plan with --replication-interval 0 to turn replicas off)" in err
